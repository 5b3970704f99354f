// oracle/fp8.py: Fp8MoeBackend selection (per-tensor, per-channel and
// DeepSeek block fp8).
#include "absl/strings/str_cat.h"
#include "server/base/status.h"
#include "server/oracle/oracle.h"

namespace kplan {
namespace {

using Q = QuantKey;

bool IsBlock(QuantKey w, QuantKey a) {
  return w == Q::kFp8Static128BlockSym && a == Q::kFp8Dynamic128Sym;
}
// 1. Blackwell + DeepEP v2 + DeepSeek block fp8: TRT-LLM first.
bool Fam100DeepEpV2Block(const SelectionContext& c, Q w, Q a) {
  return c.platform.is_cuda() && c.platform.IsDeviceCapabilityFamily(100) &&
         c.pc().use_deepep_v2_kernels() && IsBlock(w, a);
}
// 2. Exactly SM90 + block fp8: FlashInfer CUTLASS first with EP, Triton first without.
bool Sm90BlockEp(const SelectionContext& c, Q w, Q a) {
  return c.platform.is_cuda() && c.platform.IsDeviceCapability(90) && IsBlock(w, a) &&
         c.pc().ep_size > 1;
}
bool Sm90BlockNoEp(const SelectionContext& c, Q w, Q a) {
  return c.platform.is_cuda() && c.platform.IsDeviceCapability(90) && IsBlock(w, a) &&
         c.pc().ep_size <= 1;
}
bool IsXpu(const SelectionContext& c, Q, Q) { return c.platform.is_xpu(); }
bool IsCpu(const SelectionContext& c, Q, Q) { return c.platform.is_cpu(); }

const std::vector<absl::string_view> kBaseList = {
    "AITER",        "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS",   "DEEPGEMM",
    "VLLM_CUTLASS", "TRITON",            "MARLIN",               "HUMMING",
    "BATCHED_DEEPGEMM", "BATCHED_VLLM_CUTLASS", "BATCHED_TRITON", "XPU",
    "CPU",          "HPC"};
const std::vector<MoveRule> kRules = {
    {Fam100DeepEpV2Block, "FLASHINFER_TRTLLM", true},
    {Sm90BlockEp, "FLASHINFER_CUTLASS", true},
    {Sm90BlockNoEp, "TRITON", true},
    {IsXpu, "XPU", true},
    {IsCpu, "CPU", true},
};

}  // namespace

// Fp8MoeBackend, shared with the MXFP8 oracle (value == name).
const SchemeTables& Fp8Tables() {
  static const auto* t = new SchemeTables{
      "fp8", "FP8", "FP8", "Fp8",
      {
          {"NONE", "NONE", {}},
          {"FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM",
           {"TrtLlmFp8ExpertsMonolithic", "TrtLlmFp8ExpertsModular"}},
          {"FLASHINFER_CUTLASS", "FLASHINFER_CUTLASS", {"FlashInferExperts"}},
          {"DEEPGEMM", "DEEPGEMM", {"TritonOrDeepGemmExperts"}},
          {"BATCHED_DEEPGEMM", "BATCHED_DEEPGEMM", {"BatchedDeepGemmExperts"}},
          {"MARLIN", "MARLIN", {"MarlinExperts"}},
          {"HUMMING", "HUMMING",
           {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
          {"TRITON", "TRITON", {"TritonExperts"}},
          {"BATCHED_TRITON", "BATCHED_TRITON", {"BatchedTritonExperts"}},
          {"AITER", "AITER", {"AiterExperts"}},
          {"VLLM_CUTLASS", "VLLM_CUTLASS", {"TritonOrCutlassExperts"}},
          {"BATCHED_VLLM_CUTLASS", "BATCHED_VLLM_CUTLASS", {"CutlassBatchedExpertsFp8"}},
          {"XPU", "XPU", {"XPUExpertsFp8", "XPUExpertsMxFp8", "XPUExpertsBlockFp8"}},
          {"CPU", "CPU", {"CPUExpertsFp8"}},
          {"HPC", "HPC", {"HPCExperts"}},
          // vLLM has EMULATION in the enum without mapping it; kplan maps it to its own.
          {"EMULATION", "EMULATION", {"KplanEmulationExperts"}},
          {"TRITON_MXFP8", "TRITON_MXFP8", {"Mxfp8NativeTritonExperts"}},
          {"AITER_MXFP8", "AITER_MXFP8", {"AiterMxfp8Experts"}},
          // kplan's own family.
          {"KPLAN", "KPLAN", {"KplanExperts"}},
          {"KPLAN_BATCHED", "KPLAN_BATCHED", {"KplanBatchedExperts"}},
          {"KPLAN_EP", "KPLAN_EP", {"KplanEpExperts"}},
      },
      // map_fp8_backend, dict order.
      {{"triton", "TRITON"},
       {"deep_gemm", "DEEPGEMM"},
       {"cutlass", "VLLM_CUTLASS"},
       {"flashinfer_trtllm", "FLASHINFER_TRTLLM"},
       {"flashinfer_cutlass", "FLASHINFER_CUTLASS"},
       {"marlin", "MARLIN"},
       {"humming", "HUMMING"},
       {"aiter", "AITER"},
       {"hpc", "HPC"}},
      {{"kplan", "KPLAN"}, {"kplan_batched", "KPLAN_BATCHED"}, {"kplan_ep", "KPLAN_EP"},
       {"emulation", "EMULATION"}},
      {{"DEEPGEMM", "BATCHED_DEEPGEMM"},
       {"TRITON", "BATCHED_TRITON"},
       {"VLLM_CUTLASS", "BATCHED_VLLM_CUTLASS"},
       {"KPLAN", "KPLAN_BATCHED"}},
      {"KPLAN", "KPLAN_BATCHED", "EMULATION"},
  };
  return *t;
}

namespace {

class Fp8MoEKernelOracle final : public MoEKernelOracle {
 public:
  Fp8MoEKernelOracle() : MoEKernelOracle(Fp8Tables()) {}

  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                       QuantKey a) const override {
    std::vector<int> list = Build(kBaseList, kRules, c, w, a);
    AppendKplan(list, c);
    return list;
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    Selection s;
    const bool allow_cutlass = c.allow_vllm_cutlass;
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(int b, MapBackend(c.moe.moe_backend));
      if (def(b).name == "VLLM_CUTLASS" && !allow_cutlass) {
        return InvalidField("moe_backend",
                            "vLLM CUTLASS FP8 MoE backend is disabled for this configuration.");
      }
      return ReturnOrRaise(MaybeBatched(b, c), c, w, a, s, false);
    }
    std::vector<int> list = GetPriorityBackends(c, w, a);
    s.potential = list;
    // (a) DeepGEMM switches: either false removes it, both true forces it.
    if (c.env.IsSet("VLLM_USE_DEEP_GEMM") || c.env.IsSet("VLLM_MOE_USE_DEEP_GEMM")) {
      const bool use = c.env.Flag("VLLM_USE_DEEP_GEMM", true);
      const bool moe = c.env.Flag("VLLM_MOE_USE_DEEP_GEMM", true);
      if (!use || !moe) {
        Remove(list, "DEEPGEMM");
        Remove(list, "BATCHED_DEEPGEMM");
      } else {
        return ReturnOrRaise(MaybeBatched(Find("DEEPGEMM"), c), c, w, a, s, true);
      }
    }
    // (b) test hook: force Marlin.
    if (c.env.Flag("VLLM_TEST_FORCE_FP8_MARLIN", false)) {
      return ReturnOrRaise(Find("MARLIN"), c, w, a, s, true);
    }
    // (c) AITER switches.
    switch (AiterEnv(c.env)) {
      case AiterEnvRule::kDrop:
        Remove(list, "AITER");
        break;
      case AiterEnvRule::kForce:
        return ReturnOrRaise(Find("AITER"), c, w, a, s, true);
      case AiterEnvRule::kNone:
        break;
    }
    // (d) vLLM CUTLASS only where the quantization method allows it.
    if (!allow_cutlass) {
      Remove(list, "VLLM_CUTLASS");
      Remove(list, "BATCHED_VLLM_CUTLASS");
    }
    s = Loop(list, c, w, a, std::move(s));
    if (s.backend >= 0) return s;
    if (c.platform.is_cuda_alike()) return Exhausted();
    // Other platforms: (NONE, None); out-of-tree plugins take over.
    s.backend = -1;
    s.experts = nullptr;
    return s;
  }

  absl::StatusOr<std::string> MakeQuantConfig(int b, QuantKey w, QuantKey a) const override {
    absl::string_view n = b >= 0 ? def(b).name : "NONE";
    if (n == "MARLIN" || n == "CPU") return std::string("fp8_w8a16 (weight-only)");
    if (n == "HUMMING") return std::string("humming fp8 config");
    if ((n == "FLASHINFER_CUTLASS" || n == "HPC") && w == QuantKey::kFp8StaticTensorSym) {
      return std::string("fp8_w8a8 per-tensor, a_gscale = 1/a_scale, g_alphas = w_scale * a_scale");
    }
    if (w == QuantKey::kFp8Static128BlockSym) return std::string("fp8_w8a8 block_shape=[128, 128]");
    return absl::StrCat("fp8_w8a8 (", QuantKeyName(w), " x ", QuantKeyName(a), ")");
  }

};

}  // namespace

const MoEKernelOracle& Fp8Oracle() {
  static const auto* o = new Fp8MoEKernelOracle();
  return *o;
}

}  // namespace kplan
