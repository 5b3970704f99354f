// Detection of the server's own platform. The device query sits behind the
// DeviceProber interface: cuda_device_prober.cc (library kplan_device_probe)
// provides the CUDA implementation, tests inject fakes, and a build without
// CUDA uses NoDeviceProber (no_device_prober.cc). Only the CUDA prober's .cc
// sees CUDA headers; this header and kplan_platform stay free of them.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "resolve/platform/platform.h"

namespace kplan {

struct LocalDevice {
  int index = 0;
  std::string name;
  DeviceCapability capability;
  int64_t total_memory_bytes = 0;
  int multiprocessor_count = 0;
};

struct LocalRuntime {
  std::string cuda_runtime_version;  // "" without CUDA
  std::string cuda_driver_version;   // "" without a driver
  std::string nccl_version;          // "" without NCCL
  std::vector<LocalDevice> devices;
};

class DeviceProber {
 public:
  virtual ~DeviceProber() = default;
  // Lists the devices this process can use, with runtime versions. An error
  // means the query itself failed (a broken driver), not "no devices".
  virtual absl::StatusOr<LocalRuntime> Probe() const = 0;
  // Device memory in use on `device` (for metrics); UNIMPLEMENTED without a driver.
  virtual absl::StatusOr<int64_t> MemoryUsed(int device) const {
    return absl::UnimplementedError("no device memory query in this build");
  }
};

// Reports no devices: the CPU reference path.
class NoDeviceProber final : public DeviceProber {
 public:
  absl::StatusOr<LocalRuntime> Probe() const override { return LocalRuntime{}; }
};

// The prober this build provides: CUDA when built with CUDA, else NoDeviceProber.
std::unique_ptr<DeviceProber> MakeDefaultDeviceProber();

// Keeps the devices named by `selection` ("all", "none", or "0,2"); an index
// that does not exist is INVALID_ARGUMENT naming --devices.
absl::StatusOr<std::vector<LocalDevice>> SelectDevices(const std::vector<LocalDevice>& devices,
                                                       absl::string_view selection);

// The platform the oracles see for this server: CUDA at the first selected
// device's capability with this server's own kernels ("kplan") present, or
// the CPU platform when no device is selected. The CPU platform lists "kplan"
// too: library "kplan" means kplan's family runs there, and its emulation
// (the CPU reference) runs on every server; the CUDA kernels' own rows also
// need a CUDA SM90+ platform, so listing it on the CPU adds emulation only.
// A CUDA platform from a build without the kernels does not list it.
Platform LocalPlatform(const std::vector<LocalDevice>& devices, bool have_cuda_kernels);

}  // namespace kplan
