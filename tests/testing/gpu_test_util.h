// What every GPU test shares: skipping without a device, and one random seed
// per test binary (fresh each run, printed, repeatable through an
// environment variable); random_data.h's SplitMix derives independent
// streams from it. Header-only; tests that include it link CUDA's runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/random_data.h"  // SplitMix

namespace kplan::test_util {

// Devices this process sees (0 when the runtime finds none or no driver).
inline int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

inline bool HaveCuda() { return CudaDeviceCount() > 0; }

#define SKIP_WITHOUT_CUDA() \
  if (!::kplan::test_util::HaveCuda()) GTEST_SKIP() << "no CUDA device"

// The seed of this test binary: random, or the value of `env_var`; printed
// once with the variable that repeats it.
inline uint64_t TestSeed(const char* test_name, const char* env_var) {
  static const uint64_t seed = [&] {
    uint64_t s = std::random_device{}();
    s = (s << 32) ^ std::random_device{}();
    if (const char* e = std::getenv(env_var)) s = std::strtoull(e, nullptr, 10);
    std::printf("%s: random seed %llu (%s=%llu repeats it)\n", test_name,
                static_cast<unsigned long long>(s), env_var, static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

}  // namespace kplan::test_util
