// IR op kernels against the memory roofline on one GPU: kplan rms_norm and
// fused_add_rms_norm (and the native GPU kernels for contrast) on bf16
// [16384, 8192] and [64, 8192], next to an SM copy kernel measured in the
// same run. Method: ~3 s of warm-up (an idle H200 sits at low clocks), then
// CUDA events around batches of launches, median over many batches; inputs
// rotate over enough buffer sets to exceed L2 for the small shape; random
// bf16 data, never zeros. bench/ir_baseline.py prints the same table for
// PyTorch.
//
// The roofline is the best of several copy kernels (grid-stride with 1, 2 or 4
// independent 16-byte loads per thread before the stores, plain or with
// no-L1 loads and streaming stores, one wave or several; one-shot grids like
// PyTorch's elementwise kernels); each is printed.
//
// --sweep: every launch variant of the kplan norm kernels
// (KplanNormVariantName), first checked against the native kernels on random
// data (several shapes, tails and partial blocks included), then timed on
// both ops and shapes, `--passes` times round-robin; one table of variant, op,
// shape, us (min over passes of the per-pass medians), GB/s, % of the best copy.
//
// Usage: ir_bench [--warmup_s 3] [--samples 50] [--copy_mib 1024] [--sweep 1] [--passes 2]
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

#include "bench/bench_check.h"
#include "bench/copy_roofline.cuh"
#include "kernels/cuda/ir/ir_ops.h"

namespace {

using kplan::kernels::DType;
using kplan::kernels::IrRowLayout;
using kplan::kernels::IrRowsIn;
using kplan::kernels::IrWeightIn;
namespace kc = kplan::kernels::cuda;

// The copy kernels timed for the roofline (bench/copy_roofline.cuh); the best wins.
const CopyVariant kCopyVariants[] = {
    {"gs_u1_w1", CopyKernel<1, false>, false, 1, 1},  // the first run's roofline
    {"gs_u2_w1_h", CopyKernel<2, true>, false, 2, 1},
    {"gs_u4_w1", CopyKernel<4, false>, false, 4, 1},
    {"gs_u4_w1_h", CopyKernel<4, true>, false, 4, 1},
    {"gs_u4_w4_h", CopyKernel<4, true>, false, 4, 4},
    {"gs_u2_w4", CopyKernel<2, false>, false, 2, 4},
    {"os_u1", CopyOneShotKernel<1, false>, true, 1, 0},
    {"os_u2", CopyOneShotKernel<2, false>, true, 2, 0},
    {"os_u4", CopyOneShotKernel<4, false>, true, 4, 0},
    {"os_u4_h", CopyOneShotKernel<4, true>, true, 4, 0},
};

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
  bool sweep = false;
  int passes = 2;
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const bool has_value = i + 1 < argc;
    if (has_value && !std::strcmp(argv[i], "--warmup_s"))
      a.warmup_s = std::atof(argv[i + 1]);
    else if (has_value && !std::strcmp(argv[i], "--samples"))
      a.samples = std::atoi(argv[i + 1]);
    else if (has_value && !std::strcmp(argv[i], "--copy_mib"))
      a.copy_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (has_value && !std::strcmp(argv[i], "--sweep"))
      a.sweep = std::atoi(argv[i + 1]) != 0;
    else if (has_value && !std::strcmp(argv[i], "--passes"))
      a.passes = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr,
                   "usage: %s [--warmup_s S] [--samples N] [--copy_mib M] [--sweep 0|1] "
                   "[--passes P]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return a;
}

