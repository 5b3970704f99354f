// oracle/mxfp8.py: MXFP8 selection over the shared Fp8MoeBackend enum.
#include "absl/strings/str_cat.h"
#include "server/base/status.h"
#include "server/oracle/oracle.h"

namespace kplan {

const SchemeTables& Fp8Tables();

namespace {

const SchemeTables& Tables() {
  static const auto* t = [] {
    auto* t = new SchemeTables(Fp8Tables());
    t->scheme = "mxfp8";
    t->map_name = "MXFP8";
    t->display_name = "MXFP8";
    t->log_name = "Mxfp8";
    for (BackendDef& b : t->backends) {
      // DeepGemmExperts directly: the Triton fallback wrapper cannot do 1x32 blocks.
      if (b.name == "DEEPGEMM") b.experts = {"DeepGemmExperts"};
      // ROCm fallback: BF16 dequantisation at load.
      if (b.name == "EMULATION") b.experts = {"Mxfp8EmulationExperts"};
    }
    // _BACKEND_NAME_MAP, dict order ("xpu" is not a MoEBackend value: programmatic only).
    t->user_map = {{"flashinfer_trtllm", "FLASHINFER_TRTLLM"}, {"deep_gemm", "DEEPGEMM"},
                   {"marlin", "MARLIN"},   {"xpu", "XPU"},
                   {"aiter", "AITER_MXFP8"}, {"triton", "TRITON_MXFP8"},
                   {"humming", "HUMMING"}};
    t->kplan_map = {};
    t->batched = {};
    t->kplan_auto = {};
    return t;
  }();
  return *t;
}

// _SUPPORTED_BACKENDS
const std::vector<absl::string_view> kList = {"FLASHINFER_TRTLLM", "DEEPGEMM", "MARLIN",
                                              "XPU", "AITER_MXFP8", "HUMMING"};

class Mxfp8MoEKernelOracle final : public MoEKernelOracle {
 public:
  Mxfp8MoEKernelOracle() : MoEKernelOracle(Tables()) {}

  std::vector<const ExpertsClass*> BackendToKernelCls(int b,
                                                      const SelectionContext& c) const override {
    if (def(b).name == "TRITON_MXFP8") {
      // supports_mx() (gfx950): native MXFP8 Triton; elsewhere the emulated one.
      return {FindExpertsClass(RocmSupportsMx(c.platform) ? "Mxfp8NativeTritonExperts"
                                                          : "Mxfp8EmulationTritonExperts")};
    }
    return MoEKernelOracle::BackendToKernelCls(b, c);
  }

  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                       QuantKey a) const override {
    return Build(kList, {}, c, w, a);
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    Selection s;
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(int b, MapBackend(c.moe.moe_backend));
      s.potential = {b};
      std::string reason;
      if (const ExpertsClass* e = TryBackend(b, c, w, a, s, &reason)) {
        s.backend = b;
        s.experts = e;
        s.activation_key = a;
        return s;
      }
      return InvalidField("moe_backend", absl::StrCat("No supported MXFP8 expert class for ",
                                                      def(b).value, ": ", reason));
    }
    s = Loop(GetPriorityBackends(c, w, a), c, w, a, std::move(s));
    if (s.backend >= 0) return s;
    if (c.platform.is_rocm()) {
      // ROCm fallback: native MXFP8 Triton on gfx950, else emulation.
      int b = RocmSupportsMx(c.platform) ? Find("TRITON_MXFP8") : Find("EMULATION");
      const ExpertsClass* e = BackendToKernelCls(b, c).front();
      s.candidates.push_back({std::string(def(b).name), std::string(e->name), true,
                              "ROCm fallback"});
      s.backend = b;
      s.experts = e;
      s.activation_key = a;
      s.forced = true;
      return s;
    }
    return absl::FailedPreconditionError("No MXFP8 MoE backends available.");
  }

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey, QuantKey) const override {
    return std::string("mxfp8 block_shape=[1, 32], is_scale_swizzled=False");
  }
};

}  // namespace

const MoEKernelOracle& Mxfp8Oracle() {
  static const auto* o = new Mxfp8MoEKernelOracle();
  return *o;
}

}  // namespace kplan
