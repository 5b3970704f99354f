// Device decoding of stored quantised int weights, shared by the quantised
// decode kernels (moe_quant_decode.cu: tiles on mma.sync;
// moe_quant_matvec.cu: whole rows per slot) so that both dequantise a stored
// int the same way, as the CPU reference does. Internal to
// kernels/cuda/moe.
#pragma once

#include <cstdint>

namespace kplan::kernels::cuda::detail::quant {

// Word i (compile-time after unrolling) of a 16-byte vector (int4 / uint4).
template <typename V>
__device__ __forceinline__ uint32_t WordOf(const V& v, int i) {
  return static_cast<uint32_t>(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}

// (q - zp)·s in fp32, q given as the low bits of an fp32 2^23 + q and zp as
// zp_biased = 2^23 + zp (the subtraction is exact); the caller rounds it to
// the activation type, as the CPU reference does.
__device__ __forceinline__ float Deq(uint32_t q, float zp_biased, float s) {
  return __fmul_rn(__int_as_float(0x4B000000 | q) - zp_biased, s);
}

// The biased zero point of an int group: the stored one, or the implied one
// (int4: 8; signed int8 is read as q + 128, hence 128).
__device__ __forceinline__ float BiasedZero(const uint8_t* zero, int64_t gi, bool int4) {
  const float zp = zero != nullptr ? static_cast<float>(__ldg(zero + gi)) : int4 ? 8.0f : 128.0f;
  return 8388608.0f + zp;
}

}  // namespace kplan::kernels::cuda::detail::quant
