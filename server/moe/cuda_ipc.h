// CUDA IPC memory of another process on this host, for the shared-memory
// regions of shm_regions.h (Triton's CUDA shared-memory extension): open a
// cudaIpcMemHandle_t once, close it when the region goes, copy bytes out of
// it; and page-locking a POSIX region's mapping for the GPUs. The one file
// of the region registry that sees CUDA; without CUDA in the build every
// call is UNIMPLEMENTED (pinning: false). This header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kplan {

// sizeof(cudaIpcMemHandle_t) (CU_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;

struct CudaIpcMemory {
  void* base = nullptr;     // the client's allocation, opened in this process
  int64_t alloc_bytes = 0;  // its size (the driver's address range)
};

// cudaIpcOpenMemHandle(handle) on `device` (handle of kCudaIpcHandleBytes).
// A handle is open at most once in this process (the driver maps an
// allocation once; a second open and its close would pull the mapping from
// under the first): ALREADY_EXISTS naming "cuda_ipc_handle" while it is.
// INVALID_ARGUMENT naming "cuda_ipc_handle" for a handle the driver rejects
// (another process's stale handle, the wrong GPU, this process's own
// memory); UNIMPLEMENTED without CUDA in the build.
absl::StatusOr<CudaIpcMemory> OpenCudaIpcMemory(absl::string_view handle, int device);
// cudaIpcCloseMemHandle on `device` of what OpenCudaIpcMemory(handle) gave;
// errors are logged.
void CloseCudaIpcMemory(void* base, int device, absl::string_view handle);
// Synchronous copy of `bytes` of device memory on `device` to the host.
absl::Status CopyCudaToHost(void* host, const void* src, int64_t bytes, int device);

// cudaHostRegister (portable: every GPU of the process) of `bytes` of host
// memory at `p` (a POSIX region's mapping), so that the copy engines read and
// write it directly. False, logged and the error cleared, when the driver
// refuses (the memory is then used unpinned); always false without CUDA.
bool PinHostMemory(void* p, size_t bytes);
// cudaHostUnregister of what PinHostMemory(p) pinned; errors are logged.
void UnpinHostMemory(void* p);

}  // namespace kplan
