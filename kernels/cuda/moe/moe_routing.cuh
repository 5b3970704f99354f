// The MoE router's per-token step (vllm-kernel-plan.md §6.1, §2.4), the
// same math as kernels/cpu/moe/moe_routing.cc (moe::RouteTokens): one warp
// routes one token's fp32 logits row [E] to k (weight, id) picks. Shared by
// the routing kernel (below, launched by moe_routing.cu's LaunchMoeRouting
// and moe_quant_ops.cu's LaunchMoeRoutingAndFp8Quantize) and the one-kernel
// decode layer (moe_decode_layer.cu), which routes in every CTA. Internal
// to kernels/cuda/moe.
//
// Lane l holds experts l, l+32, ... (kN per lane, up to 16: E <= 512) in
// registers, indexed by unrolled constants only; every method is a run-time
// switch, the only template parameter kN. Top-k (WarpTopK) is k picks under
// the reference's order (NaN largest, then larger value, then lower index),
// a total order, so ties go to the lowest index: each candidate is one
// 64-bit key (moe_routing_key.h) and each pick two redux.sync maxima; the
// selected expert's weight rides along as a payload. (It replaced a
// butterfly arg-max of (value, index, payload) per pick: the same picks bit
// for bit, 1.07-4.63x faster; docs/PERF.md, session 10.) Grouped top-k
// stages the biased scores in shared memory so that one lane per group
// computes the group score sequentially, exactly as the reference does. Sums
// (softmax denominators, renormalisation) are warp reductions: the order
// differs from the CPU loop, hence weights agree to ~1e-6 relative.
#pragma once

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_routing_key.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the routing top-k uses redux.sync: sm_80 or later"
#endif

namespace kplan::kernels::cuda::detail::routing {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kPerLane = kMoeRoutingMaxExperts / 32;  // 16
static_assert(PerLaneFor(kMoeRoutingMaxExperts) == kPerLane);

// The routing parameters the device step reads (MoeRoutingParams as ints).
struct RouteParams {
  const float* bias;  // device [E] or null
  float scale;
  int E, k, method, scoring, G, topk_group;
  bool renormalize;
};

inline RouteParams RouteParamsOf(const MoeRoutingParams& p) {
  return RouteParams{p.e_score_correction_bias,
                     p.routed_scaling_factor,
                     p.num_experts,
                     p.top_k,
                     static_cast<int>(p.method),
                     static_cast<int>(p.scoring),
                     p.num_expert_group,
                     p.topk_group,
                     p.renormalize};
}

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

// k picks by integer maxima; lane j < k gets the j-th pick (id, payload).
// Each candidate is one 64-bit key (moe_routing_key.h); per pick one
// redux.sync max over the lanes' best keys' high words, one over the low
// words of the lanes that hold that maximum (the lowest index), the payload
// from the winning lane, which then drops its candidate.
template <int kN>
__device__ __forceinline__ void WarpTopK(const float (&key)[kN], const float (&pay)[kN], int E,
                                         int k, int lane, int& my_id, float& my_pay) {
  uint64_t ck[kN];
  uint64_t head = LaneCandidates(key, E, lane, ck);
  for (int j = 0; j < k; ++j) {
    const uint32_t hi = static_cast<uint32_t>(head >> 32);
    const uint32_t top = __reduce_max_sync(kFull, hi);
    const uint32_t lo = __reduce_max_sync(kFull, hi == top ? static_cast<uint32_t>(head) : 0u);
    const int id = KeyIndex(lo);
    const float p = __shfl_sync(kFull, HeadPayload(ck, head, pay), id & 31);
    if (lane == j) {
      my_id = id;
      my_pay = p;
    }
    if (lane == (id & 31)) head = DropCandidate(ck, lane, id);
  }
}

// Routes one token with the whole warp: g is its fp32 logits row [E], E <=
// 32 * kN; s_choice is [E] floats of shared memory of this warp's own
// (grouped top-k only). Lane j < k returns the j-th pick in (w, id); other
// lanes' values are unspecified. Ties go to the lowest expert index; NaN
// ranks highest.
template <int kN>
__device__ __forceinline__ void RouteTokenWarp(const RouteParams& a, const float* g,
                                               float* s_choice, int lane, float& w, int& id) {
  const int E = a.E, k = a.k;

  float key[kN], pay[kN];
#pragma unroll
  for (int s = 0; s < kN; ++s) {
    const int e = lane + 32 * s;
    key[s] = e < E ? g[e] : 0.0f;
  }

  const bool scored = a.method == static_cast<int>(RoutingMethod::kTopK) ||
                      a.method == static_cast<int>(RoutingMethod::kGroupedTopK);
  if (scored) {
    if (a.scoring == static_cast<int>(ScoringFunc::kSoftmax)) {
      float mx = -INFINITY;
#pragma unroll
      for (int s = 0; s < kN; ++s) {
        if (lane + 32 * s < E) mx = fmaxf(mx, key[s]);
      }
      mx = WarpMax(mx);
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kN; ++s) {
        pay[s] = lane + 32 * s < E ? expf(key[s] - mx) : 0.0f;
        sum += pay[s];
      }
      sum = WarpSum(sum);
#pragma unroll
      for (int s = 0; s < kN; ++s) pay[s] = pay[s] / sum;
    } else if (a.scoring == static_cast<int>(ScoringFunc::kSigmoid)) {
#pragma unroll
      for (int s = 0; s < kN; ++s) pay[s] = Sigmoid(key[s]);
    } else {
#pragma unroll
      for (int s = 0; s < kN; ++s) pay[s] = SqrtSoftplus(key[s]);
    }
    // Selection key: scores (+ bias); payload: unbiased scores.
#pragma unroll
    for (int s = 0; s < kN; ++s) {
      const int e = lane + 32 * s;
      key[s] = (a.bias != nullptr && e < E) ? pay[s] + a.bias[e] : pay[s];
    }
  } else {
#pragma unroll
    for (int s = 0; s < kN; ++s) pay[s] = key[s];  // raw logits
  }