float Bf16ToFloat(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Elements of `got` outside bf16 tolerance of `want` (NaN counts), or, with
// exact, not bit-identical; prints the first few.
size_t CountMismatches(const void* want_dev, const void* got_dev, size_t elems, bool exact,
                       const char* what) {
  std::vector<uint16_t> a(elems), b(elems);
  CHECK_CUDA(cudaMemcpy(a.data(), want_dev, elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), got_dev, elems * 2, cudaMemcpyDeviceToHost));
  size_t diff = 0;
  for (size_t i = 0; i < elems; ++i) {
    bool bad;
    if (exact) {
      bad = a[i] != b[i];
    } else {
      const float fa = Bf16ToFloat(a[i]), fb = Bf16ToFloat(b[i]);
      bad = !(std::fabs(fa - fb) <= 1e-3f + 1.6e-2f * std::fabs(fa));
    }
    if (bad && ++diff <= 3) {
      std::printf("    mismatch %s [%zu]: want %a got %a\n", what, i, Bf16ToFloat(a[i]),
                  Bf16ToFloat(b[i]));
    }
  }
  return diff;
}

// Buffers of one [tokens, hidden] shape: `sets` rotating sets of x, residual,
// out, residual_out (together over 4x L2), and the weight.
struct ShapeBufs {
  int64_t tokens, hidden;
  size_t elems, bytes;
  int sets;
  std::vector<void*> x, res, out, res_out;
  void* w = nullptr;
  std::string shape;

  ShapeBufs(int64_t t, int64_t h, size_t l2, bool rotate) : tokens(t), hidden(h) {
    elems = static_cast<size_t>(t) * h;
    bytes = elems * 2;
    sets = rotate ? static_cast<int>(std::max<size_t>(1, (4 * l2) / (4 * bytes) + 1)) : 1;
    x.resize(sets);
    res.resize(sets);
    out.resize(sets);
    res_out.resize(sets);
    for (int s = 0; s < sets; ++s) {
      CHECK_CUDA(cudaMalloc(&x[s], bytes));
      CHECK_CUDA(cudaMalloc(&res[s], bytes));
      CHECK_CUDA(cudaMalloc(&out[s], bytes));
      CHECK_CUDA(cudaMalloc(&res_out[s], bytes));
      Fill(x[s], elems, 100 + s);
      Fill(res[s], elems, 200 + s);
    }
    CHECK_CUDA(cudaMalloc(&w, h * 2));
    Fill(w, h, 7);
    shape = "[" + std::to_string(t) + ", " + std::to_string(h) + "]";
  }
  ~ShapeBufs() {
    for (int s = 0; s < sets; ++s) {
      CHECK_CUDA(cudaFree(x[s]));
      CHECK_CUDA(cudaFree(res[s]));
      CHECK_CUDA(cudaFree(out[s]));
      CHECK_CUDA(cudaFree(res_out[s]));
    }
    CHECK_CUDA(cudaFree(w));
  }
  double RmsBytes() const { return 2.0 * bytes + hidden * 2; }
  double FusedBytes() const { return 4.0 * bytes + hidden * 2; }
};

constexpr float kEps = 1e-6f;

absl::Status RunVariant(int variant, bool fused, const ShapeBufs& b, int s) {
  return kc::KplanNormWithVariant(variant, fused, DType::kBFloat16, {b.x[s], b.hidden},
                                  {b.res[s], b.hidden}, b.tokens, b.hidden, b.w, kEps,
                                  {b.out[s], b.hidden}, {b.res_out[s], b.hidden}, nullptr);
}

