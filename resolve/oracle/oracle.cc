#include "resolve/oracle/oracle.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/pyrepr.h"
#include "base/status.h"

namespace kplan {

std::string PyFloat(float v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

int MoEKernelOracle::Find(absl::string_view member) const {
  for (size_t i = 0; i < t_.backends.size(); ++i) {
    if (t_.backends[i].name == member) return static_cast<int>(i);
  }
  return -1;
}

std::vector<const ExpertsClass*> MoEKernelOracle::BackendToKernelCls(
    int b, const SelectionContext&) const {
  std::vector<const ExpertsClass*> out;
  for (absl::string_view name : t_.backends[b].experts) {
    if (const ExpertsClass* e = FindExpertsClass(name)) out.push_back(e);
  }
  return out;
}

absl::StatusOr<std::vector<int>> MoEKernelOracle::MapCandidates(absl::string_view moe_backend,
                                                                bool kplan_listed) const {
  auto members = [this](const UserMapRow& row) {
    std::vector<int> out;
    for (absl::string_view m : row.members) out.push_back(Find(m));
    return out;
  };
  for (const UserMapRow& row : t_.user_map) {
    if (row.user == moe_backend) return members(row);
  }
  // kplan's family joins the map only where the platform lists `kplan`;
  // elsewhere its names are as foreign to the scheme as to vLLM.
  if (kplan_listed) {
    for (const UserMapRow& row : t_.kplan_map) {
      if (row.user == moe_backend) return members(row);
    }
  }
  std::vector<std::string> keys;
  for (const UserMapRow& row : t_.user_map) keys.emplace_back(row.user);
  return InvalidField("moe_backend",
                      absl::StrCat("moe_backend=", PyRepr(moe_backend), " is not supported for ",
                                   t_.map_name, " MoE. Expected one of ", PyRepr(keys), "."));
}

absl::StatusOr<int> MoEKernelOracle::MapBackend(absl::string_view moe_backend,
                                                bool kplan_listed) const {
  KPLAN_ASSIGN_OR_RETURN(std::vector<int> candidates, MapCandidates(moe_backend, kplan_listed));
  return candidates.front();
}

ActivationFormat MoEKernelOracle::Format(const SelectionContext& c) const {
  // [newer] an explicit batched_triton (unquantized) picks the batched format
  // itself; kplan_batched does the same for kplan's family.
  const bool batched = c.pc().use_batched_activation_format() ||
                       c.moe.moe_backend == "kplan_batched" ||
                       (t_.scheme == "unquantized" && c.moe.moe_backend == "batched_triton");
  return batched ? ActivationFormat::kBatchedExperts : ActivationFormat::kStandard;
}

int MoEKernelOracle::MaybeBatched(int b, const SelectionContext& c) const {
  if (b < 0 || Format(c) != ActivationFormat::kBatchedExperts) return b;
  for (const auto& [from, to] : t_.batched) {
    if (t_.backends[b].name == from) return Find(to);
  }
  return b;
}

QuantKey MoEKernelOracle::KeyFor(int b, QuantKey a) const {
  switch (t_.activation_key) {
    case ActivationKeyRule::kNone:
      return QuantKey::kNone;
    case ActivationKeyRule::kImplied:
      return t_.backends[b].implied_activation;
    case ActivationKeyRule::kAsGiven:
      break;
  }
  return a;
}

const ExpertsClass* MoEKernelOracle::TryBackend(int b, const SelectionContext& c, QuantKey w,
                                                QuantKey a, Selection& s,
                                                std::string* last_reason) const {
  const ActivationFormat fmt = Format(c);
  for (const ExpertsClass* e : BackendToKernelCls(b, c)) {
    if (c.executable_only && !e->kplan_executable) continue;
    SupportVerdict v = IsSupportedConfig(*e, c, w, a, fmt);
    s.candidates.push_back(
        {std::string(t_.backends[b].name), std::string(e->name), v.ok, v.reason});
    if (v.ok) return e;
    if (last_reason != nullptr) *last_reason = std::move(v.reason);
  }
  return nullptr;
}

namespace {

// The backend's value as the scheme's messages print it.
std::string BackendText(const SchemeTables& t, int b, bool quoted) {
  return quoted ? absl::StrCat("'", t.backends[b].value, "'") : std::string(t.backends[b].value);
}

// "<X> MoE backend <value> does not support the deployment configuration since <reason>."
std::string ReturnOrRaiseText(const SchemeTables& t, int b, absl::string_view reason) {
  return absl::StrCat(t.display_name, " MoE backend ", BackendText(t, b, t.error_quotes_backend),
                      " does not support the deployment configuration since ", reason, ".");
}

}  // namespace

absl::Status MoEKernelOracle::ExplicitError(int b, const std::string& reason) const {
  return InvalidField("moe_backend", ReturnOrRaiseText(t_, b, reason));
}

absl::StatusOr<Selection> MoEKernelOracle::ReturnOrRaise(int b, const SelectionContext& c,
                                                         QuantKey w, QuantKey a, Selection s,
                                                         bool forced) const {
  std::string reason;
  if (const ExpertsClass* e = TryBackend(b, c, w, a, s, &reason)) {
    s.backend = b;
    s.experts = e;
    s.activation_key = a;
    s.forced = forced;
    return s;
  }
  if (forced) return absl::InvalidArgumentError(ReturnOrRaiseText(t_, b, reason));
  return InvalidField("moe_backend", ReturnOrRaiseText(t_, b, reason));
}

absl::StatusOr<Selection> MoEKernelOracle::TryExplicit(const std::vector<int>& candidates,
                                                       const SelectionContext& c, QuantKey w,
                                                       QuantKey a, Selection s) const {
  // _make_log_backend() names the scheme's priority list on this path too
  // (mxfp4: the mapped candidates).
  s.potential = t_.log_candidates ? candidates : GetPriorityBackends(c, w, a);
  absl::Status error = absl::InternalError("moe_backend maps to no candidate");
  for (int candidate : candidates) {
    const int b = MaybeBatched(candidate, c);
    const QuantKey key = KeyFor(b, a);
    std::string reason;
    if (const ExpertsClass* e = TryBackend(b, c, w, key, s, &reason)) {
      s.backend = b;
      s.experts = e;
      s.activation_key = key;
      return s;
    }
    error = ExplicitError(b, reason);  // vLLM re-raises the last ValueError
  }
  return error;
}

Selection MoEKernelOracle::Loop(const std::vector<int>& list, const SelectionContext& c, QuantKey w,
                                QuantKey a, Selection s, std::string* last_reason) const {
  s.potential = list;
  for (int b : list) {
    const QuantKey key = KeyFor(b, a);
    if (const ExpertsClass* e = TryBackend(b, c, w, key, s, last_reason)) {
      s.backend = b;
      s.experts = e;
      s.activation_key = key;
      return s;
    }
  }
  s.backend = -1;
  return s;
}

absl::Status MoEKernelOracle::Exhausted() const {
  return absl::FailedPreconditionError(
      absl::StrCat("No ", t_.display_name, " MoE backend supports the deployment configuration."));
}

absl::StatusOr<Selection> MoEKernelOracle::OnExhausted(const SelectionContext&, QuantKey, QuantKey,
                                                       Selection, const std::string&) const {
  return Exhausted();
}

Selection MoEKernelOracle::Fallback(absl::string_view member, const ExpertsClass* e,
                                    absl::string_view why, QuantKey a, Selection s) const {
  s.candidates.push_back({std::string(member), std::string(e->name), true, std::string(why)});
  s.backend = Find(member);
  s.experts = e;
  s.activation_key = a;
  s.forced = true;
  return s;
}

bool MoEKernelOracle::IsAuto(absl::string_view moe_backend) const {
  return t_.ignores_moe_backend || moe_backend == "auto" ||
         std::find(t_.auto_aliases.begin(), t_.auto_aliases.end(), moe_backend) !=
             t_.auto_aliases.end();
}

absl::StatusOr<Selection> MoEKernelOracle::SelectBackend(const SelectionContext& c, QuantKey w,
                                                         QuantKey a) const {
  if (t_.activation_key == ActivationKeyRule::kNone) a = QuantKey::kNone;
  if (std::optional<absl::StatusOr<Selection>> decided = Bypass(c, w, a)) {
    return *std::move(decided);
  }
  Selection s;
  const std::string& requested = c.moe.moe_backend;
  if (!IsAuto(requested)) {
    // Explicit requests map the user string and never fall back.
    KPLAN_ASSIGN_OR_RETURN(std::vector<int> candidates,
                           MapCandidates(requested, c.platform.HasLibrary("kplan")));
    KPLAN_RETURN_IF_ERROR(CheckExplicit(c, candidates, a));
    return TryExplicit(candidates, c, w, a, std::move(s));
  }
  std::vector<int> list = GetPriorityBackends(c, w, a);
  s.potential = list;  // a forced backend's log line names the list before any removal
  if (const int forced = EnvOverrides(c, list); forced >= 0) {
    return ReturnOrRaise(forced, c, w, a, std::move(s), true);
  }
  std::string last_reason;
  s = Loop(list, c, w, a, std::move(s), &last_reason);
  if (s.backend >= 0) return s;
  return OnExhausted(c, w, a, std::move(s), last_reason);
}

std::vector<int> MoEKernelOracle::GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                                      QuantKey a) const {
  std::vector<int> list;
  for (const PriorityRow& row : t_.priority) {
    if (row.when != nullptr && !row.when(c)) continue;
    list = Build(row.backends, row.rules, c, w, a);
    break;
  }
  FilterPriority(c, a, list);
  AppendKplan(list, c);
  return list;
}

std::vector<int> MoEKernelOracle::Build(const std::vector<absl::string_view>& names,
                                        const std::vector<MoveRule>& rules,
                                        const SelectionContext& c, QuantKey w, QuantKey a) const {
  std::vector<int> list;
  list.reserve(names.size() + 4);
  for (absl::string_view n : names) list.push_back(Find(n));
  for (const MoveRule& r : rules) {
    if (!r.when(c, w, a)) continue;
    int b = Find(r.backend);
    auto it = std::find(list.begin(), list.end(), b);
    if (it == list.end()) continue;
    list.erase(it);
    if (r.to_front) {
      list.insert(list.begin(), b);
    } else {
      list.push_back(b);
    }
  }
  return list;
}

void MoEKernelOracle::Remove(std::vector<int>& list, absl::string_view member) const {
  int b = Find(member);
  list.erase(std::remove(list.begin(), list.end(), b), list.end());
}

int MoEKernelOracle::MemberOf(absl::string_view moe_backend, bool kplan_listed) const {
  absl::StatusOr<int> b = MapBackend(moe_backend, kplan_listed);
  return b.ok() ? *b : -1;
}

bool MoEKernelOracle::HasExecutableClass(int b, const SelectionContext& c) const {
  if (b < 0) return false;
  for (const ExpertsClass* e : BackendToKernelCls(b, c)) {
    if (e->kplan_executable) return true;
  }
  return false;
}

namespace {

// An explicit backend the resident experts cannot serve: vLLM's words and
// field, FAILED_PRECONDITION (a valid request this deployment cannot serve).
absl::Status CannotServe(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) return status;
  absl::Status out = absl::FailedPreconditionError(status.message());
  std::optional<std::string> field = FieldOf(status);
  return WithField(out, field ? *field : "moe_backend");
}

}  // namespace

