// oracle/mxfp4.py: Mxfp4MoeBackend selection, the gpt-oss path
// (select_mxfp4_moe_backend) and the DeepSeek-V4 path
// (select_deepseek_v4_mxfp4_moe_backend). Each backend implies the
// activation key it runs with; user strings map to candidate lists.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/base/pyrepr.h"
#include "server/base/status.h"
#include "server/oracle/oracle.h"

namespace kplan {
namespace {

using Q = QuantKey;

const SchemeTables& Tables() {
  static const auto* t = new SchemeTables{
      "mxfp4", "MXFP4", "MXFP4", "Mxfp4",
      {
          // member, value, experts, _backend_activation_key()
          {"NONE", "None", {}},
          {"DEEPGEMM_MXFP4", "DEEPGEMM_MXFP4", {"DeepGemmFP4Experts"}, Q::kFp8Dynamic128Sym},
          {"FLASHINFER_TRTLLM_MXFP4_MXFP8", "FLASHINFER_TRTLLM_MXFP4_MXFP8",
           {"TrtLlmMxfp4ExpertsMonolithic", "TrtLlmMxfp4ExpertsModular"}, Q::kMxfp8Dynamic},
          {"FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_BF16",
           {"TrtLlmMxfp4ExpertsMonolithic", "TrtLlmMxfp4ExpertsModular"}},
          {"FLASHINFER_CUTLASS_MXFP4_MXFP8", "FLASHINFER_CUTLASS_MXFP4_MXFP8",
           {"FlashInferExperts"}, Q::kMxfp8Dynamic},
          {"FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_BF16",
           {"FlashInferExperts"}},
          {"BATCHED_MARLIN", "BATCHED_MARLIN", {"BatchedMarlinExperts"}},
          {"MARLIN", "MARLIN", {"MarlinExperts"}},
          {"AITER_MXFP4_BF16", "AITER_MXFP4_BF16", {"AiterExperts"}},  // alias AITER
          {"AITER_MXFP4_FP8", "AITER_MXFP4_FP8", {"AiterExperts"}, Q::kFp8StaticTensorSym},
          {"AITER_MXFP4_MXFP4", "AITER_MXFP4_MXFP4", {"AiterExperts"}, Q::kMxfp4Dynamic},
          {"TRITON", "TRITON", {"OAITritonMxfp4ExpertsMonolithic", "OAITritonExperts"}},
          {"TRITON_UNFUSED", "TRITON_UNFUSED", {"UnfusedOAITritonExperts"}},
          {"XPU", "XPU", {"XPUExpertsMxFp4"}},
          {"CPU", "CPU", {"CPUExpertsMxfp4"}},
          {"EMULATION", "EMULATION", {"Mxfp4EmulationExperts"}},
          {"HUMMING", "HUMMING",
           {"BatchedHummingGroupedExperts", "HummingGroupedExperts", "HummingIndexedExperts"}},
      },
      {},  // map_mxfp4_backend returns lists: see kUserMap
      {},
      {{"MARLIN", "BATCHED_MARLIN"}},
      {},
  };
  return *t;
}

// map_mxfp4_backend, dict order: user string -> candidate list. Several keys
// are not MoEBackend values (programmatic only).
struct UserRow {
  absl::string_view user;
  std::vector<absl::string_view> members;
};
const std::vector<UserRow> kUserMap = {
    {"deep_gemm", {"DEEPGEMM_MXFP4"}},
    {"flashinfer_trtllm", {"FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8"}},
    {"flashinfer_trtllm_afp8", {"FLASHINFER_TRTLLM_MXFP4_MXFP8"}},
    {"flashinfer_cutlass", {"FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"}},
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
};

// gpt-oss auto list (TRITON_UNFUSED disabled upstream: "bug with MTP support").
const std::vector<absl::string_view> kGptOssList = {
    "FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8", "AITER_MXFP4_BF16",
    "AITER_MXFP4_FP8",              "AITER_MXFP4_MXFP4",             "TRITON",
    "FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8", "MARLIN",
    "BATCHED_MARLIN",               "XPU",                           "EMULATION"};

int RoundUp(int x, int m) { return (x + m - 1) / m * m; }

class Mxfp4Base : public MoEKernelOracle {
 public:
  Mxfp4Base() : MoEKernelOracle(Tables()) {}

  absl::StatusOr<std::vector<int>> MapCandidates(absl::string_view user) const {
    for (const UserRow& row : kUserMap) {
      if (row.user != user) continue;
      std::vector<int> out;
      for (absl::string_view m : row.members) out.push_back(Find(m));
      return out;
    }
    std::vector<std::string> keys;
    for (const UserRow& row : kUserMap) keys.emplace_back(row.user);
    return InvalidField("moe_backend",
                        absl::StrCat("moe_backend=", PyRepr(user),
                                     " is not supported for MXFP4 MoE. Expected one of ",
                                     PyRepr(keys), "."));
  }

