// The server's log lines: text (spdlog's pattern) or JSON (--log_format=json:
// one object per line with "time" (UTC, RFC 3339 with milliseconds),
// "level", "message", "thread" and the fields of a LogWithFields call as
// further keys, so none may be named like those). Fields in text mode
// follow the message as key=value (quoted when empty or spaced).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

}  // namespace kplan::rpc
