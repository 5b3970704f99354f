// MoE router: fp32 logits [M, E] -> topk_weights fp32 [M, k], topk_ids int32
// [M, k], one warp per token, 4 warps per block (the kernel and its launch
// in moe_routing.cuh); here the checks of its parameters.
#include <cmath>
#include <string>

#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_routing.cuh"

namespace kplan::kernels::cuda {
namespace {

absl::Status Invalid(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(std::string(field) + ": " + what);
}

}  // namespace

MoeRoutingParams MoeRoutingParamsOf(const moe::RoutingSpec& r) {
  MoeRoutingParams rp;
  rp.num_experts = r.num_experts;
  rp.top_k = r.top_k;
  rp.method = r.method;
  rp.scoring = r.scoring;
  rp.renormalize = r.renormalize;
  rp.routed_scaling_factor = r.routed_scaling_factor;
  rp.num_expert_group = r.num_expert_group;
  rp.topk_group = r.topk_group;
  return rp;
}

absl::Status ValidateMoeRoutingParams(const MoeRoutingParams& p) {
  const int E = p.num_experts;
  if (E <= 0 || E > kMoeRoutingMaxExperts) {
    return Invalid("routing.num_experts", "num_experts must be in [1, " +
                                              std::to_string(kMoeRoutingMaxExperts) +
                                              "] for the GPU router, got " + std::to_string(E));
  }
  const int max_k = E < kMoeRoutingMaxTopK ? E : kMoeRoutingMaxTopK;
  if (p.top_k <= 0 || p.top_k > max_k) {
    return Invalid("routing.top_k", "top_k must be in [1, " + std::to_string(max_k) + "], got " +
                                        std::to_string(p.top_k));
  }
  const int method = static_cast<int>(p.method), scoring = static_cast<int>(p.scoring);
  if (method < 0 || method > 3) return Invalid("routing.method", "unknown routing method");
  if (scoring < 0 || scoring > 2) return Invalid("routing.scoring", "unknown scoring function");
  if (!std::isfinite(p.routed_scaling_factor)) {
    return Invalid("routing.routed_scaling_factor", "routed_scaling_factor must be finite");
  }
  if (p.method == RoutingMethod::kGroupedTopK) {
    const int G = p.num_expert_group;
    if (G <= 0 || p.topk_group <= 0) {
      return Invalid(G <= 0 ? "routing.num_expert_group" : "routing.topk_group",
                     "num_expert_group and topk_group must be provided when use_grouped_topk "
                     "is True");
    }
    if (G > kMoeRoutingMaxGroups) {
      return Invalid("routing.num_expert_group",
                     "the GPU router supports at most 32 expert groups, got " + std::to_string(G));
    }
    if (E % G != 0) {
      return Invalid("routing.num_expert_group", "num_expert_group " + std::to_string(G) +
                                                     " does not divide num_experts " +
                                                     std::to_string(E));
    }
    if (p.topk_group > G) {
      return Invalid("routing.topk_group", "topk_group " + std::to_string(p.topk_group) +
                                               " exceeds num_expert_group " + std::to_string(G));
    }
    const int per = E / G;
    if (p.e_score_correction_bias != nullptr && per < 2) {
      return Invalid("routing.num_expert_group",
                     "grouped top-k with a correction bias needs at least 2 experts per group");
    }
    if (p.top_k > p.topk_group * per) {
      return Invalid("routing.top_k", "top_k " + std::to_string(p.top_k) + " exceeds the " +
                                          std::to_string(p.topk_group * per) +
                                          " experts of the selected groups");
    }
  }
  return absl::OkStatus();
}

absl::Status detail::routing::CheckRoutingLaunch(const MoeRoutingParams& p, const float* logits,
                                                 int64_t num_tokens, const float* topk_weights,
                                                 const int32_t* topk_ids) {
  if (absl::Status s = ValidateMoeRoutingParams(p); !s.ok()) return s;
  if (num_tokens < 0) return Invalid("num_tokens", "num_tokens must not be negative");
  if (num_tokens > 0 && (logits == nullptr || topk_weights == nullptr || topk_ids == nullptr)) {
    return Invalid("router_logits", "logits and the top-k outputs must not be null");
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeRouting(const MoeRoutingParams& p, const float* logits, int64_t num_tokens,
                              float* topk_weights, int32_t* topk_ids, cudaStream_t stream) {
  return detail::routing::LaunchRoutingWith(p, logits, num_tokens, topk_weights, topk_ids,
                                            detail::routing::NoSideJob{}, 0, stream);
}

}  // namespace kplan::kernels::cuda
