// What every GPU test shares: skipping without a device, one random seed
// per test binary (fresh each run, printed, repeatable through an
// environment variable; random_data.h's SplitMix derives independent
// streams from it) and a device buffer. Header-only; tests that include it
// link CUDA's runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

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

// n elements of T in device memory (cudaMalloc; freed with the object),
// optionally copied from a host vector. Failures are gtest failures.
template <typename T>
struct DeviceBuf {
  T* p = nullptr;
  explicit DeviceBuf(size_t n) {
    void* v = nullptr;
    EXPECT_EQ(cudaMalloc(&v, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    p = static_cast<T*>(v);
  }
  explicit DeviceBuf(const std::vector<T>& v) : DeviceBuf(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuf() { cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
};

}  // namespace kplan::test_util
