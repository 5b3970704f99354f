// Device helpers shared by the IR op kernels and the MoE kernels: element
// conversions (typed and by run-time DType), GELU, warp-wide sums and maxima
// and block-wide sums. Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/ir_types.h"

namespace kplan::kernels::cuda::detail {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two values rounded to T (bf16 / fp16), packed as one 4-byte word (first
// value low): one conversion instruction for both.
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "16-bit T");
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}
// The inverse: the two T values of a word as floats (exact).
template <typename T>
__device__ __forceinline__ void Unpack2(uint32_t u, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    lo = __uint_as_float(u << 16);
    hi = __uint_as_float(u & 0xffff0000u);
  } else {
    T v[2];
    memcpy(v, &u, 4);
    lo = ToFloat(v[0]);
    hi = ToFloat(v[1]);
  }
}
// a and b rounded to T in place (ToFloat(FromFloat<T>(x)) of each).
template <typename T>
__device__ __forceinline__ void Round2(float& a, float& b) {
  Unpack2<T>(Pack2<T>(a, b), a, b);
}

// Run-time typed access (the native IR kernels, the MoE emulation route).
__device__ __forceinline__ float LoadAsFloat(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void StoreFromFloat(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kFloat16:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      return;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      return;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

// v.to(t).to(float32).
__device__ __forceinline__ float RoundTo(DType t, float v) {
  switch (t) {
    case DType::kFloat16:
      return __half2float(__float2half_rn(v));
    case DType::kBFloat16:
      return __bfloat162float(__float2bfloat16_rn(v));
    default:
      return v;
  }
}

__device__ __forceinline__ float Gelu(float x, bool tanh_approximate) {
  if (tanh_approximate) {
    const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + tanhf(inner));
  }
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum of `v` over the block, returned to every thread. `scratch` holds 32
// floats of shared memory; it may be reused right after the call returns.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  // Every warp reduces the per-warp sums itself: one barrier fewer than a
  // broadcast, and all threads get the bit-identical total.
  v = lane < warps ? scratch[lane] : 0.f;
  v = WarpSum(v);
  __syncthreads();
  return v;
}

}  // namespace kplan::kernels::cuda::detail
