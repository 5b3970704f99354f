#include "absl/strings/string_view.h"
#include "base/status.h"

#include <exception>
#include <new>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace kplan {

absl::Status WithField(absl::Status status, absl::string_view field) {
  // An OK status keeps no payload: no Cord built for it on the calls' path.
  if (status.ok()) return status;
  status.SetPayload(kFieldPayloadKey, absl::Cord(field));
  return status;
}

std::optional<std::string> FieldOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kFieldPayloadKey);
  if (!payload) return std::nullopt;
  return std::string(*payload);
}

absl::Status InvalidField(absl::string_view field, absl::string_view message) {
  return WithField(absl::InvalidArgumentError(message), field);
}

absl::Status NestField(absl::Status status, absl::string_view prefix) {
  std::optional<std::string> field = FieldOf(status);
  if (!field) return status;
  return WithField(std::move(status),
                   field->empty() ? std::string(prefix) : absl::StrCat(prefix, ".", *field));
}

absl::Status StatusOfCurrentException(absl::string_view oom_doing, absl::string_view failed) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory ", oom_doing));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(failed, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(failed);
  }
}

}  // namespace kplan
