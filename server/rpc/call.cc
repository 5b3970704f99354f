#include "server/rpc/call.h"

#include <openssl/crypto.h>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "server/rpc/status_mapping.h"

namespace kplan::rpc {

Call::Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method,
           bool unary)
    : env_(env),
      context_(context),
      reactor_(unary ? context->DefaultReactor() : nullptr),
      method_(method),
      start_(absl::Now()) {
  if (env_.metrics) env_.metrics->RequestStarted();
}

absl::Status Call::Authorize() const {
  if (env_.auth_token.empty()) return absl::OkStatus();
  const std::string expected = "Bearer " + env_.auth_token;
  const auto& md = context_->client_metadata();
  auto it = md.find("authorization");
  if (it != md.end() && it->second.size() == expected.size() &&
      CRYPTO_memcmp(it->second.data(), expected.data(), expected.size()) == 0) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "missing or invalid bearer token (send metadata 'authorization: Bearer <token>')");
}

grpc::Status Call::Done(const absl::Status& status) {
  grpc::Status out = ToGrpcStatus(status);
  if (!status.ok()) {
    spdlog::debug("{} from {} failed: {}", method_, context_->peer(), status.ToString());
  }
  if (env_.metrics) {
    env_.metrics->RequestFinished(method_, GrpcCodeName(out.error_code()), absl::Now() - start_);
  }
  return out;
}

grpc::ServerUnaryReactor* Call::FinishUnary(const absl::Status& status) {
  reactor_->Finish(Done(status));
  return reactor_;
}

}  // namespace kplan::rpc
