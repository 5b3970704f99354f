// Status helpers shared by every module. Errors that blame one request field
// carry the field's path as a payload, so the RPC layer can attach a
// google.rpc.BadRequest naming it without the core knowing about protobuf.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace kplan {

// Payload key under which the offending field path ("kernel_config.moe_backend")
// travels inside an absl::Status.
inline constexpr absl::string_view kFieldPayloadKey = "kplan.dev/field";

// Returns `status` with `field` attached as the offending request field.
absl::Status WithField(absl::Status status, absl::string_view field);

// The field attached by WithField, if any.
std::optional<std::string> FieldOf(const absl::Status& status);

// INVALID_ARGUMENT naming `field`: a request wrong in itself.
absl::Status InvalidField(absl::string_view field, absl::string_view message);

// Prefixes the field path of `status` with `prefix` ("model.moe" + "." + field).
absl::Status NestField(absl::Status status, absl::string_view prefix);

// Only inside a catch block: the exception being handled as a status,
// RESOURCE_EXHAUSTED "out of memory <oom_doing>" for std::bad_alloc,
// INTERNAL "<failed>: <what()>" for another std::exception, INTERNAL
// "<failed>" for anything else.
absl::Status StatusOfCurrentException(absl::string_view oom_doing, absl::string_view failed);

}  // namespace kplan

// Returns early with the error of a Status-returning expression.
#define KPLAN_RETURN_IF_ERROR(expr)             \
  do {                                          \
    if (absl::Status _st = (expr); !_st.ok()) { \
      return _st;                               \
    }                                           \
  } while (0)

#define KPLAN_CONCAT_INNER_(a, b) a##b
#define KPLAN_CONCAT_(a, b) KPLAN_CONCAT_INNER_(a, b)
// Assigns the value of a StatusOr expression or returns its error.
#define KPLAN_ASSIGN_OR_RETURN(lhs, expr) \
  KPLAN_ASSIGN_OR_RETURN_IMPL_(KPLAN_CONCAT_(_statusor_, __LINE__), lhs, expr)
#define KPLAN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
