// The MoEKernelOracle contract of vLLM's fused_moe/oracle/base.py in C++, and
// the one generic selection loop every scheme runs (§1.2 of the reference):
// explicit requests map the user string and never fall back; "auto" walks the
// platform priority list and takes the first experts class whose
// is_supported_config() passes. The per-scheme facts (enum members and values,
// user-string maps in dict order, priority lists, move rules, batched
// substitutions) are data in SchemeTables; subclasses add only the decision
// steps vLLM codes by hand (env overrides, LoRA, fallbacks).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/oracle/experts.h"
#include "server/oracle/moe_plan.h"

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

struct SchemeTables {
  absl::string_view scheme;        // plan.scheme: "fp8"
  absl::string_view map_name;      // "... is not supported for <map_name> MoE."
  absl::string_view display_name;  // "No <display_name> MoE backend supports ..."
  absl::string_view log_name;      // "Using 'X' <log_name> MoE backend out of ..."
  std::vector<BackendDef> backends;  // the enum, declaration order
  // map_<scheme>_backend(): user string -> member name, vLLM dict order.
  std::vector<std::pair<absl::string_view, absl::string_view>> user_map;
  // kplan's own family joining this scheme (DESIGN.md "Vocabulary"); not
  // listed in vLLM's "Expected one of" text.
  std::vector<std::pair<absl::string_view, absl::string_view>> kplan_map;
  // batched-variant(B) under the BatchedExperts activation format.
  std::vector<std::pair<absl::string_view, absl::string_view>> batched;
  // kplan members appended to every auto list where the platform lists `kplan`.
  std::vector<absl::string_view> kplan_auto;
};

// Outcome of select_backend(): (backend, experts class) plus what kplan reports.
struct Selection {
  int backend = -1;                        // index into tables().backends; -1 = NONE
  const ExpertsClass* experts = nullptr;   // nullptr: vLLM returned no class
  QuantKey activation_key = QuantKey::kNone;  // the key the experts were checked with
  std::vector<MoeCandidate> candidates;
  std::vector<int> potential;              // the list the log line names
  bool forced = false;                     // env override or platform fallback
};

class MoEKernelOracle {
 public:
  explicit MoEKernelOracle(const SchemeTables& tables) : t_(tables) {}
  virtual ~MoEKernelOracle() = default;

  const SchemeTables& tables() const { return t_; }
  // backend_enum_cls()
  const std::vector<BackendDef>& backend_enum_cls() const { return t_.backends; }
  int Find(absl::string_view member) const;  // -1 when absent
  const BackendDef& def(int b) const { return t_.backends[b]; }

  // get_priority_backends(moe_config): base list (platform-specific) after move rules.
  virtual std::vector<int> GetPriorityBackends(const SelectionContext& c, QuantKey w,
                                               QuantKey a) const = 0;
  // backend_to_kernel_cls(backend)
  virtual std::vector<const ExpertsClass*> BackendToKernelCls(int b,
                                                              const SelectionContext& c) const;
  // map_backend(runner_backend): INVALID_ARGUMENT (field moe_backend) with
  // vLLM's "moe_backend='x' is not supported for X MoE. Expected one of [...]".
  virtual absl::StatusOr<int> MapBackend(absl::string_view moe_backend) const;
  // select_backend(moe_config, weight_key, activation_key)
  virtual absl::StatusOr<Selection> SelectBackend(const SelectionContext& c, QuantKey w,
                                                  QuantKey a) const = 0;
  // The selection RunMoE executes (DESIGN.md "Vocabulary for what runs
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

  // --- the generic loop's pieces (shared by every scheme) ---
  ActivationFormat Format(const SelectionContext& c) const;
  // batched-variant(B) when the format is BatchedExperts.
  int MaybeBatched(int b, const SelectionContext& c) const;
  // Tries each class of `b`; records candidates; returns the first that passes.
  const ExpertsClass* TryBackend(int b, const SelectionContext& c, QuantKey w, QuantKey a,
                                 Selection& s, std::string* last_reason) const;
  // _return_or_raise(): explicit or forced backend; INVALID_ARGUMENT
  // "<X> MoE backend <value> does not support the deployment configuration since <reason>."
  absl::StatusOr<Selection> ReturnOrRaise(int b, const SelectionContext& c, QuantKey w, QuantKey a,
                                          Selection s, bool forced) const;
  // The auto loop over `list`; nullopt-like: s.backend == -1 when exhausted.
  Selection Loop(const std::vector<int>& list, const SelectionContext& c, QuantKey w, QuantKey a,
                 Selection s) const;
  // NotImplementedError("No <X> MoE backend supports the deployment configuration.")
  absl::Status Exhausted() const;
  // Applies move rules to a list of member names.
  std::vector<int> Build(const std::vector<absl::string_view>& names,
                         const std::vector<MoveRule>& rules, const SelectionContext& c, QuantKey w,
                         QuantKey a) const;
  void Remove(std::vector<int>& list, absl::string_view member) const;
  // The member a moe_backend string maps to (vLLM's map, then kplan's); -1 if none.
  int MemberOf(absl::string_view moe_backend) const;
  // Whether `b` has an experts class this server runs itself.
  bool HasExecutableClass(int b, const SelectionContext& c) const;
  // Appends kplan's family where the platform lists library `kplan`.
  void AppendKplan(std::vector<int>& list, const SelectionContext& c) const;
  // "Using 'V' X MoE backend out of potential backends: [...]."
  std::string LogLine(const Selection& s) const;

 private:
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
const MoEKernelOracle& Mxfp4Oracle();             // gpt-oss style
const MoEKernelOracle& Mxfp4DeepseekV4Oracle();   // select_deepseek_v4_mxfp4_moe_backend
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
