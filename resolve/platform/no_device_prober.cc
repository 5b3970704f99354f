// The DeviceProber of a build without CUDA: no devices, the CPU path.
#include "resolve/platform/local.h"

namespace kplan {

std::unique_ptr<DeviceProber> MakeDefaultDeviceProber() {
  return std::make_unique<NoDeviceProber>();
}

}  // namespace kplan
