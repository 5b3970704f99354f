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
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
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

// The random operands of an fp8 GEMM over `slots` (top_k slots a row of A):
// e4m3 bytes of A and of the local experts' N x K weights, positive scales
// of `scale`'s kind, a bias in [-2, 2) where asked (else empty), on the host
// (for the references) and on the device; Into sets a GEMM's operand fields
// (all but the output).
struct Fp8Operands {
  static std::vector<uint8_t> Bytes(std::mt19937_64& rng, int64_t n) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = RandomFp8(rng);
    return v;
  }
  // n values (u + offset) · scale, u uniform in [0.5, 1.5).
  static std::vector<float> Floats(std::mt19937_64& rng, int64_t n, float scale, float offset) {
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    std::vector<float> v(n);
    for (auto& x : v) x = (u(rng) + offset) * scale;
    return v;
  }
  Fp8Operands(std::mt19937_64& rng, const test_util::GemmSlots& slots, int top_k, int64_t N,
              int64_t K, kc::MoeFp8WeightScale kind, bool with_bias)
      : scale(kind),
        a_rows(slots.numel / top_k),
        a(Bytes(rng, a_rows * K)),
        w(Bytes(rng, int64_t{slots.local} * N * K)),
        as(Floats(rng, a_rows * (kind == kc::MoeFp8WeightScale::kBlock ? (K + 127) / 128 : 1),
                  0x1p-6f, 0.0f)),
        wsc(Floats(rng,
                   slots.local * (kind == kc::MoeFp8WeightScale::kBlock
                                      ? ((N + 127) / 128) * ((K + 127) / 128)
                                  : kind == kc::MoeFp8WeightScale::kPerChannel ? N
                                                                               : 1),
                   0x1p-6f, 0.0f)),
        bias(Floats(rng, with_bias ? slots.local * N : 0, 4.0f, -1.0f)),
        da(a),
        dw(w),
        das(as),
        dws(wsc),
        dbias(bias) {}
  void Into(kc::MoeGroupedGemmArgs& g) const {
    g.fp8 = true;
    g.a = da.p;
    g.w = dw.p;
    g.bias = bias.empty() ? nullptr : dbias.p;
    g.w_scale_kind = scale;
    g.w_scale = dws.p;
    g.a_scale = das.p;
  }
  kc::MoeFp8WeightScale scale;
  int64_t a_rows;
  std::vector<uint8_t> a, w;
  std::vector<float> as, wsc, bias;
  test_util::DeviceBuf<uint8_t> da, dw;
  test_util::DeviceBuf<float> das, dws, dbias;
};

void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(test_util::SplitMix(Seed() ^ std::hash<std::string>{}(c.name)));
  // Slot -> expert: the counts, shuffled over the slots; local experts: all
  // but c.non_local, renumbered in order.
  test_util::GemmSlots slots;
  test_util::MakeGemmSlots(c.counts, c.non_local, c.splits == 0 ? 128 : c.block_m, rng, &slots);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  const std::vector<int32_t>&ids = slots.ids, &emap = slots.emap;
  const int64_t numel = slots.numel;
  ASSERT_EQ(numel % c.top_k, 0);
  const int64_t N = c.N, K = c.K, nbn = (N + 127) / 128, nbk = (K + 127) / 128;
  const bool block = c.scale == kc::MoeFp8WeightScale::kBlock;
  const Fp8Operands ops(rng, slots, c.top_k, N, K, c.scale, c.bias);
  const std::vector<uint8_t>&a = ops.a, &w = ops.w;
  const std::vector<float>&as = ops.as, &wsc = ops.wsc, &bias = ops.bias;

  test_util::DeviceBuf<uint16_t> dc(numel * N);
  ASSERT_EQ(cudaMemset(dc.p, 0xff, numel * N * 2), cudaSuccess);  // NaN poison

  kc::MoeGroupedGemmArgs g;
  g.dtype = c.out;
  ops.Into(g);
  g.a_row_div = c.top_k;
  g.c = dc.p;
  slots.Into(g);
  g.N = N;
  g.K = K;
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