// Every variant against the native kernels on set 0 of `b`; returns the
// number of variant/op pairs with mismatches.
int CheckVariants(const ShapeBufs& b) {
  const int64_t t = b.tokens, h = b.hidden;
  void *ref_out, *ref_res;
  CHECK_CUDA(cudaMalloc(&ref_out, b.bytes));
  CHECK_CUDA(cudaMalloc(&ref_res, b.bytes));
  IrRowsIn xin{b.x[0], DType::kBFloat16, IrRowLayout::Rows(t, h)};
  IrRowsIn rin{b.res[0], DType::kBFloat16, IrRowLayout::Rows(t, h)};
  IrWeightIn win{b.w, DType::kBFloat16, 1};
  int bad = 0;
  for (int fused = 0; fused < 2; ++fused) {
    if (fused) {
      CHECK_OK(kc::NativeFusedAddRmsNorm(xin, rin, t, h, win, kEps, h, ref_out, ref_res, nullptr));
    } else {
      CHECK_OK(kc::NativeRmsNorm(xin, t, h, win, kEps, h, ref_out, nullptr));
    }
    for (int v = 0; v < kc::KplanNormVariantCount(); ++v) {
      CHECK_CUDA(cudaMemset(b.out[0], 0xff, b.bytes));  // NaN: unwritten elements show
      CHECK_CUDA(cudaMemset(b.res_out[0], 0xff, b.bytes));
      CHECK_OK(RunVariant(v, fused, b, 0));
      CHECK_CUDA(cudaDeviceSynchronize());
      size_t diff = CountMismatches(ref_out, b.out[0], b.elems, false, "out");
      size_t rdiff =
          fused ? CountMismatches(ref_res, b.res_out[0], b.elems, true, "residual_out") : 0;
      std::printf(
          "check %-14s %-18s %-11s vs native: out %zu%s of %zu outside bf16 tolerance%s%s\n",
          b.shape.c_str(), fused ? "fused_add_rms_norm" : "rms_norm", kc::KplanNormVariantName(v),
          diff, fused ? (", residual_out " + std::to_string(rdiff) + " not bit-exact").c_str() : "",
          b.elems, diff + rdiff ? "  <-- MISMATCH" : "", "");
      if (diff + rdiff) ++bad;
    }
  }
  CHECK_CUDA(cudaFree(ref_out));
  CHECK_CUDA(cudaFree(ref_res));
  return bad;
}

struct Row {
  std::string variant, op, shape, provider;
  double us, gbps, us_max;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  const size_t l2 = static_cast<size_t>(prop.l2CacheSize);
  const int64_t hidden = 8192;

  // Correctness of every variant first (host time, before the clocks are warm).
  if (args.sweep) {
    int bad = 0;
    for (auto [t, h] : {std::pair<int64_t, int64_t>{16384, 8192},
                        {64, 8192},
                        {37, 12296},
                        {5, 3000},
                        {1000, 1024},
                        {3, 16384}}) {
      ShapeBufs b(t, h, l2, false);
      bad += CheckVariants(b);
    }
    std::printf("checks: %d variant/op/shape combinations with mismatches\n\n", bad);
  }

  // Roofline buffers.
  const size_t copy_bytes = args.copy_mib << 20;
  void *csrc, *cdst;
  CHECK_CUDA(cudaMalloc(&csrc, copy_bytes));
  CHECK_CUDA(cudaMalloc(&cdst, copy_bytes));
  Fill(csrc, copy_bytes / 2, 1);
  const size_t copy_vecs = copy_bytes / 16;
  auto copy_with = [&](const CopyVariant& c) {
    const size_t grid = c.one_shot ? (copy_vecs + 256 * c.unroll - 1) / (256 * c.unroll)
                                   : static_cast<size_t>(prop.multiProcessorCount) * 8 * c.waves;
    c.kernel<<<static_cast<unsigned>(grid), 256>>>(static_cast<const uint4*>(csrc),
                                                   static_cast<uint4*>(cdst), copy_vecs);
  };

