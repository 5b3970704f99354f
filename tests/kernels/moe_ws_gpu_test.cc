// The bf16 / fp16 warp-specialised grouped GEMM (kernels/cuda/moe/moe_gemm_ws.h)
// in its forms, one CTA a tile, clusters of two CTAs that multicast the
// weight box (SetMoeGemmWsClusterMode) and, bf16, the ping-pong consumers
// (SetMoeGemmWsPingPongMode), against each other and against the cp.async
// kernel (SetMoeGemmWsMode(kOff)), and the tall tiles (blocks of 192, bf16)
// against the same slots in blocks of 128: the outputs must be the same bytes, and
// within the dtype's rounding of a float64 evaluation
// of the GEMM. Fresh random data every run (seed printed;
// MOE_WS_GPU_TEST_SEED=<n> repeats one): values of 16 random bits
// (random_data.h, never zero), slot counts per expert that give odd token
// tile counts, pairs of tiles of different experts, empty experts, an
// expert that is not local (zero rows), half-empty 256-slot blocks, N and K
// that are not multiples of the tiles, with and without bias, GEMM 1
// (a_row_div = top_k) and GEMM 2 row maps; the fused SiLU epilogue in both
// forms, also the same bytes as the unfused GEMM followed by the activation
// kernel; more work items than clusters; the cp.async kernel's wide form
// (blocks of 16) at K tails, against the float64 evaluation alone. The
// launch counters show which form ran. Outputs are poisoned with NaN first. Run without
// KPLAN_MOE_WS_DEBUG (its measurement bits change the kernel). Skips
// without a device.
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
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/moe_gemm_slots.h"
#include "tests/testing/random_data.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;
using test_util::DeviceBuf;

uint64_t Seed() { return test_util::TestSeed("moe_ws_gpu_test", "MOE_WS_GPU_TEST_SEED"); }

struct Case {
  const char* name;
  std::vector<int> counts;  // slots per expert
  int top_k;                // a_row_div
  int64_t N, K;
  bool bias;
  DType dtype;
  int non_local = -1;  // an expert mapped to -1 (its slots get zero rows)
  int block_m = 128;
  bool fused = false;  // GEMM 1 with SiLU-and-mul: output [numel, N / 2]
};

// Host values of n random elements of `dt` (exact in it) and their bytes.
std::vector<float> RandomValues(int64_t n, int base, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = test_util::RandomValueOf(static_cast<uint32_t>(rng()) & 0xffff, base);
  return v;
}
std::vector<uint16_t> Bytes16(const std::vector<float>& v, DType dt) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) moe::StoreFloat(out.data(), dt, i, v[i]);
  return out;
}

// kWsTallClusterSwitch: the clusters' switch on where the tall tiles run
// one CTA a tile all the same.
enum class Form { kCpAsync, kWs, kWsCluster, kWsPingPong, kWsTallClusterSwitch };

