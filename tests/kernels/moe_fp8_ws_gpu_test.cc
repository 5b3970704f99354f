// The fp8 grouped GEMMs: the warp-specialised one (kernels/cuda/moe/moe_gemm_ws_fp8.h)
// and the cp.async one of decode sizes (LaunchMoeGroupedGemm, moe_experts.h)
// against a float64 CPU evaluation of their contract (moe_experts.h's fp8
// MoeGroupedGemmArgs: per 128-wide k-block partial sums times a_scale ·
// w_scale, summed in k-block order; per-tensor / per-channel scales on the
// whole sum), on fresh random data every run (seed printed;
// MOE_FP8_WS_GPU_TEST_SEED=<n> repeats one): fp8 bytes with random sign,
// exponent and mantissa (never NaN), positive scales, slot counts per expert
// chosen to hit the tails (0, 1, 127, 128, 129, 300 slots), N and K that are
// not multiples of 128 (partial k-blocks, a 72-row last weight tile), an
// expert that is not local (its slots must be zero rows), with and without
// bias, GEMM 1 (a_row_div = top_k) and GEMM 2 (1) row maps, bf16 and fp16
// output. The output is poisoned with NaN first: an unwritten slot shows.
// Tolerance: the bf16 / fp16 rounding of the result (2^-8 / 2^-11 of |ref|)
// plus the fp8 tensor cores' accumulation inside one k-block: each element
// within 2^-7·|ref| + 2^-8·rms(ref), ‖d‖/‖ref‖ <= 4e-3. Skips without a device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/moe_gemm_slots.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;

uint64_t Seed() { return test_util::TestSeed("moe_fp8_ws_gpu_test", "MOE_FP8_WS_GPU_TEST_SEED"); }

struct Case {
  const char* name;
  std::vector<int> counts;  // slots per expert
  int top_k;                // a_row_div
  int64_t N, K;
  kc::MoeFp8WeightScale scale;
  bool bias;
  DType out;
  int non_local = -1;  // an expert mapped to -1 (its slots get zero rows)
  // 0: the warp-specialised kernel (block_m 128); else LaunchMoeGroupedGemm's
  // cp.async kernel with K split `splits` ways and block_m (16, 64 or 128).
  int splits = 0;
  int block_m = 128;
};

uint8_t RandomFp8(std::mt19937_64& rng) {
  for (;;) {
    const uint8_t b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) != 0x7f) return b;  // not NaN
  }
}

