// The service floor against gRPC's own: sequential unary calls, one at a
// time, on one channel, over a Unix socket and TCP loopback, with the
// servers in this process or in a child process (as a client and
// kplan-server would be). Per transport and case it prints the range of the
// per-round medians (p50) and the median p90:
//   grpc        a bare gRPC server (callback API, as kplan's) with a trivial
//               grpc.health.v1 Check, a plain stub: gRPC's floor here;
//   grpc_sync   the same on gRPC's synchronous server API;
//   health      kplan-server's own health service (the same server, channel
//               arguments and threads as kplan's methods), a plain stub;
//   null        GetServerInfo through kplan::Client;
//   skip        RunMoE with skip_device (the whole path without the layer)
//               through kplan::Client, 1 token of a Qwen3-shaped layer
//               (E=128 k=8 H=2048; I=16 so the CPU set stays small);
//   channel     the same RunMoE through a shared-memory call channel
//               (client/cpp/shm_channel.h: no gRPC on the call's path; the
//               transport column is then only how the channel was opened).
// Rounds alternate the cases, so a noisy host spreads its noise over all.
// --concurrency C > 1 (a list; 1 is the sequential run above) measures the
// ceiling instead: per case, C client threads, each with a channel (and so a
// connection) and stubs of its own, call back to back for --duration_s after
// --warmup_s; a second table gives requests/s (calls sent and answered
// without error within the window, over its seconds), p50 and p99 over all
// threads' calls, CPU per call over the window, and the failed calls (warm-up
// included; the first error is printed, and the exit status is then 1).
// Abseil's mutex deadlock detection is off, as in kplan-server and
// kplan_perf (--deadlock_detection: on, Debian's default).
//   rpc_floor_bench [--calls 2000] [--rounds 5] [--transport unix,tcp]
//                   [--process same,separate] [--cases grpc,...,skip]
//                   [--concurrency 1,8,64] [--duration_s 2] [--warmup_s 0.5]
//                   [--deadlock_detection]
//                   [--json F] [--csv F]
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_channel.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/rpc/server.h"

ABSL_FLAG(double, channel_spin_us, 50,
          "The channel case: how long the server's channel thread and the client poll before "
          "they sleep on the state word (kplan-server's --shm_channel_spin); 0: sleep at once");

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr int kE = 128, kK = 8, kH = 2048, kI = 16;