// out (the GEMM's [numel, out_n] output) against a float64 evaluation: C =
// round(acc) (+ round(bias)); fused: silu(g) * u of the rounded gate and up
// values.
void CheckAgainstFloat64(const Case& c, const std::vector<float>& a, const std::vector<float>& w,
                         const std::vector<float>& bias, const test_util::GemmSlots& slots,
                         const std::vector<uint16_t>& out) {
  const std::vector<int32_t>&ids = slots.ids, &emap = slots.emap;
  const int64_t numel = slots.numel, N = c.N, K = c.K;
  const int64_t out_n = c.fused ? N / 2 : N;
  // eps: the dtype's unit roundoff (half its step at 1).
  const double eps = c.dtype == DType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  std::vector<double> ref(numel * out_n, 0.0), bound(numel * out_n, 0.0);
  std::vector<char> zero_row(numel, 0);
  std::vector<double> row(N), mag(N);
  for (int64_t s = 0; s < numel; ++s) {
    const int le = emap[ids[s]];
    if (le < 0) {
      zero_row[s] = 1;
      continue;
    }
    const float* x = &a[(s / c.top_k) * K];
    for (int64_t n = 0; n < N; ++n) {
      const float* y = &w[(static_cast<int64_t>(le) * N + n) * K];
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[k]) * y[k];
      const double b = c.bias ? bias[le * N + n] : 0.0;
      row[n] = acc + b;
      // The stored value's rounding error is at most eps times this:
      // round(acc), with a bias round(round(acc) + round(b)).
      mag[n] = std::fabs(acc) + (c.bias ? std::fabs(b) + std::fabs(row[n]) : 0.0);
    }
    for (int64_t n = 0; n < out_n; ++n) {
      if (!c.fused) {
        ref[s * out_n + n] = row[n];
        continue;
      }
      const double g = row[n], u = row[N / 2 + n], sig = 1.0 / (1.0 + std::exp(-g));
      ref[s * out_n + n] = g * sig * u;
      // Gate and up err by up to eps mag each: far more than eps |value|
      // where a bias cancels the product. Through silu(g) * u the output
      // errs by up to |silu'(g)| |u| dg + |silu(g)| du, the slope widened
      // by the gate's own error (|silu''| <= 0.5).
      const double slope = std::fabs(sig * (1.0 + g * (1.0 - sig))) + 0.5 * eps * mag[n];
      bound[s * out_n + n] = slope * std::fabs(u) * mag[n] + std::fabs(g * sig) * mag[N / 2 + n];
    }
  }
  double ss = 0.0, dd = 0.0;
  for (double v : ref) ss += v * v;
  const double rms = std::sqrt(ss / std::max<size_t>(ref.size(), 1));
  ASSERT_GT(rms, 0.0);
  // Unfused: C rounded once (with bias,
  // round(acc) and round(bias) before the sum's rounding): within 4 eps of
  // |ref|, plus eps of its rms where the bias cancels the product. Fused:
  // gate and up rounded like that, then silu(g)·u rounded: within 2 eps of
  // the bound above (a factor 2 for the fp32 sums and second-order terms),
  // plus 4 eps of |ref| (the output's own rounding) and eps of the rms.
  const double rel_tol = 4 * eps, abs_tol = eps * rms;
  int64_t bad = 0, unwritten = 0, nonzero = 0;
  for (int64_t s = 0; s < numel; ++s) {
    for (int64_t n = 0; n < out_n; ++n) {
      const float v = moe::LoadFloat(out.data(), c.dtype, s * out_n + n);
      if (std::isnan(v)) {
        ++unwritten;
        continue;
      }
      if (zero_row[s]) {
        nonzero += v != 0.0f;
        continue;
      }
      const double r = ref[s * out_n + n], d = v - r;
      dd += d * d;
      if (std::fabs(d) > rel_tol * std::fabs(r) + abs_tol + 2 * eps * bound[s * out_n + n]) {
        if (bad < 5) ADD_FAILURE() << "slot " << s << " n " << n << ": got " << v << " want " << r;
        ++bad;
      }
    }
  }
  EXPECT_EQ(unwritten, 0);
  EXPECT_EQ(nonzero, 0);
  EXPECT_EQ(bad, 0);
  EXPECT_LE(std::sqrt(dd / ss), (c.fused ? 2 : 1) * rel_tol);
  std::printf("%-24s numel=%-5lld N=%-4lld K=%-4lld rel=%.2e %s\n", c.name,
              static_cast<long long>(numel), static_cast<long long>(N), static_cast<long long>(K),
              std::sqrt(dd / ss), bad == 0 ? "OK" : "FAIL");
}

// The 16-bit elements where a and b (the same size) differ.
int64_t Differing(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  return differ;
}

