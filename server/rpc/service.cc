#include "server/rpc/service.h"

#include <openssl/crypto.h>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "server/rpc/convert.h"
#include "server/rpc/resolve.h"
#include "server/rpc/status_mapping.h"

namespace kplan::rpc {
namespace {

// Per-call bookkeeping every handler shares: the bearer-token check, the
// in-flight gauge, and the code and latency metrics when the call finishes.
class Call {
 public:
  Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method)
      : env_(env), context_(context), method_(method), start_(absl::Now()) {
    if (env_.metrics) env_.metrics->RequestStarted();
  }

  // UNAUTHENTICATED unless the call carries the configured bearer token.
  absl::Status Authorize() const {
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

  grpc::ServerUnaryReactor* Finish(const absl::Status& status) {
    grpc::Status out = ToGrpcStatus(status);
    if (!status.ok()) {
      spdlog::debug("{} from {} failed: {}", method_, context_->peer(), status.ToString());
    }
    if (env_.metrics) {
      env_.metrics->RequestFinished(method_, GrpcCodeName(out.error_code()), absl::Now() - start_);
    }
    grpc::ServerUnaryReactor* reactor = context_->DefaultReactor();
    reactor->Finish(out);
    return reactor;
  }

 private:
  const ServerEnvironment& env_;
  grpc::CallbackServerContext* context_;
  const std::string method_;
  const absl::Time start_;
};

}  // namespace

grpc::ServerUnaryReactor* KernelPlanServiceImpl::ResolveKernelConfig(
    grpc::CallbackServerContext* context, const v1::ResolveKernelConfigRequest* request,
    v1::ResolveKernelConfigResponse* response) {
  Call call(env_, context, "ResolveKernelConfig");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.Finish(auth);
  absl::StatusOr<v1::ResolveKernelConfigResponse> resolved =
      rpc::ResolveKernelConfig(*request, env_.platform);
  if (resolved.ok()) *response = std::move(*resolved);
  return call.Finish(resolved.status());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest* /*request*/,
    v1::GetServerInfoResponse* response) {
  Call call(env_, context, "GetServerInfo");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.Finish(auth);
  response->set_version(KPLAN_VERSION);
  *response->mutable_build() = MakeBuildInfo();
  for (const LocalDevice& d : env_.devices) {
    v1::Device* out = response->add_devices();
    out->set_index(d.index);
    out->set_name(d.name);
    out->mutable_capability()->set_major(d.capability.major);
    out->mutable_capability()->set_minor(d.capability.minor);
    out->set_total_memory_bytes(d.total_memory_bytes);
    out->set_multiprocessor_count(d.multiprocessor_count);
  }
  PlatformToProto(env_.platform, response->mutable_platform());
  response->mutable_limits()->set_max_message_bytes(env_.max_message_bytes);
  response->set_cuda_driver_version(env_.runtime.cuda_driver_version);
  return call.Finish(absl::OkStatus());
}

v1::BuildInfo MakeBuildInfo() {
  v1::BuildInfo b;
  b.set_version(KPLAN_VERSION);
  b.set_git_revision(KPLAN_GIT_REVISION);
  b.set_cuda_version(KPLAN_BUILD_CUDA_VERSION);
  b.set_nccl_version(KPLAN_BUILD_NCCL_VERSION);
  b.set_cuda_architectures(KPLAN_BUILD_CUDA_ARCHITECTURES);
  b.set_compiler(__VERSION__);
  return b;
}

}  // namespace kplan::rpc
