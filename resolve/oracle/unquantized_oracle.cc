// oracle/unquantized.py: UnquantizedMoeBackend selection.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "resolve/oracle/oracle.h"

namespace kplan {
namespace {

bool Sm90Family(const SelectionContext& c, QuantKey, QuantKey) {
  return c.platform.IsDeviceCapabilityFamily(90);
}
bool DpGt1(const SelectionContext& c, QuantKey, QuantKey) { return c.pc().dp_size > 1; }
bool SwigluOai(const SelectionContext& c, QuantKey, QuantKey) {
  return c.moe.activation == MoEActivation::kSwigluoai;
}
bool Rocm(const SelectionContext& c) { return c.platform.is_rocm(); }
bool Cuda(const SelectionContext& c) { return c.platform.is_cuda(); }
bool Xpu(const SelectionContext& c) { return c.platform.is_xpu(); }
bool Cpu(const SelectionContext& c) { return c.platform.is_cpu(); }

const SchemeTables& Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "unquantized",
      .map_name = "unquantized",
      .display_name = "Unquantized",
      .log_name = "Unquantized",
      // UnquantizedMoeBackend (value strings appear in logs and errors).
      .backends =
          {
              {"FLASHINFER_TRTLLM",
               "FlashInfer TRTLLM",
               {"TrtLlmBf16ExpertsMonolithic", "TrtLlmBf16ExpertsModular"}},
              {"FLASHINFER_CUTLASS", "FlashInfer CUTLASS", {"FlashInferExperts"}},
              {"AITER", "ROCm AITER", {"AiterExperts"}},
              {"TRITON", "TRITON", {"TritonExperts"}},
              {"BATCHED_TRITON", "BATCHED_TRITON", {"BatchedTritonExperts"}},
              {"CPU", "CPU", {}},  // July: (CPU, None) without a kernel class
              {"XPU", "XPU", {"XPUExperts"}},
              {"TPU", "TPU", {}},
              {"OOT", "OOT", {}},
              // kplan's own family (ARCHITECTURE.md "Vocabulary").
              {"KPLAN", "kplan", {"KplanExperts"}},
              {"KPLAN_BATCHED", "kplan_batched", {"KplanBatchedExperts"}},
              {"KPLAN_EP", "kplan_ep", {"KplanEpExperts"}},
              {"EMULATION", "emulation", {"KplanEmulationExperts"}},
          },
      // map_unquantized_backend, dict order ([newer]/seed: batched_triton 2nd).
      .user_map = {{"triton", {"TRITON"}},
                   {"batched_triton", {"BATCHED_TRITON"}},
                   {"flashinfer_trtllm", {"FLASHINFER_TRTLLM"}},
                   {"flashinfer_cutlass", {"FLASHINFER_CUTLASS"}},
                   {"aiter", {"AITER"}}},
      .kplan_map = {{"kplan", {"KPLAN"}},
                    {"kplan_batched", {"KPLAN_BATCHED"}},
                    {"kplan_ep", {"KPLAN_EP"}},
                    {"emulation", {"EMULATION"}}},
      // TRITON -> BATCHED_TRITON under the BatchedExperts format.
      .batched = {{"TRITON", "BATCHED_TRITON"}, {"KPLAN", "KPLAN_BATCHED"}},
      .priority =
          {
              {Rocm, {"AITER", "TRITON", "BATCHED_TRITON"}, {}},
              // CUDA base list and its move-to-back rules, applied in order.
              {Cuda,
               {"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "TRITON", "BATCHED_TRITON"},
               {
                   {Sm90Family, "FLASHINFER_TRTLLM", false},  // Hopper: Triton beats FlashInfer
                   {Sm90Family, "FLASHINFER_CUTLASS", false},
                   {DpGt1, "FLASHINFER_CUTLASS", false},     // DP>1: FI CUTLASS demoted
                   {SwigluOai, "FLASHINFER_TRTLLM", false},  // gpt-oss activation
                   {SwigluOai, "FLASHINFER_CUTLASS", false},
               }},
              {Xpu, {"XPU"}, {}},
              {Cpu, {"CPU"}, {}},
          },
      .kplan_auto = {"KPLAN", "KPLAN_BATCHED", "EMULATION"},
      // "humming" on an unquantized layer is treated as "auto".
      .auto_aliases = {"humming"},
  };
  return *t;
}

// TRT-LLM BF16 LoRA path: SM100 family, a TRT-LLM routing, no all2all/EPLB,
// intermediate_size_per_partition % 128 == 0.
bool TrtLlmLoraSupported(const SelectionContext& c) {
  const FusedMoEParallelConfig& p = c.pc();
  RoutingMethodType r = c.moe.routing_method;
  bool routing = r == RoutingMethodType::kDeepSeekV3 || r == RoutingMethodType::kLlama4 ||
                 r == RoutingMethodType::kRenormalize ||
                 r == RoutingMethodType::kRenormalizeNaive ||
                 r == RoutingMethodType::kSigmoidRenorm || r == RoutingMethodType::kSigmoid;
  return c.platform.is_cuda() && c.platform.IsDeviceCapabilityFamily(100) &&
         c.platform.HasLibrary("flashinfer") && routing &&
         (!p.use_all2all_kernels() || p.use_ag_rs_all2all_kernels()) && !p.enable_eplb &&
         c.moe.intermediate_size_per_partition % 128 == 0;
}

class UnquantizedMoEKernelOracle final : public MoEKernelOracle {
 public:
  UnquantizedMoEKernelOracle() : MoEKernelOracle(Tables()) {}

