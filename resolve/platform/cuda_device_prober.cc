// The CUDA DeviceProber: lists the GPUs this process can see through the CUDA
// runtime. No driver or no device reads as "no devices" (the CPU path), a
// driver that answers with another error is reported as such.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "resolve/platform/local.h"

namespace kplan {
namespace {

std::string VersionString(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

class CudaDeviceProber final : public DeviceProber {
 public:
  absl::StatusOr<LocalRuntime> Probe() const override {
    LocalRuntime rt;
    int runtime_version = 0;
    if (cudaRuntimeGetVersion(&runtime_version) == cudaSuccess) {
      rt.cuda_runtime_version = VersionString(runtime_version);
    }
    int driver_version = 0;
    if (cudaDriverGetVersion(&driver_version) == cudaSuccess && driver_version > 0) {
      rt.cuda_driver_version = VersionString(driver_version);
    }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
        rt.cuda_driver_version.empty()) {
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return rt;
    }
    if (err != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount failed (", __FILE__, ":",
                                                 __LINE__, "): ", cudaGetErrorString(err)));
    }
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop{};
      if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
        return absl::UnavailableError(absl::StrCat("cudaGetDeviceProperties(", i, ") failed (",
                                                   __FILE__, ":", __LINE__,
                                                   "): ", cudaGetErrorString(e)));
      }
      rt.devices.push_back(LocalDevice{i, prop.name, DeviceCapability{prop.major, prop.minor},
                                       static_cast<int64_t>(prop.totalGlobalMem),
                                       prop.multiProcessorCount});
    }
    return rt;
  }

  absl::StatusOr<int64_t> MemoryUsed(int device) const override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
    }
    size_t free_bytes = 0, total = 0;
    if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total); e != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("cudaMemGetInfo: ", cudaGetErrorString(e)));
    }
    return static_cast<int64_t>(total - free_bytes);
  }
};

}  // namespace

std::unique_ptr<DeviceProber> MakeDefaultDeviceProber() {
  return std::make_unique<CudaDeviceProber>();
}

}  // namespace kplan
