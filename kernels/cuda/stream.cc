#include "kernels/cuda/stream.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace kplan::kernels {
namespace {

absl::Status CudaError(cudaError_t e, const char* what, int line) {
  return absl::InternalError(
      absl::StrCat(what, " failed (", __FILE__, ":", line, "): ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<void*> CreateDeviceStream(int device) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice", __LINE__);
  }
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError(e, "cudaStreamCreateWithFlags", __LINE__);
  }
  return static_cast<void*>(stream);
}

void DestroyDeviceStream(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

absl::Status SynchronizeStream(void* stream) {
  if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return CudaError(e, "cudaStreamSynchronize", __LINE__);
  }
  return absl::OkStatus();
}

absl::Status DeviceScope::Enter(int device) {
  if (cudaError_t e = cudaGetDevice(&prev_); e != cudaSuccess) {
    return CudaError(e, "cudaGetDevice", __LINE__);
  }
  if (prev_ != device) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(e, "cudaSetDevice", __LINE__);
    }
  }
  device_ = device;
  return absl::OkStatus();
}

DeviceScope::~DeviceScope() {
  if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
}

}  // namespace kplan::kernels
