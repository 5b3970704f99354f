// The one mapping from internal absl::Status to gRPC status (as Triton
// server keeps one table). A status that names a request field gains a
// google.rpc.BadRequest detail with that field, in grpc-status-details-bin.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kplan::rpc {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);

// Messages longer than this are cut (at a UTF-8 boundary) so that the
// trailers stay under gRPC's metadata limit.
inline constexpr size_t kMaxErrorMessageBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);

// A failed `status` as a serialized google.rpc.Status: what ToGrpcStatus
// sends in grpc-status-details-bin (code, message, the field), also when no
// field is named. The shared-memory channels' errors (shm_channels.h).
std::string StatusProtoBytes(const absl::Status& status);

// The other way, for calls this server makes to other servers (the peers of
// a multi-process expert-parallel group): same code, the peer's message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// "OK", "INVALID_ARGUMENT", ...: the code's canonical name (metric label).
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace kplan::rpc