  // Warm-up: keep the GPU busy for warmup_s seconds so clocks ramp up.
  {
    const auto t0 = std::chrono::steady_clock::now();
    int n = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
           args.warmup_s) {
      for (int i = 0; i < 20; ++i) copy_with(kCopyVariants[0]);
      CHECK_CUDA(cudaDeviceSynchronize());
      n += 20;
    }
    std::printf("warm-up: %d copies of %zu MiB in %.1f s\n", n, args.copy_mib, args.warmup_s);
  }
  // Every copy variant; the best is the roofline. Each is checked once.
  double copy_gbps = 0;
  const char* best_copy = "";
  std::vector<std::pair<std::string, double>> copies;
  for (const CopyVariant& c : kCopyVariants) {
    CHECK_CUDA(cudaMemset(cdst, 0, copy_bytes));
    copy_with(c);
    const bool ok = CountMismatches(csrc, cdst, copy_bytes / 2, true, c.name) == 0;
    const double ms = MedianMs([&] { copy_with(c); }, args.samples, 10, /*stream=*/nullptr);
    const double gbps = 2.0 * copy_bytes / (ms * 1e-3) / 1e9;
    std::printf("copy %-12s %zu MiB: %8.1f us %6.0f GB/s%s\n", c.name, args.copy_mib, ms * 1e3,
                gbps, ok ? "" : "  <-- WRONG OUTPUT");
    if (ok && gbps > copy_gbps) {
      copy_gbps = gbps;
      best_copy = c.name;
    }
  }
  CHECK_CUDA(cudaFree(csrc));
  CHECK_CUDA(cudaFree(cdst));
  // Keep the clocks up across the host-side setup below.
  std::vector<Row> rows;
  for (int64_t tokens : {16384, 64}) {
    ShapeBufs b(tokens, hidden, l2, true);
    const int batch = tokens >= 4096 ? 5 : 100;
    const int sets = b.sets;

    if (!args.sweep) {
      // Sanity check: kplan against the native GPU kernels on set 0.
      {
        void* ref;
        CHECK_CUDA(cudaMalloc(&ref, b.bytes));
        IrRowsIn xin{b.x[0], DType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
        IrWeightIn win{b.w, DType::kBFloat16, 1};
        CHECK_OK(kc::NativeRmsNorm(xin, tokens, hidden, win, kEps, hidden, ref, nullptr));
        CHECK_OK(kc::KplanRmsNorm(DType::kBFloat16, {b.x[0], hidden}, tokens, hidden, b.w, kEps,
                                  {b.out[0], hidden}, nullptr));
        const size_t diff = CountMismatches(ref, b.out[0], b.elems, false, "out");
        std::printf(
            "check %s rms_norm kplan (%s) vs native: %zu of %zu outside bf16 tolerance\n",
            b.shape.c_str(),
            kc::KplanNormVariantName(kc::KplanNormDefaultVariant(DType::kBFloat16, tokens, hidden)),
            diff, b.elems);
        CHECK_CUDA(cudaFree(ref));
      }
      // Re-warm after the host-side check.
      for (int i = 0; i < 200; ++i) {
        CHECK_OK(kc::KplanRmsNorm(DType::kBFloat16, {b.x[0], hidden}, tokens, hidden, b.w, kEps,
                                  {b.out[0], hidden}, nullptr));
      }
      auto add = [&](const char* op, const char* provider, double bytes_moved, double ms) {
        rows.push_back({"", op, b.shape, provider, ms * 1e3, bytes_moved / (ms * 1e-3) / 1e9, 0});
      };
      add("rms_norm", "kplan", b.RmsBytes(),
          MedianMs(
              [&](int i) {
                const int s = i % sets;
                CHECK_OK(kc::KplanRmsNorm(DType::kBFloat16, {b.x[s], hidden}, tokens, hidden, b.w,
                                          kEps, {b.out[s], hidden}, nullptr));
              },
              args.samples, batch, /*stream=*/nullptr));
      add("rms_norm", "native", b.RmsBytes(),
          MedianMs(
              [&](int i) {
                const int s = i % sets;
                IrRowsIn xin{b.x[s], DType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
                CHECK_OK(kc::NativeRmsNorm(xin, tokens, hidden, {b.w, DType::kBFloat16, 1}, kEps,
                                           hidden, b.out[s], nullptr));
              },
              args.samples, batch, /*stream=*/nullptr));
      add("fused_add_rms_norm", "kplan", b.FusedBytes(),
          MedianMs(
              [&](int i) {
                const int s = i % sets;
                CHECK_OK(kc::KplanFusedAddRmsNorm(
                    DType::kBFloat16, {b.x[s], hidden}, {b.res[s], hidden}, tokens, hidden, b.w,
                    kEps, {b.out[s], hidden}, {b.res_out[s], hidden}, nullptr));
              },
              args.samples, batch, /*stream=*/nullptr));
      add("fused_add_rms_norm", "native", b.FusedBytes(),
          MedianMs(
              [&](int i) {
                const int s = i % sets;
                IrRowsIn xin{b.x[s], DType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
                IrRowsIn rin{b.res[s], DType::kBFloat16, IrRowLayout::Rows(tokens, hidden)};
                CHECK_OK(kc::NativeFusedAddRmsNorm(xin, rin, tokens, hidden,
                                                   {b.w, DType::kBFloat16, 1}, kEps, hidden,
                                                   b.out[s], b.res_out[s], nullptr));
              },
              args.samples, batch, /*stream=*/nullptr));
      continue;
    }

    // Sweep: every variant, both ops; passes round-robin, min of the medians.
    const int nv = kc::KplanNormVariantCount();
    std::vector<double> best(2 * nv, 1e30), worst(2 * nv, 0);
    for (int pass = 0; pass < args.passes; ++pass) {
      for (int v = 0; v < nv; ++v) {
        for (int fused = 0; fused < 2; ++fused) {
          const double ms = MedianMs([&](int i) { CHECK_OK(RunVariant(v, fused, b, i % sets)); },
                                     args.samples, batch, /*stream=*/nullptr);
          best[2 * v + fused] = std::min(best[2 * v + fused], ms);
          worst[2 * v + fused] = std::max(worst[2 * v + fused], ms);
        }
      }
    }
    const int def = kc::KplanNormDefaultVariant(DType::kBFloat16, tokens, hidden);
    for (int v = 0; v < nv; ++v) {
      for (int fused = 0; fused < 2; ++fused) {
        const double ms = best[2 * v + fused];
        const double moved = fused ? b.FusedBytes() : b.RmsBytes();
        rows.push_back({std::string(kc::KplanNormVariantName(v)) + (v == def ? " *" : ""),
                        fused ? "fused_add_rms_norm" : "rms_norm", b.shape, "kplan", ms * 1e3,
                        moved / (ms * 1e-3) / 1e9, worst[2 * v + fused] * 1e3});
      }
    }
  }

  std::printf(
      "\nSM copy roofline (best of %zu copy kernels: %s): %zu MiB, %.0f GB/s (read + "
      "written)\n\n",
      sizeof(kCopyVariants) / sizeof(kCopyVariants[0]), best_copy, args.copy_mib, copy_gbps);
  if (args.sweep) {
    std::printf(
        "sweep (* = production choice; us = min over %d passes of the median of %d "
        "batches; max = the slowest pass)\n",
        args.passes, args.samples);
    std::printf("%-14s %-20s %-14s %10s %10s %10s %8s\n", "variant", "op", "shape", "time_us",
                "max_us", "GB/s", "%copy");
    for (const Row& r : rows) {
      std::printf("%-14s %-20s %-14s %10.2f %10.2f %10.0f %7.1f%%\n", r.variant.c_str(),
                  r.op.c_str(), r.shape.c_str(), r.us, r.us_max, r.gbps,
                  100.0 * r.gbps / copy_gbps);
    }
    return 0;
  }
  std::printf("%-20s %-14s %-5s %-8s %10s %10s %10s %8s\n", "op", "shape", "dtype", "provider",
              "time_us", "GB/s", "copy_GB/s", "%copy");
  for (const Row& r : rows) {
    std::printf("%-20s %-14s %-5s %-8s %10.2f %10.0f %10.0f %7.1f%%\n", r.op.c_str(),
                r.shape.c_str(), "bf16", r.provider.c_str(), r.us, r.gbps, copy_gbps,
                100.0 * r.gbps / copy_gbps);
  }
  return 0;
}
