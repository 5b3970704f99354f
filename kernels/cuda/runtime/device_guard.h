// DeviceGuard: makes a CUDA device current for a scope and restores the
// device that was current before when the scope ends, so code that runs on
// another device's worker thread (or a destructor freeing memory of some
// device) does not disturb its caller. The one device guard of the build.
//
//   DeviceGuard guard;
//   KPLAN_RETURN_IF_ERROR(guard.Enter(device));   // or (void) in a destructor
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {

class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // Restores the previous device if Enter switched away from it.
  ~DeviceGuard() {
    if (prev_ >= 0 && prev_ != device_) (void)cudaSetDevice(prev_);
  }

  // cudaGetDevice, then cudaSetDevice(device) unless it is already current.
  // Call once per guard.
  absl::Status Enter(int device) {
    KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev_));
    if (prev_ != device) KPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    device_ = device;
    return absl::OkStatus();
  }

 private:
  int prev_ = -1, device_ = -1;
};

}  // namespace kplan::kernels::cuda
