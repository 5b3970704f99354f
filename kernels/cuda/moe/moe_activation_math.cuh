// Device formulas of the MoE activations (vllm-kernel-plan.md §6.3, the
// CPU reference's kernels/cpu/moe/moe_activation.cc), in fp32, for every
// kernel that applies them: Gated(act, params, x1, x2) for the gated ones
// (swigluoai: x1 = gate x[2i], x2 = up x[2i+1]), Plain(act, x) for _no_mul.
// params.clamp_limit must already hold the 7.0 default where absent.
// Internal to kernels/cuda.
#pragma once

#include "kernels/cuda/moe/moe_experts.h"

// SiluN's bits equal Silu's only where '/' is the IEEE division (div.rn).
#ifdef __USE_FAST_MATH__
#error "moe_activation_math.cuh: built with --use_fast_math"
#endif

namespace kplan::kernels::cuda::moe_math {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float SiluDenominator(float x) { return 1.0f + expf(-x); }
__device__ __forceinline__ float Silu(float x) { return x / SiluDenominator(x); }

// Silu of n values at once, bit-identical to Silu on each. The '/' of
// Silu compiles to a fast path with a range check and a branch to a slow
// path per division, so a thread's divisions run one after another; here
// every value takes the branch-free fast path (a refined reciprocal and
// one correction: round to nearest where the operands are in range, as
// the compiler's own fast path is) and the thread redoes the values out of
// range with '/' only when it has any. In range: d = 1 + e^-x in [1, 2^58)
// (x > -40) and x = 0 or 2^-60 <= |x| <= 2^100, so the quotient is normal.
// Measured (docs/PERF.md, session 24): the fused GEMM 1's epilogue, 64
// values a thread, mostly stalled on each instruction's predecessor (ncu
// source counters); batched 16 at a time, Mixtral-8x7B's fused GEMM 1 at 64
// tokens took 468 us against 516-537 and the layer 731-737 against 759.
__device__ __forceinline__ bool SiluFastInRange(float x) {
  const float a = fabsf(x);
  return x > -40.0f && a <= 0x1p100f && (a >= 0x1p-60f || x == 0.0f);
}
// The rare path, out of line: inlined it made the fused epilogue a fifth larger.
__device__ __noinline__ inline float SiluOutOfLine(float x) { return Silu(x); }
template <int kN>
__device__ __forceinline__ void SiluN(float (&x)[kN]) {
  float q[kN];
  bool slow = false;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float d = SiluDenominator(x[i]);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(d));
    r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
    const float q0 = __fmul_rn(x[i], r);
    q[i] = __fmaf_rn(__fmaf_rn(-d, q0, x[i]), r, q0);
    if (x[i] == 0.0f) q[i] = x[i];  // a select: the correction turns -0 into +0
    slow |= !SiluFastInRange(x[i]);
  }
  if (slow) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (!SiluFastInRange(x[i])) q[i] = SiluOutOfLine(x[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) x[i] = q[i];
}
__device__ __forceinline__ float GeluErf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float GeluTanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float Relu2(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return r * r;
}
__device__ __forceinline__ float Clamp(float x, float lo, float hi) {
  return fminf(fmaxf(x, lo), hi);
}

// The row of w13 (or of a run of its rows, `width` columns wide) that holds
// the gate (up = 0) or the up (up = 1) projection of intermediate column n
// of a gated activation: swigluoai interleaves them (2n, 2n + 1), the
// others stack them (n, width + n).
__device__ __forceinline__ int64_t GatedRow(MoeActivation act, int64_t n, int64_t width, int up) {
  return act == MoeActivation::kSwigluOai ? 2 * n + up : up * width + n;
}

__device__ __forceinline__ float Gated(MoeActivation act, const MoeActParams& p, float a, float b) {
  const float L = p.clamp_limit;
  switch (act) {
    case MoeActivation::kSilu:
      return p.has_clamp_limit ? Silu(fminf(a, L)) * Clamp(b, -L, L) : Silu(a) * b;
    case MoeActivation::kGelu:
      return GeluErf(a) * b;
    case MoeActivation::kGeluTanh:
      return GeluTanh(a) * b;
    case MoeActivation::kRelu2:
      return Relu2(a) * b;
    case MoeActivation::kSwigluOai: {
      const float g = fminf(a, L);
      return (Clamp(b, -L, L) + 1.0f) * (g * Sigmoid(p.alpha * g));
    }
    case MoeActivation::kSwigluOaiUninterleave: {
      const float g = fminf(a, L);
      return g * Sigmoid(p.alpha * g) * (Clamp(b, -L, L) + p.beta);
    }
    case MoeActivation::kSwigluStep:
      return fminf(Silu(a), L) * Clamp(b, -L, L);
    default:
      return 0.0f;
  }
}

// Gated(kSilu, p, a[i], b[i]) into a[i] for n pairs at once (SiluN).
template <int kN>
__device__ __forceinline__ void GatedSiluN(const MoeActParams& p, float (&a)[kN],
                                           const float (&b)[kN]) {
  const float L = p.clamp_limit;
  if (p.has_clamp_limit) {
#pragma unroll
    for (int i = 0; i < kN; ++i) a[i] = fminf(a[i], L);
  }
  SiluN(a);
#pragma unroll
  for (int i = 0; i < kN; ++i) a[i] = a[i] * (p.has_clamp_limit ? Clamp(b[i], -L, L) : b[i]);
}

__device__ __forceinline__ float Plain(MoeActivation act, float x) {
  switch (act) {
    case MoeActivation::kSiluNoMul:
      return Silu(x);
    case MoeActivation::kGeluNoMul:
      return GeluErf(x);
    case MoeActivation::kGeluTanhNoMul:
      return GeluTanh(x);
    default:
      return Relu2(x);
  }
}

}  // namespace kplan::kernels::cuda::moe_math
