// The MoEKernelOracle contract of vLLM's fused_moe/oracle/base.py in C++, and
// the one generic selection loop every scheme runs (§1.2 of the reference):
// explicit requests map the user string and never fall back; "auto" walks the
// platform priority list and takes the first experts class whose
// is_supported_config() passes. The per-scheme facts (enum members and values,
// user-string maps in dict order, priority lists per platform, move rules,
// batched substitutions) are data in SchemeTables; subclasses override only
// the hooks for the decision steps vLLM codes by hand (env overrides, LoRA,
// platform fallbacks).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "resolve/oracle/experts.h"
#include "resolve/oracle/moe_plan.h"

namespace kplan {

// One member of a scheme's backend enum.
struct BackendDef {
  absl::string_view name;   // enum member name (TRITON)
  absl::string_view value;  // enum value ("FlashInfer TRTLLM")
  // backend_to_kernel_cls(): experts classes in selection order.
  std::vector<absl::string_view> experts;
  // mxfp4 only: _backend_activation_key() (the activation key the backend implies).
  QuantKey implied_activation = QuantKey::kNone;
};

// A "move to front/back" rule applied to the priority list, in order.
struct MoveRule {
  bool (*when)(const SelectionContext& c, QuantKey w, QuantKey a);
  absl::string_view backend;
  bool to_front;  // else: pop and append
};

// One entry of map_<scheme>_backend(): a user string and the member(s) it
// maps to. One member everywhere except mxfp4, whose map returns candidate
// lists (map_mxfp4_backend).
struct UserMapRow {
  absl::string_view user;
  std::vector<absl::string_view> members;
};

// One platform branch of get_priority_backends(): the base list and its move
// rules. The first row whose `when` holds is the list; none: an empty list.
struct PriorityRow {
  bool (*when)(const SelectionContext& c) = nullptr;  // nullptr: every platform
  std::vector<absl::string_view> backends;
  std::vector<MoveRule> rules;
};

// The activation key each backend's experts are checked with.
enum class ActivationKeyRule : uint8_t {
  kAsGiven,  // the layer's key
  kNone,     // weight-only schemes (int_wna16.py): always None
  kImplied,  // mxfp4: the key the backend implies (_backend_activation_key)
};

// Everything vLLM states as data about one scheme's oracle. Adding a vLLM
// backend is one BackendDef (plus its UserMapRow and its place in a
// PriorityRow where vLLM lists it there).
struct SchemeTables {
  absl::string_view scheme = {};          // plan.scheme: "fp8"
  absl::string_view map_name = {};        // "... is not supported for <map_name> MoE."
  absl::string_view display_name = {};    // "No <display_name> MoE backend supports ..."
  absl::string_view log_name = {};        // "Using 'X' <log_name> MoE backend out of ..."
  std::vector<BackendDef> backends = {};  // the enum, declaration order
  // map_<scheme>_backend(): vLLM's dict, in dict order (the "Expected one of" list).
  std::vector<UserMapRow> user_map = {};
  // kplan's own family joining this scheme (ARCHITECTURE.md "Vocabulary"): mapped
  // only where the platform lists library `kplan`, and never part of vLLM's
  // "Expected one of" text.
  std::vector<UserMapRow> kplan_map = {};
  // batched-variant(B) under the BatchedExperts activation format.
  std::vector<std::pair<absl::string_view, absl::string_view>> batched = {};
  // get_priority_backends(), one row per platform branch.
  std::vector<PriorityRow> priority = {};
  // kplan members appended to every auto list where the platform lists `kplan`.
  std::vector<absl::string_view> kplan_auto = {};
  // User strings this scheme treats as "auto" (unquantized: humming).
  std::vector<absl::string_view> auto_aliases = {};
  ActivationKeyRule activation_key = ActivationKeyRule::kAsGiven;
  // The log line of an explicit request names the mapped candidates
  // (mxfp4, whose map yields lists) rather than the chosen backend alone.
  bool log_candidates = false;
  // The backend's value quoted in the log line ("Using 'V' ...": nvfp4.py,
  // int_wna16.py, mxfp4.py, mxfp8.py; not fp8.py, unquantized.py, int8.py,
  // w4a8*.py: "Using TRITON Fp8 MoE backend ...") and in "<X> MoE backend 'V'
  // does not support ..." (nvfp4.py, int_wna16.py, mxfp4.py).
  bool log_quotes_backend = false;
  bool error_quotes_backend = false;
  // The log line names the potential backends ("... out of potential
  // backends: [...]."); int_wna16.py and w4a8.py log "Using V X MoE backend.".
  bool log_lists_potential = true;
  // select_<scheme>_moe_backend() never reads moe_backend (w4a8.py): every
  // request takes the auto path.
  bool ignores_moe_backend = false;
};

// Outcome of select_backend(): (backend, experts class) plus what kplan reports.
struct Selection {
  int backend = -1;                           // index into tables().backends; -1 = NONE
  const ExpertsClass* experts = nullptr;      // nullptr: vLLM returned no class
  QuantKey activation_key = QuantKey::kNone;  // the key the experts were checked with
  std::vector<MoeCandidate> candidates;
  std::vector<int> potential;  // the list the log line names
  bool forced = false;         // env override or platform fallback
};

// One scheme's oracle: its SchemeTables plus the hooks below for the steps
// vLLM codes by hand. SelectBackend() is the one selection loop (§1.2) every
// scheme runs:
//   Bypass -> explicit: map, CheckExplicit, try each candidate (batched
//   variant, never a fallback), ExplicitError -> auto: priority list
//   (FilterPriority, kplan's family), EnvOverrides (drop or force), the
//   loop, OnExhausted.
class MoEKernelOracle {
 public:
  explicit MoEKernelOracle(const SchemeTables& tables) : t_(tables) {}
  virtual ~MoEKernelOracle() = default;