  if (a.method == static_cast<int>(RoutingMethod::kGroupedTopK)) {
    __syncwarp();  // a previous token's reads of s_choice are done
    float* c = s_choice;
#pragma unroll
    for (int s = 0; s < kN; ++s) {
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
    for (int s = 0; s < kN; ++s) {
      const int e = lane + 32 * s;
      if (e < E && !((keep >> (e / per)) & 1u)) key[s] = -INFINITY;
    }
  }

  int my_id = 0;
  float my_pay = 0.0f;
  WarpTopK<kN>(key, pay, E, k, lane, my_id, my_pay);
  id = my_id;

  const bool mine = lane < k;
  w = 0.0f;
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
}

// --- The routing kernel (LaunchMoeRouting, moe_ops.h), here so that work
// that neither reads what the routing writes nor writes what it reads can
// run in CTAs of its own beside it (MoeRoutingKernel's side job): one kernel of
// a decode layer's chain instead of two (LaunchMoeRoutingAndFp8Quantize,
// moe_quant_gemm.h).

constexpr int kWarpsPerBlock = 4;

struct RoutingArgs {
  const float* logits;
  int64_t num_tokens;
  float* weights;
  int32_t* ids;
  RouteParams p;
  unsigned route_blocks;  // blocks routing tokens (a warp each); side(...) in the rest
};

// No side job (LaunchMoeRouting).
struct NoSideJob {
  __device__ void operator()(unsigned /*block*/, unsigned /*blocks*/) const {}
};

// Blocks [0, a.route_blocks) route a token a warp, the picks to weights / ids
// [token, k]; the others run side(block - route_blocks, side blocks).
template <int kN, typename Side>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) MoeRoutingKernel(RoutingArgs a, Side side) {
  __shared__ float s_choice[kWarpsPerBlock][kMoeRoutingMaxExperts];
  PdlWaitThenRelease();
  if (blockIdx.x >= a.route_blocks) {
    side(blockIdx.x - a.route_blocks, gridDim.x - a.route_blocks);
    return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (token >= a.num_tokens) return;  // whole warp: no block barrier below
  float w;
  int id;
  RouteTokenWarp<kN>(a.p, a.logits + token * a.p.E, s_choice[warp], lane, w, id);
  if (lane < a.p.k) {
    a.weights[token * a.p.k + lane] = w;
    a.ids[token * a.p.k + lane] = id;
  }
}

// LaunchMoeRouting's checks of its arguments (moe_routing.cu).
absl::Status CheckRoutingLaunch(const MoeRoutingParams& p, const float* logits, int64_t num_tokens,
                                const float* topk_weights, const int32_t* topk_ids);

// LaunchMoeRouting with `side` in side_blocks more blocks of
// kWarpsPerBlock warps.
template <typename Side>
absl::Status LaunchRoutingWith(const MoeRoutingParams& p, const float* logits, int64_t num_tokens,
                               float* topk_weights, int32_t* topk_ids, const Side& side,
                               int64_t side_blocks, cudaStream_t stream) {
  if (absl::Status s = CheckRoutingLaunch(p, logits, num_tokens, topk_weights, topk_ids); !s.ok()) {
    return s;
  }
  const int64_t route_blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (route_blocks + side_blocks > 0x7fffffff) {
    return absl::InvalidArgumentError("num_tokens: too many tokens");
  }
  if (route_blocks + side_blocks == 0) return absl::OkStatus();
  RoutingArgs a;
  a.logits = logits;
  a.num_tokens = num_tokens;
  a.weights = topk_weights;
  a.ids = topk_ids;
  a.p = RouteParamsOf(p);
  a.route_blocks = static_cast<unsigned>(route_blocks);
  void (*kernel)(RoutingArgs, Side) = MoeRoutingKernel<kPerLane, Side>;
  switch (PerLaneFor(p.num_experts)) {
    case 1:
      kernel = MoeRoutingKernel<1, Side>;
      break;
    case 4:
      kernel = MoeRoutingKernel<4, Side>;
      break;
    case 8:
      kernel = MoeRoutingKernel<8, Side>;
      break;
    default:
      break;
  }
  KPLAN_CUDA_RETURN_IF_ERROR(LaunchPdl(kernel,
                                       dim3(static_cast<unsigned>(route_blocks + side_blocks)),
                                       dim3(kWarpsPerBlock * 32), 0, stream, a, side));
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda::detail::routing
