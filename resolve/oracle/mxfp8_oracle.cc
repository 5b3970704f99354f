// oracle/mxfp8.py: MXFP8 selection over the shared Fp8MoeBackend enum.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "resolve/oracle/oracle.h"

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
    t->log_quotes_backend = true;  // "Using 'V' Mxfp8 MoE backend ..."
    for (BackendDef& b : t->backends) {
      // DeepGemmExperts directly: the Triton fallback wrapper cannot do 1x32 blocks.
      if (b.name == "DEEPGEMM") b.experts = {"DeepGemmExperts"};
      // ROCm fallback: BF16 dequantisation at load.
      if (b.name == "EMULATION") b.experts = {"Mxfp8EmulationTritonExperts"};
    }
    // _BACKEND_NAME_MAP, dict order ("xpu" is not a MoEBackend value: programmatic only).
    t->user_map = {{"flashinfer_trtllm", {"FLASHINFER_TRTLLM"}},
                   {"deep_gemm", {"DEEPGEMM"}},
                   {"marlin", {"MARLIN"}},
                   {"xpu", {"XPU"}},
                   {"aiter", {"AITER_MXFP8"}},
                   {"triton", {"TRITON_MXFP8"}},
                   {"humming", {"HUMMING"}}};
    t->kplan_map = {};
    t->batched = {};
    // _SUPPORTED_BACKENDS, every platform.
    t->priority = {{nullptr,
                    {"FLASHINFER_TRTLLM", "DEEPGEMM", "MARLIN", "XPU", "AITER_MXFP8", "HUMMING"},
                    {}}};
    t->kplan_auto = {};
    return t;
  }();
  return *t;
}

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

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey, QuantKey) const override {
    return std::string("mxfp8 block_shape=[1, 32], is_scale_swizzled=False");
  }

 protected:
  // select_mxfp8_moe_backend(): an explicit backend without a supported class
  // raises ValueError("No supported MXFP8 expert class for <value>: <reason>").
  absl::Status ExplicitError(int b, const std::string& reason) const override {
    return InvalidField("moe_backend", absl::StrCat("No supported MXFP8 expert class for ",
                                                    def(b).value, ": ", reason));
  }
  // Exhausted: ROCm falls back to native MXFP8 Triton on gfx950, else to
  // emulation (BF16 dequantisation at load); elsewhere ValueError("No MXFP8
  // MoE backends available.").
  absl::StatusOr<Selection> OnExhausted(const SelectionContext& c, QuantKey, QuantKey a,
                                        Selection s, const std::string&) const override {
    if (!c.platform.is_rocm()) {
      return absl::FailedPreconditionError("No MXFP8 MoE backends available.");
    }
    const absl::string_view member = RocmSupportsMx(c.platform) ? "TRITON_MXFP8" : "EMULATION";
    const ExpertsClass* e = BackendToKernelCls(Find(member), c).front();
    return Fallback(member, e, "ROCm fallback", a, std::move(s));
  }
};

}  // namespace

const MoEKernelOracle& Mxfp8Oracle() {
  static const auto* o = new Mxfp8MoEKernelOracle();
  return *o;
}

}  // namespace kplan
