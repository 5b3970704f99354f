#include "server/rpc/call.h"

#include <openssl/crypto.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "base/client_text.h"
#include "base/status.h"
#include "absl/strings/str_cat.h"
#include "server/rpc/logging.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

thread_local std::shared_ptr<ResponseSink>* pending_sink = nullptr;

}  // namespace

ScopedResponseSink::ScopedResponseSink(std::shared_ptr<ResponseSink> sink) {
  delete pending_sink;
  pending_sink = new std::shared_ptr<ResponseSink>(std::move(sink));
}

ScopedResponseSink::~ScopedResponseSink() {
  delete pending_sink;
  pending_sink = nullptr;
}

namespace {

std::shared_ptr<ResponseSink> TakePendingSink() {
  if (pending_sink == nullptr) return nullptr;
  std::shared_ptr<ResponseSink> sink = std::move(*pending_sink);
  delete pending_sink;
  pending_sink = nullptr;
  return sink;
}

}  // namespace

Call::Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method,
           bool unary)
    : env_(env),
      context_(context),
      reactor_(nullptr),
      method_(method),
      sink_(TakePendingSink()),
      start_(sink_ != nullptr ? sink_->arrival : absl::Now()) {
  if (unary) {
    reactor_ =
        sink_ != nullptr && sink_->reactor != nullptr ? sink_->reactor : context->DefaultReactor();
  }
  if (env_.metrics) env_.metrics->RequestStarted();
  if (sink_ != nullptr) sink_->counted = true;
  // Streams (LoadExperts) may take long to send a large set; the idle
  // timeout bounds them instead of --max_request_time.
  deadline_ = unary && env_.max_request_time > absl::ZeroDuration() ? start_ + env_.max_request_time
                                                                    : absl::InfiniteFuture();
  const auto client = context_->deadline();
  if (client != std::chrono::system_clock::time_point::max()) {
    deadline_ = std::min(deadline_, absl::FromChrono(client));
  }
}

bool Call::Claim() {
  // A raw-registered call's flag lives in its sink, which outlives this Call
  // when the handler throws (raw_service.cc answers then, unless claimed).
  std::atomic<bool>& claimed = sink_ != nullptr ? sink_->finished : claimed_;
  return !claimed.exchange(true);
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

grpc::Status Call::Done(const absl::Status& outcome) {
  absl::Status status = outcome;
  if (status.ok() && sink_ != nullptr) {
    const absl::Time before = absl::Now();
    status = sink_->Serialize();
    if (env_.metrics)
      env_.metrics->ObserveHop(method_, Metrics::Hop::kSerialize, absl::Now() - before);
  }
  grpc::Status out = ToGrpcStatus(status);
  if (!status.ok()) {
    // Messages and fields quote client strings: escaped, so a client cannot
    // forge log lines.
    LogFailedCall(env_.failed_call_logs, absl::StrCat(method_, " failed"),
                  {{"method", method_},
                   {"code", GrpcCodeName(out.error_code())},
                   {"error", ClientText(status.message(), kMaxErrorMessageBytes)},
                   {"field", ClientText(FieldOf(status).value_or("-"))},
                   {"peer", context_->peer()}});
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
