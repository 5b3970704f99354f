// IR op kernels against the memory roofline on one GPU: kplan rms_norm and
// fused_add_rms_norm (and the native GPU kernels for contrast) on bf16
// [16384, 8192] and [64, 8192], next to an SM copy kernel measured in the
// same run. Method: ~3 s of warm-up (an idle H200 sits at low clocks), then
// CUDA events around batches of launches, median over many batches; inputs
// rotate over enough buffer sets to exceed L2 for the small shape; random
// bf16 data, never zeros. bench/ir_baseline.py prints the same table for
// PyTorch.
//
// Usage: ir_bench [--warmup_s 3] [--samples 50] [--copy_mib 1024]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/ir_ops.h"

namespace {

using kplan::kernels::IrRowLayout;
using kplan::kernels::IrRowsIn;
using kplan::kernels::IrScalarType;
using kplan::kernels::IrWeightIn;
namespace kc = kplan::kernels::cuda;

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    cudaError_t _e = (expr);                                                              \
    if (_e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                 \
                   cudaGetErrorString(_e));                                               \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

#define CHECK_OK(expr)                                                                    \
  do {                                                                                    \
    absl::Status _s = (expr);                                                             \
    if (!_s.ok()) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str());     \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// The roofline: each thread copies 16-byte vectors, grid-stride.
__global__ void CopyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

// Deterministic pseudo-random bf16 in [-2, 2), never exactly zero.
__global__ void FillKernel(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float v = (h & 0xffffff) / 16777216.0f * 4.f - 2.f;
    if (std::fabs(v) < 1e-3f) v = 0.5f;
    p[i] = __float2bfloat16(v);
  }
}

void Fill(void* p, size_t elems, uint32_t seed) {
  FillKernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), elems, seed);
  CHECK_CUDA(cudaGetLastError());
}

struct Args {
  double warmup_s = 3.0;
  int samples = 50;
  size_t copy_mib = 1024;
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--warmup_s")) a.warmup_s = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--samples")) a.samples = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--copy_mib")) a.copy_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--warmup_s S] [--samples N] [--copy_mib M]\n", argv[0]);
      std::exit(2);
    }
  }
  return a;
}

// Median milliseconds per launch of `launch(i)` over `samples` batches of `batch`.
template <typename F>
double MedianMs(F&& launch, int samples, int batch) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < batch; ++i) launch(i);  // untimed warm batch
  std::vector<double> ms;
  int k = 0;
  for (int s = 0; s < samples; ++s) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int i = 0; i < batch; ++i) launch(k++);
    CHECK_CUDA(cudaEventRecord(stop));
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

