// oracle/nvfp4.py: NvFp4MoeBackend selection.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/pyrepr.h"
#include "base/status.h"
#include "resolve/oracle/oracle.h"

namespace kplan {
namespace {

const SchemeTables& Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "nvfp4",
      .map_name = "NvFP4",  // "... is not supported for NvFP4 MoE."; elsewhere NvFp4
      .display_name = "NvFp4",
      .log_name = "NvFp4",
      .backends =
          {
              {"FLASHINFER_TRTLLM",
               "FLASHINFER_TRTLLM",
               {"TrtLlmNvFp4ExpertsMonolithic", "TrtLlmNvFp4ExpertsModular"}},
              {"FLASHINFER_CUTLASS", "FLASHINFER_CUTLASS", {"FlashInferExperts"}},
              {"FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL", {"FlashInferCuteDSLExperts"}},
              {"FLASHINFER_CUTEDSL_BATCHED",
               "FLASHINFER_CUTEDSL_BATCHED",
               {"FlashInferCuteDSLBatchedExperts"}},
              {"FLASHINFER_B12X", "FLASHINFER_B12X", {"FlashInferB12xExperts"}},
              {"VLLM_CUTLASS", "VLLM_CUTLASS", {"CutlassExpertsFp4"}},
              {"MARLIN", "MARLIN", {"MarlinExperts"}},
              {"HUMMING",
               "HUMMING",
               {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
              {"EMULATION", "EMULATION", {"Nvfp4QuantizationEmulationTritonExperts"}},
          },
      // map_nvfp4_backend, dict order.
      .user_map = {{"cutlass", {"VLLM_CUTLASS"}},
                   {"flashinfer_trtllm", {"FLASHINFER_TRTLLM"}},
                   {"flashinfer_cutlass", {"FLASHINFER_CUTLASS"}},
                   {"flashinfer_cutedsl", {"FLASHINFER_CUTEDSL"}},
                   {"flashinfer_b12x", {"FLASHINFER_B12X"}},
                   {"marlin", {"MARLIN"}},
                   {"humming", {"HUMMING"}},
                   {"emulation", {"EMULATION"}}},
      .batched = {{"FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED"}},
      // FLASHINFER_B12X is opt-in only: not in the auto list.
      .priority = {{nullptr,
                    {"FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED",
                     "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "MARLIN", "HUMMING", "EMULATION"},
                    {}}},
      // "Using 'V' NvFp4 MoE backend ...", "NvFp4 MoE backend 'V' does not support ..."
      .log_quotes_backend = true,
      .error_quotes_backend = true,
  };
  return *t;
}

// Backends that apply the SwiGLU clamp (swiglu_limit).
const std::vector<absl::string_view> kSwigluClamp = {"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS",
                                                     "MARLIN"};

bool AppliesClamp(absl::string_view member) {
  return std::find(kSwigluClamp.begin(), kSwigluClamp.end(), member) != kSwigluClamp.end();
}

class Nvfp4MoEKernelOracle final : public MoEKernelOracle {
 public:
  Nvfp4MoEKernelOracle() : MoEKernelOracle(Tables()) {}

  absl::StatusOr<std::string> MakeQuantConfig(int b, QuantKey, QuantKey a) const override {
    if (b >= 0 && def(b).name == "MARLIN") return std::string("nvfp4_w4a16 (Marlin)");
    return std::string(a == QuantKey::kNone ? "nvfp4_w4a16" : "nvfp4_w4a4");
  }

 protected:
  // select_nvfp4_moe_backend(): a model with swiglu_limit keeps only the
  // backends that apply the SwiGLU clamp.
  void FilterPriority(const SelectionContext& c, QuantKey, std::vector<int>& list) const override {
    if (!c.moe.swiglu_limit.has_value()) return;
    std::vector<int> kept;
    for (int b : list) {
      if (AppliesClamp(def(b).name)) kept.push_back(b);
    }
    list = kept;
  }
  // select_nvfp4_moe_backend(): the same rule for an explicit request is a ValueError.
  absl::Status CheckExplicit(const SelectionContext& c, std::vector<int>& candidates,
                             QuantKey) const override {
    if (!c.moe.swiglu_limit.has_value() || AppliesClamp(def(candidates.front()).name)) {
      return absl::OkStatus();
    }
    return InvalidField(
        "moe_backend",
        absl::StrCat("Model sets swiglu_limit=", PyFloat(*c.moe.swiglu_limit),
                     ", but the explicitly requested moe_backend=", PyRepr(c.moe.moe_backend),
                     " does not apply the SwiGLU clamp. Use 'flashinfer_trtllm' or "
                     "'flashinfer_cutlass' instead."));
  }
  // select_nvfp4_moe_backend(): VLLM_TEST_FORCE_FP8_MARLIN forces Marlin.
  int EnvOverrides(const SelectionContext& c, std::vector<int>&) const override {
    return c.env.Flag("VLLM_TEST_FORCE_FP8_MARLIN", false) ? Find("MARLIN") : -1;
  }
};

}  // namespace

const MoEKernelOracle& Nvfp4Oracle() {
  static const auto* o = new Nvfp4MoEKernelOracle();
  return *o;
}

}  // namespace kplan
