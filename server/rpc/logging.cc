#include "server/rpc/logging.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "grpc/support/log.h"
#include "spdlog/pattern_formatter.h"

namespace kplan::rpc {
namespace {

// The fields of the LogWithFields call on this thread, while it logs.
thread_local const std::initializer_list<LogField>* current_fields = nullptr;

// `value` as is, or quoted (with \" and \\) when it is empty or holds a space
// or quote, so that key=value pairs stay apart.
std::string TextValue(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \"\\") == std::string::npos) return value;
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// %* in the text pattern: " key=value" per field.
class TextFieldsFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (current_fields == nullptr) return;
    for (const LogField& f : *current_fields) {
      const std::string text = absl::StrCat(" ", f.first, "=", TextValue(f.second));
      dest.append(text.data(), text.data() + text.size());
    }
  }
  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<TextFieldsFlag>();
  }
};

class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line;
    line["time"] =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromChrono(msg.time), absl::UTCTimeZone());
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string(level.data(), level.size());
    line["message"] = std::string(msg.payload.data(), msg.payload.size());
    line["thread"] = msg.thread_id;
    if (current_fields != nullptr) {
      for (const LogField& f : *current_fields) line[std::string(f.first)] = f.second;
    }
    // Invalid UTF-8 (a client's bytes) becomes U+FFFD rather than an exception.
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format: unknown format '", name, "'; expected text or json"));
}

std::unique_ptr<spdlog::formatter> MakeLogFormatter(LogFormat format) {
  if (format == LogFormat::kJson) return std::make_unique<JsonFormatter>();
  auto text = std::make_unique<spdlog::pattern_formatter>();
  text->add_flag<TextFieldsFlag>('*').set_pattern("%+%*");
  return text;
}

void SetLogFormat(LogFormat format) { spdlog::set_formatter(MakeLogFormatter(format)); }

void RouteGrpcLogs() {
  gpr_set_log_function([](gpr_log_func_args* args) {
    const spdlog::level::level_enum level =
        args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
        : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                  : spdlog::level::debug;
    absl::string_view file = args->file != nullptr ? args->file : "";
    file = file.substr(file.find_last_of('/') + 1);  // npos + 1 == 0: the whole name
    LogWithFields(level, args->message != nullptr ? args->message : "",
                  {{"source", "grpc"}, {"file", absl::StrCat(file, ":", args->line)}});
  });
}

void LogWithFields(spdlog::level::level_enum level, absl::string_view message,
                   std::initializer_list<LogField> fields) {
  current_fields = &fields;
  spdlog::log(level, "{}", std::string(message));
  current_fields = nullptr;
}

LogRateLimiter::LogRateLimiter(double per_second, std::function<absl::Time()> clock)
    : per_second_(per_second),
      clock_(std::move(clock)),
      burst_(std::max(1.0, per_second)),
      tokens_(burst_) {}

bool LogRateLimiter::Allow(absl::Time now, int64_t* left_out) {
  absl::MutexLock lock(&mu_);
  if (refilled_ != absl::InfinitePast() && now > refilled_) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - refilled_) * per_second_);
  }
  refilled_ = now;  // back in time too: the refill goes on from there
  if (tokens_ < 1.0) {
    ++left_out_;
    return false;
  }
  tokens_ -= 1.0;
  *left_out = std::exchange(left_out_, 0);
  return true;
}

void LogFailedCall(LogRateLimiter* limiter, absl::string_view message,
                   std::initializer_list<LogField> fields) {
  int64_t left_out = 0;
  if (limiter != nullptr && !limiter->Allow(&left_out)) return;
  if (left_out > 0) {
    LogWithFields(spdlog::level::warn, "failed calls left out of the log (--failed_call_log_rate)",
                  {{"count", absl::StrCat(left_out)}});
  }
  LogWithFields(spdlog::level::warn, message, fields);
}

}  // namespace kplan::rpc
