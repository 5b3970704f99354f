#include "server/rpc/service.h"

#include "spdlog/spdlog.h"
#include "server/rpc/convert.h"
#include "server/rpc/resolve.h"
#include "server/rpc/status_mapping.h"

namespace kplan::rpc {
namespace {

// Finishes a unary call with `status`, logging failures once.
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, absl::string_view method,
                                 const absl::Status& status) {
  if (!status.ok()) {
    spdlog::debug("{} from {} failed: {}", std::string(method), context->peer(),
                  status.ToString());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* KernelPlanServiceImpl::ResolveKernelConfig(
    grpc::CallbackServerContext* context, const v1::ResolveKernelConfigRequest* request,
    v1::ResolveKernelConfigResponse* response) {
  absl::StatusOr<v1::ResolveKernelConfigResponse> resolved =
      rpc::ResolveKernelConfig(*request, env_.platform);
  if (resolved.ok()) *response = std::move(*resolved);
  return Finish(context, "ResolveKernelConfig", resolved.status());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest* /*request*/,
    v1::GetServerInfoResponse* response) {
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
  return Finish(context, "GetServerInfo", absl::OkStatus());
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
