// oracle/mxfp4.py: Mxfp4MoeBackend selection, the gpt-oss path
// (select_mxfp4_moe_backend) and the DeepSeek-V4 path
// (select_deepseek_v4_mxfp4_moe_backend). Each backend implies the
// activation key it runs with; user strings map to candidate lists.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/pyrepr.h"
#include "base/status.h"
#include "resolve/oracle/oracle.h"

namespace kplan {
namespace {

using Q = QuantKey;

bool Rocm(const SelectionContext& c) { return c.platform.is_rocm(); }
bool RocmDeepseekV4(const SelectionContext& c) {
  return c.platform.is_rocm() && c.moe.routing_method == RoutingMethodType::kDeepseekV4;
}
bool Xpu(const SelectionContext& c) { return c.platform.is_xpu(); }
bool Cuda(const SelectionContext& c) { return c.platform.is_cuda(); }

// The gpt-oss path (select_mxfp4_moe_backend).
const SchemeTables& Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "mxfp4",
      .map_name = "MXFP4",
      .display_name = "MXFP4",
      .log_name = "Mxfp4",
      .backends =
          {
              // member, value, experts, _backend_activation_key()
              {"NONE", "None", {}},
              {"DEEPGEMM_MXFP4", "DEEPGEMM_MXFP4", {"DeepGemmFP4Experts"}, Q::kFp8Dynamic128Sym},
              {"FLASHINFER_TRTLLM_MXFP4_MXFP8",
               "FLASHINFER_TRTLLM_MXFP4_MXFP8",
               {"TrtLlmMxfp4ExpertsMonolithic", "TrtLlmMxfp4ExpertsModular"},
               Q::kMxfp8Dynamic},
              {"FLASHINFER_TRTLLM_MXFP4_BF16",
               "FLASHINFER_TRTLLM_MXFP4_BF16",
               {"TrtLlmMxfp4ExpertsMonolithic", "TrtLlmMxfp4ExpertsModular"}},
              {"FLASHINFER_CUTLASS_MXFP4_MXFP8",
               "FLASHINFER_CUTLASS_MXFP4_MXFP8",
               {"FlashInferExperts"},
               Q::kMxfp8Dynamic},
              {"FLASHINFER_CUTLASS_MXFP4_BF16",
               "FLASHINFER_CUTLASS_MXFP4_BF16",
               {"FlashInferExperts"}},
              {"BATCHED_MARLIN", "BATCHED_MARLIN", {"BatchedMarlinExperts"}},
              {"MARLIN", "MARLIN", {"MarlinExperts"}},
              {"AITER_MXFP4_BF16", "AITER_MXFP4_BF16", {"AiterExperts"}},  // alias AITER
              {"AITER_MXFP4_FP8", "AITER_MXFP4_FP8", {"AiterExperts"}, Q::kFp8StaticTensorSym},
              {"AITER_MXFP4_MXFP4", "AITER_MXFP4_MXFP4", {"AiterExperts"}, Q::kMxfp4Dynamic},
              {"TRITON", "TRITON", {"OAITritonMxfp4ExpertsMonolithic", "OAITritonExperts"}},
              {"TRITON_UNFUSED", "TRITON_UNFUSED", {"UnfusedOAITritonExperts"}},
              {"XPU", "XPU", {"XPUExpertsMXFp4"}},
              {"CPU", "CPU", {"CPUExpertsMxfp4"}},
              {"EMULATION", "EMULATION", {"OCP_MXQuantizationEmulationTritonExperts"}},
              {"HUMMING",
               "HUMMING",
               {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
          },
      // map_mxfp4_backend, dict order: user string -> candidate list. Several
      // keys are not MoEBackend values (programmatic only).
      .user_map =
          {
              {"deep_gemm", {"DEEPGEMM_MXFP4"}},
              {"flashinfer_trtllm",
               {"FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8"}},
              {"flashinfer_trtllm_afp8", {"FLASHINFER_TRTLLM_MXFP4_MXFP8"}},
              {"flashinfer_cutlass",
               {"FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"}},
              {"flashinfer_cutlass_afp8", {"FLASHINFER_CUTLASS_MXFP4_MXFP8"}},
              {"triton", {"TRITON"}},
              {"triton_unfused", {"TRITON_UNFUSED"}},
              {"humming", {"HUMMING"}},
              {"marlin", {"MARLIN"}},
              {"aiter", {"AITER_MXFP4_BF16", "AITER_MXFP4_FP8", "AITER_MXFP4_MXFP4"}},
              {"aiter_mxfp4_fp8", {"AITER_MXFP4_FP8"}},
              {"aiter_mxfp4_mxfp4", {"AITER_MXFP4_MXFP4"}},
              {"xpu", {"XPU"}},
              {"cpu", {"CPU"}},
              {"emulation", {"EMULATION"}},
          },
      .batched = {{"MARLIN", "BATCHED_MARLIN"}},
      // gpt-oss auto list (TRITON_UNFUSED disabled upstream: "bug with MTP support").
      .priority = {{nullptr,
                    {"FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8",
                     "AITER_MXFP4_BF16", "AITER_MXFP4_FP8", "AITER_MXFP4_MXFP4", "TRITON",
                     "FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8", "MARLIN",
                     "BATCHED_MARLIN", "XPU", "EMULATION"},
                    {}}},
      .activation_key = ActivationKeyRule::kImplied,
      .log_candidates = true,
      // "Using 'V' Mxfp4 MoE backend ...", "MXFP4 MoE backend 'V' does not support ..."
      .log_quotes_backend = true,
      .error_quotes_backend = true,
  };
  return *t;
}

// The DeepSeek-V4 path (select_deepseek_v4_mxfp4_moe_backend): the same enum
// and map, its own priority lists.
const SchemeTables& DeepseekV4Tables() {
  static const auto* t = [] {
    auto* t = new SchemeTables(Tables());
    t->priority = {
        {RocmDeepseekV4, {"AITER_MXFP4_BF16", "TRITON_UNFUSED"}, {}},
        {Rocm, {"AITER_MXFP4_BF16"}, {}},
        {Xpu, {"XPU"}, {}},
        {Cuda, {"FLASHINFER_TRTLLM_MXFP4_MXFP8", "DEEPGEMM_MXFP4", "MARLIN", "BATCHED_MARLIN"}, {}},
    };
    return t;
  }();
  return *t;
}

int RoundUp(int x, int m) { return (x + m - 1) / m * m; }

class Mxfp4Base : public MoEKernelOracle {
 public:
  explicit Mxfp4Base(const SchemeTables& tables) : MoEKernelOracle(tables) {}

