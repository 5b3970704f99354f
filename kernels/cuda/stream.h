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

}  // namespace kplan::kernels
