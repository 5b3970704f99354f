// MoE router: fp32 logits [M, E] -> topk_weights fp32 [M, k], topk_ids int32
// [M, k] (vllm-kernel-plan.md §6.1, §2.4), the same math as
// kernels/cpu/moe/moe_routing.cc (moe::RouteTokens).
//
// One warp per token, 4 warps per block, one kernel for every method (a
// run-time switch, no templates). Lane l holds experts l, l+32, ... (up to
// 16 per lane, E <= 512) in registers, indexed by unrolled constants only.
// Top-k is k rounds of a warp arg-max over (key, index) under the reference's
// order (NaN largest, then larger value, then lower index), a total order, so
// every lane of the butterfly agrees and ties go to the lowest index; the
// selected expert's weight rides along as a payload. Each lane caches its
// own best candidate and only the lane that lost its best rescans. Grouped
// top-k stages the biased scores in shared memory so that one lane per group
// computes the group score sequentially, exactly as the reference does.
// Sums (softmax denominators, renormalisation) are warp reductions: the
// order differs from the CPU loop, hence weights agree to ~1e-6 relative.
#include <cmath>
#include <string>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::WarpMax;
using detail::WarpSum;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kMoeRoutingMaxExperts / 32;  // 16

struct RoutingArgs {
  const float* logits;
  int64_t num_tokens;
  float* weights;
  int32_t* ids;
  const float* bias;
  float scale;
  int E, k, method, scoring, G, topk_group;
  bool renormalize;
};

// a ranks before b. Index -1 is "no candidate" and ranks after everything.
__device__ __forceinline__ bool Before(float va, int a, float vb, int b) {
  if (b < 0) return a >= 0;
  if (a < 0) return false;
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return a < b;
}

__device__ __forceinline__ void WarpBest(float& v, int& i, float& p) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, off);
    const int oi = __shfl_xor_sync(kFull, i, off);
    const float op = __shfl_xor_sync(kFull, p, off);
    if (Before(ov, oi, v, i)) {
      v = ov;
      i = oi;
      p = op;
    }
  }
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// torch softplus (beta 1, threshold 20), then sqrt.
__device__ __forceinline__ float SqrtSoftplus(float x) {
  return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

// Best not-yet-taken candidate of this lane.
__device__ __forceinline__ void LaneBest(const float (&key)[kPerLane], const float (&pay)[kPerLane],
                                         unsigned taken, int E, int lane, float& bv, int& bi,
                                         float& bp) {
  bv = 0.0f;
  bi = -1;
  bp = 0.0f;
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int e = lane + 32 * s;
    if (e < E && !((taken >> s) & 1u) && Before(key[s], e, bv, bi)) {
      bv = key[s];
      bi = e;
      bp = pay[s];
    }
  }
}

