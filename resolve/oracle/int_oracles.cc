// oracle/int8.py (W8A8-int8), oracle/int_wna16.py (weight-only int4/int8),
// oracle/w4a8.py (int4 x fp8) and oracle/w4a8_int8.py (CPU int4 x int8).
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "resolve/oracle/oracle.h"

namespace kplan {
namespace {

bool IsCpu(const SelectionContext& c, QuantKey, QuantKey) { return c.platform.is_cpu(); }
bool Cpu(const SelectionContext& c) { return c.platform.is_cpu(); }
bool Xpu(const SelectionContext& c) { return c.platform.is_xpu(); }

// --- Int8 -------------------------------------------------------------------
const SchemeTables& Int8Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "int8",
      .map_name = "Int8",
      .display_name = "Int8",
      .log_name = "Int8",
      .backends =
          {
              {"TRITON", "TRITON", {"TritonExperts"}},
              {"HUMMING",
               "HUMMING",
               {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
              {"CPU", "CPU", {"CPUExpertsInt8"}},
              // kplan's emulation joins the int8 family.
              {"EMULATION", "EMULATION", {"KplanEmulationExperts"}},
          },
      .user_map = {{"triton", {"TRITON"}}, {"humming", {"HUMMING"}}},
      .kplan_map = {{"emulation", {"EMULATION"}}},
      // CPU moved to the front on CPU.
      .priority = {{nullptr, {"TRITON", "HUMMING", "CPU"}, {{IsCpu, "CPU", true}}}},
      .kplan_auto = {"EMULATION"},
  };
  return *t;
}

class Int8MoEKernelOracle final : public MoEKernelOracle {
 public:
  Int8MoEKernelOracle() : MoEKernelOracle(Int8Tables()) {}

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey, QuantKey) const override {
    return std::string("int8_w8a8 per-channel weights, per-token activations");
  }
};

// --- WNA16 ------------------------------------------------------------------
const SchemeTables& Wna16Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "wna16",
      .map_name = "WNA16",
      .display_name = "WNA16",
      .log_name = "WNA16",
      .backends =
          {
              {"MARLIN", "MARLIN", {"MarlinExperts"}},
              {"BATCHED_MARLIN", "BATCHED_MARLIN", {"BatchedMarlinExperts"}},
              {"HUMMING",
               "HUMMING",
               {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
              {"CPU", "CPU", {"cpu_moe.CPUExpertsInt4"}},
              {"FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM", {"TrtLlmMxint4ExpertsMonolithic"}},
              {"XPU", "XPU", {"XPUExpertsWNA16"}},
              // vLLM's emulation first; kplan's emulation where vLLM's cannot run.
              {"EMULATION", "EMULATION", {"WNA16EmulationExperts", "KplanEmulationExperts"}},
              // kplan's own kernels for int8 / int4 group-scaled weights.
              {"KPLAN", "KPLAN", {"KplanDequantExperts", "KplanQuantDecodeExperts"}},
          },
      .user_map = {{"marlin", {"MARLIN"}},
                   {"humming", {"HUMMING"}},
                   {"flashinfer_trtllm", {"FLASHINFER_TRTLLM"}},
                   {"emulation", {"EMULATION"}}},
      .kplan_map = {{"kplan", {"KPLAN"}}},
      .batched = {{"MARLIN", "BATCHED_MARLIN"}},
      .priority = {{Cpu, {"CPU"}, {}},
                   {Xpu, {"XPU"}, {}},
                   {nullptr,
                    {"FLASHINFER_TRTLLM", "MARLIN", "BATCHED_MARLIN", "HUMMING", "EMULATION"},
                    {}}},
      .kplan_auto = {"KPLAN"},
      // Weight-only: the activation key is always None.
      .activation_key = ActivationKeyRule::kNone,
      // "Using 'V' WNA16 MoE backend.", "WNA16 MoE backend 'V' does not support ..."
      .log_quotes_backend = true,
      .error_quotes_backend = true,
      .log_lists_potential = false,
  };
  return *t;
}

class Wna16MoEKernelOracle final : public MoEKernelOracle {
 public:
  Wna16MoEKernelOracle() : MoEKernelOracle(Wna16Tables()) {}

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey w, QuantKey) const override {
    if (w == QuantKey::kInt8Static) return std::string("int8_w8a16");
    const int group = (w == QuantKey::kInt4Static32 || w == QuantKey::kInt4Static32Asym) ? 32 : -1;
    return absl::StrCat("int4_w4a16 block_shape=[0, ", group, "]");
  }
};

