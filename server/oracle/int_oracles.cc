// oracle/int8.py (W8A8-int8), oracle/int_wna16.py (weight-only int4/int8),
// oracle/w4a8.py (int4 x fp8) and oracle/w4a8_int8.py (CPU int4 x int8).
#include "absl/strings/str_cat.h"
#include "server/base/status.h"
#include "server/oracle/oracle.h"

namespace kplan {
namespace {

bool IsCpu(const SelectionContext& c, QuantKey, QuantKey) { return c.platform.is_cpu(); }

// --- Int8 -------------------------------------------------------------------
const SchemeTables& Int8Tables() {
  static const auto* t = new SchemeTables{
      "int8", "Int8", "Int8", "Int8",
      {
          {"TRITON", "TRITON", {"TritonExperts"}},
          {"HUMMING", "HUMMING",
           {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
          {"CPU", "CPU", {"CPUExpertsInt8"}},
          // kplan's emulation joins the int8 family.
          {"EMULATION", "EMULATION", {"KplanEmulationExperts"}},
      },
      {{"triton", "TRITON"}, {"humming", "HUMMING"}},
      {{"emulation", "EMULATION"}},
      {},
      {"EMULATION"},
  };
  return *t;
}

class Int8MoEKernelOracle final : public MoEKernelOracle {
 public:
  Int8MoEKernelOracle() : MoEKernelOracle(Int8Tables()) {}

  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                       QuantKey a) const override {
    std::vector<int> list = Build({"TRITON", "HUMMING", "CPU"}, {{IsCpu, "CPU", true}}, c, w, a);
    AppendKplan(list, c);
    return list;
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    Selection s;
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(int b, MapBackend(c.moe.moe_backend));
      return ReturnOrRaise(MaybeBatched(b, c), c, w, a, s, false);
    }
    s = Loop(GetPriorityBackends(c, w, a), c, w, a, std::move(s));
    if (s.backend < 0) return Exhausted();
    return s;
  }

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey, QuantKey) const override {
    return std::string("int8_w8a8 per-channel weights, per-token activations");
  }
};

// --- WNA16 ------------------------------------------------------------------
const SchemeTables& Wna16Tables() {
  static const auto* t = new SchemeTables{
      "wna16", "WNA16", "WNA16", "WNA16",
      {
          {"MARLIN", "MARLIN", {"MarlinExperts"}},
          {"BATCHED_MARLIN", "BATCHED_MARLIN", {"BatchedMarlinExperts"}},
          {"HUMMING", "HUMMING",
           {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
          {"CPU", "CPU", {"CPUExpertsWNA16"}},
          {"FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM", {"TrtLlmMxint4ExpertsMonolithic"}},
          {"XPU", "XPU", {"XPUExpertsWNA16"}},
          // vLLM's emulation first; kplan's emulation where vLLM's cannot run.
          {"EMULATION", "EMULATION", {"WNA16EmulationExperts", "KplanEmulationExperts"}},
      },
      {{"marlin", "MARLIN"},
       {"humming", "HUMMING"},
       {"flashinfer_trtllm", "FLASHINFER_TRTLLM"},
       {"emulation", "EMULATION"}},
      {},
      {{"MARLIN", "BATCHED_MARLIN"}},
      {},
  };
  return *t;
}

class Wna16MoEKernelOracle final : public MoEKernelOracle {
 public:
  Wna16MoEKernelOracle() : MoEKernelOracle(Wna16Tables()) {}

  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                       QuantKey a) const override {
    if (c.platform.is_cpu()) return {Find("CPU")};
    if (c.platform.is_xpu()) return {Find("XPU")};
    return Build({"FLASHINFER_TRTLLM", "MARLIN", "BATCHED_MARLIN", "HUMMING", "EMULATION"}, {}, c,
                 w, a);
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey) const override {
    // Weight-only: the activation key is always None.
    const QuantKey a = QuantKey::kNone;
    Selection s;
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(int b, MapBackend(c.moe.moe_backend));
      return ReturnOrRaise(MaybeBatched(b, c), c, w, a, s, false);
    }
    s = Loop(GetPriorityBackends(c, w, a), c, w, a, std::move(s));
    if (s.backend < 0) return Exhausted();
    return s;
  }

  absl::StatusOr<std::string> MakeQuantConfig(int, QuantKey w, QuantKey) const override {
    if (w == QuantKey::kInt8Static) return std::string("int8_w8a16");
    const int group = (w == QuantKey::kInt4Static32 || w == QuantKey::kInt4Static32Asym) ? 32 : -1;
    return absl::StrCat("int4_w4a16 block_shape=[0, ", group, "]");
  }
};

// --- W4A8 (int4 x fp8) -------------------------------------------------------
const SchemeTables& W4a8Tables() {
  static const auto* t = new SchemeTables{
      "w4a8", "W4A8", "W4A8", "W4A8",
      {{"CUTLASS", "CUTLASS", {"CutlassExpertsW4A8Fp8"}}},
      {{"cutlass", "CUTLASS"}},
      {},
      {},
      {},
  };
  return *t;
}

class W4a8MoEKernelOracle final : public MoEKernelOracle {
 public:
  W4a8MoEKernelOracle() : MoEKernelOracle(W4a8Tables()) {}

  std::vector<int> GetPriorityBackends(const SelectionContext&, QuantKey, QuantKey) const override {
    return {Find("CUTLASS")};
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    Selection s;
    int b = Find("CUTLASS");
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(b, MapBackend(c.moe.moe_backend));
    }
    s.potential = {b};
    std::string reason;
    if (const ExpertsClass* e = TryBackend(b, c, w, a, s, &reason)) {
      s.backend = b;
      s.experts = e;
      s.activation_key = a;
      return s;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "W4A8 MoE backend CUTLASS does not support the deployment configuration: ", reason, "."));
  }
};

// --- W4A8-INT8 (CPU) ----------------------------------------------------------
const SchemeTables& W4a8Int8Tables() {
  static const auto* t = new SchemeTables{
      "w4a8_int8", "W4A8 Int8", "W4A8 Int8", "W4A8 Int8",
      {{"CPU_INT4", "CPU_INT4", {"CPUExpertsW4A8Int8"}}},
      {{"cpu", "CPU_INT4"}},
      {},
      {},
      {},
  };
  return *t;
}

class W4a8Int8MoEKernelOracle final : public MoEKernelOracle {
 public:
  W4a8Int8MoEKernelOracle() : MoEKernelOracle(W4a8Int8Tables()) {}

  std::vector<int> GetPriorityBackends(const SelectionContext&, QuantKey, QuantKey) const override {
    return {Find("CPU_INT4")};
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    if (!c.platform.is_cpu()) {
      return absl::FailedPreconditionError("W4A8 Int8 MoE is only supported on CPU platforms");
    }
    Selection s;
    int b = Find("CPU_INT4");
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(b, MapBackend(c.moe.moe_backend));
    }
    s.potential = {b};
    return ReturnOrRaise(b, c, w, a, s, false);
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
