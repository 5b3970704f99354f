// The platform as vLLM's kernel selection sees it: kind (CUDA, ROCm, ...),
// device capability, device name, the kernel libraries importable there and
// the compilation switches that change IR op defaults. A request may describe
// any platform (plan for hardware you do not have); the server's own comes
// from DetectLocalPlatform().
#pragma once

#include <optional>
#include <set>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace kplan {

enum class PlatformKind { kCuda, kRocm, kCpu, kXpu, kTpu, kOot };

// "cuda", "rocm", "cpu", "xpu", "tpu", "oot".
absl::string_view PlatformKindName(PlatformKind kind);
std::optional<PlatformKind> PlatformKindFromName(absl::string_view name);

struct DeviceCapability {
  int major = 0;
  int minor = 0;
  // vLLM's DeviceCapability.to_int(): major * 10 + minor.
  int AsInt() const { return major * 10 + minor; }
  bool operator==(const DeviceCapability&) const = default;
};

struct Platform {
  PlatformKind kind = PlatformKind::kCpu;
  std::optional<DeviceCapability> capability;  // CUDA and ROCm
  std::string device_name;
  std::set<std::string> libraries;  // importable kernel libraries
  bool use_inductor = false;
  bool enforce_eager = false;  // cudagraph_mode == NONE
  std::string gcn_arch_name;   // ROCm: gfx942, gfx950, gfx1100, ...

  bool is_cuda() const { return kind == PlatformKind::kCuda; }
  bool is_rocm() const { return kind == PlatformKind::kRocm; }
  bool is_cpu() const { return kind == PlatformKind::kCpu; }
  bool is_xpu() const { return kind == PlatformKind::kXpu; }
  bool is_tpu() const { return kind == PlatformKind::kTpu; }
  bool is_out_of_tree() const { return kind == PlatformKind::kOot; }
  // vLLM's is_cuda_alike(): CUDA or ROCm.
  bool is_cuda_alike() const { return is_cuda() || is_rocm(); }

  // has_device_capability(c): capability >= c (c as major*10+minor).
  bool HasDeviceCapability(int c) const { return capability && capability->AsInt() >= c; }
  // is_device_capability(c): exactly c.
  bool IsDeviceCapability(int c) const { return capability && capability->AsInt() == c; }
  // is_device_capability_family(c): same major generation (100 = SM100/SM103).
  bool IsDeviceCapabilityFamily(int c) const {
    return capability && capability->AsInt() / 10 == c / 10;
  }
  bool HasLibrary(absl::string_view lib) const { return libraries.count(std::string(lib)) > 0; }
  // vllm.platforms.rocm.on_gfx9() / on_gfx1x(): the GCN arch name holds
  // gfx90a, gfx942 or gfx950 / gfx11 or gfx12. Without a name, by the
  // capability's major (9 / 11-12).
  bool on_gfx9() const;
  bool on_gfx1x() const;
};

// Known kernel library names a Platform may list.
const std::vector<absl::string_view>& KnownLibraries();

// Parses the CLI's short platform form: "cuda:9.0", "cuda:10.0+flashinfer,deep_gemm",
// "rocm:gfx950", "cpu", "xpu". Library lists replace the kind's defaults.
absl::StatusOr<Platform> ParsePlatformSpec(absl::string_view spec);

// The libraries a typical deployment of `kind` has (vLLM's wheel plus the
// common extras); used when a spec names none.
std::set<std::string> DefaultLibraries(PlatformKind kind);

// A one-line description: "cuda 9.0 (NVIDIA H200) +flashinfer,deep_gemm".
std::string DescribePlatform(const Platform& p);

}  // namespace kplan
