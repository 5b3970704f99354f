// oracle/fp8.py: Fp8MoeBackend selection (per-tensor, per-channel and
// DeepSeek block fp8).
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "resolve/oracle/oracle.h"

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

}  // namespace

// Fp8MoeBackend, shared with the MXFP8 oracle (value == name).
const SchemeTables& Fp8Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "fp8",
      .map_name = "FP8",
      .display_name = "FP8",
      .log_name = "Fp8",
      .backends =
          {
              {"NONE", "NONE", {}},
              {"FLASHINFER_TRTLLM",
               "FLASHINFER_TRTLLM",
               {"TrtLlmFp8ExpertsMonolithic", "TrtLlmFp8ExpertsModular"}},
              {"FLASHINFER_CUTLASS", "FLASHINFER_CUTLASS", {"FlashInferExperts"}},
              {"DEEPGEMM", "DEEPGEMM", {"TritonOrDeepGemmExperts"}},
              {"BATCHED_DEEPGEMM", "BATCHED_DEEPGEMM", {"BatchedDeepGemmExperts"}},
              {"MARLIN", "MARLIN", {"MarlinExperts"}},
              {"HUMMING",
               "HUMMING",
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
              {"KPLAN", "KPLAN", {"KplanFp8Experts", "KplanQuantDecodeExperts"}},
              {"KPLAN_BATCHED", "KPLAN_BATCHED", {"KplanBatchedExperts"}},
              {"KPLAN_EP", "KPLAN_EP", {"KplanEpExperts"}},
          },
      // map_fp8_backend, dict order.
      .user_map = {{"triton", {"TRITON"}},
                   {"deep_gemm", {"DEEPGEMM"}},
                   {"cutlass", {"VLLM_CUTLASS"}},
                   {"flashinfer_trtllm", {"FLASHINFER_TRTLLM"}},
                   {"flashinfer_cutlass", {"FLASHINFER_CUTLASS"}},
                   {"marlin", {"MARLIN"}},
                   {"humming", {"HUMMING"}},
                   {"aiter", {"AITER"}},
                   {"hpc", {"HPC"}}},
      .kplan_map = {{"kplan", {"KPLAN"}},
                    {"kplan_batched", {"KPLAN_BATCHED"}},
                    {"kplan_ep", {"KPLAN_EP"}},
                    {"emulation", {"EMULATION"}}},
      .batched = {{"DEEPGEMM", "BATCHED_DEEPGEMM"},
                  {"TRITON", "BATCHED_TRITON"},
                  {"VLLM_CUTLASS", "BATCHED_VLLM_CUTLASS"},
                  {"KPLAN", "KPLAN_BATCHED"}},
      // One list on every platform, then the move-to-front rules in order.
      .priority = {{nullptr,
                    {"AITER", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "DEEPGEMM", "VLLM_CUTLASS",
                     "TRITON", "MARLIN", "HUMMING", "BATCHED_DEEPGEMM", "BATCHED_VLLM_CUTLASS",
                     "BATCHED_TRITON", "XPU", "CPU", "HPC"},
                    {
                        {Fam100DeepEpV2Block, "FLASHINFER_TRTLLM", true},
                        {Sm90BlockEp, "FLASHINFER_CUTLASS", true},
                        {Sm90BlockNoEp, "TRITON", true},
                        {IsXpu, "XPU", true},
                        {IsCpu, "CPU", true},
                    }}},
      .kplan_auto = {"KPLAN", "KPLAN_BATCHED", "EMULATION"},
  };
  return *t;
}

namespace {

class Fp8MoEKernelOracle final : public MoEKernelOracle {
 public:
  Fp8MoEKernelOracle() : MoEKernelOracle(Fp8Tables()) {}

  absl::StatusOr<std::string> MakeQuantConfig(int b, QuantKey w, QuantKey a) const override;

 protected:
  // select_fp8_moe_backend(allow_vllm_cutlass=False): an explicit `cutlass`
  // where the quantization method does not allow vLLM CUTLASS.
  absl::Status CheckExplicit(const SelectionContext& c, std::vector<int>& candidates,
                             QuantKey) const override {
    if (def(candidates.front()).name == "VLLM_CUTLASS" && !c.allow_vllm_cutlass) {
      return InvalidField("moe_backend",
                          "vLLM CUTLASS FP8 MoE backend is disabled for this configuration.");
    }
    return absl::OkStatus();
  }

  // select_fp8_moe_backend()'s env handling, in vLLM's order.
  int EnvOverrides(const SelectionContext& c, std::vector<int>& list) const override {
    // (a) DeepGEMM switches: either false removes it, both true forces it.
    if (c.env.IsSet("VLLM_USE_DEEP_GEMM") || c.env.IsSet("VLLM_MOE_USE_DEEP_GEMM")) {
      const bool use = c.env.Flag("VLLM_USE_DEEP_GEMM", true);
      const bool moe = c.env.Flag("VLLM_MOE_USE_DEEP_GEMM", true);
      if (use && moe) return MaybeBatched(Find("DEEPGEMM"), c);
      Remove(list, "DEEPGEMM");
      Remove(list, "BATCHED_DEEPGEMM");
    }
    // (b) test hook: force Marlin.
    if (c.env.Flag("VLLM_TEST_FORCE_FP8_MARLIN", false)) return Find("MARLIN");
    // (c) AITER switches.
    switch (AiterEnv(c.env)) {
      case AiterEnvRule::kDrop:
        Remove(list, "AITER");
        break;
      case AiterEnvRule::kForce:
        return Find("AITER");
      case AiterEnvRule::kNone:
        break;
    }
    // (d) vLLM CUTLASS only where the quantization method allows it.
    if (!c.allow_vllm_cutlass) {
      Remove(list, "VLLM_CUTLASS");
      Remove(list, "BATCHED_VLLM_CUTLASS");
    }
    return -1;
  }

  // select_fp8_moe_backend() exhausted: NotImplementedError on CUDA/ROCm;
  // elsewhere (NONE, None), so that out-of-tree plugins take over.
  absl::StatusOr<Selection> OnExhausted(const SelectionContext& c, QuantKey, QuantKey, Selection s,
                                        const std::string&) const override {
    if (c.platform.is_cuda_alike()) return Exhausted();
    s.backend = -1;
    s.experts = nullptr;
    return s;
  }
};

absl::StatusOr<std::string> Fp8MoEKernelOracle::MakeQuantConfig(int b, QuantKey w,
                                                                QuantKey a) const {
  absl::string_view n = b >= 0 ? def(b).name : "NONE";
  if (n == "MARLIN" || n == "CPU") return std::string("fp8_w8a16 (weight-only)");
  if (n == "HUMMING") return std::string("humming fp8 config");
  if ((n == "FLASHINFER_CUTLASS" || n == "HPC") && w == QuantKey::kFp8StaticTensorSym) {
    return std::string("fp8_w8a8 per-tensor, a_gscale = 1/a_scale, g_alphas = w_scale * a_scale");
  }
  if (w == QuantKey::kFp8Static128BlockSym) return std::string("fp8_w8a8 block_shape=[128, 128]");
  return absl::StrCat("fp8_w8a8 (", QuantKeyName(w), " x ", QuantKeyName(a), ")");
}

}  // namespace

const MoEKernelOracle& Fp8Oracle() {
  static const auto* o = new Fp8MoEKernelOracle();
  return *o;
}

}  // namespace kplan