  const SchemeTables& tables() const { return t_; }
  // backend_enum_cls()
  const std::vector<BackendDef>& backend_enum_cls() const { return t_.backends; }
  int Find(absl::string_view member) const;  // -1 when absent
  const BackendDef& def(int b) const { return t_.backends[b]; }

  // get_priority_backends(moe_config): the platform's PriorityRow after its
  // move rules and FilterPriority, then kplan's family where listed.
  std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w, QuantKey a) const;
  // backend_to_kernel_cls(backend)
  virtual std::vector<const ExpertsClass*> BackendToKernelCls(int b,
                                                              const SelectionContext& c) const;
  // map_backend(runner_backend): the first mapped member. INVALID_ARGUMENT
  // (field moe_backend) with vLLM's "moe_backend='x' is not supported for X
  // MoE. Expected one of [...]" for a string outside vLLM's map, and for
  // kplan's family unless `kplan_listed` (the platform lists library `kplan`;
  // the default asks for the scheme's whole vocabulary, as on this server).
  absl::StatusOr<int> MapBackend(absl::string_view moe_backend, bool kplan_listed = true) const;
  // The same, every candidate in order.
  absl::StatusOr<std::vector<int>> MapCandidates(absl::string_view moe_backend,
                                                 bool kplan_listed) const;
  // select_backend(moe_config, weight_key, activation_key): the one loop.
  absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w, QuantKey a) const;
  // The selection RunMoE executes (ARCHITECTURE.md "Vocabulary for what runs
  // here"): the same generic loop, over the backends behind the moe_backend
  // names in `runs` (the server's executable backends) and, inside them,
  // over kplan's own experts classes only (c.executable_only must be set).
  // The scheme's hand-coded steps (platform bypasses, env overrides, LoRA)
  // are skipped: each of them picks one of vLLM's backends, which this
  // server cannot run. "auto" keeps the platform priority order, then the
  // order of `runs`; exhausted is vLLM's NotImplementedError text
  // (FAILED_PRECONDITION). An explicit name outside `runs` is
  // FAILED_PRECONDITION "moe_backend 'x' cannot run on this server; it runs:
  // ..."; one this scheme does not map, or whose experts reject the layer,
  // keeps vLLM's text and field (moe_backend) as FAILED_PRECONDITION: the
  // request is valid, the resident experts are what it cannot serve.
  absl::StatusOr<Selection> SelectExecutable(const SelectionContext& c, QuantKey w, QuantKey a,
                                             const std::vector<std::string>& runs) const;
  // convert_to_kernel_format(): the weight transform, in words.
  virtual std::string ConvertToKernelFormat(int b, const SelectionContext& c) const;
  // make_quant_config(): a description of the FusedMoEQuantConfig it builds.
  virtual absl::StatusOr<std::string> MakeQuantConfig(int b, QuantKey w, QuantKey a) const;
  // mxfp4_round_up_hidden_size_and_intermediate_size(); identity elsewhere.
  virtual std::pair<int, int> RoundUpSizes(int b, const SelectionContext& c, int hidden,
                                           int intermediate) const {
    return {hidden, intermediate};
  }

  // make_kernel(): fills the plan for a selection (experts, P/F, format).
  absl::Status MakeKernel(const Selection& s, const SelectionContext& c, MoePlan& plan) const;

  ActivationFormat Format(const SelectionContext& c) const;
  // Whether `moe_backend` takes the auto path: "auto", an auto alias, or any
  // string where the scheme ignores moe_backend.
  bool IsAuto(absl::string_view moe_backend) const;
  // "Using V X MoE backend out of potential backends: [...]." in the
  // scheme's form (log_quotes_backend, log_lists_potential).
  std::string LogLine(const Selection& s) const;

 protected:
  // --- hooks: the steps vLLM codes by hand; the defaults do nothing ---
  // Steps before the explicit request that decide by themselves (platform
  // bypasses, LoRA, preconditions); nullopt continues the loop.
  virtual std::optional<absl::StatusOr<Selection>> Bypass(const SelectionContext& /*c*/,
                                                          QuantKey /*w*/, QuantKey /*a*/) const {
    return std::nullopt;
  }
  // Checks (and may narrow) an explicit request's mapped candidates.
  virtual absl::Status CheckExplicit(const SelectionContext& /*c*/,
                                     std::vector<int>& /*candidates*/, QuantKey /*a*/) const {
    return absl::OkStatus();
  }
  // Narrows the auto list after the move rules.
  virtual void FilterPriority(const SelectionContext& /*c*/, QuantKey /*a*/,
                              std::vector<int>& /*list*/) const {}
  // Env-var overrides of the auto list: removes members from `list`, or
  // returns the member it forces (-1: none).
  virtual int EnvOverrides(const SelectionContext& /*c*/, std::vector<int>& /*list*/) const {
    return -1;
  }
  // The error of an explicit request whose candidates all fail: vLLM's
  // _return_or_raise() ValueError "<X> MoE backend <value> does not support
  // the deployment configuration since <reason>." (INVALID_ARGUMENT, field
  // moe_backend) unless the scheme words it otherwise.
  virtual absl::Status ExplicitError(int b, const std::string& reason) const;
  // An exhausted auto list; `last_reason` is the last rejection. Default:
  // NotImplementedError("No <X> MoE backend supports the deployment
  // configuration.") as FAILED_PRECONDITION.
  virtual absl::StatusOr<Selection> OnExhausted(const SelectionContext& c, QuantKey w, QuantKey a,
                                                Selection s, const std::string& last_reason) const;

  // --- the loop's pieces ---
  // batched-variant(B) when the format is BatchedExperts.
  int MaybeBatched(int b, const SelectionContext& c) const;
  // The activation key backend `b` is checked with (ActivationKeyRule).
  QuantKey KeyFor(int b, QuantKey a) const;
  // Tries each class of `b`; records candidates; returns the first that passes.
  const ExpertsClass* TryBackend(int b, const SelectionContext& c, QuantKey w, QuantKey a,
                                 Selection& s, std::string* last_reason) const;
  // _return_or_raise(): "<X> MoE backend <value> does not support the
  // deployment configuration since <reason>." as INVALID_ARGUMENT, without a
  // field for a backend an env override forced, with field moe_backend else.
  absl::StatusOr<Selection> ReturnOrRaise(int b, const SelectionContext& c, QuantKey w, QuantKey a,
                                          Selection s, bool forced) const;
  // An explicit request: each candidate in order (its batched variant, its
  // activation key); the last failure's ExplicitError.
  absl::StatusOr<Selection> TryExplicit(const std::vector<int>& candidates,
                                        const SelectionContext& c, QuantKey w, QuantKey a,
                                        Selection s) const;
  // The auto loop over `list`: s.backend == -1 when exhausted.
  Selection Loop(const std::vector<int>& list, const SelectionContext& c, QuantKey w, QuantKey a,
                 Selection s, std::string* last_reason = nullptr) const;
  // NotImplementedError("No <X> MoE backend supports the deployment configuration.")
  absl::Status Exhausted() const;
  // A platform fallback vLLM takes without is_supported_config (first class of `member`).
  Selection Fallback(absl::string_view member, const ExpertsClass* e, absl::string_view why,
                     QuantKey a, Selection s) const;
  void Remove(std::vector<int>& list, absl::string_view member) const;

 private:
  // Applies move rules to a list of member names.
  std::vector<int> Build(const std::vector<absl::string_view>& names,
                         const std::vector<MoveRule>& rules, const SelectionContext& c, QuantKey w,
                         QuantKey a) const;
  // The member a moe_backend string maps to (vLLM's map, then kplan's where
  // listed); -1 if none.
  int MemberOf(absl::string_view moe_backend, bool kplan_listed) const;
  // Whether `b` has an experts class this server runs itself.
  bool HasExecutableClass(int b, const SelectionContext& c) const;
  // Appends kplan's family where the platform lists library `kplan`.
  void AppendKplan(std::vector<int>& list, const SelectionContext& c) const;

  const SchemeTables& t_;
};

