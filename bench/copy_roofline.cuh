// Copy kernels for the device-copy roofline the benchmarks measure in the
// same run: grid-stride copies with kUnroll independent 16-byte loads per
// thread before the stores (kHints: no-L1 loads, streaming stores), and a
// one-shot grid. MeasureCopyRoofline times kCopyRooflineVariants and takes
// the best correct one as the roofline (ir_bench times its own list).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/bench_check.h"

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

inline const CopyVariant kCopyRooflineVariants[] = {
    {"gs_u1_w1", CopyKernel<1, false>, false, 1, 1},
    {"gs_u4_w1_h", CopyKernel<4, true>, false, 4, 1},
    {"gs_u2_w4", CopyKernel<2, false>, false, 2, 4},
    {"os_u2", CopyOneShotKernel<2, false>, true, 2, 0},
    {"os_u4_h", CopyOneShotKernel<4, true>, true, 4, 0},
};

static __global__ void CopyRooflineFill(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<uint32_t>(i * 0x9e3779b1u) | 1u;  // never zero
  }
}

// The device-copy roofline over `bytes` (read + write counted): every
// variant of kCopyRooflineVariants on a device with `sms` multiprocessors,
// its head and tail checked, its median printed; the best correct one's
// GB/s, 0 when none copied right.
inline double MeasureCopyRoofline(size_t bytes, int sms, cudaStream_t stream) {
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CopyRooflineFill<<<1024, 256, 0, stream>>>(static_cast<uint32_t*>(src), bytes / 4);
  const size_t vecs = bytes / 16;
  std::vector<uint16_t> a(4096), b(4096);
  double best = 0;
  for (const CopyVariant& c : kCopyRooflineVariants) {
    const size_t grid = c.one_shot ? (vecs + 256 * c.unroll - 1) / (256 * c.unroll)
                                   : static_cast<size_t>(sms) * 8 * c.waves;
    auto launch = [&] {
      c.kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(static_cast<const uint4*>(src),
                                                                static_cast<uint4*>(dst), vecs);
    };
    CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, stream));
    launch();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    bool ok = true;  // the head and the tail of the copy
    for (size_t off : {size_t{0}, bytes - sizeof(uint16_t) * a.size()}) {
      CHECK_CUDA(cudaMemcpy(a.data(), static_cast<char*>(src) + off, a.size() * 2,
                            cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(b.data(), static_cast<char*>(dst) + off, b.size() * 2,
                            cudaMemcpyDeviceToHost));
      ok = ok && a == b;
    }
    const double ms = MedianMs(launch, 30, 10, stream);
    const double gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
    std::printf("copy    %-10s %zu MiB (read + write): %8.1f us  %6.0f GB/s%s\n", c.name,
                bytes >> 20, ms * 1e3, gbps, ok ? "" : "  <-- WRONG OUTPUT");
    if (ok) best = std::max(best, gbps);
  }
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  return best;
}
