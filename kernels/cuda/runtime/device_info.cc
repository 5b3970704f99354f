#include "kernels/cuda/runtime/device_info.h"

#include <cuda_runtime_api.h>

#include <atomic>

#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

constexpr int kCachedDevices = 64;
std::atomic<int> sm_count[kCachedDevices];  // 0: not queried yet
std::atomic<int> l2_bytes[kCachedDevices];

absl::StatusOr<int> Cached(std::atomic<int> (&cache)[kCachedDevices], cudaDeviceAttr attr,
                           int device) {
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    if (const int n = cache[device].load(std::memory_order_relaxed); n > 0) return n;
  }
  int n = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n, attr, device));
  if (cached) cache[device].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace

absl::StatusOr<int> MultiprocessorCount(int device) {
  return Cached(sm_count, cudaDevAttrMultiProcessorCount, device);
}

absl::StatusOr<int> L2CacheBytes(int device) {
  return Cached(l2_bytes, cudaDevAttrL2CacheSize, device);
}

}  // namespace kplan::kernels::cuda