struct Row {
  std::string op, shape, provider;
  double us, gbps;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);

  // Roofline buffers.
  const size_t copy_bytes = args.copy_mib << 20;
  void *csrc, *cdst;
  CHECK_CUDA(cudaMalloc(&csrc, copy_bytes));
  CHECK_CUDA(cudaMalloc(&cdst, copy_bytes));
  Fill(csrc, copy_bytes / 2, 1);
  const size_t copy_vecs = copy_bytes / 16;
  const int copy_grid = prop.multiProcessorCount * 8;
  auto copy = [&](int) {
    CopyKernel<<<copy_grid, 256>>>(static_cast<const uint4*>(csrc), static_cast<uint4*>(cdst),
                                   copy_vecs);
  };

  // Warm-up: keep the GPU busy for warmup_s seconds so clocks ramp up.
  {
    const auto t0 = std::chrono::steady_clock::now();
    int n = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
           args.warmup_s) {
      for (int i = 0; i < 20; ++i) copy(0);
      CHECK_CUDA(cudaDeviceSynchronize());
      n += 20;
    }
    std::printf("warm-up: %d copies of %zu MiB in %.1f s\n", n, args.copy_mib, args.warmup_s);
  }
  const double copy_ms = MedianMs(copy, args.samples, 10);
  const double copy_gbps = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;

  std::vector<Row> rows;
  const int64_t hidden = 8192;
  const float eps = 1e-6f;
  for (int64_t tokens : {16384, 64}) {
    const size_t elems = static_cast<size_t>(tokens) * hidden;
    const size_t bytes = elems * 2;
    // Enough rotating sets (x, residual, out, residual_out) to exceed 4x L2.
    const int sets = static_cast<int>(
        std::max<size_t>(1, (4 * static_cast<size_t>(prop.l2CacheSize)) / (4 * bytes) + 1));
    std::vector<void*> x(sets), res(sets), out(sets), res_out(sets);
    for (int s = 0; s < sets; ++s) {
      CHECK_CUDA(cudaMalloc(&x[s], bytes));
      CHECK_CUDA(cudaMalloc(&res[s], bytes));
      CHECK_CUDA(cudaMalloc(&out[s], bytes));
      CHECK_CUDA(cudaMalloc(&res_out[s], bytes));
      Fill(x[s], elems, 100 + s);
      Fill(res[s], elems, 200 + s);
    }
    void* w;
    CHECK_CUDA(cudaMalloc(&w, hidden * 2));
    Fill(w, hidden, 7);
    const std::string shape = "[" + std::to_string(tokens) + ", " + std::to_string(hidden) + "]";
    const int batch = tokens >= 4096 ? 5 : 100;

    // Sanity check: kplan against the native GPU kernels on set 0.
    {
      void* ref;
      CHECK_CUDA(cudaMalloc(&ref, bytes));
      IrRowsIn xin{x[0], IrScalarType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
      IrWeightIn win{w, IrScalarType::kBFloat16, 1};
      CHECK_OK(kc::NativeRmsNorm(xin, tokens, hidden, win, eps, hidden, ref, nullptr));
      CHECK_OK(kc::KplanRmsNorm(IrScalarType::kBFloat16, {x[0], hidden}, tokens, hidden, w, eps,
                                {out[0], hidden}, nullptr));
      std::vector<uint16_t> a(elems), b(elems);
      CHECK_CUDA(cudaMemcpy(a.data(), ref, bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(b.data(), out[0], bytes, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      for (size_t i = 0; i < elems; ++i) {
        uint32_t ua = static_cast<uint32_t>(a[i]) << 16, ub = static_cast<uint32_t>(b[i]) << 16;
        float fa, fb;
        std::memcpy(&fa, &ua, 4);
        std::memcpy(&fb, &ub, 4);
        if (!(std::fabs(fa - fb) <= 1e-3f + 1.6e-2f * std::fabs(fa))) ++diff;
      }
      std::printf("check %s rms_norm kplan vs native: %zu of %zu outside bf16 tolerance\n",
                  shape.c_str(), diff, elems);
      CHECK_CUDA(cudaFree(ref));
    }

    const double rms_bytes = 2.0 * bytes + hidden * 2;
    const double fused_bytes = 4.0 * bytes + hidden * 2;
    auto add = [&](const char* op, const char* provider, double bytes_moved, double ms) {
      rows.push_back({op, shape, provider, ms * 1e3, bytes_moved / (ms * 1e-3) / 1e9});
    };
    add("rms_norm", "kplan", rms_bytes, MedianMs([&](int i) {
          const int s = i % sets;
          CHECK_OK(kc::KplanRmsNorm(IrScalarType::kBFloat16, {x[s], hidden}, tokens, hidden, w,
                                    eps, {out[s], hidden}, nullptr));
        }, args.samples, batch));
    add("rms_norm", "native", rms_bytes, MedianMs([&](int i) {
          const int s = i % sets;
          IrRowsIn xin{x[s], IrScalarType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
          CHECK_OK(kc::NativeRmsNorm(xin, tokens, hidden, {w, IrScalarType::kBFloat16, 1}, eps,
                                     hidden, out[s], nullptr));
        }, args.samples, batch));
    add("fused_add_rms_norm", "kplan", fused_bytes, MedianMs([&](int i) {
          const int s = i % sets;
          CHECK_OK(kc::KplanFusedAddRmsNorm(IrScalarType::kBFloat16, {x[s], hidden},
                                            {res[s], hidden}, tokens, hidden, w, eps,
                                            {out[s], hidden}, {res_out[s], hidden}, nullptr));
        }, args.samples, batch));
    add("fused_add_rms_norm", "native", fused_bytes, MedianMs([&](int i) {
          const int s = i % sets;
          IrRowsIn xin{x[s], IrScalarType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
          IrRowsIn rin{res[s], IrScalarType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
          CHECK_OK(kc::NativeFusedAddRmsNorm(xin, rin, tokens, hidden,
                                             {w, IrScalarType::kBFloat16, 1}, eps, hidden,
                                             out[s], res_out[s], nullptr));
        }, args.samples, batch));
    for (int s = 0; s < sets; ++s) {
      CHECK_CUDA(cudaFree(x[s]));
      CHECK_CUDA(cudaFree(res[s]));
      CHECK_CUDA(cudaFree(out[s]));
      CHECK_CUDA(cudaFree(res_out[s]));
    }
    CHECK_CUDA(cudaFree(w));
  }
  CHECK_CUDA(cudaFree(csrc));
  CHECK_CUDA(cudaFree(cdst));

  std::printf("\nSM copy roofline: %zu MiB, %.1f us, %.0f GB/s (read + written)\n\n",
              args.copy_mib, copy_ms * 1e3, copy_gbps);
  std::printf("%-20s %-14s %-5s %-8s %10s %10s %10s %8s\n", "op", "shape", "dtype", "provider",
              "time_us", "GB/s", "copy_GB/s", "%copy");
  for (const Row& r : rows) {
    std::printf("%-20s %-14s %-5s %-8s %10.2f %10.0f %10.0f %7.1f%%\n", r.op.c_str(),
                r.shape.c_str(), "bf16", r.provider.c_str(), r.us, r.gbps, copy_gbps,
                100.0 * r.gbps / copy_gbps);
  }
  return 0;
}
