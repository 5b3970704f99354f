// Copy kernels for the device-copy roofline the benchmarks measure in the
// same run: grid-stride copies with kUnroll independent 16-byte loads per
// thread before the stores (kHints: no-L1 loads, streaming stores), and a
// one-shot grid. Each benchmark times its own list of variants and takes the
// best as the roofline.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

template <bool kHints>
__device__ __forceinline__ uint4 CopyLoad(const uint4* p) {
  if constexpr (kHints) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
  } else {
    return *p;
  }
}

template <bool kHints>
__device__ __forceinline__ void CopyStore(uint4* p, uint4 v) {
  if constexpr (kHints) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

template <int kUnroll, bool kHints>
__global__ void __launch_bounds__(256)
    CopyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = CopyLoad<kHints>(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) CopyStore<kHints>(dst + i + u * stride, v[u]);
  }
  for (; i < n; i += stride) CopyStore<kHints>(dst + i, CopyLoad<kHints>(src + i));
}

// One-shot: block b copies vectors [b * 256 * kUnroll, (b + 1) * 256 * kUnroll),
// thread t the ones at t + 256 u (grid = n / (256 kUnroll), no loop).
template <int kUnroll, bool kHints>
__global__ void __launch_bounds__(256)
    CopyOneShotKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t base = blockIdx.x * static_cast<size_t>(256 * kUnroll) + threadIdx.x;
  uint4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (base + u * 256 < n) v[u] = CopyLoad<kHints>(src + base + u * 256);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (base + u * 256 < n) CopyStore<kHints>(dst + base + u * 256, v[u]);
  }
}

struct CopyVariant {
  const char* name;
  void (*kernel)(const uint4*, uint4*, size_t);
  bool one_shot;
  int unroll;
  int waves;  // grid-stride: grid = SMs * 8 * waves (8 blocks of 256 = one full wave)
};
