// The MoE layer as kplan receives it (MoeLayerSpec, a field-for-field mirror
// of kplan.v1.MoELayerConfig) and the vLLM models the oracles derive from it:
// MoEActivation (fused_moe/activation.py), RoutingMethodType and
// get_routing_method_type (fused_moe/config.py), the QuantKey identities of
// quantization/utils/quant_utils.py, FusedMoEParallelConfig with make()
// flattening, and FusedMoEConfig with its __post_init__ validation. Pure C++:
// no proto, gRPC or CUDA headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/platform/platform.h"

namespace kplan {

// Mirror of kplan.v1.MoELayerConfig (same field names, same meaning of empty).
struct MoeLayerSpec {
  std::string name;               // free-form label echoed in the plan
  int32_t num_experts = 0;        // global
  int32_t experts_per_token = 0;  // top-k
  int32_t hidden_dim = 0;
  int32_t intermediate_size = 0;  // full, unsharded
  std::string activation;         // MoEActivation value; "" = "silu"
  std::string routing_method;     // RoutingMethodType name; "" = derived
  std::string scoring_func;       // softmax | sigmoid | sqrtsoftplus ("" = softmax)
  bool renormalize = false;
  int32_t num_expert_group = 0;
  int32_t topk_group = 0;
  bool has_e_score_correction_bias = false;
  std::optional<float> routed_scaling_factor;
  std::string in_dtype;             // bfloat16 | float16 | float32; "" = bfloat16
  std::string router_logits_dtype;  // "" = in_dtype
  std::string weight_quant;         // QuantKey name; "" = unquantized
  std::string activation_quant;     // QuantKey name; "" = 16-bit activations
  bool is_lora_enabled = false;
  std::optional<float> swiglu_limit;
  bool has_bias = false;
  int32_t max_num_tokens = 0;       // 0 = vLLM's default
  bool allow_vllm_cutlass = false;  // fp8: compressed-tensors W8A8 / online fp8
  int32_t weight_bits = 0;          // wna16: 4 or 8 (0 = from weight_quant)
  std::string quant_scheme;         // override: mxfp4_deepseek_v4, w4a8, w4a8_int8, ...
};

// ---------------------------------------------------------------------------
// MoEActivation (vllm/model_executor/layers/fused_moe/activation.py).
enum class MoEActivation : uint8_t {
  kSilu,
  kGelu,
  kGeluTanh,
  kRelu2,
  kSwigluoai,
  kSwigluoaiUninterleave,
  kSwiglustep,
  kSiluNoMul,
  kGeluNoMul,
  kGeluTanhNoMul,
  kRelu2NoMul,
};
inline constexpr int kNumMoEActivations = 11;

// The enum value: "silu", "swigluoai_uninterleave", ...
absl::string_view MoEActivationValue(MoEActivation a);
// str(member) as Python formats it: "MoEActivation.SWIGLUOAI".
std::string MoEActivationRepr(MoEActivation a);
// is_gated: the value does not end with "_no_mul" (plain relu2 counts as gated).
bool IsGated(MoEActivation a);
// without_mul(): silu -> silu_no_mul, ...; other values unchanged.
MoEActivation WithoutMul(MoEActivation a);
// MoEActivation.from_str: accepts the alias gelu_pytorch_tanh; unknown ->
// InvalidArgument "Unknown MoE activation: '<s>'. Valid activations: [...]".
absl::StatusOr<MoEActivation> MoEActivationFromStr(absl::string_view s);

// ---------------------------------------------------------------------------
// RoutingMethodType (IntEnum mirroring FlashInfer runner.h).
enum class RoutingMethodType : int {
  kDefault = 0,
  kRenormalize = 1,
  kDeepSeekV3 = 2,
  kLlama4 = 3,
  kRenormalizeNaive = 4,
  kTopK = 5,
  kSigmoidRenorm = 6,
  kMiniMax2 = 7,
  kSigmoid = 8,
  kUnspecified = 9,
  kDeepseekV4 = 100,
  kCustom = 101,
  kSimulated = 102,
};
// Member name: "Renormalize", "DeepSeekV3", ... (the routing_methods.h table).
absl::string_view RoutingMethodName(RoutingMethodType r);
std::optional<RoutingMethodType> RoutingMethodFromName(absl::string_view name);
// get_routing_method_type(scoring_func, top_k, renormalize, num_expert_group,
// has_e_score_bias, routed_scaling_factor).
RoutingMethodType GetRoutingMethodType(absl::string_view scoring_func, int top_k, bool renormalize,
                                       int num_expert_group, bool has_e_score_bias,
                                       std::optional<float> routed_scaling_factor = 1.0f);

// ---------------------------------------------------------------------------
// QuantKey identities the oracles compare (quant_utils.py). kNone is Python's
// None: unquantized weights or 16-bit activations.
enum class QuantKey : uint8_t {
  kNone,
  kFp8StaticTensorSym,
  kFp8DynamicTensorSym,
  kFp8StaticTokenSym,
  kFp8StaticChannelSym,
  kFp8DynamicTokenSym,
  kFp8Static128BlockSym,
  kFp8Dynamic128Sym,
  kMxfp8Static,
  kMxfp8Dynamic,
  kNvfp4Static,
  kNvfp4Dynamic,
  kMxfp4Static,
  kMxfp4Dynamic,
  kInt8StaticChannelSym,
  kInt8DynamicTokenSym,
  kInt4Static,
  kInt4Static32,
  kInt4StaticAsym,
  kInt4Static32Asym,
  kInt8Static,
  kInt4W4A8StaticGroup128Sym,
  kInt4W4A8StaticGroup64Sym,
  kInt4W4A8StaticGroup32Sym,
  kInt4W4A8StaticChannelSym,
};
// The vLLM constant name ("kFp8Static128BlockSym"); "None" for kNone.
absl::string_view QuantKeyName(QuantKey k);
// Parses a constant name; "" -> kNone; unknown -> nullopt.
std::optional<QuantKey> QuantKeyFromName(absl::string_view name);
// All named keys (without kNone), in declaration order.
const std::vector<QuantKey>& AllQuantKeys();
// str(QuantKey) as vLLM formats it in is_supported_config reasons, e.g.
// "QuantKey(f8e4m3fn,scale(f32,static,per_tensor),symmetric)"; "None" for kNone.
std::string QuantKeyStr(QuantKey k);

// ---------------------------------------------------------------------------
// FusedMoEParallelConfig (fused_moe/config.py).
struct FusedMoEParallelConfig {
  int tp_size = 1;
  int pcp_size = 1;
  int dp_size = 1;
  int ep_size = 1;
  int tp_rank = 0;
  int pcp_rank = 0;
  int dp_rank = 0;
  int ep_rank = 0;
  int sp_size = 1;
  bool use_ep = false;
  std::string all2all_backend = "allgather_reducescatter";
  bool enable_eplb = false;

