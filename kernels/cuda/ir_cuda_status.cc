#include "kernels/cuda/ir_cuda_status.h"

#include "absl/strings/str_cat.h"

namespace kplan::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, const char* file, int line, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(file, ":", line, ": ", what, ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace kplan::kernels::cuda
