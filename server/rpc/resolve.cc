#include "server/rpc/resolve.h"

#include "server/base/env.h"
#include "server/base/status.h"
#include "server/plan/kernel_config.h"
#include "server/rpc/convert.h"

namespace kplan::rpc {

absl::StatusOr<v1::ResolveKernelConfigResponse> ResolveKernelConfig(
    const v1::ResolveKernelConfigRequest& request, const Platform& local_platform) {
  std::vector<std::string> warnings;
  absl::StatusOr<KernelConfig> kernel_config =
      NormalizeKernelConfig(KernelConfigFromProto(request.kernel_config()));
  if (!kernel_config.ok()) return NestField(kernel_config.status(), "kernel_config");
  absl::StatusOr<ParallelConfig> parallel =
      NormalizeParallelConfig(ParallelConfigFromProto(request.parallel()), &warnings);
  if (!parallel.ok()) return NestField(parallel.status(), "parallel");
  Platform platform = local_platform;
  if (request.has_platform()) {
    KPLAN_ASSIGN_OR_RETURN(platform, PlatformFromProto(request.platform(), &warnings));
  }
  EnvVars env(std::map<std::string, std::string>(request.env().begin(), request.env().end()));

  ModelInfo model;
  const ModelInfo* model_ptr = nullptr;
  if (request.has_model()) {
    model.architectures.assign(request.model().architectures().begin(),
                               request.model().architectures().end());
    model_ptr = &model;
  }
  KPLAN_RETURN_IF_ERROR(
      SetPlatformDefaults(*kernel_config, model_ptr, *parallel, platform, env, &warnings));

  v1::ResolveKernelConfigResponse response;
  KernelConfigToProto(*kernel_config, response.mutable_kernel_config());
  ParallelConfigToProto(*parallel, response.mutable_parallel());
  PlatformToProto(platform, response.mutable_platform());
  response.set_config_hash(ComputeHash(*kernel_config));
  for (std::string& w : warnings) response.add_warnings(std::move(w));
  return response;
}

}  // namespace kplan::rpc
