// A kernel's dynamic shared-memory opt-in, raised once per device, for the
// launchers whose kernels take one fixed size (moe_align's size changes with
// the experts, so it sets the attribute per launch; the decode layer caches it
// with its other launch facts). Header-only: the kernel is a template
// argument.
#pragma once

#include <cuda_runtime.h>  // cudaFuncSetAttribute's template over kernel pointers

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {

// Sets kKernel's dynamic shared-memory limit on the current device to
// `bytes` (the one size its launches take) the first time it is called for
// that device; each kernel instantiation keeps its own bits. Thread-safe: the
// attribute is idempotent, so a race only repeats the call. A failed call is
// not remembered; device ordinals past 63 set it every time.
template <auto kKernel>
absl::Status RaiseDynamicSmemOnce(int bytes) {
  static std::atomic<uint64_t> set{0};  // one bit per device ordinal below 64
  int device = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if ((set.load(std::memory_order_acquire) & bit) != 0) return absl::OkStatus();
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  set.fetch_or(bit, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