absl::StatusOr<Selection> MoEKernelOracle::SelectExecutable(
    const SelectionContext& c, QuantKey w, QuantKey a, const std::vector<std::string>& runs) const {
  Selection s;
  if (!IsAuto(c.moe.moe_backend)) {
    if (std::find(runs.begin(), runs.end(), c.moe.moe_backend) == runs.end()) {
      return WithField(absl::FailedPreconditionError(absl::StrCat(
                           "moe_backend '", c.moe.moe_backend,
                           "' cannot run on this server; it runs: ", absl::StrJoin(runs, ", "))),
                       "moe_backend");
    }
    absl::StatusOr<int> b = MapBackend(c.moe.moe_backend, c.platform.HasLibrary("kplan"));
    if (!b.ok()) return CannotServe(b.status());
    absl::StatusOr<Selection> sel =
        ReturnOrRaise(MaybeBatched(*b, c), c, w, a, std::move(s), false);
    if (!sel.ok()) return CannotServe(sel.status());
    return sel;
  }
  auto has = [](const std::vector<int>& v, int b) {
    return std::find(v.begin(), v.end(), b) != v.end();
  };
  std::vector<int> allowed;  // the members behind `runs` that have a class of ours
  for (const std::string& name : runs) {
    const int b = MemberOf(name, c.platform.HasLibrary("kplan"));
    if (HasExecutableClass(b, c) && !has(allowed, b)) allowed.push_back(b);
  }
  std::vector<int> list;  // the platform's priority order, then the order of `runs`
  for (int b : GetPriorityBackends(c, w, a)) {
    if (has(allowed, b) && !has(list, b)) list.push_back(b);
  }
  for (int b : allowed) {
    if (!has(list, b)) list.push_back(b);
  }
  // kplan's kernels before its emulation, which runs anything (wna16 lists
  // vLLM's EMULATION ahead of the kplan members appended to it).
  const int emulation = Find("EMULATION");
  if (emulation >= 0 && has(list, emulation)) {
    list.erase(std::find(list.begin(), list.end(), emulation));
    list.push_back(emulation);
  }
  s = Loop(list, c, w, a, std::move(s));
  if (s.backend < 0) return Exhausted();
  return s;
}

