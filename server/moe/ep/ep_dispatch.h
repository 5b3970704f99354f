// Expert-parallel execution of one fused MoE layer over a Communicator (the
// CPU path): each rank holds a contiguous slice of the experts
// (ExpertPlacement) and of the request's tokens and calls
// RunMoeExpertParallel from its own thread. The step is vLLM's modular
// prepare -> local experts -> finalize, with the dispatch strategy behind
// EpDispatch (allgather_reducescatter and kplan_all2allv, one file each;
// passthrough runs on GPU ranks only). docs/EP.md ("Strategies") has the
// numerics of each strategy and the failure semantics.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/comm/communicator.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/moe/ep/ep_placement.h"

namespace kplan::moe::ep {

enum class EpStrategy {
  kAllGatherReduceScatter,  // "allgather_reducescatter" (vLLM's name)
  kAll2AllV,                // "kplan_all2allv"
  kPassthrough,             // "passthrough" (vLLM's name; GPU ranks with kplan_ep only)
};

absl::string_view EpStrategyName(EpStrategy strategy);
// INVALID_ARGUMENT (field "all2all_backend") for unknown names.
absl::StatusOr<EpStrategy> ParseEpStrategy(absl::string_view name);

// The layer as one rank sees it: the layer's shape and options (identical on
// every rank) and this rank's experts.
struct EpLayer {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int num_experts = 0;       // E, global
  int top_k = 0;
  kernels::DType act_dtype = kernels::DType::kBFloat16;
  MoeActivation activation = MoeActivation::kSilu;
  ActivationParams act_params;
  bool apply_router_weight_on_input = false;  // k must be 1
  ExpertPlacement placement;
  // Experts [placement.FirstExpert(rank), +NumLocalExperts(rank)) of this
  // rank, first dimension num_local_experts (weights, biases and scales all
  // indexed by the local id). Unused on a rank that owns no expert.
  MoeWeights local_weights;
  int num_threads = 0;  // for moe::RunExperts; never changes a result
};

// This rank's slice of the request. Either topk_ids + topk_weights (int32 /
// fp32 [num_tokens, k]) or router_logits (fp32 [num_tokens, E]) with
// `routing` (num_experts / top_k default to the layer's); routing is per
// token, so routing each slice locally equals routing the whole batch.
struct MoeInputsForThisRank {
  int64_t num_tokens = 0;               // may be 0
  const void* hidden_states = nullptr;  // [num_tokens, H] in act_dtype
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  const float* router_logits = nullptr;
  RoutingSpec routing;
  void* output = nullptr;  // [num_tokens, H] in act_dtype
};

// What prepare / run / finalize share, fixed once the ranks agreed on the
// step: the layer, this rank's routed tokens and every rank's token count.
struct EpStep {
  const EpLayer* layer = nullptr;
  int rank = 0;
  int size = 1;
  std::vector<int64_t> tokens_per_rank;  // [size]
  int64_t num_tokens = 0;                // == tokens_per_rank[rank]
  const void* hidden_states = nullptr;
  const int32_t* topk_ids = nullptr;    // [num_tokens, k], routed
  const float* topk_weights = nullptr;  // [num_tokens, k]
  void* output = nullptr;
};

// One dispatch strategy; an object holds the buffers of one step, so use one
// per rank and step (or call the three stages in order each step).
class EpDispatch {
 public:
  virtual ~EpDispatch() = default;
  virtual EpStrategy strategy() const = 0;
  // Exchanges the rows this rank's experts need.
  virtual absl::Status Prepare(const EpStep& step, comm::Communicator& comm) = 0;
  // Runs this rank's experts on the prepared rows (no communication).
  virtual absl::Status RunLocalExperts(const EpStep& step) = 0;
  // Returns the results to the tokens' owners and writes step.output.
  virtual absl::Status Finalize(const EpStep& step, comm::Communicator& comm) = 0;
};

// Null for kPassthrough (no CPU strategy object).
std::unique_ptr<EpDispatch> MakeEpDispatch(EpStrategy strategy);

// Runs one MoE layer step on this rank; every rank of `comm` calls it with
// the same layer options and strategy, each on its own thread. Writes
// inputs.output (this rank's tokens). Failures: docs/EP.md ("Failures (CPU ranks)").
absl::Status RunMoeExpertParallel(const EpLayer& layer_on_this_rank,
                                  const MoeInputsForThisRank& inputs, comm::Communicator& comm,
                                  EpStrategy strategy);

// Helpers shared by the strategies.
kernels::DType CommDTypeOf(kernels::DType act_dtype);
// The MoeProblem of `num_tokens` rows on this rank's local experts.
MoeProblem LocalExpertProblem(const EpLayer& layer, int rank, int64_t num_tokens, int top_k,
                              const void* hidden_states, const int32_t* expert_map);

}  // namespace kplan::moe::ep
