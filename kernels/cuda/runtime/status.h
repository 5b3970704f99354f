// CUDA and NCCL results as absl::Status: the one mapping of the build. Every
// CUDA or NCCL call outside a kernel returns through it, so an error carries
// "<file>:<line>: <what>: <the library's error string>" across module
// boundaries like every other error, and the same failure gets the same code
// everywhere: out of device memory is RESOURCE_EXHAUSTED (the RPC layer then
// answers RESOURCE_EXHAUSTED, as ARCHITECTURE.md "Errors" says), a misused
// NCCL call INVALID_ARGUMENT, a dead peer UNAVAILABLE, the rest INTERNAL.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kplan::kernels::cuda {

// OK for cudaSuccess; RESOURCE_EXHAUSTED for cudaErrorMemoryAllocation;
// INTERNAL otherwise. Message "<file>:<line>: <what>: <cudaGetErrorString>".
// Needs no device (cudaGetErrorString is a table lookup).
absl::Status CudaStatus(cudaError_t error, const char* file, int line, const char* what);

// The canonical code of an NCCL result (an ncclResult_t as int, so that this
// header needs no nccl.h) whose ncclGetLastError text is `last_error`:
// ncclInvalidArgument / ncclInvalidUsage -> INVALID_ARGUMENT, ncclRemoteError
// / ncclInProgress -> UNAVAILABLE, ncclUnhandledCudaError / ncclSystemError
// whose text says the memory ran out -> RESOURCE_EXHAUSTED, else INTERNAL.
absl::StatusCode NcclStatusCode(int result, absl::string_view last_error);

// OK for ncclSuccess; otherwise NcclStatusCode and "<file>:<line>: <what>:
// <ncclGetErrorString> (<ncclGetLastError>)". Defined only in builds with
// NCCL (KPLAN_HAVE_NCCL): only code that calls NCCL calls it.
absl::Status NcclStatus(int result, const char* file, int line, const char* what);

}  // namespace kplan::kernels::cuda

// Returns the Status of a failed CUDA runtime call from the enclosing
// function. Failed calls are also cleared from the thread's last-error state,
// so a later KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR does not report them again.
#define KPLAN_CUDA_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                       \
    if (const cudaError_t kplan_cuda_err_ = (expr); kplan_cuda_err_ != cudaSuccess) {        \
      (void)cudaGetLastError();                                                              \
      return ::kplan::kernels::cuda::CudaStatus(kplan_cuda_err_, __FILE__, __LINE__, #expr); \
    }                                                                                        \
  } while (0)

// After a kernel launch (<<<...>>>): the launch error, if any; `what` names it.
#define KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR(what)                                                   \
  do {                                                                                            \
    if (const cudaError_t kplan_cuda_err_ = cudaGetLastError(); kplan_cuda_err_ != cudaSuccess) { \
      return ::kplan::kernels::cuda::CudaStatus(kplan_cuda_err_, __FILE__, __LINE__, what);       \
    }                                                                                             \
  } while (0)

// Returns the Status of a failed NCCL call (an ncclResult_t expression).
#define KPLAN_NCCL_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                       \
    if (const int kplan_nccl_res_ = static_cast<int>(expr); kplan_nccl_res_ != 0) {          \
      return ::kplan::kernels::cuda::NcclStatus(kplan_nccl_res_, __FILE__, __LINE__, #expr); \
    }                                                                                        \
  } while (0)