void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(test_util::SplitMix(Seed() ^ std::hash<std::string>{}(c.name)));
  test_util::GemmSlots slots;
  test_util::MakeGemmSlots(c.counts, c.non_local, c.block_m, rng, &slots);
  ASSERT_FALSE(testing::Test::HasFatalFailure());
  const int local = slots.local;
  const int64_t numel = slots.numel;
  ASSERT_EQ(numel % c.top_k, 0);
  const int64_t a_rows = numel / c.top_k, N = c.N, K = c.K;
  const int64_t out_n = c.fused ? N / 2 : N;

  const int wbase = -static_cast<int>(std::ceil(std::log2(std::sqrt(double(K)))));
  const std::vector<float> a = RandomValues(a_rows * K, 0, rng);
  const std::vector<float> w = RandomValues(local * N * K, wbase, rng);
  std::vector<float> bias = c.bias ? RandomValues(local * N, -3, rng) : std::vector<float>{};
  DeviceBuf<uint16_t> da(Bytes16(a, c.dtype)), dw(Bytes16(w, c.dtype));
  DeviceBuf<float> dbias(bias);
  DeviceBuf<uint16_t> dc(numel * out_n);

  kc::MoeGroupedGemmArgs g;
  g.dtype = c.dtype;
  g.a = da.p;
  g.a_row_div = c.top_k;
  g.w = dw.p;
  g.bias = c.bias ? dbias.p : nullptr;
  g.c = dc.p;
  slots.Into(g);
  g.N = N;
  g.K = K;
  // Blocks of 16 / 64: the cp.async kernel alone (against float64 below).
  // Blocks of 192 (bf16): the tall tiles alone, against the same slots in
  // blocks of 128 on the default form (below) and float64.
  const bool tall = c.block_m == 192;
  const bool ws_forms = c.block_m >= 128 && !tall;
  ASSERT_EQ(kc::MoeGemmWsApplies(g), ws_forms || (tall && c.dtype == DType::kBFloat16));

  auto run = [&](Form f) {
    std::vector<uint16_t> out(numel * out_n);
    EXPECT_EQ(cudaMemset(dc.p, 0xff, out.size() * 2), cudaSuccess);  // NaN poison
    kc::SetMoeGemmWsMode(f == Form::kCpAsync ? kc::MoeGemmWsMode::kOff : kc::MoeGemmWsMode::kOn);
    kc::SetMoeGemmWsClusterMode(f == Form::kWsCluster || f == Form::kWsTallClusterSwitch
                                    ? kc::MoeGemmWsMode::kOn
                                    : kc::MoeGemmWsMode::kOff);
    kc::SetMoeGemmWsPingPongMode(f == Form::kWsPingPong ? kc::MoeGemmWsMode::kOn
                                                        : kc::MoeGemmWsMode::kOff);
    const int64_t ws = kc::MoeGemmWsLaunches(), clustered = kc::MoeGemmWsClusterLaunches(),
                  ping_pong = kc::MoeGemmWsPingPongLaunches();
    absl::Status st;
    if (c.fused) {
      st = kc::LaunchMoeGroupedGemmWsAct(g, kernels::MoeActivation::kSilu, {}, dc.p, nullptr);
    } else {
      st = kc::LaunchMoeGroupedGemm(g, nullptr);
    }
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(kc::MoeGemmWsLaunches(), ws + (f == Form::kCpAsync ? 0 : 1));
    EXPECT_EQ(kc::MoeGemmWsClusterLaunches(), clustered + (f == Form::kWsCluster ? 1 : 0));
    // The ping-pong form is bf16's: fp16 falls back to one CTA a tile.
    EXPECT_EQ(kc::MoeGemmWsPingPongLaunches(),
              ping_pong + (f == Form::kWsPingPong && c.dtype == DType::kBFloat16 ? 1 : 0));
    EXPECT_EQ(cudaMemcpy(out.data(), dc.p, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kFromEnv);
    kc::SetMoeGemmWsClusterMode(kc::MoeGemmWsMode::kFromEnv);
    kc::SetMoeGemmWsPingPongMode(kc::MoeGemmWsMode::kFromEnv);
    return out;
  };
  if (tall) {
    const int64_t talls = kc::MoeGemmWsTallTilesLaunches();
    const std::vector<uint16_t> out = run(Form::kWs);
    // The clusters' switch on: still one CTA a tile, the same bits.
    const std::vector<uint16_t> switched = run(Form::kWsTallClusterSwitch);
    EXPECT_EQ(kc::MoeGemmWsTallTilesLaunches(), talls + 2);
    EXPECT_EQ(out, switched) << "tall tiles with the clusters' switch on";
    // The same slots in blocks of 128, with the default forms' choice.
    test_util::GemmSlots s128;
    s128.ids = slots.ids;
    s128.emap = slots.emap;
    s128.local = slots.local;
    test_util::AlignGemmSlots(128, &s128);
    ASSERT_FALSE(testing::Test::HasFatalFailure());
    std::vector<uint16_t> want(out.size());
    EXPECT_EQ(cudaMemset(dc.p, 0xff, want.size() * 2), cudaSuccess);
    kc::MoeGroupedGemmArgs g128 = g;
    s128.Into(g128);
    const absl::Status st = c.fused ? kc::LaunchMoeGroupedGemmWsAct(
                                          g128, kernels::MoeActivation::kSilu, {}, dc.p, nullptr)
                                    : kc::LaunchMoeGroupedGemm(g128, nullptr);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(cudaMemcpy(want.data(), dc.p, want.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(Differing(out, want), 0) << "tall tiles against tiles of 128";
    CheckAgainstFloat64(c, a, w, bias, slots, out);
    return;
  }
  const std::vector<uint16_t> cluster = run(ws_forms ? Form::kWsCluster : Form::kCpAsync);
  if (ws_forms) {
    const std::vector<uint16_t> single = run(Form::kWs);
    EXPECT_EQ(Differing(cluster, single), 0) << "clusters of two against one CTA a tile";
  }
  if (ws_forms) {  // the ping-pong form (fp16: the fallback)
    const std::vector<uint16_t> pp = run(Form::kWsPingPong);
    EXPECT_EQ(Differing(cluster, pp), 0) << "clusters of two against the ping-pong form";
  }
  if (ws_forms && c.fused) {
    // Bit for bit the unfused GEMM (the default form) and the activation
    // kernel, which the fused epilogue's rounding points follow.
    DeviceBuf<uint16_t> full(numel * N), act(numel * out_n);
    kc::MoeGroupedGemmArgs gu = g;
    gu.c = full.p;
    const absl::Status st = kc::LaunchMoeGroupedGemm(gu, nullptr);
    EXPECT_TRUE(st.ok()) << st;
    const absl::Status sa = kc::LaunchMoeActivation(kernels::MoeActivation::kSilu, {}, c.dtype,
                                                    full.p, numel, N, act.p, out_n, nullptr);
    EXPECT_TRUE(sa.ok()) << sa;
    std::vector<uint16_t> want(numel * out_n);
    EXPECT_EQ(cudaMemcpy(want.data(), act.p, want.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(Differing(cluster, want), 0)
        << "fused epilogue against the GEMM and the activation kernel";
  }
  if (ws_forms && !c.fused) {  // the cp.async kernel has no fused epilogue
    const std::vector<uint16_t> cp = run(Form::kCpAsync);
    EXPECT_EQ(Differing(cluster, cp), 0) << "clusters of two against the cp.async kernel";
  }

  CheckAgainstFloat64(c, a, w, bias, slots, cluster);
}

// 128-slot blocks: 17 token tiles (odd: the last cluster has one tile),
// pairs of tiles of two experts, empty experts and a non-local one; tiles
// whose second 64 slots are padding.
TEST(MoeWsGpuTest, TailsAndMixedPairs) {
  SKIP_WITHOUT_CUDA();
  RunCase({"tails_bf16_bias",
           {0, 1, 127, 128, 129, 300, 256, 255, 400, 4},
           2,
           392,
           520,
           true,
           DType::kBFloat16,
           4});
  RunCase({"tails_fp16", {130, 0, 260, 3, 129, 258, 1, 300}, 1, 264, 136, false, DType::kFloat16});
  // The consumer warpgroups' padding skip at its edges: 63 / 64 slots (the
  // second warpgroup skips its MMAs), 65 (it runs for one slot), 192.
  RunCase({"half_tiles_fp16_bias", {64, 65, 192, 63, 16}, 2, 136, 264, true, DType::kFloat16});
}

// 256-slot blocks: an expert's last block may be half padding (an empty tile
// beside a full one in a cluster).
TEST(MoeWsGpuTest, HalfEmptyBlocksOf256) {
  SKIP_WITHOUT_CUDA();
  RunCase(
      {"block256_fp16_bias", {500, 3, 256, 257, 130}, 1, 512, 256, true, DType::kFloat16, -1, 256});
  RunCase({"block256_non_local", {600, 129, 384}, 3, 256, 192, false, DType::kBFloat16, 0, 256});
}

// One expert's tiles in pairs (every k-tile multicast), GEMM 1 row map.
TEST(MoeWsGpuTest, LongExperts) {
  SKIP_WITHOUT_CUDA();
  RunCase({"long_bf16", {1024, 1024, 512}, 2, 768, 1024, false, DType::kBFloat16});
}

// Many more work items than clusters (41 token tiles, 21 units x 16 row
// tiles): each cluster walks several, through multicast, solo and idle
// items, so the ring's stages and phases carry over between them.
TEST(MoeWsGpuTest, ClustersWalkManyWorkItems) {
  SKIP_WITHOUT_CUDA();
  RunCase(
      {"many_items", {1500, 1300, 900, 700, 3, 129, 1}, 1, 4096, 128, false, DType::kBFloat16, 2});
}

// The fused SiLU-and-mul epilogue in every form (gate and up boxes), blocks
// of 128 and 256, and its deferred half (moe_gemm_ws_sm90.cu) across tiles.
TEST(MoeWsGpuTest, FusedActivation) {
  SKIP_WITHOUT_CUDA();
  RunCase({"fused_bf16_bias",
           {300, 129, 0, 520, 7},
           2,
           400,
           264,
           true,
           DType::kBFloat16,
           1,
           128,
           true});
  RunCase({"fused_fp16_256", {700, 260, 300}, 1, 512, 128, false, DType::kFloat16, -1, 256, true});
  RunCase(
      {"fused_bf16_256", {600, 3, 257, 130}, 1, 272, 200, true, DType::kBFloat16, 2, 256, true});
  // More work items (328) than CTAs: a consumer thread's deferred units of
  // one tile finished during the next tile's k-tiles (K 576: 9 k-tiles for 8
  // units) or, where a tile has fewer k-tiles than units (K 328 and 128), at
  // the next tile's end; after a non-local tile's zero rows; and (N 2064) in
  // tiles whose output columns end past N / 2.
  RunCase({"fused_many_items_k576",
           {1500, 1300, 900, 700, 3, 129, 2},
           2,
           2048,
           576,
           true,
           DType::kBFloat16,
           2,
           128,
           true});
  RunCase({"fused_many_items_k328",
           {1500, 1300, 900, 700, 3, 129, 2},
           2,
           2048,
           328,
           true,
           DType::kBFloat16,
           2,
           128,
           true});
  RunCase({"fused_many_items_n2064_fp16",
           {1500, 1300, 900, 700, 3, 129, 1},
           1,
           2064,
           128,
           false,
           DType::kFloat16,
           -1,
           128,
           true});
}

// The tall tiles (blocks of 192, bf16), one CTA a tile (also with the
// clusters' switch on), against the same slots in tiles of 128 and float64: tiles whose second or
// third 64 slots are padding (an expert's 1, 63-65, 127-129 slots), full ones (191-193: a second
// tile of one slot), several tiles of one expert, empty experts and a non-local one, N and K off
// the tiles, with and without bias, GEMM 1 and 2 row maps; the fused SiLU epilogue; more work items
// than CTAs (27 token tiles x 16 weight-row tiles), so the ring's stages and phases carry over.
TEST(MoeWsGpuTest, TallTiles) {
  SKIP_WITHOUT_CUDA();
  RunCase({"tall_bf16_bias",
           {0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 401},  // 1554 slots: even
           2,
           392,
           520,
           true,
           DType::kBFloat16,
           3,
           192});
  RunCase({"tall_fused_bias",
           {150, 120, 3, 192, 300, 70, 0},
           1,
           400,
           264,
           true,
           DType::kBFloat16,
           2,
           192,
           true});
  RunCase(
      {"tall_fused_k4104", {130, 129, 65}, 2, 272, 4104, false, DType::kBFloat16, -1, 192, true});
  RunCase({"tall_many_items",
           {1500, 1300, 900, 700, 3, 129, 1},
           1,
           4096,
           128,
           false,
           DType::kBFloat16,
           -1,
           192});
}

// The cp.async kernel's wide form (256 bytes of each row a stage: blocks of
// 16, K >= 4096, not split) at K tails: the last stage's second sub-tile
// wholly past K (4104 = 32 x 128 + 8), partly past it (4168), none (4224);
// N not a multiple of the 128 weight rows; an expert with two blocks.
TEST(MoeWsGpuTest, WideKTilesOfBlocksOf16) {
  SKIP_WITHOUT_CUDA();
  RunCase({"wide_bf16_4104", {5, 16, 0, 17, 1}, 1, 264, 4104, true, DType::kBFloat16, -1, 16});
  RunCase({"wide_fp16_4168", {3, 9, 12}, 3, 136, 4168, false, DType::kFloat16, -1, 16});
  RunCase({"wide_bf16_4224", {8, 1, 2, 16}, 1, 128, 4224, false, DType::kBFloat16, 2, 16});
}

// The ping-pong form's turns: many tiles of at most 64 slots (one half-item
// each, the warpgroups alternating), tiles of 65-128 (two), reductions of
// 1-3 k-tiles (fewer than the ring's stages, so a warpgroup's next
// half-item reuses stages the other just released), fused and not; then
// several times more work items than CTAs (13 token tiles x 32 weight-row
// tiles: about 3 a CTA), so each CTA walks several half-items
// with odd and even counts, with reductions shorter and longer than the
// ring, and a non-local expert with slots (zero rows between turns).
TEST(MoeWsGpuTest, PingPongTurns) {
  SKIP_WITHOUT_CUDA();
  RunCase({"turns_k64",
           {16, 64, 65, 1, 0, 33, 128, 17, 2, 90, 64, 3, 127, 5},
           1,
           520,
           64,
           true,
           DType::kBFloat16,
           5});
  RunCase({"turns_k136_fused",
           {9, 70, 1, 64, 0, 128, 31, 67},
           2,
           272,
           136,
           false,
           DType::kBFloat16,
           -1,
           128,
           true});
  RunCase({"turns_k1000", {40, 3, 200, 64, 65, 1}, 1, 1032, 1000, false, DType::kBFloat16});
  RunCase({"walk_k136",
           {30, 64, 65, 3, 128, 17, 100, 1, 64, 9, 250, 40},
           1,
           8192,
           136,
           false,
           DType::kBFloat16,
           3});
  RunCase({"walk_k320_fused",
           {30, 64, 65, 3, 128, 17, 100, 1, 64, 9, 250, 41},
           2,
           8192,
           320,
           true,
           DType::kBFloat16,
           6,
           128,
           true});
}

// Small enough for compute-sanitizer (memcheck / racecheck / synccheck).
TEST(MoeWsGpuTest, SanitizerShape) {
  SKIP_WITHOUT_CUDA();
  RunCase({"sanitizer", {300, 0, 128, 2}, 2, 136, 144, true, DType::kBFloat16, 3});
  RunCase({"sanitizer_tall", {300, 0, 150, 2}, 2, 272, 144, true, DType::kBFloat16, 3, 192});
  RunCase(
      {"sanitizer_tall_fused", {200, 64, 1}, 1, 272, 200, true, DType::kBFloat16, -1, 192, true});
}

// Which blocks the kernels take (host logic: nothing is read or launched,
// so this runs without a device too): every block of 128 or 256 however few
// of its slots are filled (MoeGemmBlockMFor picks 128 from 16 or 64 slots
// per expert), never blocks of 16 or 64, never split K.
TEST(MoeWsGpuTest, TakesBlocksOf128HoweverFewSlots) {
  kc::MoeGroupedGemmArgs g;
  g.dtype = DType::kBFloat16;
  g.N = 256;
  g.K = 512;
  g.num_local_experts = 8;
  g.numel = 16 * 8;  // 16 slots per expert
  g.block_m = 128;
  g.num_blocks = 8;
  EXPECT_TRUE(kc::MoeGemmWsApplies(g));
  g.fp8 = true;
  EXPECT_TRUE(kc::MoeGemmWsFp8Applies(g));
  g.fp8 = false;
  g.numel = 3;  // three slots on three experts
  EXPECT_TRUE(kc::MoeGemmWsApplies(g));
  g.block_m = 256;
  EXPECT_TRUE(kc::MoeGemmWsApplies(g));
  for (int bm : {16, 64}) {
    g.block_m = bm;
    EXPECT_FALSE(kc::MoeGemmWsApplies(g)) << bm;
  }
  g.block_m = 128;
  g.splits = 2;
  EXPECT_FALSE(kc::MoeGemmWsApplies(g));
}

}  // namespace
}  // namespace kplan
