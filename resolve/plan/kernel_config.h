// vLLM's KernelConfig and IrOpPriorityConfig (seed vllm/config/kernel.py) and
// the parts of ParallelConfig that kernel selection reads, in C++: parsing and
// normalisation with vLLM's validators, set_platform_defaults() (IR op
// defaults per platform, the FlashInfer MoE-EP model check, the passthrough
// all2all binding) and compute_hash(), byte-compatible with vLLM.
#pragma once

#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/env.h"
#include "resolve/platform/platform.h"

namespace kplan {

// One priority list per IR op, keyed by op name; every op of IrOpNames() is present.
struct IrOpPriorityConfig {
  std::map<std::string, std::vector<std::string>> priority;

  IrOpPriorityConfig();
  std::vector<std::string>& of(absl::string_view op) { return priority[std::string(op)]; }
  const std::vector<std::string>& of(absl::string_view op) const {
    return priority.at(std::string(op));
  }
  // IrOpPriorityConfig.with_default(default, **overrides).
  static IrOpPriorityConfig WithDefault(const std::vector<std::string>& fallback);
};

struct KernelConfig {
  IrOpPriorityConfig ir_op_priority;
  std::optional<bool> enable_flashinfer_autotune;  // vLLM default None
  bool enable_rocm_segmented_attn_autotune = false;
  bool enable_cutedsl_warmup = true;
  bool enable_jit_warmup = true;
  bool monokernel = false;
  std::string moe_backend = "auto";
  std::string sparse_indexer_topk_backend = "auto";
  std::string linear_backend = "auto";
  std::optional<std::map<std::string, std::string>> linear_backend_per_quant;
};

struct ParallelConfig {
  int tp_size = 1;
  int dp_size = 1;
  int pcp_size = 1;
  int sp_size = 1;
  int tp_rank = 0;
  int dp_rank = 0;
  int pcp_rank = 0;
  bool enable_expert_parallel = false;
  std::string all2all_backend = "allgather_reducescatter";
  bool enable_eplb = false;
};

struct ModelInfo {
  std::vector<std::string> architectures;
};

// IrOpPriorityConfig._to_list_str for a plain string: spaces dropped, split at ",".
std::vector<std::string> SplitPriorityString(absl::string_view value);

// The field validators of KernelConfig: lower()+"-"->"_" on the three backend
// strings, Literal checks (pydantic's literal_error text), non-empty
// linear_backend_per_quant with LinearBackend values, known IR providers.
// Errors are INVALID_ARGUMENT naming the field relative to the KernelConfig.
absl::StatusOr<KernelConfig> NormalizeKernelConfig(KernelConfig config);

// ParallelConfig validation: sizes >= 1, ranks in range, all2all_backend in
// the Literal; the removed "naive"/"pplx" values are rewritten to
// allgather_reducescatter with vLLM's log text appended to `warnings`.
absl::StatusOr<ParallelConfig> NormalizeParallelConfig(ParallelConfig config,
                                                       std::vector<std::string>* warnings);

// validate_flashinfer_moe_ep_model().
absl::Status ValidateFlashinferMoeEpModel(absl::string_view moe_backend,
                                          const std::vector<std::string>& architectures);

// bind_passthrough_all2all_backend(): may rewrite parallel.all2all_backend.
absl::Status BindPassthroughAll2AllBackend(absl::string_view moe_backend, ParallelConfig& parallel,
                                           std::vector<std::string>* warnings);

// current_platform.get_default_ir_op_priority(vllm_config).
IrOpPriorityConfig DefaultIrOpPriority(const Platform& platform, const EnvVars& env);

// KernelConfig.set_platform_defaults(): model check, passthrough binding, and
// the idempotent append of the platform's IR priorities to the user's lists.
// Field paths in its errors are relative to the request (kernel_config.*,
// parallel.*), since the checks span both configs.
absl::Status SetPlatformDefaults(KernelConfig& config, const ModelInfo* model,
                                 ParallelConfig& parallel, const Platform& platform,
                                 const EnvVars& env, std::vector<std::string>* warnings);

// IrOpPriorityConfig.compute_hash() and KernelConfig.compute_hash().
std::string ComputeHash(const IrOpPriorityConfig& config);
std::string ComputeHash(const KernelConfig& config);

// Python-style rendering of an IrOpPriorityConfig, as vLLM logs it.
std::string DescribeIrOpPriority(const IrOpPriorityConfig& config);

}  // namespace kplan
