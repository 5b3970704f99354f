// CUDA stream plumbing for the device workers: make the calling thread use a
// device and give it a non-blocking stream. Errors carry file:line and
// cudaGetErrorString.
#pragma once

#include "absl/status/statusor.h"

namespace kplan::kernels {

// cudaSetDevice + cudaStreamCreateWithFlags(cudaStreamNonBlocking).
absl::StatusOr<void*> CreateDeviceStream(int device);
void DestroyDeviceStream(void* stream);
absl::Status SynchronizeStream(void* stream);

// Makes `device` current for a scope and restores the previous device when
// it ends (so a caller on another device's worker thread is not disturbed).
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  absl::Status Enter(int device);
  ~DeviceScope();

 private:
  int prev_ = -1, device_ = -1;
};

}  // namespace kplan::kernels
