#include "resolve/oracle/moe_config.h"

#include <array>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/pyrepr.h"
#include "base/status.h"
#include "resolve/oracle/routing_methods.h"

namespace kplan {
namespace {

// MoEActivation members in declaration order: (value, member name).
constexpr std::array<std::pair<absl::string_view, absl::string_view>, kNumMoEActivations>
    kActivations = {{
        {"silu", "SILU"},
        {"gelu", "GELU"},
        {"gelu_tanh", "GELU_TANH"},
        {"relu2", "RELU2"},
        {"swigluoai", "SWIGLUOAI"},
        {"swigluoai_uninterleave", "SWIGLUOAI_UNINTERLEAVE"},
        {"swiglustep", "SWIGLUSTEP"},
        {"silu_no_mul", "SILU_NO_MUL"},
        {"gelu_no_mul", "GELU_NO_MUL"},
        {"gelu_tanh_no_mul", "GELU_TANH_NO_MUL"},
        {"relu2_no_mul", "RELU2_NO_MUL"},
    }};

// One row per QuantKey constant of quant_utils.py: its name and its str()
// (torch.fx dtype abbreviations; ScaleDesc "dtype,static|dynamic,shape").
struct QuantKeyRow {
  QuantKey key;
  absl::string_view name;
  absl::string_view str;
};
constexpr std::array<QuantKeyRow, 25> kQuantKeys = {{
    {QuantKey::kNone, "None", "None"},
    {QuantKey::kFp8StaticTensorSym, "kFp8StaticTensorSym",
     "QuantKey(f8e4m3fn,scale(f32,static,per_tensor),symmetric)"},
    {QuantKey::kFp8DynamicTensorSym, "kFp8DynamicTensorSym",
     "QuantKey(f8e4m3fn,scale(f32,dynamic,per_tensor),symmetric)"},
    {QuantKey::kFp8StaticTokenSym, "kFp8StaticTokenSym",
     "QuantKey(f8e4m3fn,scale(f32,static,per_token),symmetric)"},
    {QuantKey::kFp8StaticChannelSym, "kFp8StaticChannelSym",
     "QuantKey(f8e4m3fn,scale(f32,static,per_channel),symmetric)"},
    {QuantKey::kFp8DynamicTokenSym, "kFp8DynamicTokenSym",
     "QuantKey(f8e4m3fn,scale(f32,dynamic,per_token),symmetric)"},
    {QuantKey::kFp8Static128BlockSym, "kFp8Static128BlockSym",
     "QuantKey(f8e4m3fn,scale(f32,static,GroupShape(row=128, col=128)),symmetric)"},
    {QuantKey::kFp8Dynamic128Sym, "kFp8Dynamic128Sym",
     "QuantKey(f8e4m3fn,scale(f32,dynamic,GroupShape(row=1, col=128)),symmetric)"},
    {QuantKey::kMxfp8Static, "kMxfp8Static",
     "QuantKey(f8e4m3fn,scale(u8,static,GroupShape(row=1, col=32)),symmetric)"},
    {QuantKey::kMxfp8Dynamic, "kMxfp8Dynamic",
     "QuantKey(f8e4m3fn,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)"},
    {QuantKey::kNvfp4Static, "kNvfp4Static",
     "QuantKey(u8,scale(f8e4m3fn,static,GroupShape(row=1, col=16)),scale2(f32,static,per_tensor),"
     "symmetric)"},
    {QuantKey::kNvfp4Dynamic, "kNvfp4Dynamic",
     "QuantKey(u8,scale(f8e4m3fn,dynamic,GroupShape(row=1, col=16)),scale2(f32,static,per_tensor),"
     "symmetric)"},
    {QuantKey::kMxfp4Static, "kMxfp4Static",
     "QuantKey(u8,scale(u8,static,GroupShape(row=1, col=32)),symmetric)"},
    {QuantKey::kMxfp4Dynamic, "kMxfp4Dynamic",
     "QuantKey(u8,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)"},
    {QuantKey::kInt8StaticChannelSym, "kInt8StaticChannelSym",
     "QuantKey(i8,scale(f32,static,per_channel),symmetric)"},
    {QuantKey::kInt8DynamicTokenSym, "kInt8DynamicTokenSym",
     "QuantKey(i8,scale(f32,dynamic,per_token),symmetric)"},
    {QuantKey::kInt4Static, "kInt4Static", "QuantKey(i4,scale(f16,static,per_token),symmetric)"},
    {QuantKey::kInt4Static32, "kInt4Static32",
     "QuantKey(i4,scale(f16,static,GroupShape(row=1, col=32)),symmetric)"},
    {QuantKey::kInt4StaticAsym, "kInt4StaticAsym",
     "QuantKey(u4,scale(f16,static,per_token),asymmetric)"},
    {QuantKey::kInt4Static32Asym, "kInt4Static32Asym",
     "QuantKey(u4,scale(f16,static,GroupShape(row=1, col=32)),asymmetric)"},
    {QuantKey::kInt8Static, "kInt8Static", "QuantKey(i8,scale(f16,static,per_token),symmetric)"},
    {QuantKey::kInt4W4A8StaticGroup128Sym, "kInt4W4A8StaticGroup128Sym",
     "QuantKey(i4,scale(f8e4m3fn,static,GroupShape(row=1, col=128)),symmetric)"},
    {QuantKey::kInt4W4A8StaticGroup64Sym, "kInt4W4A8StaticGroup64Sym",
     "QuantKey(i4,scale(f8e4m3fn,static,GroupShape(row=1, col=64)),symmetric)"},
    {QuantKey::kInt4W4A8StaticGroup32Sym, "kInt4W4A8StaticGroup32Sym",
     "QuantKey(i4,scale(f8e4m3fn,static,GroupShape(row=1, col=32)),symmetric)"},
    {QuantKey::kInt4W4A8StaticChannelSym, "kInt4W4A8StaticChannelSym",
     "QuantKey(i4,scale(f32,static,per_channel),symmetric)"},
}};

std::string PyBool(bool b) { return b ? "True" : "False"; }

}  // namespace

absl::string_view MoEActivationValue(MoEActivation a) {
  return kActivations[static_cast<int>(a)].first;
}

std::string MoEActivationRepr(MoEActivation a) {
  return absl::StrCat("MoEActivation.", kActivations[static_cast<int>(a)].second);
}

bool IsGated(MoEActivation a) { return !absl::EndsWith(MoEActivationValue(a), "_no_mul"); }

MoEActivation WithoutMul(MoEActivation a) {
  switch (a) {
    case MoEActivation::kSilu:
      return MoEActivation::kSiluNoMul;
    case MoEActivation::kGelu:
      return MoEActivation::kGeluNoMul;
    case MoEActivation::kGeluTanh:
      return MoEActivation::kGeluTanhNoMul;
    case MoEActivation::kRelu2:
      return MoEActivation::kRelu2NoMul;
    default:
      return a;
  }
}

absl::StatusOr<MoEActivation> MoEActivationFromStr(absl::string_view s) {
  // from_str's alias table: HF configs spell gelu_tanh as gelu_pytorch_tanh.
  absl::string_view v = s == "gelu_pytorch_tanh" ? absl::string_view("gelu_tanh") : s;
  for (int i = 0; i < kNumMoEActivations; ++i) {
    if (kActivations[i].first == v) return static_cast<MoEActivation>(i);
  }
  std::vector<std::string> valid;
  for (const auto& [value, name] : kActivations) valid.emplace_back(value);
  return absl::InvalidArgumentError(
      absl::StrCat("Unknown MoE activation: ", PyRepr(s), ". Valid activations: ", PyRepr(valid)));
}

absl::string_view RoutingMethodName(RoutingMethodType r) { return RoutingMethodOf(r).name; }

std::optional<RoutingMethodType> RoutingMethodFromName(absl::string_view name) {
  const RoutingMethodInfo* m = FindRoutingMethod(name);
  if (m == nullptr) return std::nullopt;
  return m->type;
}

RoutingMethodType GetRoutingMethodType(absl::string_view scoring_func, int top_k, bool renormalize,
                                       int num_expert_group, bool has_e_score_bias,
                                       std::optional<float> routed_scaling_factor) {
  if (scoring_func == "sqrtsoftplus") {
    return renormalize ? RoutingMethodType::kDeepseekV4 : RoutingMethodType::kUnspecified;
  }
  if (has_e_score_bias) {
    if (scoring_func == "sigmoid" && renormalize && num_expert_group > 0) {
      return RoutingMethodType::kDeepSeekV3;
    }
    if (scoring_func == "sigmoid" && renormalize &&
        (!routed_scaling_factor.has_value() || *routed_scaling_factor == 1.0f)) {
      return RoutingMethodType::kMiniMax2;
    }
    return RoutingMethodType::kUnspecified;
  }
  if (scoring_func == "sigmoid") {
    return renormalize ? RoutingMethodType::kSigmoidRenorm : RoutingMethodType::kSigmoid;
  }
  if (scoring_func == "softmax") {
    return renormalize ? RoutingMethodType::kRenormalizeNaive : RoutingMethodType::kDefault;
  }
  return RoutingMethodType::kUnspecified;
}

absl::string_view QuantKeyName(QuantKey k) { return kQuantKeys[static_cast<int>(k)].name; }

std::string QuantKeyStr(QuantKey k) { return std::string(kQuantKeys[static_cast<int>(k)].str); }

std::optional<QuantKey> QuantKeyFromName(absl::string_view name) {
  if (name.empty()) return QuantKey::kNone;
  for (const QuantKeyRow& row : kQuantKeys) {
    if (row.key != QuantKey::kNone && row.name == name) return row.key;
  }
  return std::nullopt;
}

const std::vector<QuantKey>& AllQuantKeys() {
  static const auto* keys = [] {
    auto* v = new std::vector<QuantKey>;
    for (const QuantKeyRow& row : kQuantKeys) {
      if (row.key != QuantKey::kNone) v->push_back(row.key);
    }
    return v;
  }();
  return *keys;
}

// --- FusedMoEParallelConfig -------------------------------------------------

bool FusedMoEParallelConfig::use_deepep_ht_kernels() const {
  return use_all2all_kernels() && all2all_backend == "deepep_high_throughput";
}
bool FusedMoEParallelConfig::use_deepep_ll_kernels() const {
  return use_all2all_kernels() && all2all_backend == "deepep_low_latency";
}
bool FusedMoEParallelConfig::use_deepep_v2_kernels() const {
  return use_all2all_kernels() && all2all_backend == "deepep_v2";
}
bool FusedMoEParallelConfig::use_fi_nvl_two_sided_kernels() const {
  // flashinfer_all2allv is the temporary alias of flashinfer_nvlink_two_sided.
  return use_all2all_kernels() && (all2all_backend == "flashinfer_all2allv" ||
                                   all2all_backend == "flashinfer_nvlink_two_sided");
}
bool FusedMoEParallelConfig::use_fi_nvl_one_sided_kernels() const {
  return use_all2all_kernels() && all2all_backend == "flashinfer_nvlink_one_sided";
}
bool FusedMoEParallelConfig::use_ag_rs_all2all_kernels() const {
  return use_all2all_kernels() && all2all_backend == "allgather_reducescatter";
}
bool FusedMoEParallelConfig::use_mori_kernels() const {
  return use_all2all_kernels() &&
         (all2all_backend == "mori_high_throughput" || all2all_backend == "mori_low_latency");
}
bool FusedMoEParallelConfig::use_nixl_ep_kernels() const {
  return use_all2all_kernels() && all2all_backend == "nixl_ep";
}
bool FusedMoEParallelConfig::use_passthrough_kernels() const {
  return all2all_backend == "passthrough";
}

FusedMoEParallelConfig FusedMoEParallelConfig::Make(int tp_size, int pcp_size, int dp_size,
                                                    int sp_size, const ParallelConfig& parallel) {
  FusedMoEParallelConfig c;
  const int flat_tp = dp_size * pcp_size * tp_size;
  const int flat_rank =
      parallel.dp_rank * pcp_size * tp_size + parallel.pcp_rank * tp_size + parallel.tp_rank;
  c.use_ep = flat_tp > 1 && parallel.enable_expert_parallel;
  c.dp_size = dp_size;
  c.dp_rank = parallel.dp_rank;
  c.pcp_size = pcp_size;
  c.pcp_rank = parallel.pcp_rank;
  c.sp_size = sp_size;
  c.all2all_backend = parallel.all2all_backend;
  c.enable_eplb = parallel.enable_eplb;
  if (!c.use_ep) {
    c.tp_size = flat_tp;
    c.tp_rank = flat_rank;
    c.ep_size = 1;
    c.ep_rank = 0;
  } else {
    c.tp_size = 1;
    c.tp_rank = 0;
    c.ep_size = flat_tp;
    c.ep_rank = flat_rank;
  }
  return c;
}

FusedMoEParallelConfig FusedMoEParallelConfig::Make(const ParallelConfig& parallel) {
  return Make(parallel.tp_size, parallel.pcp_size, parallel.dp_size, parallel.sp_size, parallel);
}

FusedMoEParallelConfig FusedMoEParallelConfig::MakeNoParallel() { return FusedMoEParallelConfig{}; }

std::string FusedMoEParallelConfig::Repr() const {
  return absl::StrCat(
      "FusedMoEParallelConfig(tp_size=", tp_size, ", pcp_size=", pcp_size, ", dp_size=", dp_size,
      ", ep_size=", ep_size, ", tp_rank=", tp_rank, ", pcp_rank=", pcp_rank, ", dp_rank=", dp_rank,
      ", ep_rank=", ep_rank, ", sp_size=", sp_size, ", use_ep=", PyBool(use_ep),
      ", all2all_backend=", PyRepr(all2all_backend), ", enable_eplb=", PyBool(enable_eplb), ")");
}

// --- FusedMoEConfig ---------------------------------------------------------

bool RocmAiterMoeEnabled(const Platform& platform, const EnvVars& env) {
  // @if_aiter_supported: ROCm, the aiter package importable, a gfx9 device.
  return platform.is_rocm() && platform.HasLibrary("aiter") && platform.on_gfx9() &&
         env.Flag("VLLM_ROCM_USE_AITER", false) && env.Flag("VLLM_ROCM_USE_AITER_MOE", true);
}

absl::StatusOr<FusedMoEConfig> FusedMoEConfig::Make(const MoeLayerSpec& layer,
                                                    MoEActivation activation,
                                                    RoutingMethodType routing,
                                                    const FusedMoEParallelConfig& parallel,
                                                    absl::string_view moe_backend,
                                                    const Platform& platform, const EnvVars& env) {
  FusedMoEConfig c;
  c.num_experts = layer.num_experts;
  c.experts_per_token = layer.experts_per_token;
  c.hidden_dim = layer.hidden_dim;
  c.intermediate_size = layer.intermediate_size;
  c.num_local_experts = parallel.ep_size > 0 ? layer.num_experts / parallel.ep_size : 0;
  c.num_logical_experts = layer.num_experts;
  c.activation = activation;
  c.device = std::string(PlatformKindName(platform.kind));
  c.routing_method = routing;
  c.moe_parallel_config = parallel;
  c.in_dtype = layer.in_dtype.empty() ? "bfloat16" : layer.in_dtype;
  c.moe_backend = std::string(moe_backend);
  c.has_bias = layer.has_bias;
  c.is_lora_enabled = layer.is_lora_enabled;
  c.swiglu_limit = layer.swiglu_limit;

  // 1. assert intermediate_size % tp_size == 0
  if (parallel.tp_size <= 0 || layer.intermediate_size % parallel.tp_size != 0) {
    return InvalidField("intermediate_size",
                        absl::StrCat("intermediate_size (", layer.intermediate_size,
                                     ") must be divisible by the MoE tensor-parallel size (",
                                     parallel.tp_size, ")"));
  }
  c.intermediate_size_per_partition = layer.intermediate_size / parallel.tp_size;
  // 2. assert max_num_tokens > 0 (the layer passes max_num_batched_tokens).
  c.max_num_tokens = layer.max_num_tokens == 0 ? kDefaultMoeMaxNumTokens : layer.max_num_tokens;
  if (c.max_num_tokens <= 0) {
    return InvalidField("max_num_tokens", "max_num_tokens must be > 0");
  }
  // 3. defaults.
  c.router_logits_dtype =
      layer.router_logits_dtype.empty() ? c.in_dtype : layer.router_logits_dtype;
  c.hidden_dim_unpadded = c.hidden_dim;
  // 4. AITER flags (read for gated layers).
  if (c.is_act_and_mul()) {
    c.rocm_aiter_fmoe_enabled = RocmAiterMoeEnabled(platform, env);
    c.aiter_fmoe_shared_expert_enabled =
        c.rocm_aiter_fmoe_enabled && env.Flag("VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", false);
  }
  // 5. Mori needs AITER fused MoE without shared-expert fusion.
  if (parallel.use_mori_kernels()) {
    if (!c.rocm_aiter_fmoe_enabled) {
      return absl::FailedPreconditionError("Mori needs to be used with aiter fused_moe for now.");
    }
    if (c.aiter_fmoe_shared_expert_enabled) {
      return absl::FailedPreconditionError(
          "Mori does not support fusion shared expert now. Turn it off by setting "
          "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=0");
    }
  }
  // 6. non-gated MLPs only on CUDA-alike and XPU.
  if (!c.is_act_and_mul() && !(platform.is_cuda_alike() || platform.is_xpu())) {
    return absl::FailedPreconditionError(
        "is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now");
  }
  return c;
}

}  // namespace kplan
