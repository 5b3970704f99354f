#include "kernels/cuda/runtime/device_info.h"

#include <cuda_runtime_api.h>

#include <atomic>

#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

constexpr int kCachedDevices = 64;
std::atomic<int> sm_count[kCachedDevices];  // 0: not queried yet

}  // namespace

absl::StatusOr<int> MultiprocessorCount(int device) {
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    if (const int n = sm_count[device].load(std::memory_order_relaxed); n > 0) return n;
  }
  int n = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (cached) sm_count[device].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace kplan::kernels::cuda
