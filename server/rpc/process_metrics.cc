#include "server/rpc/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace kplan::rpc {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {metric}};
}

int64_t OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t n = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory stream's own descriptor
}

// Seconds since the epoch at which the system booted (/proc/stat btime).
int64_t BootTime() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    int64_t t = 0;
    if (line.rfind("btime ", 0) == 0 && absl::SimpleAtoi(line.substr(6), &t)) return t;
  }
  return -1;
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  std::ifstream in("/proc/self/stat");
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  // The command name (field 2) is in parentheses and may hold spaces: the
  // fields counted below start after its closing parenthesis (field 3).
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  auto field = [&](int number) {  // proc(5) numbering
    double v = 0;
    const size_t i = static_cast<size_t>(number - 3);
    return i < f.size() && absl::SimpleAtod(f[i], &v) ? v : -1.0;
  };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  std::vector<prometheus::MetricFamily> out;
  out.push_back(Family("process_cpu_seconds_total", "User and system CPU time spent in seconds",
                       prometheus::MetricType::Counter, (field(14) + field(15)) / ticks));
  out.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes",
                       prometheus::MetricType::Gauge, field(24) * page));
  out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes",
                       prometheus::MetricType::Gauge, field(23)));
  out.push_back(Family("process_threads", "Number of OS threads in the process",
                       prometheus::MetricType::Gauge, field(20)));
  const int64_t boot = BootTime();
  if (boot >= 0) {
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since unix epoch in seconds",
                         prometheus::MetricType::Gauge, boot + field(22) / ticks));
  }
  const int64_t fds = OpenFds();
  if (fds >= 0) {
    out.push_back(Family("process_open_fds", "Number of open file descriptors",
                         prometheus::MetricType::Gauge, static_cast<double>(fds)));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(Family("process_max_fds", "Maximum number of open file descriptors",
                         prometheus::MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace kplan::rpc
