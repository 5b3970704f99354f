// Device decoding of stored quantised weights, shared by the quantised
// decode kernels (moe_quant_decode.cu: tiles on mma.sync; moe_quant_matvec.cu:
// one warp per weight row) so that both decode a stored byte the same way.
// Internal to kernels/cuda/moe.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kplan::kernels::cuda::detail::quant {

// Two e4m3 bytes (lo first) as an f16x2 register, exact.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
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
