// The kernels' environment knobs: an integer (EnvInt), and a process-wide
// on / off switch of one kernel choice (KernelSwitch, behind the Set*Mode and
// *Enabled functions of moe_ops.h, moe_experts.h and moe_gemm_ws*.h): kOn /
// kOff as set, or with kFromEnv (the default) what from_env() says, read on
// the first call that needs it. Internal to kernels/cuda/moe.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cuda/moe/moe_ops.h"

namespace kplan::kernels::cuda::detail {

// The integer value of environment variable `name` (the kernels' measurement
// knobs); `fallback` when it is unset or empty.
inline int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// The on / off value of environment variable `name` (a KernelSwitch's
// from_env): `fallback` when it is unset or empty, off for "0", on for
// anything else.
inline bool EnvOnOff(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strcmp(v, "0") != 0;
}

class KernelSwitch {
 public:
  explicit constexpr KernelSwitch(bool (*from_env)()) : from_env_(from_env) {}
  void Set(MoeKernelMode mode) { mode_.store(static_cast<int>(mode)); }
  bool On() {
    const auto m = static_cast<MoeKernelMode>(mode_.load(std::memory_order_relaxed));
    if (m != MoeKernelMode::kFromEnv) return m == MoeKernelMode::kOn;
    std::call_once(once_, [this] { env_on_ = from_env_(); });
    return env_on_;
  }
  // Set to kOn: a form that a rule chooses runs even where the rule says no.
  bool Forced() const {
    return mode_.load(std::memory_order_relaxed) == static_cast<int>(MoeKernelMode::kOn);
  }

 private:
  bool (*const from_env_)();
  std::atomic<int> mode_{static_cast<int>(MoeKernelMode::kFromEnv)};
  std::once_flag once_;
  bool env_on_ = false;
};

}  // namespace kplan::kernels::cuda::detail