  // mxfp4_round_up_hidden_size_and_intermediate_size(backend, H, I).
  std::pair<int, int> RoundUpSizes(int b, const SelectionContext& c, int h, int i) const override {
    if (b < 0) return {h, i};
    absl::string_view n = def(b).name;
    if (n == "EMULATION") return {RoundUp(h, 32), RoundUp(i, 32)};  // OCP MX block
    if (n == "DEEPGEMM_MXFP4") return {RoundUp(h, 128), RoundUp(i, 128)};
    if (n == "MARLIN" || n == "BATCHED_MARLIN") {
      return {RoundUp(h, c.platform.is_xpu() ? 128 : 256), RoundUp(i, 128)};
    }
    if (absl::StartsWith(n, "FLASHINFER_TRTLLM")) return {RoundUp(h, 256), RoundUp(i, 256)};
    if (absl::StartsWith(n, "FLASHINFER_CUTLASS")) return {RoundUp(h, 128), RoundUp(i, 128)};
    if (c.platform.is_rocm()) return {RoundUp(h, 256), RoundUp(i, 256)};
    if (c.platform.is_cpu()) return {RoundUp(h, 32), RoundUp(i, 32)};
    return {h, RoundUp(i, 64)};
  }

  std::string ConvertToKernelFormat(int b, const SelectionContext& c) const override {
    absl::string_view n = def(b).name;
    if (n == "TRITON" || n == "TRITON_UNFUSED") {
      return "swizzle weights and scales into triton_kernels' MXFP4 layout";
    }
    return MoEKernelOracle::ConvertToKernelFormat(b, c);
  }