// GEMM 1 with the activation and GEMM 2's 1 x 128 quantisation in its
// epilogue (LaunchMoeGroupedGemmWsFp8ActQuant) against the three steps it
// replaces on the same fresh random data: the GEMM into C1, the activation
// kernel, the per-group quantiser. Its bytes and scales must be the same;
// both outputs are poisoned first (0xff bytes: e4m3 NaN, which no finite
// value quantises to; NaN scales). I of 128 to 1024 (one to eight groups),
// K with a partial k-block, 0 to 1500 slots an expert, a non-local expert
// (zero rows: q 0 and the all-zero group's scale), with and without bias
// and clamp, bf16 and fp16.
void RunActQuantCase(const char* name, const std::vector<int>& counts, int64_t I, int64_t K,
                     bool with_bias, DType dtype, int non_local, bool clamp) {
  SCOPED_TRACE(name);
  std::mt19937_64 rng(test_util::SplitMix(Seed() ^ std::hash<std::string>{}(name)));
  test_util::GemmSlots slots;
  test_util::MakeGemmSlots(counts, non_local, 128, rng, &slots);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  constexpr int kTopK = 2;
  const int64_t numel = slots.numel, N = 2 * I;
  ASSERT_EQ(numel % kTopK, 0);
  const Fp8Operands ops(rng, slots, kTopK, N, K, kc::MoeFp8WeightScale::kBlock, with_bias);

  kc::MoeGroupedGemmArgs g;
  g.dtype = dtype;
  ops.Into(g);
  g.a_row_div = kTopK;
  slots.Into(g);
  g.N = N;
  g.K = K;
  kc::MoeActParams ap;
  ap.has_clamp_limit = clamp;
  ap.clamp_limit = 3.0f;
  ASSERT_TRUE(kc::MoeGemmWsFp8ActQuantApplies(g, kernels::MoeActivation::kSilu, 128));

  const int64_t groups = I / 128;
  test_util::DeviceBuf<uint8_t> q_fused(numel * I), q_steps(numel * I);
  test_util::DeviceBuf<float> s_fused(numel * groups), s_steps(numel * groups);
  for (void* b : {static_cast<void*>(q_fused.p), static_cast<void*>(q_steps.p)}) {
    ASSERT_EQ(cudaMemset(b, 0xff, numel * I), cudaSuccess);
  }
  for (void* b : {static_cast<void*>(s_fused.p), static_cast<void*>(s_steps.p)}) {
    ASSERT_EQ(cudaMemset(b, 0xff, numel * groups * 4), cudaSuccess);
  }
  const int64_t launches = kc::MoeGemmWsFp8ActQuantLaunches();
  absl::Status st = kc::LaunchMoeGroupedGemmWsFp8ActQuant(g, ap, q_fused.p, s_fused.p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(kc::MoeGemmWsFp8ActQuantLaunches(), launches + 1);

  test_util::DeviceBuf<uint16_t> c1(numel * N), c2(numel * I);
  g.c = c1.p;
  st = kc::LaunchMoeGroupedGemmWsFp8(g, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  st = kc::LaunchMoeActivation(kernels::MoeActivation::kSilu, ap, dtype, c1.p, numel, N, c2.p, I,
                               nullptr);
  ASSERT_TRUE(st.ok()) << st;
  st = kc::LaunchMoeFp8Quantize(kc::MoeFp8ActQuant::kPerGroup, dtype, c2.p, numel, I, 128, 0.0f,
                                nullptr, q_steps.p, s_steps.p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> qf(numel * I), qs(numel * I);
  std::vector<uint32_t> sf(numel * groups), ss(numel * groups);
  ASSERT_EQ(cudaMemcpy(qf.data(), q_fused.p, qf.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(qs.data(), q_steps.p, qs.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sf.data(), s_fused.p, sf.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ss.data(), s_steps.p, ss.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t byte_diff = 0, unwritten = 0, nonzero_bytes = 0;
  for (int64_t i = 0; i < numel * I; ++i) {
    unwritten += qf[i] == 0xff;
    nonzero_bytes += (qf[i] & 0x7f) != 0;
    if (qf[i] != qs[i]) {
      if (byte_diff < 5) {
        ADD_FAILURE() << "slot " << i / I << " column " << i % I << ": fused 0x" << std::hex
                      << int{qf[i]} << ", steps 0x" << int{qs[i]} << std::dec;
      }
      ++byte_diff;
    }
  }
  int64_t scale_diff = 0;
  for (size_t i = 0; i < sf.size(); ++i) scale_diff += sf[i] != ss[i];
  EXPECT_EQ(unwritten, 0);
  EXPECT_EQ(byte_diff, 0);
  EXPECT_EQ(scale_diff, 0);
  // A kernel that wrote zeros would show: random fp8 operands of every
  // exponent give heavy-tailed sums, so that a group's small values round to
  // zero next to its largest (46% of the bytes were not zero on the H100),
  // but far from all of them.
  EXPECT_GT(nonzero_bytes, numel * I / 8);
}

TEST(MoeFp8WsGpuTest, ActQuantMatchesTheSteps) {
  SKIP_WITHOUT_CUDA();
  RunActQuantCase("act_quant_bf16", {300, 0, 129, 1, 128, 127, 241}, 384, 400, false,
                  DType::kBFloat16, -1, false);
  RunActQuantCase("act_quant_fp16_bias_nonlocal_clamp", {200, 130, 256, 7, 180, 251}, 256, 1040,
                  true, DType::kFloat16, 3, true);
  // More work items than CTAs (33 token tiles x 8 row tiles): rings carry over.
  RunActQuantCase("act_quant_many_items", {1500, 1300, 700, 3, 129, 2}, 1024, 528, true,
                  DType::kBFloat16, 2, false);
  RunActQuantCase("act_quant_fp16", {130, 64, 300, 2}, 128, 272, false, DType::kFloat16, -1, false);
}

// Small enough for compute-sanitizer.
TEST(MoeFp8WsGpuTest, ActQuantSanitizerShape) {
  SKIP_WITHOUT_CUDA();
  RunActQuantCase("act_quant_sanitizer", {300, 0, 128, 2}, 128, 144, true, DType::kBFloat16, 3,
                  false);
}

// The rule (host logic, no device needed), at the points session 40
// measured: on for DeepSeek-V3 from 2048 tokens, off at 1024 and for every
// Mixtral-8x7B and Qwen3-30B-A3B row; forced on and off by the switch.
TEST(MoeFp8WsGpuTest, ActQuantRule) {
  if (std::getenv("KPLAN_MOE_FP8_ACT_QUANT") != nullptr) {
    GTEST_SKIP() << "KPLAN_MOE_FP8_ACT_QUANT is set";
  }
  kc::SetMoeGemmWsFp8ActQuantMode(kc::MoeKernelMode::kFromEnv);
  kc::SetMoeGemmWsFp8Mode(kc::MoeKernelMode::kOn);
  EXPECT_TRUE(kc::MoeGemmWsFp8ActQuantFor(4096 * 8, 256, 7168));   // DeepSeek-V3, 128 slots
  EXPECT_TRUE(kc::MoeGemmWsFp8ActQuantFor(2048 * 8, 256, 7168));   // 64 slots
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantFor(2016 * 8, 256, 7168));  // 63 slots
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantFor(1024 * 8, 256, 7168));  // 32 slots
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantFor(4096 * 2, 8, 4096));    // Mixtral-8x7B, K 4096
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantFor(4096 * 8, 128, 2048));  // Qwen3-30B-A3B, K 2048
  kc::SetMoeGemmWsFp8ActQuantMode(kc::MoeKernelMode::kOn);
  EXPECT_TRUE(kc::MoeGemmWsFp8ActQuantFor(64 * 2, 8, 4096));
  kc::SetMoeGemmWsFp8ActQuantMode(kc::MoeKernelMode::kOff);
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantFor(4096 * 8, 256, 7168));
  kc::SetMoeGemmWsFp8Mode(kc::MoeKernelMode::kOff);  // the kernel switched off: never
  kc::SetMoeGemmWsFp8ActQuantMode(kc::MoeKernelMode::kOn);
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantFor(4096 * 8, 256, 7168));
  kc::SetMoeGemmWsFp8ActQuantMode(kc::MoeKernelMode::kFromEnv);
  kc::SetMoeGemmWsFp8Mode(kc::MoeKernelMode::kFromEnv);
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
  // The fused GEMM 1: block scales, silu, groups of 128, I a multiple of 128.
  g.K = 256;
  g.w_scale_kind = kc::MoeFp8WeightScale::kBlock;
  EXPECT_TRUE(kc::MoeGemmWsFp8ActQuantApplies(g, kernels::MoeActivation::kSilu, 128));
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantApplies(g, kernels::MoeActivation::kGelu, 128));
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantApplies(g, kernels::MoeActivation::kSilu, 64));
  g.N = 384;  // I = 192: a group across two tiles
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantApplies(g, kernels::MoeActivation::kSilu, 128));
  g.N = 512;
  g.w_scale_kind = kc::MoeFp8WeightScale::kPerChannel;
  EXPECT_FALSE(kc::MoeGemmWsFp8ActQuantApplies(g, kernels::MoeActivation::kSilu, 128));
  uint8_t* q = nullptr;
  float* qs = nullptr;
  EXPECT_EQ(kc::LaunchMoeGroupedGemmWsFp8ActQuant(g, {}, q, qs, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // per-channel scales
  // Block scales: its outputs null, then misaligned (checked before any launch).
  g.w_scale_kind = kc::MoeFp8WeightScale::kBlock;
  g.num_blocks = 8;
  alignas(16) int32_t dummy[4] = {};  // never read: the checks come first
  g.a = g.w = dummy;
  g.a_scale = g.w_scale = reinterpret_cast<float*>(dummy);
  g.sorted_token_ids = g.expert_ids = g.num_tokens_post_padded = dummy;
  EXPECT_EQ(kc::LaunchMoeGroupedGemmWsFp8ActQuant(g, {}, q, qs, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  alignas(16) uint8_t bytes[32];
  alignas(16) float scales[4];
  EXPECT_EQ(kc::LaunchMoeGroupedGemmWsFp8ActQuant(g, {}, bytes + 1, scales, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kplan
