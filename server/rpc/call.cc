#include "server/rpc/call.h"

#include <openssl/crypto.h>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "server/base/client_text.h"
#include "server/base/status.h"
#include "server/rpc/status_mapping.h"

namespace kplan::rpc {
namespace {

thread_local ResponseSink* pending_sink = nullptr;

}  // namespace

ScopedResponseSink::ScopedResponseSink(std::unique_ptr<ResponseSink> sink) {
  delete pending_sink;
  pending_sink = sink.release();
}

ScopedResponseSink::~ScopedResponseSink() {
  delete pending_sink;
  pending_sink = nullptr;
}

Call::Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method,
           bool unary)
    : env_(env),
      context_(context),
      reactor_(unary ? context->DefaultReactor() : nullptr),
      method_(method),
      start_(absl::Now()),
      sink_(pending_sink) {
  pending_sink = nullptr;
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

grpc::Status Call::Done(const absl::Status& outcome) {
  absl::Status status = outcome;
  if (status.ok() && sink_ != nullptr) status = sink_->Serialize();
  grpc::Status out = ToGrpcStatus(status);
  if (!status.ok()) {
    // Messages and fields quote client strings: escaped, so a client cannot
    // forge log lines.
    spdlog::debug("{} from {} failed: {} {} (field {})", method_, context_->peer(),
                  absl::StatusCodeToString(status.code()),
                  ClientText(status.message(), kMaxErrorMessageBytes),
                  ClientText(FieldOf(status).value_or("-")));
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