// --- W4A8 (int4 x fp8) -------------------------------------------------------
const SchemeTables& W4a8Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "w4a8",
      .map_name = "W4A8",
      .display_name = "W4A8",
      .log_name = "W4A8",
      .backends = {{"CUTLASS", "CUTLASS", {"CutlassExpertsW4A8Fp8"}}},
      .priority = {{nullptr, {"CUTLASS"}, {}}},
      .log_lists_potential = false,  // "Using CUTLASS W4A8 MoE backend."
      .ignores_moe_backend = true,   // its one backend, whatever moe_backend says
  };
  return *t;
}

class W4a8MoEKernelOracle final : public MoEKernelOracle {
 public:
  W4a8MoEKernelOracle() : MoEKernelOracle(W4a8Tables()) {}

 protected:
  // select_w4a8_moe_backend(): its single backend failing, explicit or not,
  // is NotImplementedError("W4A8 MoE backend CUTLASS does not support the
  // deployment configuration: <reason>.").
  absl::Status ExplicitError(int b, const std::string& reason) const override {
    return absl::FailedPreconditionError(
        absl::StrCat("W4A8 MoE backend ", def(b).value,
                     " does not support the deployment configuration: ", reason, "."));
  }
  absl::StatusOr<Selection> OnExhausted(const SelectionContext&, QuantKey, QuantKey, Selection,
                                        const std::string& last_reason) const override {
    return ExplicitError(Find("CUTLASS"), last_reason);
  }
};

// --- W4A8-INT8 (CPU) ----------------------------------------------------------
const SchemeTables& W4a8Int8Tables() {
  static const auto* t = new SchemeTables{
      .scheme = "w4a8_int8",
      .map_name = "W4A8 Int8",
      .display_name = "W4A8 Int8",
      .log_name = "W4A8 Int8",
      .backends = {{"CPU_INT4", "CPU_INT4", {"cpu_int4_moe.CPUExpertsInt4"}}},
      .user_map = {{"cpu", {"CPU_INT4"}}},
      .priority = {{nullptr, {"CPU_INT4"}, {}}},
  };
  return *t;
}

class W4a8Int8MoEKernelOracle final : public MoEKernelOracle {
 public:
  W4a8Int8MoEKernelOracle() : MoEKernelOracle(W4a8Int8Tables()) {}

 protected:
  // select_w4a8_int8_moe_backend(): CPU platforms only.
  std::optional<absl::StatusOr<Selection>> Bypass(const SelectionContext& c, QuantKey,
                                                  QuantKey) const override {
    if (c.platform.is_cpu()) return std::nullopt;
    return absl::FailedPreconditionError("W4A8 Int8 MoE is only supported on CPU platforms");
  }
};

}  // namespace

const MoEKernelOracle& Int8Oracle() {
  static const auto* o = new Int8MoEKernelOracle();
  return *o;
}
const MoEKernelOracle& Wna16Oracle() {
  static const auto* o = new Wna16MoEKernelOracle();
  return *o;
}
const MoEKernelOracle& W4a8Oracle() {
  static const auto* o = new W4a8MoEKernelOracle();
  return *o;
}
const MoEKernelOracle& W4a8Int8Oracle() {
  static const auto* o = new W4a8Int8MoEKernelOracle();
  return *o;
}

}  // namespace kplan