  absl::StatusOr<std::string> MakeQuantConfig(int b, QuantKey, QuantKey) const override {
    QuantKey a = b >= 0 ? def(b).implied_activation : QuantKey::kNone;
    if (a == QuantKey::kMxfp8Dynamic) return std::string("mxfp4_w4a8 (mxfp8 activations)");
    if (a == QuantKey::kMxfp4Dynamic) return std::string("mxfp4_w4a4");
    if (a == QuantKey::kFp8Dynamic128Sym || a == QuantKey::kFp8StaticTensorSym) {
      return std::string("mxfp4 weights, fp8 activations");
    }
    return std::string("mxfp4_w4a16");
  }
};

class Mxfp4MoEKernelOracle final : public Mxfp4Base {
 public:
  Mxfp4MoEKernelOracle() : Mxfp4Base(Tables()) {}

 protected:
  // _filter_by_activation() on an explicit request's candidates; none left
  // is vLLM's ValueError naming the variants it maps to.
  absl::Status CheckExplicit(const SelectionContext& c, std::vector<int>& candidates,
                             QuantKey a) const override {
    std::vector<int> kept = FilterByActivation(candidates, a);
    if (kept.empty()) {
      std::vector<std::string> names;
      for (int b : candidates) names.emplace_back(def(b).name);
      return InvalidField("moe_backend",
                          absl::StrCat("moe_backend=", PyRepr(c.moe.moe_backend),
                                       " does not support activation=", QuantKeyName(a),
                                       "; supported variants: ", PyRepr(names)));
    }
    candidates = std::move(kept);
    return absl::OkStatus();
  }
  // _filter_by_activation() on the auto list.
  void FilterPriority(const SelectionContext&, QuantKey a, std::vector<int>& list) const override {
    list = FilterByActivation(list, a);
  }
  // select_mxfp4_moe_backend()'s platform fallbacks when nothing native
  // passes: XPU, CPU, ROCm (TRITON_UNFUSED); CUDA raises; others (NONE, None).
  absl::StatusOr<Selection> OnExhausted(const SelectionContext& c, QuantKey w, QuantKey a,
                                        Selection s, const std::string&) const override {
    absl::string_view forced;
    if (c.platform.is_xpu()) {
      forced = "XPU";
    } else if (c.platform.is_cpu()) {
      forced = "CPU";
    } else if (c.platform.is_rocm()) {
      forced = "TRITON_UNFUSED";
    }
    if (!forced.empty()) {
      const ExpertsClass* e = FindExpertsClass(def(Find(forced)).experts.front());
      return Fallback(forced, e, "platform fallback", QuantKey::kNone, std::move(s));
    }
    if (c.platform.is_cuda()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "No MXFP4 MoE backend supports the deployment configuration. weight_key=",
          QuantKeyName(w), ", activation_key=", QuantKeyName(a),
          ". Native backends require specific hardware. Set `VLLM_LOGGING_LEVEL=DEBUG` to see "
          "detailed unsupported reasons. "));
    }
    s.backend = -1;
    s.experts = nullptr;
    return s;
  }

 private:
  // _filter_by_activation(): with a requested key keep the candidates that
  // imply it (EMULATION always); without one prefer the BF16 candidates.
  std::vector<int> FilterByActivation(const std::vector<int>& list, QuantKey requested) const {
    std::vector<int> out;
    for (int b : list) {
      QuantKey implied = def(b).implied_activation;
      if (requested != QuantKey::kNone) {
        if (implied == requested || def(b).name == "EMULATION") out.push_back(b);
      } else if (implied == QuantKey::kNone) {
        out.push_back(b);
      }
    }
    if (requested == QuantKey::kNone && out.empty()) return list;
    return out;
  }
};

// DeepSeek-V4 MXFP4 checkpoints: explicit candidates unfiltered; exhausted is
// the plain NotImplementedError.
class DeepseekV4Mxfp4MoEKernelOracle final : public Mxfp4Base {
 public:
  DeepseekV4Mxfp4MoEKernelOracle() : Mxfp4Base(DeepseekV4Tables()) {}
};

}  // namespace

const MoEKernelOracle& Mxfp4Oracle() {
  static const auto* o = new Mxfp4MoEKernelOracle();
  return *o;
}

const MoEKernelOracle& Mxfp4DeepseekV4Oracle() {
  static const auto* o = new DeepseekV4Mxfp4MoEKernelOracle();
  return *o;
}

}  // namespace kplan
