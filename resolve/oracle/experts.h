// The experts capability matrix (vLLM fused_moe experts classes and the
// facts FusedMoEExperts.is_supported_config() reads), as data: one row per
// experts class. IsSupportedConfig() evaluates a row in vLLM's exact order
// and words the first failing check as vLLM does.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "base/env.h"
#include "resolve/oracle/moe_config.h"
#include "resolve/platform/platform.h"

namespace kplan {

// FusedMoEActivationFormat.
enum class ActivationFormat : uint8_t { kStandard, kBatchedExperts };
// "standard" / "batched_experts".
absl::string_view ActivationFormatName(ActivationFormat f);

// Everything the capability predicates read.
struct SelectionContext {
  const Platform& platform;
  const EnvVars& env;
  const FusedMoEConfig& moe;
  // fp8 select_backend(allow_vllm_cutlass=...): compressed-tensors W8A8 / online fp8.
  bool allow_vllm_cutlass = false;
  // Execution on this server (MoEKernelOracle::SelectExecutable): only the
  // experts classes kplan runs itself (kplan_executable) are tried.
  bool executable_only = false;
  const FusedMoEParallelConfig& pc() const { return moe.moe_parallel_config; }
};

using ActivationSet = uint32_t;
constexpr ActivationSet Act(MoEActivation a) { return 1u << static_cast<int>(a); }

// One row of the capability matrix. The defaults are the base class
// FusedMoEExperts' answers, so a row states only where its class differs.
struct ExpertsClass {
  absl::string_view name;  // the class's __name__
  // Where two vLLM modules define classes of the same name (CPUExpertsInt4 in
  // experts/cpu_moe.py and experts/cpu_int4_moe.py): "<module>.<name>", the
  // id backends and FindExpertsClass use; empty: the name is the id.
  absl::string_view id = {};
  // _supports_current_device()
  bool (*device)(const SelectionContext&) = nullptr;
  // _supports_no_act_and_mul()
  bool no_act_and_mul = false;
  // _supports_activation()
  ActivationSet activations = 0;
  // _supports_quant_scheme(weight_key, activation_key)
  bool (*quant)(const SelectionContext&, QuantKey w, QuantKey a) = nullptr;
  // _supports_parallel_config(); nullptr = any
  bool (*parallel)(const FusedMoEParallelConfig&) = nullptr;
  // _supports_routing_method(); nullptr = any (monolithic classes override)
  bool (*routing)(RoutingMethodType r, QuantKey w, QuantKey a) = nullptr;
  // _supports_router_logits_dtype(); nullptr = any
  bool (*logits)(absl::string_view dtype, RoutingMethodType r) = nullptr;
  // _supports_shape(hidden_dim); nullptr = any
  bool (*shape)(int hidden_dim) = nullptr;
  // activation_format()
  ActivationFormat format = ActivationFormat::kStandard;
  bool monolithic = false;
  bool lora = false;             // supports_lora()
  bool batch_invariant = false;  // _supports_batch_invariance()
  // Class-specific first check (CutlassExpertsW4A8Fp8: bf16 in/out only);
  // returns a non-empty reason on failure. nullptr = none.
  std::string (*precheck)(const SelectionContext&) = nullptr;
  // A suffix the class appends to every reason (AiterExperts when AITER MoE is off).
  std::string (*reason_suffix)(const SelectionContext&) = nullptr;
  // kplan's own classes (ARCHITECTURE.md "Vocabulary"): this server runs them.
  bool kplan_executable = false;
};

// The row of an experts class; nullptr when unknown.
const ExpertsClass* FindExpertsClass(absl::string_view id);
// Every row, in table order.
const ExpertsClass* ExpertsClasses(int* count);

struct SupportVerdict {
  bool ok = true;
  std::string reason;  // "kernel does not support ..." when !ok
};
// FusedMoEExperts.is_supported_config(cls, moe_config, weight_key,
// activation_key, activation_format).
SupportVerdict IsSupportedConfig(const ExpertsClass& cls, const SelectionContext& ctx, QuantKey w,
                                 QuantKey a, ActivationFormat format);

// Capability helpers used by several rows.
bool SupportsFp8(const Platform& p);                  // current_platform.supports_fp8()
bool IsDeepGemmSupported(const SelectionContext& c);  // is_deep_gemm_supported()
bool RocmSupportsMx(const Platform& p);               // supports_mx(): gfx950

}  // namespace kplan
