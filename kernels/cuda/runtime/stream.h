// CUDA stream plumbing for the device workers (server/exec): make the calling
// thread use a device and give it a non-blocking stream. Streams travel as
// void* so that callers need no CUDA headers. Errors are CudaStatus's.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kplan::kernels::cuda {

// cudaSetDevice(device), then cudaStreamCreateWithFlags(cudaStreamNonBlocking):
// the device stays current on the calling thread.
absl::StatusOr<void*> CreateDeviceStream(int device);
// cudaStreamDestroy; null is a no-op.
void DestroyDeviceStream(void* stream);
absl::Status SynchronizeStream(void* stream);

}  // namespace kplan::kernels::cuda
