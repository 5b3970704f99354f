// The result of MoE kernel selection for one layer (MoePlan, a field-for-field
// mirror of kplan.v1.MoEPlan) and the entry point that computes it:
// PlanMoeLayer() detects the quantization scheme, builds FusedMoEConfig and
// runs the scheme's oracle exactly as vLLM would, then picks the
// prepare/finalize for the all2all backend. ExplainPlan/ComparePlans render
// plans for people (`kplan explain`, `kplan resolve --compare-platform`).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/env.h"
#include "resolve/oracle/moe_config.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/platform/platform.h"

namespace kplan {

// Mirror of kplan.v1.MoECandidate.
struct MoeCandidate {
  std::string backend;         // scheme enum name, e.g. FLASHINFER_TRTLLM
  std::string experts_kernel;  // FusedMoEExperts class, e.g. TrtLlmFp8ExpertsMonolithic
  bool accepted = false;
  std::string reason;  // why it was rejected, as is_supported_config words it
  bool operator==(const MoeCandidate&) const = default;
};

// Mirror of kplan.v1.MoEPlan.
struct MoePlan {
  std::string layer;    // MoELayerConfig.name
  std::string scheme;   // unquantized | fp8 | mxfp8 | nvfp4 | mxfp4 | int8 | wna16 | w4a8 | ...
  std::string backend;  // enum member name, e.g. TRITON ("NONE" when vLLM returns (NONE, None))
  std::string backend_value;   // enum value, e.g. "FlashInfer TRTLLM"
  std::string experts_kernel;  // "" when vLLM returns no experts class
  bool monolithic = false;
  std::string activation_format;  // standard | batched_experts
  std::string prepare_finalize;
  std::string topk_indices_dtype;  // "" = no constraint, else int32 / int64
  bool output_is_reduced = false;
  int32_t hidden_dim = 0;  // after backend/dispatch round-ups
  int32_t intermediate_size_per_partition = 0;
  std::string log_line;  // what vLLM would log
  std::vector<MoeCandidate> candidates;
  bool executable = false;  // the chosen backend is one of kplan's own (kplan*, emulation)
  std::string weight_key;
  std::string activation_key;
  std::string routing_method;
  std::string weight_layout;  // the convert_to_kernel_format transform, in words
};

// What PlanMoeLayer plans for.
struct PlanOptions {
  // Empty: planning, vLLM's full tables (any platform). Otherwise execution
  // on this server (ARCHITECTURE.md "Vocabulary for what runs here"): the moe_backend
  // names it runs (GetServerInfo's executable_backends); the oracle selects
  // among their backends and kplan's own experts classes only
  // (MoEKernelOracle::SelectExecutable), so "auto" never picks a backend the
  // server cannot run.
  std::vector<std::string> executable_backends;
};

// Plans one MoE layer. `moe_backend` is KernelConfig.moe_backend already
// normalised; `parallel` is the normalised ParallelConfig (after the
// passthrough binding). Errors:
//  - a bad layer field: InvalidField("<MoELayerConfig field>", ...);
//  - a bad explicit request (vLLM ValueError): INVALID_ARGUMENT, field "moe_backend";
//  - nothing supports the deployment (vLLM NotImplementedError): FAILED_PRECONDITION;
//  - execution (options.executable_backends set): an explicit backend this
//    server cannot run, or that the layer rules out, is FAILED_PRECONDITION
//    with field "moe_backend".
absl::StatusOr<MoePlan> PlanMoeLayer(const MoeLayerSpec& layer, absl::string_view moe_backend,
                                     const ParallelConfig& parallel, const Platform& platform,
                                     const EnvVars& env, const PlanOptions& options = {});

// A table of every candidate (backend, experts kernel, verdict, reason) and a
// summary of the chosen plan.
std::string ExplainPlan(const MoePlan& plan);

// Two plans side by side: what differs and why (the rejection reasons that
// decided each side).
std::string ComparePlans(const MoePlan& a, absl::string_view label_a, const MoePlan& b,
                         absl::string_view label_b);

// The moe_backend strings this server can execute (ARCHITECTURE.md "Vocabulary").
const std::vector<absl::string_view>& KplanMoeBackends();

}  // namespace kplan
