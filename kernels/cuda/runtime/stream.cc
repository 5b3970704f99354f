#include "kernels/cuda/runtime/stream.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {

absl::StatusOr<void*> CreateDeviceStream(int device) {
  KPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return static_cast<void*>(stream);
}

void DestroyDeviceStream(void* stream) {
  if (stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

absl::Status SynchronizeStream(void* stream) {
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