class CallbackHealth final : public Health::CallbackService {
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context, const HealthCheckRequest*,
                                  HealthCheckResponse* response) override {
    response->set_status(HealthCheckResponse::SERVING);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class SyncHealth final : public Health::Service {
  grpc::Status Check(grpc::ServerContext*, const HealthCheckRequest*,
                     HealthCheckResponse* response) override {
    response->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
};

// The three servers of one transport and where a client reaches them.
struct Servers {
  CallbackHealth callback_health;
  SyncHealth sync_health;
  std::unique_ptr<grpc::Server> bare, bare_sync;
  std::unique_ptr<kplan::rpc::KplanServer> kplan;
  std::string targets[3];  // bare, bare_sync, kplan
};

std::string Listen(const std::string& transport, const char* what) {
  return transport == "unix" ? absl::StrCat("unix:/tmp/kplan-rpc-floor-", getpid(), "-", what)
                             : std::string("127.0.0.1:0");
}

std::string Target(const std::string& listen, int port) {
  return listen.rfind("unix:", 0) == 0 ? listen : absl::StrCat("127.0.0.1:", port);
}

// The bare servers of `transport`: built before any KplanServer::Start in
// this process, which turns on gRPC's reflection for every server built
// after it (and its default health service, which the bare ones replace).
bool StartBare(const std::string& transport, Servers& s) {
  int i = 0;
  for (grpc::Service* service : {static_cast<grpc::Service*>(&s.callback_health),
                                 static_cast<grpc::Service*>(&s.sync_health)}) {
    const std::string listen = Listen(transport, i == 0 ? "bare" : "sync");
    if (transport == "unix") unlink(listen.c_str() + 5);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    (i == 0 ? s.bare : s.bare_sync) = builder.BuildAndStart();
    if ((i == 0 ? s.bare : s.bare_sync) == nullptr) return false;
    s.targets[i++] = Target(listen, port);
  }
  return true;
}

bool StartKplan(const std::string& transport, Servers& s) {
  kplan::rpc::ServerOptions options;
  options.listen_address = Listen(transport, "kplan");
  options.devices = "none";
  options.allow_skip_device = true;
  options.allow_shared_memory = true;  // the channel case
  options.max_shm_channels = 1024;
  options.shm_channel_spin = absl::Microseconds(absl::GetFlag(FLAGS_channel_spin_us));
  auto kplan = kplan::rpc::KplanServer::Start(options);
  if (!kplan.ok()) {
    std::fprintf(stderr, "kplan server: %s\n", kplan.status().ToString().c_str());
    return false;
  }
  s.kplan = *std::move(kplan);
  s.targets[2] = Target(options.listen_address, s.kplan->port());
  return true;
}

struct Row {
  std::string transport, process, name;
  int concurrency = 1;
  std::vector<double> p50s, p90s, p99s;         // one per round (concurrency > 1: the window)
  double client_cpu_ns = 0, server_cpu_ns = 0;  // all rounds
  double seconds = 0;                           // of the measured calls, all rounds
  int64_t calls = 0, errors = 0;
  std::string first_error;
};

// Nanoseconds of CPU this process has used so far (all its threads, ended
// ones included).
double SelfCpuNs() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return 1e9 * static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e3 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The servers' process: this one, or a child that answers its CPU time
// (SelfCpuNs) for each byte written to `fd` and stops when it is closed.
struct ServerProcess {
  int fd = -1;  // -1: this process
  double CpuNs() const {
    if (fd < 0) return 0;
    char c = 'c';
    if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) return 0;  // a child gone: no SIGPIPE
    std::string line;
    while (read(fd, &c, 1) == 1 && c != '\n') line += c;
    double ns = 0;
    return absl::SimpleAtod(line, &ns) ? ns : 0;
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One client of the three servers (bare, bare_sync, kplan): id < 0 on
// gRPC's default channels; id >= 0 on channels with a channel argument of
// its own, so that gRPC gives it connections of its own.
kplan::ShmChannel::Options ChannelOptions() {
  kplan::ShmChannel::Options options;
  options.spin = absl::Microseconds(absl::GetFlag(FLAGS_channel_spin_us));
  return options;
}

struct Clients {
  std::unique_ptr<Health::Stub> bare, bare_sync, health;  // health: kplan's
  std::unique_ptr<kplan::Client> client;
  std::unique_ptr<kplan::ShmChannel> channel;  // opened at its first call
  absl::Status Channel(const kplan::v1::RunMoERequest& request) {
    if (channel == nullptr) {
      absl::StatusOr<std::unique_ptr<kplan::ShmChannel>> opened =
          kplan::ShmChannel::Open(*client, ChannelOptions());
      if (!opened.ok()) return opened.status();
      channel = *std::move(opened);
    }
    kplan::v1::RunMoEResponse response;
    return channel->RunMoE(request, &response);
  }
};

std::unique_ptr<Clients> ConnectClients(const std::string* targets, int id) {
  kplan::ClientOptions options;
  options.max_attempts = 1;
  auto channel = [&](const std::string& target, int64_t max_message_bytes) {
    if (id < 0) return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    grpc::ChannelArguments args;
    args.SetInt("kplan.floor_client", id);
    if (max_message_bytes > 0) {  // as kplan::Client::Connect
      args.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
      args.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
    }
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  };
  auto c = std::make_unique<Clients>();
  c->bare = Health::NewStub(channel(targets[0], 0));
  c->bare_sync = Health::NewStub(channel(targets[1], 0));
  c->client = id < 0 ? kplan::Client::Connect(targets[2], options)
                     : std::make_unique<kplan::Client>(
                           channel(targets[2], options.max_message_bytes), options);
  c->health = Health::NewStub(c->client->channel());
  return c;
}

// One case: a call through one client's stubs.
struct Case {
  const char* name;
  std::function<absl::Status(Clients&)> call;
};

// The runs of --concurrency C > 1: C threads per case, for duration_s
// after warmup_s.
struct LoadOptions {
  std::vector<int> concurrency;  // each > 1
  double warmup_s = 0.5, duration_s = 2;
};

// `concurrency` threads, the n-th on pool[n], calling `c` back to back: the
// calls sent and answered within the window after the warm-up, and both
// processes' CPU time over it.
void MeasureLoad(const Case& c, int concurrency, const std::vector<std::unique_ptr<Clients>>& pool,
                 const ServerProcess& server, const LoadOptions& load, Row& row) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(50);  // threads up
  const Clock::time_point from = start + seconds(load.warmup_s),
                          to = from + seconds(load.duration_s);
  std::vector<std::vector<double>> us(static_cast<size_t>(concurrency));
  std::vector<int64_t> errors(static_cast<size_t>(concurrency));
  std::vector<std::string> first_error(static_cast<size_t>(concurrency));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < static_cast<size_t>(concurrency); ++t) {
    threads.emplace_back([&, t] {
      std::this_thread::sleep_until(start);
      while (true) {
        const Clock::time_point sent = Clock::now();
        if (sent >= to) break;
        const absl::Status status = c.call(*pool[t]);
        const Clock::time_point done = Clock::now();
        if (!status.ok()) {
          if (errors[t]++ == 0) first_error[t] = status.ToString();
        } else if (sent >= from && done <= to) {
          us[t].push_back(std::chrono::duration<double, std::micro>(done - sent).count());
        }
      }
    });
  }
  std::this_thread::sleep_until(from);
  const double client_before = SelfCpuNs(), server_before = server.CpuNs();
  std::this_thread::sleep_until(to);
  row.client_cpu_ns = SelfCpuNs() - client_before;
  row.server_cpu_ns = server.CpuNs() - server_before;
  for (std::thread& thread : threads) thread.join();
  std::vector<double> all;
  for (size_t t = 0; t < us.size(); ++t) {
    all.insert(all.end(), us[t].begin(), us[t].end());
    row.errors += errors[t];
    if (row.first_error.empty()) row.first_error = first_error[t];
  }
  row.calls = static_cast<int64_t>(all.size());
  row.seconds = load.duration_s;
  row.p50s = {Percentile(all, 0.5)};
  row.p90s = {Percentile(all, 0.9)};
  row.p99s = {Percentile(all, 0.99)};
}

// `server`: where the servers run (this process: its CPU time is then all
// in the client's column). `sequential`: the run of --concurrency 1.
int Measure(const std::string& transport, const std::string& process, const std::string* targets,
            const ServerProcess& server, int calls, int rounds, bool sequential,
            const LoadOptions& load, const std::vector<std::string>& only, std::vector<Row>& rows) {
  const std::unique_ptr<Clients> one = ConnectClients(targets, -1);
  kplan::Client* client = one->client.get();
  auto check = [](Health::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckResponse response;
    const grpc::Status status = stub.Check(&context, HealthCheckRequest(), &response);
    return status.ok() ? absl::OkStatus()
                       : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                      status.error_message());
  };

  kplan::v1::ExpertsHeader header;
  header.set_experts_id("floor");
  header.set_num_experts(kE);
  header.set_hidden_size(kH);
  header.set_intermediate_size(kI);
  std::vector<kplan::v1::TensorChunk> chunks;  // every weight bf16 0.0115 (0x3c3c)
  header.set_dtype(kplan::v1::DTYPE_BFLOAT16);
  kplan::AppendTensorChunks("w13", kplan::v1::DTYPE_BFLOAT16, {kE, 2 * kI, kH},
                            std::string(size_t{2} * kE * 2 * kI * kH, '\x3c'), 8 << 20, &chunks);
  kplan::AppendTensorChunks("w2", kplan::v1::DTYPE_BFLOAT16, {kE, kH, kI},
                            std::string(size_t{2} * kE * kH * kI, '\x3c'), 8 << 20, &chunks);
  if (auto loaded = client->LoadExperts(header, chunks); !loaded.ok()) {
    std::fprintf(stderr, "load: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  kplan::v1::RunMoERequest request;
  request.set_experts_id("floor");
  request.set_skip_device(true);
  request.mutable_routing()->set_top_k(kK);
  kplan::v1::Tensor* x = request.mutable_hidden_states();
  x->set_dtype(kplan::v1::DTYPE_BFLOAT16);
  x->add_shape(1);
  x->add_shape(kH);
  x->set_data(std::string(2 * kH, '\x3c'));
  kplan::v1::Tensor* logits = request.mutable_router_logits();
  logits->set_dtype(kplan::v1::DTYPE_FLOAT32);
  logits->add_shape(1);
  logits->add_shape(kE);
  std::vector<float> values(kE);
  for (int e = 0; e < kE; ++e) values[e] = static_cast<float>((e * 37) % kE) / kE;
  logits->set_data(values.data(), values.size() * sizeof(float));

  std::vector<Case> cases = {
      {"grpc", [&](Clients& c) { return check(*c.bare); }},
      {"grpc_sync", [&](Clients& c) { return check(*c.bare_sync); }},
      {"health", [&](Clients& c) { return check(*c.health); }},
      {"null", [&](Clients& c) { return c.client->GetServerInfo().status(); }},
      {"skip", [&](Clients& c) { return c.client->RunMoE(request).status(); }},
      {"channel", [&](Clients& c) { return c.Channel(request); }},
  };
  if (!only.empty()) {
    std::erase_if(cases, [&](const Case& c) {
      return std::find(only.begin(), only.end(), c.name) == only.end();
    });
  }
  auto add_row = [&](const char* name, int concurrency) -> Row& {
    Row& row = rows.emplace_back();
    row.transport = transport;
    row.process = process;
    row.name = name;
    row.concurrency = concurrency;
    return row;
  };
  const size_t first = rows.size();
  if (sequential) {
    for (const Case& c : cases) add_row(c.name, 1);
  }
  for (int round = -1; sequential && round < rounds; ++round) {  // round -1 warms up
    for (size_t i = 0; i < cases.size(); ++i) {
      std::vector<double> us;
      us.reserve(static_cast<size_t>(calls));
      const double client_before = SelfCpuNs(), server_before = server.CpuNs();
      const auto round_start = std::chrono::steady_clock::now();
      for (int n = 0; n < (round < 0 ? 200 : calls); ++n) {
        const auto start = std::chrono::steady_clock::now();
        if (const absl::Status status = cases[i].call(*one); !status.ok()) {
          std::fprintf(stderr, "%s: %s failed: %s\n", transport.c_str(), cases[i].name,
                       status.ToString().c_str());
          return 1;
        }
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
      }
      if (round < 0) continue;
      rows[first + i].seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start).count();
      rows[first + i].client_cpu_ns += SelfCpuNs() - client_before;
      rows[first + i].server_cpu_ns += server.CpuNs() - server_before;
      rows[first + i].calls += calls;
      rows[first + i].p50s.push_back(Percentile(us, 0.5));
      rows[first + i].p90s.push_back(Percentile(us, 0.9));
      rows[first + i].p99s.push_back(Percentile(us, 0.99));
    }
  }
  // --concurrency C > 1: a client per thread, kept from one C to the next.
  std::vector<std::unique_ptr<Clients>> pool;
  for (int concurrency : load.concurrency) {
    while (pool.size() < static_cast<size_t>(concurrency)) {
      pool.push_back(ConnectClients(targets, static_cast<int>(pool.size())));
    }
    for (const Case& c : cases) {
      MeasureLoad(c, concurrency, pool, server, load, add_row(c.name, concurrency));
    }
  }
  (void)client->UnloadExperts("floor");
  return 0;
}

// The child of --process separate: serves until its parent closes `fd`.
[[noreturn]] void ServeForParent(const std::string& transport, int fd) {
  Servers s;
  if (!StartBare(transport, s) || !StartKplan(transport, s)) _exit(1);
  std::string line = absl::StrCat(s.targets[0], " ", s.targets[1], " ", s.targets[2], "\n");
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(1);
  char c;
  while (read(fd, &c, 1) > 0) {
    const std::string cpu = absl::StrFormat("%.0f\n", SelfCpuNs());
    if (write(fd, cpu.data(), cpu.size()) != static_cast<ssize_t>(cpu.size())) break;
  }
  s.kplan->Shutdown(absl::Seconds(1));
  s.bare->Shutdown();
  s.bare_sync->Shutdown();
  _exit(0);
}

}  // namespace

