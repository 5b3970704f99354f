#include "server/moe/cuda_ipc.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

#if KPLAN_HAVE_CUDA
#include <cuda.h>  // CUdeviceptr, CUresult (types only: the entry point comes from the runtime)
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/status.h"
#include "spdlog/spdlog.h"
#endif

namespace kplan {

#if KPLAN_HAVE_CUDA
namespace {

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange through the runtime's driver entry point (no -lcuda).
AddressRangeFn AddressRange() {
  static std::once_flag once;
  static AddressRangeFn fn = nullptr;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<AddressRangeFn>(f);
    }
    cudaGetLastError();
  });
  return fn;
}

// The handles open in this process.
std::mutex open_mu;
std::set<std::string, std::less<>>& OpenHandles() {
  static auto* open = new std::set<std::string, std::less<>>();
  return *open;
}

}  // namespace

absl::StatusOr<CudaIpcMemory> OpenCudaIpcMemory(absl::string_view handle, int device) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return InvalidField("cuda_ipc_handle",
                        absl::StrCat("a CUDA IPC handle has ", sizeof(cudaIpcMemHandle_t),
                                     " bytes (cudaIpcGetMemHandle), got ", handle.size()));
  }
  std::lock_guard<std::mutex> lock(open_mu);
  if (OpenHandles().count(handle)) {
    return WithField(absl::AlreadyExistsError(
                         "this CUDA allocation is registered already (or a call still uses it "
                         "after its unregister); one region per allocation"),
                     "cuda_ipc_handle");
  }
  kernels::cuda::DeviceGuard guard;
  KPLAN_RETURN_IF_ERROR(guard.Enter(device));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next call on this thread
    return InvalidField("cuda_ipc_handle",
                        absl::StrCat("cudaIpcOpenMemHandle on cuda:", device,
                                     " refused the handle: ", cudaGetErrorString(err),
                                     " (a live allocation of another process on this GPU?)"));
  }
  // With peer access a handle of another GPU's memory opens here too: the
  // region must be on the device it names.
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, base) != cudaSuccess || attr.type != cudaMemoryTypeDevice ||
      attr.device != device) {
    cudaGetLastError();
    (void)cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    return WithField(absl::FailedPreconditionError(absl::StrCat(
                         "the CUDA allocation behind cuda_ipc_handle is not memory of cuda:",
                         device, " (it is on cuda:", attr.device,
                         " as this server numbers its GPUs); give that device_id")),
                     "device_id");
  }
  CudaIpcMemory mem;
  mem.base = base;
  CUdeviceptr start = 0;
  size_t size = 0;
  const AddressRangeFn range = AddressRange();
  if (range == nullptr ||
      range(&start, &size, reinterpret_cast<CUdeviceptr>(base)) != CUDA_SUCCESS) {
    (void)cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    return absl::InternalError("cuMemGetAddressRange failed on an opened CUDA IPC handle");
  }
  mem.alloc_bytes = static_cast<int64_t>(size - (reinterpret_cast<CUdeviceptr>(base) - start));
  OpenHandles().emplace(handle);
  return mem;
}

void CloseCudaIpcMemory(void* base, int device, absl::string_view handle) {
  std::lock_guard<std::mutex> lock(open_mu);
  if (auto it = OpenHandles().find(handle); it != OpenHandles().end()) OpenHandles().erase(it);
  kernels::cuda::DeviceGuard guard;
  if (absl::Status s = guard.Enter(device); !s.ok()) {
    spdlog::warn("closing a CUDA IPC region on cuda:{}: {}", device, s.ToString());
    return;
  }
  if (const cudaError_t err = cudaIpcCloseMemHandle(base); err != cudaSuccess) {
    cudaGetLastError();
    spdlog::warn("cudaIpcCloseMemHandle on cuda:{}: {}", device, cudaGetErrorString(err));
  }
}

absl::Status CopyCudaToHost(void* host, const void* src, int64_t bytes, int device) {
  if (bytes == 0) return absl::OkStatus();
  kernels::cuda::DeviceGuard guard;
  KPLAN_RETURN_IF_ERROR(guard.Enter(device));
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

bool PinHostMemory(void* p, size_t bytes) {
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next call on this thread
    spdlog::info(
        "shared-memory region of {} bytes stays unpinned (cudaHostRegister: {}); the "
        "GPU path stages its bytes",
        bytes, cudaGetErrorString(err));
    return false;
  }
  return true;
}

void UnpinHostMemory(void* p) {
  if (const cudaError_t err = cudaHostUnregister(p); err != cudaSuccess) {
    cudaGetLastError();
    spdlog::warn("cudaHostUnregister of a shared-memory region: {}", cudaGetErrorString(err));
  }
}

#else  // without CUDA in the build

namespace {
absl::Status NoCuda() {
  return absl::UnimplementedError(
      "this server was built without CUDA: CUDA IPC shared memory needs a CUDA build and a GPU");
}

}  // namespace

absl::StatusOr<CudaIpcMemory> OpenCudaIpcMemory(absl::string_view, int) { return NoCuda(); }
void CloseCudaIpcMemory(void*, int, absl::string_view) {}
absl::Status CopyCudaToHost(void*, const void*, int64_t, int) { return NoCuda(); }
bool PinHostMemory(void*, size_t) { return false; }
void UnpinHostMemory(void*) {}

#endif

}  // namespace kplan