// The oracle of a scheme ("fp8", "mxfp4_deepseek_v4", ...); nullptr when unknown.
const MoEKernelOracle* OracleFor(absl::string_view scheme);
// Every scheme name OracleFor() knows.
const std::vector<absl::string_view>& OracleSchemes();

// Per-scheme oracles (one file each).
const MoEKernelOracle& UnquantizedOracle();
const MoEKernelOracle& Fp8Oracle();
const MoEKernelOracle& Mxfp8Oracle();
const MoEKernelOracle& Nvfp4Oracle();
const MoEKernelOracle& Mxfp4Oracle();            // gpt-oss style
const MoEKernelOracle& Mxfp4DeepseekV4Oracle();  // select_deepseek_v4_mxfp4_moe_backend
const MoEKernelOracle& Int8Oracle();
const MoEKernelOracle& Wna16Oracle();
const MoEKernelOracle& W4a8Oracle();
const MoEKernelOracle& W4a8Int8Oracle();

// The all2all backend -> prepare/finalize table (all2all_utils.py).
struct PrepareFinalizeChoice {
  std::string cls;
  ActivationFormat format = ActivationFormat::kStandard;
  std::string topk_indices_dtype;  // "" = no constraint
  bool output_is_reduced = false;
};
// maybe_make_prepare_finalize(..., allow_new_interface=True, use_monolithic).
absl::StatusOr<PrepareFinalizeChoice> ChoosePrepareFinalize(const FusedMoEParallelConfig& pc,
                                                            const ExpertsClass& experts,
                                                            QuantKey activation_key);
// maybe_roundup_layer_hidden_size(): DeepEP HT/v2 512-byte rule, LL/NIXL size
// list (INVALID_ARGUMENT past 8192, field hidden_dim).
absl::StatusOr<int> RoundUpLayerHiddenSize(int hidden, absl::string_view in_dtype,
                                           const FusedMoEParallelConfig& pc);

// The VLLM_ROCM_USE_AITER / VLLM_ROCM_USE_AITER_MOE rule of the unquantized
// and fp8 oracles: untouched when neither is set; either false -> drop AITER
// from the list; both true -> force AITER.
enum class AiterEnvRule { kNone, kDrop, kForce };
AiterEnvRule AiterEnv(const EnvVars& env);

// Python float repr of a float32 value ("7.0", "10.5").
std::string PyFloat(float v);

}  // namespace kplan