ABSL_FLAG(int, calls, 2000, "Sequential unary calls per case and round");
ABSL_FLAG(int, rounds, 5, "Rounds; the cases alternate within each");
ABSL_FLAG(std::string, transport, "unix,tcp", "Comma-separated transports: unix, tcp");
ABSL_FLAG(std::string, process, "same,separate",
          "Comma-separated: servers in this process (same) or a forked child (separate)");
ABSL_FLAG(std::string, cases, "", "Comma-separated cases to run alone (empty: all)");
ABSL_FLAG(std::string, concurrency, "1",
          "Comma-separated client counts: 1 the sequential calls (--calls, --rounds), C > 1 C "
          "threads per case, each on its own connection, for --duration_s");
ABSL_FLAG(double, duration_s, 2.0, "Measured seconds per case at each concurrency > 1");
ABSL_FLAG(double, warmup_s, 0.5, "Unmeasured seconds before each of those");
ABSL_FLAG(std::string, json, "", "Write the results as JSON to this file");
ABSL_FLAG(std::string, csv, "", "Write the results as CSV to this file");
ABSL_FLAG(bool, deadlock_detection, false,
          "Keep Abseil's mutex deadlock detection on (as Debian's Abseil builds it)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The service floor: sequential unary calls against a bare gRPC server and kplan's,\n"
      "and with --concurrency C > 1 the calls/s of C clients, each on its own connection.\n"
      "  rpc_floor_bench --calls 2000 --rounds 3 --csv out.csv\n"
      "  rpc_floor_bench --concurrency 1,8,64 --duration_s 2 --warmup_s 0.5 --cases grpc,skip");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::GetFlag(FLAGS_deadlock_detection)
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
  const int calls = absl::GetFlag(FLAGS_calls), rounds = absl::GetFlag(FLAGS_rounds);
  if (calls <= 0 || rounds <= 0) {
    std::fprintf(stderr, "rpc_floor_bench: --calls and --rounds must be > 0\n");
    return 2;
  }
  bool sequential = false;  // --concurrency has 1
  LoadOptions load;
  load.warmup_s = absl::GetFlag(FLAGS_warmup_s);
  load.duration_s = absl::GetFlag(FLAGS_duration_s);
  for (const absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int c = 0;
    if (!absl::SimpleAtoi(part, &c) || c <= 0) {
      std::fprintf(stderr, "rpc_floor_bench: --concurrency: not a count > 0: '%s'\n",
                   std::string(part).c_str());
      return 2;
    }
    if (c == 1) {
      sequential = true;
    } else {
      load.concurrency.push_back(c);
    }
  }
  if (load.duration_s <= 0 || load.warmup_s < 0) {
    std::fprintf(stderr, "rpc_floor_bench: --duration_s must be > 0, --warmup_s >= 0\n");
    return 2;
  }
  const std::vector<std::string> transports = absl::StrSplit(absl::GetFlag(FLAGS_transport), ',');
  const std::vector<std::string> processes = absl::StrSplit(absl::GetFlag(FLAGS_process), ',');
  const std::string json = absl::GetFlag(FLAGS_json), csv = absl::GetFlag(FLAGS_csv);
  std::vector<std::string> only;  // --cases: these alone
  if (!absl::GetFlag(FLAGS_cases).empty()) only = absl::StrSplit(absl::GetFlag(FLAGS_cases), ',');
  // Children are forked before this process starts gRPC.
  std::vector<std::pair<pid_t, int>> children;  // per (process, transport) pair of "separate"
  std::vector<std::string> child_targets;

  for (const std::string& p : processes) {
    if (p != "separate") continue;
    for (const std::string& t : transports) {
      int fds[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 1;
      const pid_t pid = fork();
      if (pid == 0) {
        close(fds[0]);
        for (auto& [other, fd] : children) close(fd);  // its EOF is its sibling's stop
        ServeForParent(t, fds[1]);
      }
      close(fds[1]);
      children.emplace_back(pid, fds[0]);
    }
  }
  for (auto& [pid, fd] : children) {
    std::string line;
    char c;
    while (read(fd, &c, 1) == 1 && c != '\n') line += c;
    child_targets.push_back(line);
  }
  if (sequential) {
    std::printf("# sequential unary calls, %d per round, %d rounds; p50 range over rounds (us)\n",
                calls, rounds);
  }
  std::vector<Row> rows;
  size_t child = 0;
  std::vector<std::unique_ptr<Servers>> local;  // "same": every transport's bare servers first
  for (const std::string& p : processes) {
    if (p != "same" || !local.empty()) continue;
    for (const std::string& t : transports) {
      local.push_back(std::make_unique<Servers>());
      if (!StartBare(t, *local.back())) return 1;
    }
  }
  for (const std::string& p : processes) {
    for (size_t ti = 0; ti < transports.size(); ++ti) {
      const std::string& t = transports[ti];
      std::string targets[3];
      ServerProcess server;
      if (p == "separate") {
        server.fd = children[child].second;
        std::vector<std::string> parts = absl::StrSplit(child_targets[child++], ' ');
        if (parts.size() != 3) return 1;
        for (int i = 0; i < 3; ++i) targets[i] = parts[i];
      } else {
        Servers& here = *local[ti];
        if (!StartKplan(t, here)) return 1;
        for (int i = 0; i < 3; ++i) targets[i] = here.targets[i];
      }
      if (Measure(t, p, targets, server, calls, rounds, sequential, load, only, rows) != 0) {
        return 1;
      }
      if (p == "same") local[ti]->kplan->Shutdown(absl::Seconds(1));
    }
  }
  for (auto& [pid, fd] : children) {
    close(fd);
    waitpid(pid, nullptr, 0);
  }
  struct Out {
    double p50_min, p50_median, p50_max, p90_median, client_cpu, server_cpu, p99_median, req_per_s;
  };
  auto out_of = [](const Row& r) {
    const double n = static_cast<double>(std::max<int64_t>(r.calls, 1));
    return Out{
        Percentile(r.p50s, 0),     Percentile(r.p50s, 0.5),
        Percentile(r.p50s, 1),     Percentile(r.p90s, 0.5),
        r.client_cpu_ns / n / 1e3, r.server_cpu_ns / n / 1e3,
        Percentile(r.p99s, 0.5),   r.seconds > 0 ? static_cast<double>(r.calls) / r.seconds : 0};
  };
  if (sequential) {
    std::printf("%-9s %-9s %-10s %9s %9s %9s %9s %10s %10s\n", "transport", "process", "case",
                "p50 min", "p50 med", "p50 max", "p90 med", "cpu client", "cpu server");
    for (const Row& r : rows) {
      if (r.concurrency != 1) continue;
      const Out o = out_of(r);
      std::printf("%-9s %-9s %-10s %9.1f %9.1f %9.1f %9.1f %10.1f %10.1f\n", r.transport.c_str(),
                  r.process.c_str(), r.name.c_str(), o.p50_min, o.p50_median, o.p50_max,
                  o.p90_median, o.client_cpu, o.server_cpu);
    }
    std::printf(
        "# cpu: us of CPU per call, all threads of the process (same: both sides in 'client')\n");
  }
  int64_t errors = 0;
  if (!load.concurrency.empty()) {
    std::printf(
        "# concurrent clients, each on its own connection, back-to-back calls for %.1f s after "
        "%.1f s of warm-up; req/s: calls answered within the window; p50, p99 over all its calls "
        "(us)\n",
        load.duration_s, load.warmup_s);
    std::printf("%-9s %-9s %-10s %11s %9s %9s %9s %10s %10s %8s\n", "transport", "process", "case",
                "concurrency", "req/s", "p50", "p99", "cpu client", "cpu server", "errors");
    for (const Row& r : rows) {
      if (r.concurrency == 1) continue;
      const Out o = out_of(r);
      std::printf("%-9s %-9s %-10s %11d %9.0f %9.1f %9.1f %10.1f %10.1f %8lld\n",
                  r.transport.c_str(), r.process.c_str(), r.name.c_str(), r.concurrency,
                  o.req_per_s, o.p50_median, o.p99_median, o.client_cpu, o.server_cpu,
                  static_cast<long long>(r.errors));
      errors += r.errors;
    }
    std::printf(
        "# cpu: us of CPU per call answered, all threads of the process (same: both sides in "
        "'client'); errors: failed calls, warm-up included\n");
    for (const Row& r : rows) {
      if (r.errors == 0) continue;
      std::printf("# errors: %s %s %s concurrency %d: %lld, the first: %s\n", r.transport.c_str(),
                  r.process.c_str(), r.name.c_str(), r.concurrency,
                  static_cast<long long>(r.errors), r.first_error.c_str());
    }
  }
  // The columns of the sequential rows, then concurrency, req_per_s (calls
  // over the seconds spent calling), p99_median_us and errors; a row of
  // concurrency > 1 has one window, its p50 min, median and max alike.
  constexpr const char* kFields =
      "transport,process,case,p50_min_us,p50_median_us,p50_max_us,p90_median_us,"
      "client_cpu_us,server_cpu_us,concurrency,req_per_s,p99_median_us,errors";
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"calls_per_round\": " << calls << ", \"rounds\": " << rounds
        << ", \"duration_s\": " << load.duration_s << ", \"warmup_s\": " << load.warmup_s
        << ", \"rows\": [";
    for (size_t n = 0; n < rows.size(); ++n) {
      const Row& r = rows[n];
      const Out o = out_of(r);
      out << (n ? ",\n  " : "\n  ")
          << absl::StrFormat(
                 "{\"transport\": \"%s\", \"process\": \"%s\", \"case\": \"%s\", "
                 "\"p50_min_us\": %.1f, \"p50_median_us\": %.1f, \"p50_max_us\": %.1f, "
                 "\"p90_median_us\": %.1f, \"client_cpu_us\": %.1f, \"server_cpu_us\": %.1f, "
                 "\"concurrency\": %d, \"req_per_s\": %.1f, \"p99_median_us\": %.1f, "
                 "\"errors\": %d}",
                 r.transport, r.process, r.name, o.p50_min, o.p50_median, o.p50_max, o.p90_median,
                 o.client_cpu, o.server_cpu, r.concurrency, o.req_per_s, o.p99_median, r.errors);
    }
    out << "\n]}\n";
  }
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << kFields << "\n";
    for (const Row& r : rows) {
      const Out o = out_of(r);
      out << absl::StrFormat("%s,%s,%s,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%d,%.1f,%.1f,%d\n",
                             r.transport, r.process, r.name, o.p50_min, o.p50_median, o.p50_max,
                             o.p90_median, o.client_cpu, o.server_cpu, r.concurrency, o.req_per_s,
                             o.p99_median, r.errors);
    }
  }
  if (errors > 0) {
    std::fprintf(stderr, "rpc_floor_bench: %lld calls failed\n", static_cast<long long>(errors));
    return 1;
  }
  return 0;
}
