#include "server/moe/ep/ep_dispatch.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kplan::moe::ep {

// Defined in ep_allgather_reducescatter.cc and ep_all2allv.cc.
std::unique_ptr<EpDispatch> MakeAllGatherReduceScatterDispatch();
std::unique_ptr<EpDispatch> MakeAll2AllVDispatch();

namespace {

// One row per strategy: its name (the all2all_backend string).
struct StrategyRow {
  EpStrategy strategy;
  absl::string_view name;
};
constexpr StrategyRow kStrategies[] = {
    {EpStrategy::kAllGatherReduceScatter, "allgather_reducescatter"},  // vLLM naive DP/EP P/F
    {EpStrategy::kAll2AllV, "kplan_all2allv"},  // ours: rows only to their expert's rank
    // vLLM's binding for self-dispatching backends (all2all_utils.py
    // bind_passthrough_all2all_backend); here moe_backend kplan_ep on GPUs.
    {EpStrategy::kPassthrough, "passthrough"},
};

// Checks this rank's inputs and routes them; the error is what this rank
// reports to its peers in the header exchange.
absl::Status PrepareLocal(const EpLayer& layer, const MoeInputsForThisRank& in,
                          const comm::Communicator& comm, std::vector<int32_t>& ids,
                          std::vector<float>& weights) {
  const ExpertPlacement& pl = layer.placement;
  if (pl.num_ranks() != comm.size()) {
    return InvalidField("placement", absl::StrCat("placement is for ", pl.num_ranks(),
                                                  " ranks but the communicator has ", comm.size()));
  }
  if (pl.num_experts() != layer.num_experts) {
    return InvalidField("placement", absl::StrCat("placement covers ", pl.num_experts(),
                                                  " experts, the layer has ", layer.num_experts));
  }
  const int rank = comm.rank();
  const int local = pl.NumLocalExperts(rank);
  if (local > 0 && layer.local_weights.num_local_experts != local) {
    return InvalidField("weights.num_local_experts",
                        absl::StrCat("rank ", rank, " owns ", local,
                                     " experts but its weights "
                                     "hold ",
                                     layer.local_weights.num_local_experts));
  }
  // The layer as a whole, checked once on every rank (weights: this rank's).
  const std::vector<int32_t> map = pl.ExpertMap(rank);
  MoeProblem p =
      LocalExpertProblem(layer, rank, in.num_tokens, layer.top_k, in.hidden_states, map.data());
  MoeWeights none;  // a rank without experts: validate all but the weights
  if (local == 0) {
    none.dtype = kernels::DType::kFloat32;
    none.num_local_experts = layer.num_experts;
    none.w13 = none.w2 = &none;  // never read
    p.weights = none;
    p.expert_map = nullptr;
  }
  p.router_logits = in.router_logits;
  p.topk_ids = in.topk_ids;
  p.topk_weights = in.topk_weights;
  const bool route = in.topk_ids == nullptr;
  KPLAN_RETURN_IF_ERROR(ValidateMoeProblem(p, route));
  if (in.num_tokens > 0 && in.output == nullptr) {
    return InvalidField("output", "output must not be null");
  }
  const int k = layer.top_k;
  ids.resize(in.num_tokens * k);
  weights.resize(in.num_tokens * k);
  if (route) {
    RoutingSpec spec = in.routing;
    if (spec.num_experts == 0) spec.num_experts = layer.num_experts;
    if (spec.top_k == 0) spec.top_k = k;
    if (spec.num_experts != layer.num_experts || spec.top_k != k) {
      return InvalidField(
          spec.num_experts != layer.num_experts ? "routing.num_experts" : "routing.top_k",
          "routing spec disagrees with the layer's num_experts / top_k");
    }
    if (in.num_tokens > 0) {
      KPLAN_RETURN_IF_ERROR(
          RouteTokens(spec, in.router_logits, in.num_tokens, weights.data(), ids.data()));
    }
  } else {
    std::copy(in.topk_ids, in.topk_ids + in.num_tokens * k, ids.begin());
    std::copy(in.topk_weights, in.topk_weights + in.num_tokens * k, weights.begin());
  }
  for (int64_t t = 0; t < in.num_tokens * k; ++t) {
    if (ids[t] < 0 || ids[t] >= layer.num_experts) {
      return InvalidField("topk_ids", absl::StrCat("topk_ids[", t / k, "][", t % k, "] = ", ids[t],
                                                   " is not in [0, ", layer.num_experts, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view EpStrategyName(EpStrategy strategy) {
  for (const StrategyRow& row : kStrategies) {
    if (row.strategy == strategy) return row.name;
  }
  return "unknown";
}

absl::StatusOr<EpStrategy> ParseEpStrategy(absl::string_view name) {
  for (const StrategyRow& row : kStrategies) {
    if (row.name == name) return row.strategy;
  }
  return InvalidField("all2all_backend",
                      absl::StrCat("unknown expert-parallel dispatch '", name,
                                   "'; valid: allgather_reducescatter, kplan_all2allv, "
                                   "passthrough"));
}

std::unique_ptr<EpDispatch> MakeEpDispatch(EpStrategy strategy) {
  switch (strategy) {
    case EpStrategy::kAllGatherReduceScatter:
      return MakeAllGatherReduceScatterDispatch();
    case EpStrategy::kAll2AllV:
      return MakeAll2AllVDispatch();
    case EpStrategy::kPassthrough:
      return nullptr;  // device transport only (gpu_ep.h)
  }
  return nullptr;
}

kernels::DType CommDTypeOf(kernels::DType act_dtype) {
  switch (act_dtype) {
    case kernels::DType::kFloat16:
      return kernels::DType::kFloat16;
    case kernels::DType::kBFloat16:
      return kernels::DType::kBFloat16;
    default:
      return kernels::DType::kFloat32;
  }
}

MoeProblem LocalExpertProblem(const EpLayer& layer, int rank, int64_t num_tokens, int top_k,
                              const void* hidden_states, const int32_t* expert_map) {
  MoeProblem p;
  p.num_tokens = num_tokens;
  p.hidden = layer.hidden;
  p.intermediate = layer.intermediate;
  p.num_experts = layer.num_experts;
  p.top_k = top_k;
  p.act_dtype = layer.act_dtype;
  p.hidden_states = hidden_states;
  p.activation = layer.activation;
  p.act_params = layer.act_params;
  p.weights = layer.local_weights;
  p.expert_map = expert_map;
  p.apply_router_weight_on_input = layer.apply_router_weight_on_input;
  p.num_threads = layer.num_threads;
  return p;
}

absl::Status RunMoeExpertParallel(const EpLayer& layer, const MoeInputsForThisRank& inputs,
                                  comm::Communicator& comm, EpStrategy strategy) {
  if (strategy == EpStrategy::kPassthrough) {
    // Every rank of the step gets the same strategy, so every rank returns
    // here before any collective: the communicator stays usable.
    return WithField(
        absl::FailedPreconditionError(
            "all2all_backend 'passthrough' needs a device transport (moe_backend kplan_ep on "
            "GPU ranks); CPU expert-parallel ranks run allgather_reducescatter or "
            "kplan_all2allv"),
        "parallel.all2all_backend");
  }
  std::vector<int32_t> ids;
  std::vector<float> weights;
  const absl::Status local = PrepareLocal(layer, inputs, comm, ids, weights);

  // Header: every rank's token count and verdict on its inputs.
  const int n = comm.size(), rank = comm.rank();
  const int64_t header[2] = {inputs.num_tokens, static_cast<int64_t>(local.code())};
  std::vector<int64_t> headers(2 * n);
  if (absl::Status st = comm.AllGather(header, headers.data(), 2, kernels::DType::kInt64);
      !st.ok()) {
    comm.Abort(st.message());
    return st;
  }
  if (!local.ok()) return local;
  for (int r = 0; r < n; ++r) {
    if (headers[2 * r + 1] != 0) {
      const auto code = static_cast<absl::StatusCode>(headers[2 * r + 1]);
      return absl::Status(
          code, absl::StrCat("expert-parallel step rejected by rank ", r, " (",
                             absl::StatusCodeToString(code), "); that rank returned the details"));
    }
  }

  EpStep step;
  step.layer = &layer;
  step.rank = rank;
  step.size = n;
  step.tokens_per_rank.resize(n);
  for (int r = 0; r < n; ++r) step.tokens_per_rank[r] = headers[2 * r];
  step.num_tokens = inputs.num_tokens;
  step.hidden_states = inputs.hidden_states;
  step.topk_ids = ids.data();
  step.topk_weights = weights.data();
  step.output = inputs.output;

  std::unique_ptr<EpDispatch> dispatch = MakeEpDispatch(strategy);
  if (dispatch == nullptr) return absl::InvalidArgumentError("unknown expert-parallel strategy");
  absl::Status st = dispatch->Prepare(step, comm);
  if (st.ok()) st = dispatch->RunLocalExperts(step);
  if (st.ok()) st = dispatch->Finalize(step, comm);
  if (!st.ok()) {
    // Peers may be waiting in a collective this rank will never join.
    comm.Abort(
        absl::StrCat(EpStrategyName(strategy), " step failed on rank ", rank, ": ", st.message()));
    return absl::Status(
        st.code(), absl::StrCat(EpStrategyName(strategy), " on rank ", rank, ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace kplan::moe::ep
