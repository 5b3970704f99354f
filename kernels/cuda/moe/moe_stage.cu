// The call's staging copies by the SMs (moe_ops.h LaunchMoeStageCopy).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

constexpr int kStageThreads = 256;
constexpr int kStageUnroll = 4;  // loads in flight per thread before its stores
constexpr int64_t kStageMaxCtas = 132;

// Each thread moves kStageUnroll words of T a round, all loads issued
// before any store: over PCIe a load is a microsecond's round trip. With
// T = uint4 the `tail` bytes past the last whole word go by CTA 0.
template <typename T>
__global__ void __launch_bounds__(kStageThreads)
    MoeStageCopyKernel(const T* __restrict__ src, T* __restrict__ dst, int64_t n, int tail) {
  detail::PdlWaitThenRelease();
  const int64_t step = int64_t{gridDim.x} * kStageThreads * kStageUnroll;
  for (int64_t base = int64_t{blockIdx.x} * kStageThreads * kStageUnroll + threadIdx.x; base < n;
       base += step) {
    T v[kStageUnroll];
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kStageThreads;
      if (i < n) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kStageThreads;
      if (i < n) dst[i] = v[u];
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    reinterpret_cast<char*>(dst + n)[threadIdx.x] =
        reinterpret_cast<const char*>(src + n)[threadIdx.x];
  }
}

template <typename T>
absl::Status Launch(const void* src, void* dst, int64_t n, int tail, cudaStream_t stream) {
  const int64_t per_cta = int64_t{kStageThreads} * kStageUnroll;
  const int64_t ctas = std::max<int64_t>(1, std::min(kStageMaxCtas, (n + per_cta - 1) / per_cta));
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
      MoeStageCopyKernel<T>, dim3(static_cast<unsigned>(ctas)), dim3(kStageThreads), 0, stream,
      static_cast<const T*>(src), static_cast<T*>(dst), n, tail));
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchMoeStageCopy(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
    return absl::InvalidArgumentError("LaunchMoeStageCopy: null pointer or negative size");
  }
  if (bytes == 0) return absl::OkStatus();
  // 16-byte words when both pointers are aligned to them (the server's
  // buffers are), the bytes past the last word by the same kernel.
  const bool words =
      (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0;
  return words ? Launch<uint4>(src, dst, bytes / 16, static_cast<int>(bytes % 16), stream)
               : Launch<uint8_t>(src, dst, bytes, 0, stream);
}

}  // namespace kplan::kernels::cuda
