#include "absl/strings/string_view.h"
#include "resolve/platform/local.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace kplan {

absl::StatusOr<std::vector<LocalDevice>> SelectDevices(const std::vector<LocalDevice>& devices,
                                                       absl::string_view selection) {
  if (selection.empty() || selection == "all") return devices;
  if (selection == "none") return std::vector<LocalDevice>{};
  std::vector<LocalDevice> out;
  for (absl::string_view part : absl::StrSplit(selection, ',', absl::SkipWhitespace())) {
    int index = -1;
    if (!absl::SimpleAtoi(part, &index) || index < 0 || index >= static_cast<int>(devices.size())) {
      return InvalidField("devices",
                          absl::StrCat("device '", part, "' does not exist; this host has ",
                                       devices.size(), " device(s)"));
    }
    for (const LocalDevice& d : out) {
      if (d.index == index) {
        return InvalidField("devices", absl::StrCat("device ", index, " is listed twice"));
      }
    }
    out.push_back(devices[index]);
  }
  return out;
}

Platform LocalPlatform(const std::vector<LocalDevice>& devices, bool have_cuda_kernels) {
  Platform p;
  if (devices.empty()) {
    p.kind = PlatformKind::kCpu;
    p.device_name = "cpu";
    // kplan's emulation (the CPU reference) runs here: KplanEmulationExperts
    // must pass on the server's own CPU platform, as RunMoE executes it.
    p.libraries.insert("kplan");
    return p;
  }
  p.kind = PlatformKind::kCuda;
  p.capability = devices.front().capability;
  p.device_name = devices.front().name;
  if (have_cuda_kernels) p.libraries.insert("kplan");
  return p;
}

}  // namespace kplan