void MoEKernelOracle::AppendKplan(std::vector<int>& list, const SelectionContext& c) const {
  if (!c.platform.HasLibrary("kplan")) return;
  for (absl::string_view n : t_.kplan_auto) {
    int b = Find(n);
    if (std::find(list.begin(), list.end(), b) == list.end()) list.push_back(b);
  }
}

std::string MoEKernelOracle::LogLine(const Selection& s) const {
  if (s.backend < 0 || s.experts == nullptr) return "";
  const std::string head = absl::StrCat("Using ", BackendText(t_, s.backend, t_.log_quotes_backend),
                                        " ", t_.log_name, " MoE backend");
  if (!t_.log_lists_potential) return absl::StrCat(head, ".");
  const std::vector<int>& pot = s.potential.empty() ? std::vector<int>{s.backend} : s.potential;
  std::vector<std::string> values;
  for (int b : pot) values.emplace_back(t_.backends[b].value);
  return absl::StrCat(head, " out of potential backends: ", PyRepr(values), ".");
}

std::string MoEKernelOracle::ConvertToKernelFormat(int b, const SelectionContext& c) const {
  if (b < 0) return "identity";
  absl::string_view n = t_.backends[b].name;
  const bool gated = c.moe.is_act_and_mul();
  if (absl::StartsWith(n, "KPLAN")) return "identity (row-major w13 [E, 2I, H], w2 [E, H, I])";
  if (n == "EMULATION") return "dequantize weights to the activation dtype at load";
  if (absl::StartsWith(n, "AITER")) return "shuffle w13/w2 (and scales) into AITER's tiled layout";
  if (absl::StartsWith(n, "FLASHINFER_CUTLASS")) {
    return gated ? "swap w13 halves to [w3; w1] for FlashInfer CUTLASS" : "identity";
  }
  if (absl::StartsWith(n, "FLASHINFER_TRTLLM")) {
    return "reorder w13 to [w3; w1], shuffle weights and scales into TRT-LLM-gen block layout";
  }
  if (absl::StartsWith(n, "FLASHINFER_CUTEDSL") || n == "FLASHINFER_B12X") {
    return "swizzle NVFP4 block scales for FlashInfer CuTeDSL";
  }
  if (absl::StrContains(n, "MARLIN")) return "repack weights and scales into Marlin tiles";
  if (absl::StrContains(n, "DEEPGEMM")) {
    return "DeepGEMM layout (scales transformed to UE8M0 where the GPU requires it)";
  }
  if (n == "VLLM_CUTLASS" || n == "BATCHED_VLLM_CUTLASS") {
    return "CUTLASS grouped-GEMM layout (w transposed stride, per-expert scales)";
  }
  return "identity";
}

