// The server's log lines: text (spdlog's pattern) or JSON (--log_format=json:
// one object per line with "time" (UTC, RFC 3339 with milliseconds),
// "level", "message", "thread" and the fields of a LogWithFields call as
// further keys, so none may be named like those). Fields in text mode
// follow the message as key=value (quoted when empty or spaced).
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/formatter.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {

enum class LogFormat { kText, kJson };

// "text" or "json"; anything else is INVALID_ARGUMENT.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);

// The formatter of `format`; LogWithFields' fields appear in either.
std::unique_ptr<spdlog::formatter> MakeLogFormatter(LogFormat format);

// Sets the default logger's formatter.
void SetLogFormat(LogFormat format);

// gRPC's own log lines (a failed TLS handshake, say) go through the default
// logger too, in its format, with the fields source=grpc and file=NAME:LINE;
// GRPC_VERBOSITY still chooses which gRPC emits (default: errors).
void RouteGrpcLogs();

using LogField = std::pair<absl::string_view, std::string>;

// Logs `message` with `fields` at `level` through the default logger (on
// this thread: spdlog's default logger formats synchronously).
void LogWithFields(spdlog::level::level_enum level, absl::string_view message,
                   std::initializer_list<LogField> fields);

// About `per_second` lines a second on average, in bursts of up to that
// many (at least one): a token bucket. The lines left out are counted, so that the
// next line let through can say how many. Thread-safe.
class LogRateLimiter {
 public:
  // `clock`: the time of Allow(left_out) (tests pass their own).
  explicit LogRateLimiter(double per_second, std::function<absl::Time()> clock = absl::Now);
  // Whether a line may be logged at `now`; when it may, *left_out gets the
  // lines refused since the last one let through (else it is untouched). A
  // clock stepping back restarts the refill from the earlier time.
  bool Allow(absl::Time now, int64_t* left_out);
  bool Allow(int64_t* left_out) { return Allow(clock_(), left_out); }

 private:
  const double per_second_;
  const std::function<absl::Time()> clock_;
  const double burst_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t left_out_ ABSL_GUARDED_BY(mu_) = 0;
};

// A failed call's warning (the server's one form for it: gRPC calls and
// shared-memory channel calls), through `limiter` (null: every one). A line
// let through after some were left out is preceded by one that counts them.
// The metrics count every failed call whatever the log shows.
void LogFailedCall(LogRateLimiter* limiter, absl::string_view message,
                   std::initializer_list<LogField> fields);

}  // namespace kplan::rpc