  std::string ConvertToKernelFormat(int b, const SelectionContext& c) const override {
    absl::string_view n = def(b).name;
    if (n == "FLASHINFER_TRTLLM") {
      return c.moe.is_act_and_mul()
                 ? "permute w13/w2 into TRT-LLM block layout"
                 : "pad intermediate to a multiple of 128 and permute w13/w2 into TRT-LLM block "
                   "layout";
    }
    if (n == "TRITON" && c.platform.is_rocm() && c.env.Flag("VLLM_ROCM_MOE_PADDING", true)) {
      return "identity (ROCm MoE padding: skip .contiguous())";
    }
    return MoEKernelOracle::ConvertToKernelFormat(b, c);
  }

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey, QuantKey) const override {
    return absl::UnimplementedError(
        "UnquantizedMoEKernelOracle does not implement make_quant_config; this oracle has no "
        "quantization-specific config to build.");
  }

 protected:
  // select_unquantized_moe_backend() steps 1-3, before the explicit request:
  // the key assertion, the platforms whose layers bypass the modular kernels
  // (CPU, TPU, OOT), and the LoRA rule, which overrides an explicit backend.
  std::optional<absl::StatusOr<Selection>> Bypass(const SelectionContext& c, QuantKey w,
                                                  QuantKey a) const override {
    if (w != QuantKey::kNone || a != QuantKey::kNone) {
      return absl::InternalError(
          "Weights and activations will never be quantized for UnquantizedMoEKernelOracle");
    }
    Selection s;
    if (c.platform.is_cpu()) return Direct("CPU", s);
    if (c.platform.is_tpu()) return Direct("TPU", s);
    if (c.platform.is_out_of_tree()) return Direct("OOT", s);
    if (!c.moe.is_lora_enabled) return std::nullopt;
    int trt = Find("FLASHINFER_TRTLLM");
    int triton = Find("TRITON");
    s.potential = {trt, triton};
    if (TrtLlmLoraSupported(c)) {
      s.candidates.push_back({"FLASHINFER_TRTLLM", "TrtLlmBf16LoRAExperts", true, ""});
      s.backend = trt;
      s.experts = &kTrtLlmLora;
      return s;
    }
    s.candidates.push_back(
        {"FLASHINFER_TRTLLM", "TrtLlmBf16LoRAExperts", false,
         "LoRA is enabled and the TRT-LLM BF16 LoRA path needs an SM100-family GPU with "
         "FlashInfer, a TRT-LLM routing method, no all2all kernels or EPLB, and "
         "intermediate_size_per_partition % 128 == 0"});
    s.candidates.push_back({"TRITON", "TritonExperts", true, ""});
    s.backend = triton;
    s.experts = FindExpertsClass("TritonExperts");
    return s;
  }

  // select_unquantized_moe_backend() step 6: the AITER switches.
  int EnvOverrides(const SelectionContext& c, std::vector<int>& list) const override {
    switch (AiterEnv(c.env)) {
      case AiterEnvRule::kDrop:
        Remove(list, "AITER");
        return -1;
      case AiterEnvRule::kForce:
        return Find("AITER");
      case AiterEnvRule::kNone:
        break;
    }
    return -1;
  }

 private:
  absl::StatusOr<Selection> Direct(absl::string_view member, Selection s) const {
    s.backend = Find(member);
    s.experts = nullptr;
    return s;
  }

  // TrtLlmBf16LoRAExperts: chosen by the LoRA rule, not by is_supported_config.
  static constexpr ExpertsClass kTrtLlmLora = {
      .name = "TrtLlmBf16LoRAExperts", .no_act_and_mul = true, .lora = true};
};

}  // namespace

AiterEnvRule AiterEnv(const EnvVars& env) {
  if (!env.IsSet("VLLM_ROCM_USE_AITER") && !env.IsSet("VLLM_ROCM_USE_AITER_MOE")) {
    return AiterEnvRule::kNone;
  }
  const bool aiter = env.Flag("VLLM_ROCM_USE_AITER", false);
  const bool moe = env.Flag("VLLM_ROCM_USE_AITER_MOE", true);
  return aiter && moe ? AiterEnvRule::kForce : AiterEnvRule::kDrop;
}

const MoEKernelOracle& UnquantizedOracle() {
  static const auto* o = new UnquantizedMoEKernelOracle();
  return *o;
}

}  // namespace kplan