absl::StatusOr<std::string> MoEKernelOracle::MakeQuantConfig(int, QuantKey w, QuantKey a) const {
  return absl::StrCat("FusedMoEQuantConfig(weight=", QuantKeyName(w),
                      ", activation=", QuantKeyName(a), ")");
}

absl::Status MoEKernelOracle::MakeKernel(const Selection& s, const SelectionContext& c,
                                         MoePlan& plan) const {
  plan.scheme = std::string(t_.scheme);
  if (s.backend < 0) {
    plan.backend = "NONE";
    plan.backend_value = "None";
  } else {
    plan.backend = std::string(t_.backends[s.backend].name);
    plan.backend_value = std::string(t_.backends[s.backend].value);
  }
  plan.candidates = s.candidates;
  plan.activation_key = std::string(QuantKeyName(s.activation_key));
  plan.weight_layout = s.backend < 0 ? "identity" : ConvertToKernelFormat(s.backend, c);
  plan.log_line = LogLine(s);
  plan.intermediate_size_per_partition = c.moe.intermediate_size_per_partition;
  plan.hidden_dim = c.moe.hidden_dim;
  plan.activation_format = std::string(ActivationFormatName(Format(c)));
  if (s.experts == nullptr) return absl::OkStatus();
  plan.experts_kernel = std::string(s.experts->name);
  plan.monolithic = s.experts->monolithic;
  plan.activation_format = std::string(ActivationFormatName(s.experts->format));
  plan.executable = s.experts->kplan_executable;
  KPLAN_ASSIGN_OR_RETURN(PrepareFinalizeChoice pf,
                         ChoosePrepareFinalize(c.pc(), *s.experts, s.activation_key));
  plan.prepare_finalize = pf.cls;
  plan.topk_indices_dtype = pf.topk_indices_dtype;
  plan.output_is_reduced = pf.output_is_reduced;
  auto [h, i] = RoundUpSizes(s.backend, c, plan.hidden_dim, plan.intermediate_size_per_partition);
  if (h != plan.hidden_dim || i != plan.intermediate_size_per_partition) {
    plan.weight_layout =
        absl::StrCat(plan.weight_layout, "; pad hidden ", plan.hidden_dim, " -> ", h,
                     ", intermediate ", plan.intermediate_size_per_partition, " -> ", i);
  }
  plan.hidden_dim = h;
  plan.intermediate_size_per_partition = i;
  return absl::OkStatus();
}