void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(test_util::SplitMix(Seed() ^ std::hash<std::string>{}(c.name)));
  // Slot -> expert: the counts, shuffled over the slots; local experts: all
  // but c.non_local, renumbered in order.
  test_util::GemmSlots slots;
  test_util::MakeGemmSlots(c.counts, c.non_local, c.splits == 0 ? 128 : c.block_m, rng, &slots);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  const std::vector<int32_t>&ids = slots.ids, &emap = slots.emap;
  const int local = slots.local;
  const int64_t numel = slots.numel;
  ASSERT_EQ(numel % c.top_k, 0);
  const int64_t a_rows = numel / c.top_k;
  const int64_t N = c.N, K = c.K, nbn = (N + 127) / 128, nbk = (K + 127) / 128;
  const bool block = c.scale == kc::MoeFp8WeightScale::kBlock;

  std::vector<uint8_t> a(a_rows * K), w(static_cast<size_t>(local) * N * K);
  for (auto& b : a) b = RandomFp8(rng);
  for (auto& b : w) b = RandomFp8(rng);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  std::vector<float> as(a_rows * (block ? nbk : 1)),
      wsc(local * (block                                           ? nbn * nbk
                   : c.scale == kc::MoeFp8WeightScale::kPerChannel ? N
                                                                   : 1));
  for (auto& s : as) s = u(rng) * 0x1p-6f;
  for (auto& s : wsc) s = u(rng) * 0x1p-6f;
  std::vector<float> bias(c.bias ? local * N : 0);
  for (auto& b : bias) b = (u(rng) - 1.0f) * 4.0f;

  test_util::DeviceBuf<uint8_t> da(a), dw(w);
  test_util::DeviceBuf<float> das(as), dws(wsc), dbias(bias);
  test_util::DeviceBuf<uint16_t> dc(numel * N);
  ASSERT_EQ(cudaMemset(dc.p, 0xff, numel * N * 2), cudaSuccess);  // NaN poison

  kc::MoeGroupedGemmArgs g;
  g.dtype = c.out;
  g.fp8 = true;
  g.a = da.p;
  g.a_row_div = c.top_k;
  g.w = dw.p;
  g.bias = c.bias ? dbias.p : nullptr;
  g.c = dc.p;
  slots.Into(g);
  g.N = N;
  g.K = K;
  g.w_scale_kind = c.scale;
  g.w_scale = dws.p;
  g.a_scale = das.p;
  if (c.splits == 0) {
    ASSERT_TRUE(kc::MoeGemmWsFp8Applies(g));
    const int64_t launches = kc::MoeGemmWsFp8Launches();
    const absl::Status st = kc::LaunchMoeGroupedGemmWsFp8(g, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(kc::MoeGemmWsFp8Launches(), launches + 1);
  } else {
    test_util::DeviceBuf<float> partials(c.splits > 1 ? c.splits * numel * N : 0);
    g.splits = c.splits;
    g.partials = c.splits > 1 ? partials.p : nullptr;
    const absl::Status st = kc::LaunchMoeGroupedGemm(g, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<uint16_t> out(numel * N);
  ASSERT_EQ(cudaMemcpy(out.data(), dc.p, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);

  std::vector<float> fa(a.size()), fw(w.size());
  for (size_t i = 0; i < a.size(); ++i) fa[i] = moe::Fp8E4m3ToFloat(a[i]);
  for (size_t i = 0; i < w.size(); ++i) fw[i] = moe::Fp8E4m3ToFloat(w[i]);
  std::vector<double> ref(numel * N, 0.0);
  std::vector<char> zero_row(numel, 0);
  for (int64_t s = 0; s < numel; ++s) {
    const int le = emap[ids[s]];
    if (le < 0) {
      zero_row[s] = 1;
      continue;
    }
    const int64_t r = s / c.top_k;
    for (int64_t n = 0; n < N; ++n) {
      const float* x = &fa[r * K];
      const float* y = &fw[(static_cast<int64_t>(le) * N + n) * K];
      double acc = 0.0;
      for (int64_t kb = 0; kb < nbk; ++kb) {
        double part = 0.0;
        for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k)
          part += double(x[k]) * y[k];
        if (block) {
          const float sc = as[r * nbk + kb] * wsc[(le * nbn + n / 128) * nbk + kb];
          acc += part * sc;
        } else {
          acc += part;
        }
      }
      if (!block) {
        const float sw = c.scale == kc::MoeFp8WeightScale::kPerChannel ? wsc[le * N + n] : wsc[le];
        acc *= double(as[r] * sw);
      }
      if (c.bias) acc += bias[le * N + n];
      ref[s * N + n] = acc;
    }
  }
  auto to_float = [&](uint16_t h) {
    return c.out == DType::kBFloat16 ? moe::LoadFloat(&h, DType::kBFloat16, 0)
                                     : moe::LoadFloat(&h, DType::kFloat16, 0);
  };
  double ss = 0.0, dd = 0.0;
  for (double v : ref) ss += v * v;
  const double rms = std::sqrt(ss / std::max<size_t>(ref.size(), 1));
  ASSERT_GT(rms, 0.0);
  int64_t bad = 0, unwritten = 0, nonzero = 0;
  for (int64_t s = 0; s < numel; ++s) {
    for (int64_t n = 0; n < N; ++n) {
      const float v = to_float(out[s * N + n]);
      if (std::isnan(v)) {
        ++unwritten;
        continue;
      }
      if (zero_row[s]) {
        nonzero += v != 0.0f;
        continue;
      }
      const double d = v - ref[s * N + n];
      dd += d * d;
      if (std::fabs(d) > 0x1p-7 * std::fabs(ref[s * N + n]) + 0x1p-8 * rms) {
        if (bad < 5) {
          ADD_FAILURE() << "slot " << s << " n " << n << ": got " << v << " want "
                        << ref[s * N + n];
        }
        ++bad;
      }
    }
  }
  EXPECT_EQ(unwritten, 0);
  EXPECT_EQ(nonzero, 0);
  EXPECT_EQ(bad, 0);
  EXPECT_LE(std::sqrt(dd / ss), 4e-3);
}

using kc::MoeFp8WeightScale;

TEST(MoeFp8WsGpuTest, BlockScalesWithTails) {
  SKIP_WITHOUT_CUDA();
  RunCase({"block_gemm1_tails",
           {300, 0, 129, 1, 128, 127, 241},
           2,
           328,
           400,
           MoeFp8WeightScale::kBlock,
           false,
           DType::kBFloat16});
}

TEST(MoeFp8WsGpuTest, BlockScalesBiasNonLocalFp16) {
  SKIP_WITHOUT_CUDA();
  RunCase({"block_gemm2_bias_nonlocal",
           {200, 130, 256, 7, 180, 251},
           1,
           512,
           1040,
           MoeFp8WeightScale::kBlock,
           true,
           DType::kFloat16,
           3});
}

TEST(MoeFp8WsGpuTest, PerChannel) {
  SKIP_WITHOUT_CUDA();
  RunCase({"per_channel",
           {260, 129, 140, 1, 300},
           2,
           264,
           272,
           MoeFp8WeightScale::kPerChannel,
           true,
           DType::kBFloat16,
           1});
}

TEST(MoeFp8WsGpuTest, PerTensor) {
  SKIP_WITHOUT_CUDA();
  RunCase({"per_tensor",
           {128, 256, 129, 300, 17},
           1,
           776,
           512,
           MoeFp8WeightScale::kPerTensor,
           false,
           DType::kBFloat16});
}

// More work items than CTAs (33 token tiles x 8 row tiles on an H200's
// 132): a CTA walks two, 5 k-tiles each (K ends in a partial one), so its
// ring's stages and phases carry over from one item to the next.
TEST(MoeFp8WsGpuTest, ManyWorkItems) {
  SKIP_WITHOUT_CUDA();
  RunCase({"many_items",
           {1500, 1300, 700, 3, 129, 1},
           1,
           2048,
           528,
           MoeFp8WeightScale::kBlock,
           false,
           DType::kBFloat16,
           2});
}

// The cp.async kernel that takes the layer's fp8 GEMMs on blocks of 16 and
// 64 (and of 128 only where the warp-specialised kernel is switched off or
// no tensor map fits): block scales staged with each k-tile, K split or not,
// and per tensor.
TEST(MoeFp8WsGpuTest, CpAsyncKernel) {
  SKIP_WITHOUT_CUDA();
  RunCase({"cp_async_block16",
           {1, 5, 16, 17, 41, 0},
           2,
           328,
           400,
           MoeFp8WeightScale::kBlock,
           true,
           DType::kBFloat16,
           2,
           1,
           16});
  RunCase({"cp_async_block64_split3",
           {64, 65, 3, 130},
           1,
           264,
           1040,
           MoeFp8WeightScale::kBlock,
           false,
           DType::kFloat16,
           -1,
           3,
           64});
  RunCase({"cp_async_block128",
           {130, 5, 200},
           1,
           392,
           528,
           MoeFp8WeightScale::kBlock,
           true,
           DType::kBFloat16,
           -1,
           1,
           128});
  RunCase({"cp_async_per_tensor16",
           {9, 31, 2},
           1,
           136,
           272,
           MoeFp8WeightScale::kPerTensor,
           false,
           DType::kBFloat16,
           -1,
           1,
           16});
}

// Small enough for compute-sanitizer (memcheck / racecheck / synccheck).
TEST(MoeFp8WsGpuTest, SanitizerShape) {
  SKIP_WITHOUT_CUDA();
  RunCase({"sanitizer",
           {300, 0, 128, 2},
           2,
           136,
           144,
           MoeFp8WeightScale::kBlock,
           true,
           DType::kBFloat16,
           3});
}

TEST(MoeFp8WsGpuTest, RejectsWhatItDoesNotTake) {
  kc::MoeGroupedGemmArgs g;
  g.fp8 = true;
  g.block_m = 64;
  g.N = 256;
  g.K = 256;
  g.numel = 1024;
  g.num_local_experts = 4;
  EXPECT_FALSE(kc::MoeGemmWsFp8Applies(g));  // block_m 64
  g.block_m = 128;
  g.fp8 = false;
  EXPECT_FALSE(kc::MoeGemmWsFp8Applies(g));  // not fp8
  g.fp8 = true;
  g.K = 264;  // not a multiple of 16
  EXPECT_FALSE(kc::MoeGemmWsFp8Applies(g));
  EXPECT_EQ(kc::LaunchMoeGroupedGemmWsFp8(g, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kplan
