#include "absl/strings/string_view.h"
#include "resolve/platform/platform.h"

#include <array>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status.h"

namespace kplan {

namespace {

// A ROCm platform whose GCN arch name holds one of `archs`; without a name,
// one whose capability major is in [major_lo, major_hi].
bool OnRocmArch(const Platform& p, std::initializer_list<absl::string_view> archs, int major_lo,
                int major_hi) {
  if (!p.is_rocm()) return false;
  if (p.gcn_arch_name.empty()) {
    return p.capability && p.capability->major >= major_lo && p.capability->major <= major_hi;
  }
  for (absl::string_view a : archs) {
    if (absl::StrContains(p.gcn_arch_name, a)) return true;
  }
  return false;
}

constexpr std::array<std::pair<PlatformKind, absl::string_view>, 6> kKindNames = {{
    {PlatformKind::kCuda, "cuda"},
    {PlatformKind::kRocm, "rocm"},
    {PlatformKind::kCpu, "cpu"},
    {PlatformKind::kXpu, "xpu"},
    {PlatformKind::kTpu, "tpu"},
    {PlatformKind::kOot, "oot"},
}};

}  // namespace

bool Platform::on_gfx9() const { return OnRocmArch(*this, {"gfx90a", "gfx942", "gfx950"}, 9, 9); }
bool Platform::on_gfx1x() const { return OnRocmArch(*this, {"gfx11", "gfx12"}, 11, 12); }

absl::string_view PlatformKindName(PlatformKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

std::optional<PlatformKind> PlatformKindFromName(absl::string_view name) {
  for (const auto& [k, n] : kKindNames) {
    if (n == name) return k;
  }
  return std::nullopt;
}

const std::vector<absl::string_view>& KnownLibraries() {
  static const auto* libs = new std::vector<absl::string_view>{
      "flashinfer", "deep_gemm", "triton_kernels",   "aiter", "flydsl", "hpc", "humming",
      "nvshmem",    "kplan",     "vllm_xpu_kernels", "oink"};
  return *libs;
}

std::set<std::string> DefaultLibraries(PlatformKind kind) {
  switch (kind) {
    case PlatformKind::kCuda:
      return {"flashinfer", "deep_gemm", "triton_kernels"};
    case PlatformKind::kRocm:
      return {"aiter", "triton_kernels"};
    case PlatformKind::kXpu:
      return {"vllm_xpu_kernels"};
    default:
      return {};
  }
}

absl::StatusOr<Platform> ParsePlatformSpec(absl::string_view spec) {
  constexpr absl::string_view kField = "platform";
  Platform p;
  absl::string_view body = spec;
  std::optional<absl::string_view> libs;
  if (size_t plus = spec.find('+'); plus != absl::string_view::npos) {
    body = spec.substr(0, plus);
    libs = spec.substr(plus + 1);
  }
  absl::string_view kind_name = body;
  absl::string_view detail;
  if (size_t colon = body.find(':'); colon != absl::string_view::npos) {
    kind_name = body.substr(0, colon);
    detail = body.substr(colon + 1);
  }
  std::optional<PlatformKind> kind = PlatformKindFromName(kind_name);
  if (!kind) {
    return InvalidField(kField, absl::StrCat("unknown platform kind '", kind_name,
                                             "'; expected cuda, rocm, cpu, xpu, tpu or oot"));
  }
  p.kind = *kind;
  if (!detail.empty()) {
    if (p.kind == PlatformKind::kRocm && absl::StartsWith(detail, "gfx")) {
      p.gcn_arch_name = std::string(detail);
      // gfx9xx -> 9.x, gfx1100 -> 11.0 (what torch reports for ROCm devices).
      absl::string_view digits = absl::StripPrefix(detail, "gfx");
      int major = 0, minor = 0;
      if (digits.size() == 3 && absl::SimpleAtoi(digits.substr(0, 1), &major) &&
          absl::SimpleAtoi(digits.substr(1, 1), &minor)) {
        p.capability = DeviceCapability{major, minor};
      } else if (digits.size() == 4 && absl::SimpleAtoi(digits.substr(0, 2), &major) &&
                 absl::SimpleAtoi(digits.substr(2, 1), &minor)) {
        p.capability = DeviceCapability{major, minor};
      }
    } else {
      std::pair<absl::string_view, absl::string_view> mm = absl::StrSplit(detail, '.');
      DeviceCapability cap;
      if (!absl::SimpleAtoi(mm.first, &cap.major) ||
          (!mm.second.empty() && !absl::SimpleAtoi(mm.second, &cap.minor))) {
        return InvalidField(kField, absl::StrCat("bad device capability '", detail,
                                                 "'; expected MAJOR.MINOR such as 9.0"));
      }
      p.capability = cap;
    }
  } else if (p.kind == PlatformKind::kCuda) {
    p.capability = DeviceCapability{9, 0};
  }
  if (libs) {
    for (absl::string_view lib : absl::StrSplit(*libs, ',', absl::SkipEmpty())) {
      p.libraries.insert(std::string(lib));
    }
  } else {
    p.libraries = DefaultLibraries(p.kind);
  }
  return p;
}

std::string DescribePlatform(const Platform& p) {
  std::string out(PlatformKindName(p.kind));
  if (!p.gcn_arch_name.empty()) {
    absl::StrAppend(&out, " ", p.gcn_arch_name);
  } else if (p.capability) {
    absl::StrAppend(&out, " ", p.capability->major, ".", p.capability->minor);
  }
  if (!p.device_name.empty()) absl::StrAppend(&out, " (", p.device_name, ")");
  if (!p.libraries.empty()) absl::StrAppend(&out, " +", absl::StrJoin(p.libraries, ","));
  return out;
}

}  // namespace kplan
