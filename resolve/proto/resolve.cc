#include "resolve/proto/resolve.h"

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/status.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/proto/convert.h"
#include "resolve/proto/moe_plan_convert.h"

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
  KPLAN_RETURN_IF_ERROR(ValidateVllmEnv(env));

  ModelInfo model;
  const ModelInfo* model_ptr = nullptr;
  if (request.has_model()) {
    model.architectures.assign(request.model().architectures().begin(),
                               request.model().architectures().end());
    model_ptr = &model;
  }
  KPLAN_RETURN_IF_ERROR(
      SetPlatformDefaults(*kernel_config, model_ptr, *parallel, platform, env, &warnings));

  // One plan per MoE layer: model.moe, then model.moe_layers in order. A
  // layer with no experts is absent.
  v1::ResolveKernelConfigResponse response;
  auto plan_layer = [&](const v1::MoELayerConfig& layer, const std::string& path,
                        v1::MoEPlan* out) -> absl::Status {
    absl::StatusOr<MoePlan> plan = PlanMoeLayer(
        MoeLayerFromProto(layer), kernel_config->moe_backend, *parallel, platform, env);
    if (!plan.ok()) {
      // Backend complaints name the KernelConfig field; the rest name the layer's.
      return FieldOf(plan.status()) == "moe_backend" ? NestField(plan.status(), "kernel_config")
                                                     : NestField(plan.status(), path);
    }
    MoePlanToProto(*plan, out);
    return absl::OkStatus();
  };
  if (request.model().has_moe() && request.model().moe().num_experts() != 0) {
    KPLAN_RETURN_IF_ERROR(
        plan_layer(request.model().moe(), "model.moe", response.mutable_moe_plan()));
  }
  for (int i = 0; i < request.model().moe_layers_size(); ++i) {
    KPLAN_RETURN_IF_ERROR(plan_layer(request.model().moe_layers(i),
                                     absl::StrCat("model.moe_layers[", i, "]"),
                                     response.add_moe_layer_plans()));
  }
  KernelConfigToProto(*kernel_config, response.mutable_kernel_config());
  ParallelConfigToProto(*parallel, response.mutable_parallel());
  PlatformToProto(platform, response.mutable_platform());
  response.set_config_hash(ComputeHash(*kernel_config));
  for (std::string& w : warnings) response.add_warnings(std::move(w));
  return response;
}

}  // namespace kplan::rpc