// --- prepare/finalize (all2all_utils.py maybe_make_prepare_finalize) -----------------

namespace {

bool IsFp8Key(QuantKey k) {
  switch (k) {
    case QuantKey::kFp8StaticTensorSym:
    case QuantKey::kFp8DynamicTensorSym:
    case QuantKey::kFp8StaticTokenSym:
    case QuantKey::kFp8DynamicTokenSym:
    case QuantKey::kFp8Dynamic128Sym:
      return true;
    default:
      return false;
  }
}

// One row per all2all backend used with all2all kernels (EP with DP/PCP/SP > 1).
struct PfRow {
  absl::string_view all2all;
  absl::string_view cls;
  ActivationFormat format;
  absl::string_view topk_dtype;
  bool reduced;
};
constexpr ActivationFormat kS = ActivationFormat::kStandard;
constexpr ActivationFormat kB = ActivationFormat::kBatchedExperts;
const PfRow kPfRows[] = {
    {"deepep_high_throughput", "DeepEPHTPrepareAndFinalize", kS, "int64", true},
    {"deepep_low_latency", "DeepEPLLPrepareAndFinalize", kB, "int64", true},
    {"deepep_v2", "DeepEPV2PrepareAndFinalize", kS, "int64", true},
    {"mori_high_throughput", "MoriPrepareAndFinalize", kS, "int32", true},
    {"mori_low_latency", "MoriPrepareAndFinalize", kS, "int32", true},
    {"flashinfer_all2allv", "FlashInferNVLinkTwoSidedPrepareAndFinalize", kS, "", true},
    {"flashinfer_nvlink_two_sided", "FlashInferNVLinkTwoSidedPrepareAndFinalize", kS, "", true},
    {"flashinfer_nvlink_one_sided", "FlashInferNVLinkOneSidedPrepareAndFinalize", kS, "int32",
     true},
    {"allgather_reducescatter", "MoEPrepareAndFinalizeNaiveDPEP", kS, "", false},
    {"nixl_ep", "NixlEPPrepareAndFinalize", kB, "int64", true},
    // kplan's own (server/moe/ep): vLLM's modular prepare/finalize shape with
    // an NCCL all-to-all-v that sends only the rows each rank's experts need
    // (the role of DeepEPHTPrepareAndFinalize); standard format, int32 ids,
    // the finalize combines at the source, so the output is reduced.
    {"kplan_all2allv", "KplanAll2AllVPrepareAndFinalize", kS, "int32", true},
};

// The passthrough binding (all2all_utils.py: backends that dispatch and
// combine themselves get a prepare/finalize whose prepare returns its input,
// as FlashInferMoeEpPrepareAndFinalize for the flashinfer_moe_ep_* backends).
// One row per self-dispatching family: its class, the top-k id dtype its
// kernels read, and whether its output is already reduced.
struct PassthroughPfRow {
  bool kplan;  // the experts are kplan's (moe_backend kplan_ep)
  absl::string_view cls;
  absl::string_view topk_dtype;
  bool reduced;
};
const PassthroughPfRow kPassthroughPfRows[] = {
    {false, "FlashInferMoeEpPrepareAndFinalize", "int32", true},  // vLLM flashinfer_moe_ep_*
    // kplan_ep: the kplan_ep transport writes rows into the peers and the
    // expert outputs back; int32 ids; combined at the source (reduced).
    {true, "KplanEpPrepareAndFinalize", "int32", true},
};

// DeepEP low-latency / NIXL-EP dispatch buffer hidden sizes.
constexpr int kLowLatencyHiddenSizes[] = {2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192};

int ItemSize(absl::string_view dtype) { return dtype == "float32" ? 4 : 2; }

}  // namespace

