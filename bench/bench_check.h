// Fail-fast checks for the benchmark programs: a CUDA or absl error prints
// where and why, then exits 1 (a benchmark has no way to recover); and their
// one event timing (MedianMs); the device buffer they share (DevBuf).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t _e = (expr);                                                                      \
    if (_e != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define CHECK_OK(expr)                                                                \
  do {                                                                                \
    absl::Status _s = (expr);                                                         \
    if (!_s.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// The benchmarks' one timing rule: median milliseconds per call of `launch`
// on `stream`. First one untimed batch of `batch` calls (first-call costs:
// lazy module loading, cold caches and TLBs), then `samples` batches of
// `batch` calls, each between two CUDA events on `stream`; the result is the
// median over the batches of (batch time / batch). `launch` takes no
// argument, or the call's index (0 .. batch - 1 through the untimed batch,
// then 0, 1, ... through the timed ones) for a benchmark that rotates over
// input sets. A benchmark may warm up longer first (clocks). ir_bench,
// moe_bench and moe_fp8_gemm_bench time every kernel with this, so their
// numbers mean the same thing (docs/PERF.md "Method"); ep_bench times
// per-rank steps of its own.
template <typename F>
double MedianMs(F&& launch, int samples, int batch, cudaStream_t stream) {
  const auto call = [&](int i) {
    if constexpr (std::is_invocable_v<F&, int>) {
      launch(i);
    } else {
      launch();
    }
  };
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < batch; ++i) call(i);  // untimed
  std::vector<double> ms;
  int k = 0;
  for (int s = 0; s < samples; ++s) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < batch; ++i) call(k++);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaGetLastError());
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(static_cast<double>(t) / batch);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A device buffer of at least `bytes` (256 at the least), freed with it;
// allocation failures exit as CHECK_CUDA does.
struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~DevBuf() {
    if (p != nullptr) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// The experts a routing hits: the distinct ids among the `numel` top-k ids
// at `device_ids` (read back from the device). Their weights are what a MoE
// layer reads, so the benchmarks' memory floors count them.
inline int ExpertsHit(const int32_t* device_ids, int64_t numel) {
  std::vector<int32_t> ids(static_cast<size_t>(numel));
  CHECK_CUDA(
      cudaMemcpy(ids.data(), device_ids, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  std::sort(ids.begin(), ids.end());
  return static_cast<int>(std::unique(ids.begin(), ids.end()) - ids.begin());
}
