// CUDA errors of the IR op launchers as absl::Status, carrying file:line and
// cudaGetErrorString, so they cross module boundaries like every other error.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace kplan::kernels::cuda {

// OK for cudaSuccess; otherwise INTERNAL (RESOURCE_EXHAUSTED for
// cudaErrorMemoryAllocation) "<file>:<line>: <what>: <cudaGetErrorString>".
absl::Status CudaStatus(cudaError_t error, const char* file, int line, const char* what);

}  // namespace kplan::kernels::cuda

#define KPLAN_IR_CUDA_RETURN_IF_ERROR(expr)                                              \
  do {                                                                                   \
    if (cudaError_t _err = (expr); _err != cudaSuccess) {                                \
      return ::kplan::kernels::cuda::CudaStatus(_err, __FILE__, __LINE__, #expr);       \
    }                                                                                    \
  } while (0)

// After a kernel launch: the launch error, if any.
#define KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR(what)                                       \
  do {                                                                                   \
    if (cudaError_t _err = cudaGetLastError(); _err != cudaSuccess) {                    \
      return ::kplan::kernels::cuda::CudaStatus(_err, __FILE__, __LINE__, what);        \
    }                                                                                    \
  } while (0)