  bool is_sequence_parallel() const { return sp_size > 1; }
  bool use_all2all_kernels() const {
    return use_ep && (dp_size > 1 || pcp_size > 1 || is_sequence_parallel());
  }
  bool use_deepep_ht_kernels() const;
  bool use_deepep_ll_kernels() const;
  bool use_deepep_v2_kernels() const;
  bool use_fi_nvl_two_sided_kernels() const;
  bool use_fi_nvl_one_sided_kernels() const;
  bool use_ag_rs_all2all_kernels() const;
  bool use_mori_kernels() const;
  bool use_nixl_ep_kernels() const;
  // kplan/seed: passthrough (the MoE backend dispatches and combines itself).
  bool use_passthrough_kernels() const;
  bool use_batched_activation_format() const {
    return use_deepep_ll_kernels() || use_nixl_ep_kernels();
  }
  bool needs_round_robin_routing_tables() const { return use_batched_activation_format(); }

  // FusedMoEParallelConfig.make(tp_size_, pcp_size_, dp_size_, sp_size_,
  // vllm_parallel_config): TP flattened across DP and PCP; EP takes it all.
  static FusedMoEParallelConfig Make(int tp_size, int pcp_size, int dp_size, int sp_size,
                                     const ParallelConfig& parallel);
  // Make() from the sizes and ranks of `parallel` itself.
  static FusedMoEParallelConfig Make(const ParallelConfig& parallel);
  static FusedMoEParallelConfig MakeNoParallel();

  // The dataclass repr vLLM prints in "parallel config {...}" reasons.
  std::string Repr() const;
  bool operator==(const FusedMoEParallelConfig&) const = default;
};

// ---------------------------------------------------------------------------
// FusedMoEConfig (fused_moe/config.py), built from a layer spec.
struct FusedMoEConfig {
  int num_experts = 0;  // global
  int experts_per_token = 0;
  int hidden_dim = 0;
  int intermediate_size = 0;  // full, unsharded
  int num_local_experts = 0;
  int num_logical_experts = 0;
  MoEActivation activation = MoEActivation::kSilu;
  std::string device;  // current_platform.device_name: cuda, rocm, cpu, xpu, ...
  RoutingMethodType routing_method = RoutingMethodType::kDefault;
  FusedMoEParallelConfig moe_parallel_config;
  std::string in_dtype = "bfloat16";
  std::string router_logits_dtype;  // set in Make(): defaults to in_dtype
  int hidden_dim_unpadded = 0;
  int intermediate_size_per_partition = 0;
  std::string moe_backend = "auto";
  int max_num_tokens = 0;
  bool has_bias = false;
  bool is_lora_enabled = false;
  std::optional<float> swiglu_limit;
  bool rocm_aiter_fmoe_enabled = false;
  bool aiter_fmoe_shared_expert_enabled = false;

  bool is_act_and_mul() const { return IsGated(activation); }

  // Fills the fields and runs __post_init__'s checks in vLLM's order.
  // Layer-field errors are InvalidField(<MoELayerConfig field>); the
  // platform-level NotImplementedErrors are FailedPrecondition.
  static absl::StatusOr<FusedMoEConfig> Make(const MoeLayerSpec& layer, MoEActivation activation,
                                             RoutingMethodType routing,
                                             const FusedMoEParallelConfig& parallel,
                                             absl::string_view moe_backend,
                                             const Platform& platform, const EnvVars& env);
};

// vLLM's default for FusedMoEConfig.max_num_tokens when the layer passes none.
inline constexpr int kDefaultMoeMaxNumTokens = 2048;

// is_rocm_aiter_moe_enabled(): ROCm on gfx9 with the aiter library
// (@if_aiter_supported), VLLM_ROCM_USE_AITER=1 (default off) and
// VLLM_ROCM_USE_AITER_MOE=1 (default on).
bool RocmAiterMoeEnabled(const Platform& platform, const EnvVars& env);

}  // namespace kplan
