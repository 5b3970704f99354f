#include "server/rpc/call.h"

#include <openssl/crypto.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {

Call::Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method,
           bool unary)
    : env_(env),
      context_(context),
      reactor_(unary ? context->DefaultReactor() : nullptr),
      method_(method),
      start_(absl::Now()) {
  if (env_.metrics) env_.metrics->RequestStarted();
  // Streams (LoadExperts) may take long to send a large set; the idle
  // timeout bounds them instead of --max_request_time.
  deadline_ = unary && env_.max_request_time > absl::ZeroDuration() ? start_ + env_.max_request_time
                                                                    : absl::InfiniteFuture();
  const auto client = context_->deadline();
  if (client != std::chrono::system_clock::time_point::max()) {
    deadline_ = std::min(deadline_, absl::FromChrono(client));
  }
}

bool Call::IsCancelled() const { return context_->IsCancelled(); }

DeviceExecutor::Job Call::UnaryJob(const std::shared_ptr<Call>& call, int64_t bytes,
                                   DeviceExecutor::Work work) {
  DeviceExecutor::Job job;
  job.work = std::move(work);
  job.bytes = bytes;
  job.deadline = call->deadline();
  job.cancelled = [call] { return call->IsCancelled(); };
  job.fail = [call](const absl::Status& status) { call->FinishUnary(status); };
  return job;
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
  if (!Claim()) return reactor_;
  reactor_->Finish(Done(status));
  return reactor_;
}

}  // namespace kplan::rpc