// k rounds of warp arg-max; lane j < k gets the j-th pick (id, payload).
__device__ __forceinline__ void WarpTopK(const float (&key)[kPerLane], const float (&pay)[kPerLane],
                                         int E, int k, int lane, int& my_id, float& my_pay) {
  unsigned taken = 0;
  float lv, lp;
  int li;
  LaneBest(key, pay, taken, E, lane, lv, li, lp);
  for (int j = 0; j < k; ++j) {
    float v = lv, p = lp;
    int i = li;
    WarpBest(v, i, p);
    if (lane == j) {
      my_id = i;
      my_pay = p;
    }
    if (i >= 0 && (i & 31) == lane) {
      taken |= 1u << (i >> 5);
      LaneBest(key, pay, taken, E, lane, lv, li, lp);
    }
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32) MoeRoutingKernel(RoutingArgs a) {
  __shared__ float s_choice[kWarpsPerBlock][kMoeRoutingMaxExperts];
  detail::PdlWaitThenRelease();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (token >= a.num_tokens) return;  // whole warp: no block barrier below
  const int E = a.E, k = a.k;
  const float* g = a.logits + token * E;

  float key[kPerLane], pay[kPerLane];
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int e = lane + 32 * s;
    key[s] = e < E ? g[e] : 0.0f;
  }

  const bool scored = a.method == static_cast<int>(RoutingMethod::kTopK) ||
                      a.method == static_cast<int>(RoutingMethod::kGroupedTopK);
  if (scored) {
    if (a.scoring == static_cast<int>(ScoringFunc::kSoftmax)) {
      float mx = -INFINITY;
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) {
        if (lane + 32 * s < E) mx = fmaxf(mx, key[s]);
      }
      mx = WarpMax(mx);
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) {
        pay[s] = lane + 32 * s < E ? expf(key[s] - mx) : 0.0f;
        sum += pay[s];
      }
      sum = WarpSum(sum);
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) pay[s] = pay[s] / sum;
    } else if (a.scoring == static_cast<int>(ScoringFunc::kSigmoid)) {
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) pay[s] = Sigmoid(key[s]);
    } else {
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) pay[s] = SqrtSoftplus(key[s]);
    }
    // Selection key: scores (+ bias); payload: unbiased scores.
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int e = lane + 32 * s;
      key[s] = (a.bias != nullptr && e < E) ? pay[s] + a.bias[e] : pay[s];
    }
  } else {
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) pay[s] = key[s];  // raw logits
  }

  if (a.method == static_cast<int>(RoutingMethod::kGroupedTopK)) {
    float* c = s_choice[warp];
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      if (lane + 32 * s < E) c[lane + 32 * s] = key[s];
    }
    __syncwarp();
    const int G = a.G, per = E / G;
    // Lane gi: group score of group gi (top-2 sum with bias, max without).
    float gs = 0.0f;
    int gi = -1;
    if (lane < G) {
      float v1 = 0.0f, v2 = 0.0f;
      int i1 = -1, i2 = -1;
      for (int i = 0; i < per; ++i) {
        const float v = c[lane * per + i];
        if (Before(v, i, v1, i1)) {
          v2 = v1;
          i2 = i1;
          v1 = v;
          i1 = i;
        } else if (Before(v, i, v2, i2)) {
          v2 = v;
          i2 = i;
        }
      }
      gs = a.bias != nullptr ? v1 + v2 : v1;
      gi = lane;
    }
    // Keep the topk_group best groups.
    unsigned keep = 0;
    for (int j = 0; j < a.topk_group; ++j) {
      float v = gs, p = 0.0f;
      int i = gi;
      WarpBest(v, i, p);
      if (i >= 0) keep |= 1u << i;
      if (i == lane) gi = -1;
    }
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int e = lane + 32 * s;
      if (e < E && !((keep >> (e / per)) & 1u)) key[s] = -INFINITY;
    }
  }

  int my_id = 0;
  float my_pay = 0.0f;
  WarpTopK(key, pay, E, k, lane, my_id, my_pay);

  const bool mine = lane < k;
  float w = 0.0f;
  if (a.method == static_cast<int>(RoutingMethod::kTopKThenSoftmax)) {
    const float mx = WarpMax(mine ? my_pay : -INFINITY);
    const float ex = mine ? expf(my_pay - mx) : 0.0f;
    const float sum = WarpSum(ex);
    w = ex / sum;
  } else if (a.method == static_cast<int>(RoutingMethod::kLlama4)) {
    w = Sigmoid(my_pay);
  } else {
    w = my_pay;
    if (a.renormalize) {
      const float sum = WarpSum(mine ? w : 0.0f);
      w = w / sum;
    }
    if (a.scale != 1.0f) w = w * a.scale;
  }
  if (mine) {
    a.weights[token * k + lane] = w;
    a.ids[token * k + lane] = my_id;
  }
}

absl::Status Invalid(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(std::string(field) + ": " + what);
}

}  // namespace

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

absl::Status LaunchMoeRouting(const MoeRoutingParams& p, const float* logits, int64_t num_tokens,
                              float* topk_weights, int32_t* topk_ids, cudaStream_t stream) {
  if (absl::Status s = ValidateMoeRoutingParams(p); !s.ok()) return s;
  if (num_tokens < 0) return Invalid("num_tokens", "num_tokens must not be negative");
  if (num_tokens == 0) return absl::OkStatus();
  if (logits == nullptr || topk_weights == nullptr || topk_ids == nullptr) {
    return Invalid("router_logits", "logits and the top-k outputs must not be null");
  }
  const int64_t blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return Invalid("num_tokens", "too many tokens");
  RoutingArgs a;
  a.logits = logits;
  a.num_tokens = num_tokens;
  a.weights = topk_weights;
  a.ids = topk_ids;
  a.bias = p.e_score_correction_bias;
  a.scale = p.routed_scaling_factor;
  a.E = p.num_experts;
  a.k = p.top_k;
  a.method = static_cast<int>(p.method);
  a.scoring = static_cast<int>(p.scoring);
  a.G = p.num_expert_group;
  a.topk_group = p.topk_group;
  a.renormalize = p.renormalize;
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(MoeRoutingKernel,
                                               dim3(static_cast<unsigned>(blocks)),
                                               dim3(kWarpsPerBlock * 32), 0, stream, a));
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
