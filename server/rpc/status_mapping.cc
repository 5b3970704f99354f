#include "server/rpc/status_mapping.h"

#include <array>
#include <utility>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kplan::rpc {
namespace {

constexpr std::array<std::pair<absl::StatusCode, grpc::StatusCode>, 17> kCodes = {{
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
}};

// The message travels in trailers (twice, with the BadRequest detail), which
// gRPC caps at a few KiB: a longer one would reach the client as
// RESOURCE_EXHAUSTED on metadata instead of the real error. Texts that quote
// client strings shorten them at the source; this bounds the rest.
std::string BoundedMessage(absl::string_view message, size_t max_bytes = kMaxErrorMessageBytes) {
  if (message.size() <= max_bytes) return std::string(message);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xc0) == 0x80) --cut;
  return absl::StrCat(message.substr(0, cut), "...(+", message.size() - cut, " bytes)");
}

}  // namespace

grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  for (const auto& [a, g] : kCodes) {
    if (a == code) return g;
  }
  return grpc::StatusCode::UNKNOWN;
}

std::string GrpcCodeName(grpc::StatusCode code) {
  // absl's names are the canonical gRPC code names, and the codes coincide.
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const grpc::StatusCode code = ToGrpcCode(status.code());
  std::string message = BoundedMessage(status.message());
  std::optional<std::string> field = FieldOf(status);
  if (!field) return grpc::Status(code, message);
  google::rpc::BadRequest bad_request;
  google::rpc::BadRequest::FieldViolation* v = bad_request.add_field_violations();
  v->set_field(BoundedMessage(*field, kMaxErrorMessageBytes / 4));
  v->set_description(message);
  google::rpc::Status details;
  details.set_code(static_cast<int>(code));
  details.set_message(message);
  details.add_details()->PackFrom(bad_request);
  return grpc::Status(code, message, details.SerializeAsString());
}

std::string StatusProtoBytes(const absl::Status& status) {
  const grpc::Status g = ToGrpcStatus(status);
  if (!g.error_details().empty()) return g.error_details();
  google::rpc::Status plain;
  plain.set_code(static_cast<int>(g.error_code()));
  plain.set_message(g.error_message());
  return plain.SerializeAsString();
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // gRPC's and absl's canonical codes have the same numbers.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace kplan::rpc