absl::StatusOr<PrepareFinalizeChoice> ChoosePrepareFinalize(const FusedMoEParallelConfig& pc,
                                                            const ExpertsClass& experts,
                                                            QuantKey activation_key) {
  PrepareFinalizeChoice pf;
  const absl::string_view suffix = experts.monolithic ? "Monolithic" : "Modular";
  if (pc.use_passthrough_kernels()) {
    // The backend dispatches and combines itself: prepare returns its input.
    for (const PassthroughPfRow& row : kPassthroughPfRows) {
      if (row.kplan != experts.kplan_executable) continue;
      pf.cls = std::string(row.cls);
      pf.topk_indices_dtype = std::string(row.topk_dtype);
      pf.output_is_reduced = row.reduced;
      return pf;
    }
  }
  if (!pc.use_all2all_kernels()) {
    if (experts.format == ActivationFormat::kBatchedExperts) {
      pf.cls = "BatchedPrepareAndFinalize";
      pf.format = ActivationFormat::kBatchedExperts;
    } else if (pc.dp_size > 1) {
      pf.cls = absl::StrCat("MoEPrepareAndFinalizeNaiveDPEP", suffix);
    } else {
      pf.cls = absl::StrCat("MoEPrepareAndFinalizeNoDPEP", suffix);
    }
    return pf;
  }
  for (const PfRow& row : kPfRows) {
    if (row.all2all != pc.all2all_backend) continue;
    if (row.all2all == "flashinfer_nvlink_one_sided") {
      const bool ok = activation_key == QuantKey::kNone ||
                      activation_key == QuantKey::kNvfp4Dynamic ||
                      activation_key == QuantKey::kMxfp8Dynamic;
      if (!ok) {
        // {quant_dtype!r}: a torch dtype prints bare, a string quoted.
        std::string q = IsFp8Key(activation_key)                           ? "torch.float8_e4m3fn"
                        : activation_key == QuantKey::kInt8DynamicTokenSym ? "torch.int8"
                                                                           : "'mxfp4'";
        return absl::FailedPreconditionError(
            absl::StrCat("flashinfer_nvlink_one_sided dispatch supports nvfp4, mxfp8, and bf16 "
                         "(quant_dtype=None) today; got quant_dtype=",
                         q));
      }
    }
    pf.cls = row.all2all == "allgather_reducescatter" ? absl::StrCat(row.cls, suffix)
                                                      : std::string(row.cls);
    pf.format = row.format;
    pf.topk_indices_dtype = std::string(row.topk_dtype);
    pf.output_is_reduced = row.reduced;
    return pf;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no prepare/finalize for all2all_backend=", PyRepr(pc.all2all_backend)));
}

absl::StatusOr<int> RoundUpLayerHiddenSize(int hidden, absl::string_view in_dtype,
                                           const FusedMoEParallelConfig& pc) {
  auto round512 = [&](int h) {
    const int unit = 512 / ItemSize(in_dtype);  // H * itemsize % 512 == 0
    return (h + unit - 1) / unit * unit;
  };
  auto low_latency = [&](int h) -> absl::StatusOr<int> {
    for (int s : kLowLatencyHiddenSizes) {
      if (h <= s) return s;
    }
    return InvalidField("hidden_dim", absl::StrCat("Hidden Size ", h,
                                                   " is greater than the maximum supported hidden "
                                                   "size 8192"));
  };
  // Applied in vLLM's order: HT -> LL -> v2 -> nixl.
  if (pc.use_deepep_ht_kernels()) hidden = round512(hidden);
  if (pc.use_deepep_ll_kernels()) {
    KPLAN_ASSIGN_OR_RETURN(hidden, low_latency(hidden));
  }
  if (pc.use_deepep_v2_kernels()) hidden = round512(hidden);
  if (pc.use_nixl_ep_kernels()) {
    KPLAN_ASSIGN_OR_RETURN(hidden, low_latency(hidden));
  }
  return hidden;
}

const MoEKernelOracle* OracleFor(absl::string_view scheme) {
  if (scheme == "unquantized") return &UnquantizedOracle();
  if (scheme == "fp8") return &Fp8Oracle();
  if (scheme == "mxfp8") return &Mxfp8Oracle();
  if (scheme == "nvfp4") return &Nvfp4Oracle();
  if (scheme == "mxfp4") return &Mxfp4Oracle();
  if (scheme == "mxfp4_deepseek_v4") return &Mxfp4DeepseekV4Oracle();
  if (scheme == "int8") return &Int8Oracle();
  if (scheme == "wna16") return &Wna16Oracle();
  if (scheme == "w4a8") return &W4a8Oracle();
  if (scheme == "w4a8_int8") return &W4a8Int8Oracle();
  return nullptr;
}

const std::vector<absl::string_view>& OracleSchemes() {
  static const auto* v = new std::vector<absl::string_view>{
      "unquantized",       "fp8",  "mxfp8", "nvfp4", "mxfp4",
      "mxfp4_deepseek_v4", "int8", "wna16", "w4a8",  "w4a8_int8"};
  return *v;
}

}  // namespace kplan
