// Device formulas of the MoE activations (vllm-kernel-plan.md §6.3, the
// CPU reference's kernels/cpu/moe/moe_activation.cc), in fp32, for every
// kernel that applies them: Gated(act, params, x1, x2) for the gated ones
// (swigluoai: x1 = gate x[2i], x2 = up x[2i+1]), Plain(act, x) for _no_mul.
// params.clamp_limit must already hold the 7.0 default where absent.
// Internal to kernels/cuda.
#pragma once

#include "kernels/cuda/moe/moe_experts.h"

namespace kplan::kernels::cuda::moe_math {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float Silu(float x) { return x / (1.0f + expf(-x)); }
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