  absl::StatusOr<int> MapBackend(absl::string_view user) const override {
    KPLAN_ASSIGN_OR_RETURN(std::vector<int> c, MapCandidates(user));
    return c.front();
  }

  // Tries explicit candidates in order, each with its implied activation key;
  // re-raises the last ValueError.
  absl::StatusOr<Selection> TryExplicit(const std::vector<int>& cands, const SelectionContext& c,
                                        QuantKey w, Selection s) const {
    std::string message;
    s.potential = cands;
    for (int cand : cands) {
      const int b = MaybeBatched(cand, c);
      const QuantKey a = def(b).implied_activation;
      std::string reason;
      if (const ExpertsClass* e = TryBackend(b, c, w, a, s, &reason)) {
        s.backend = b;
        s.experts = e;
        s.activation_key = a;
        return s;
      }
      message = absl::StrCat("MXFP4 MoE backend ", def(b).value,
                             " does not support the deployment configuration since ", reason, ".");
    }
    return InvalidField("moe_backend", message);
  }

  Selection LoopImplied(const std::vector<int>& list, const SelectionContext& c, QuantKey w,
                        Selection s) const {
    s.potential = list;
    for (int b : list) {
      QuantKey a = def(b).implied_activation;
      if (const ExpertsClass* e = TryBackend(b, c, w, a, s, nullptr)) {
        s.backend = b;
        s.experts = e;
        s.activation_key = a;
        return s;
      }
    }
    s.backend = -1;
    return s;
  }

  // mxfp4_round_up_hidden_size_and_intermediate_size(backend, H, I).
  std::pair<int, int> RoundUpSizes(int b, const SelectionContext& c, int h,
                                   int i) const override {
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
  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                       QuantKey a) const override {
    return Build(kGptOssList, {}, c, w, a);
  }

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

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    Selection s;
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(std::vector<int> cands, MapCandidates(c.moe.moe_backend));
      std::vector<int> kept = FilterByActivation(cands, a);
      if (kept.empty()) {
        std::vector<std::string> names;
        for (int b : cands) names.emplace_back(def(b).name);
        return InvalidField("moe_backend",
                            absl::StrCat("moe_backend=", PyRepr(c.moe.moe_backend),
                                         " does not support activation=", QuantKeyName(a),
                                         "; supported variants: ", PyRepr(names)));
      }
      return TryExplicit(kept, c, w, s);
    }
    std::vector<int> list = FilterByActivation(GetPriorityBackends(c, w, a), a);
    s = LoopImplied(list, c, w, std::move(s));
    if (s.backend >= 0) return s;
    // Platform fallbacks when nothing native passes.
    absl::string_view forced;
    if (c.platform.is_xpu()) forced = "XPU";
    else if (c.platform.is_cpu()) forced = "CPU";
    else if (c.platform.is_rocm()) forced = "TRITON_UNFUSED";
    if (!forced.empty()) {
      int b = Find(forced);
      const ExpertsClass* e = FindExpertsClass(def(b).experts.front());
      s.candidates.push_back({std::string(forced), std::string(e->name), true,
                              "platform fallback"});
      s.backend = b;
      s.experts = e;
      s.activation_key = QuantKey::kNone;
      s.forced = true;
      return s;
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
};

// DeepSeek-V4 MXFP4 checkpoints.
class DeepseekV4Mxfp4MoEKernelOracle final : public Mxfp4Base {
 public:
  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                       QuantKey a) const override {
    if (c.platform.is_rocm()) {
      if (c.moe.routing_method == RoutingMethodType::kDeepseekV4) {
        return Build({"AITER_MXFP4_BF16", "TRITON_UNFUSED"}, {}, c, w, a);
      }
      return Build({"AITER_MXFP4_BF16"}, {}, c, w, a);
    }
    if (c.platform.is_xpu()) return Build({"XPU"}, {}, c, w, a);
    if (c.platform.is_cuda()) {
      return Build({"FLASHINFER_TRTLLM_MXFP4_MXFP8", "DEEPGEMM_MXFP4", "MARLIN", "BATCHED_MARLIN"},
                   {}, c, w, a);
    }
    return {};
  }

  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                          QuantKey a) const override {
    Selection s;
    if (c.moe.moe_backend != "auto") {
      KPLAN_ASSIGN_OR_RETURN(std::vector<int> cands, MapCandidates(c.moe.moe_backend));
      return TryExplicit(cands, c, w, s);
    }
    s = LoopImplied(GetPriorityBackends(c, w, a), c, w, std::move(s));
    if (s.backend < 0) {
      return absl::FailedPreconditionError(
          "No MXFP4 MoE backend supports the deployment configuration.");
    }
    return s;
  }
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
