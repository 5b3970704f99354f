// Batch invariance of the GPU MoE layer (MoeRunInput::batch_invariant,
// server/moe/gpu_layer.h), on which coalescing's bit-identity rests on a GPU:
// fresh random tokens run one by one and merged in one launch give the same
// bits per row (memcmp), on the fast kernels (bf16, fp8 per-token and 128 x
// 128 block scales on tensor cores, int4 / int8 groups on the dequantised
// route) and the emulation route (fp32 activations), at the Qwen3-30B-A3B shape where a lone token
// takes the decode kernels and split-K when not batch-invariant; the merged launch is also checked
// against the CPU reference (the batch-invariant kernel choice must be right, not only stable). The
// workspace is poisoned with NaN first. Skips without a device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/moe/gpu_runner.h"
#include "tests/moe/random_moe.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/tolerance.h"

namespace kplan {
namespace {

constexpr int kExperts = 128, kTopK = 8;
constexpr int64_t kHidden = 2048, kInter = 768;
constexpr int64_t kTokens = 40;

struct Case {
  std::string name;
  kernels::DType weights, act;
  std::string scheme;
};

// Rows [first, first + m) of a merged input.
MoeRunInput Rows(const MoeRunInput& all, int64_t first, int64_t m) {
  MoeRunInput in = all;
  const size_t row = all.hidden_states.size() / all.hidden_shape[0];
  in.hidden_shape = {m, all.hidden_shape[1]};
  in.hidden_states = std::string(all.hidden_states.bytes().substr(first * row, m * row));
  if (all.by_logits()) {
    in.logits_shape = {m, all.logits_shape[1]};
    in.router_logits =
        std::string(all.router_logits.bytes().substr(first * kExperts * 4, m * kExperts * 4));
  } else {
    in.topk_shape = {m, all.topk_shape[1]};
    in.topk_ids = all.topk_ids.substr(first * kTopK * 4, m * kTopK * 4);
    in.topk_weights = all.topk_weights.substr(first * kTopK * 4, m * kTopK * 4);
  }
  return in;
}

// Where a merged launch and the CPU reference disagree, from the outputs past
// the element bound per token (`outliers`, the test's count): those counts,
// then, for the token with the most, each of its slots alone (top-1, weight
// 1) on both sides, as the GPU's output over the CPU's in the least-squares
// sense (1 = the same) and the relative RMS of the difference: a slot whose
// ratio is off 1 by far more than its noise has a wrong scale; noise alike
// on every slot is the arithmetic's.
void Localise(const ExpertSet& set, const GpuExperts& gpu, const MoeRunInput& routed,
              const MoeRunOutput& whole, const std::vector<int>& outliers, kernels::DType act) {
  const int64_t row = kHidden;
  int worst = -1, worst_count = 0;
  std::string per_token;
  for (int t = 0; t < kTokens; ++t) {
    if (outliers[t] > 0) absl::StrAppend(&per_token, " t", t, ":", outliers[t]);
    if (outliers[t] > worst_count) worst = t, worst_count = outliers[t];
  }
  std::printf("outputs past the element bound, per token:%s\n", per_token.c_str());
  if (worst < 0) return;
  int worst_expert = -1;
  double worst_rel = 0;
  std::vector<double> worst_diff;
  for (int s = 0; s < kTopK; ++s) {
    MoeRunInput one = Rows(routed, worst, 1);
    one.topk_shape = {1, 1};
    one.topk_ids = routed.topk_ids.substr((worst * kTopK + s) * 4, 4);
    const float w = 1.0f;
    one.topk_weights.assign(reinterpret_cast<const char*>(&w), 4);
    one.batch_invariant = true;
    absl::StatusOr<MoeRunOutput> g = RunMoeOnGpu(gpu, one, nullptr);
    absl::StatusOr<MoeRunOutput> c = RunMoeOnCpu(set, one);
    if (!g.ok() || !c.ok()) {
      std::printf("  slot %d alone: gpu %s, cpu %s\n", s, g.status().ToString().c_str(),
                  c.status().ToString().c_str());
      return;
    }
    std::vector<double> diff(row);
    double gc = 0, cc = 0, dd = 0;
    for (int64_t j = 0; j < row; ++j) {
      const double have = moe::LoadFloat(g->output.data(), act, j);
      const double want = moe::LoadFloat(c->output.data(), act, j);
      diff[j] = have - want;
      gc += have * want, cc += want * want, dd += diff[j] * diff[j];
    }
    int32_t id;
    std::memcpy(&id, one.topk_ids.data(), 4);
    const double rel = cc > 0 ? std::sqrt(dd / cc) : 0.0;
    std::printf("  token %d slot %d (expert %d, weight %.4f): gpu/cpu %.5f, rel rms diff %.3g\n",
                worst, s, id, whole.topk_weights[worst * kTopK + s], cc > 0 ? gc / cc : 0.0, rel);
    if (rel > worst_rel) worst_rel = rel, worst_expert = id, worst_diff = std::move(diff);
  }
  // fp8 per-channel: how much of the worst slot's difference one input
  // column of its down weights explains (one intermediate element off by a
  // step moves the slot's output along that column, W2[:, i] * s2).
  if (set.spec().quant.scheme != "fp8_per_channel" || worst_expert < 0) return;
  const moe::MoeWeights w = set.Weights();
  const uint8_t* w2 = static_cast<const uint8_t*>(w.w2) + int64_t{worst_expert} * row * kInter;
  const float* s2 = w.quant.w2_scale + int64_t{worst_expert} * row;
  double dd = 0;
  for (double v : worst_diff) dd += v * v;
  int best = -1;
  double best_share = 0, best_alpha = 0;
  for (int64_t i = 0; i < kInter; ++i) {
    double dc = 0, cc = 0;
    for (int64_t j = 0; j < row; ++j) {
      const double c = moe::Fp8E4m3ToFloat(w2[j * kInter + i]) * s2[j];
      dc += worst_diff[j] * c, cc += c * c;
    }
    const double share = cc > 0 && dd > 0 ? dc * dc / (cc * dd) : 0;
    if (share > best_share) best = static_cast<int>(i), best_share = share, best_alpha = dc / cc;
  }
  std::printf(
      "  expert %d: intermediate column %d explains %.1f%% of the difference (that element "
      "off by %.4g)\n",
      worst_expert, best, 100 * best_share, best_alpha);
}

TEST(MoeCoalesceGpuTest, RowsComeOutTheSameAloneAndMerged) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(test_util::TestSeed("moe_coalesce_gpu_test", "MOE_COALESCE_GPU_TEST_SEED"));
  const std::vector<Case> cases = {
      {"bf16", kernels::DType::kBFloat16, kernels::DType::kBFloat16, ""},
      {"bf16 weights, fp32 activations (emulation)", kernels::DType::kBFloat16,
       kernels::DType::kFloat32, ""},
      {"fp8 per-channel, per-token", kernels::DType::kFp8E4m3, kernels::DType::kBFloat16,
       "fp8_per_channel"},
      {"fp8 128x128 blocks", kernels::DType::kFp8E4m3, kernels::DType::kBFloat16, "fp8_block"},
      // int weights: the dequant route at every M when batch-invariant.
      {"int4 groups", kernels::DType::kInt4Packed, kernels::DType::kBFloat16, "int4_group"},
      {"int8 groups, fp16", kernels::DType::kInt8, kernels::DType::kFloat16, "int8_group"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpertsSpec spec;
    spec.experts_id = c.name;
    spec.num_experts = kExperts;
    spec.hidden = kHidden;
    spec.intermediate = kInter;
    spec.dtype = c.weights;
    spec.quant.scheme = c.scheme;
    spec.quant.activation_scale = c.scheme == "fp8_block" ? "per_tensor" : "per_token";
    std::shared_ptr<ExpertSet> set = RandomExpertSet(spec, rng);
    absl::StatusOr<std::unique_ptr<GpuExperts>> gpu = GpuExperts::Create(*set, 0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const MoeRunInput all =
        RandomMoeInput(kExperts, kHidden, kTokens, c.act, "Renormalize", kTopK, rng);
    GpuRunOptions poison;
    poison.poison_workspace = true;
    // Merged: all tokens, and a split of 7 + 33.
    MoeRunInput merged = all;
    merged.batch_invariant = true;
    absl::StatusOr<MoeRunOutput> whole = RunMoeOnGpu(**gpu, merged, nullptr, poison);
    ASSERT_TRUE(whole.ok()) << whole.status();
    const size_t row = whole->output.size() / kTokens;
    for (int64_t first : {int64_t{0}, int64_t{7}}) {
      const int64_t m = first == 0 ? 7 : kTokens - 7;
      MoeRunInput part = Rows(all, first, m);
      part.batch_invariant = true;
      absl::StatusOr<MoeRunOutput> out = RunMoeOnGpu(**gpu, part, nullptr, poison);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(std::memcmp(out->output.data(), whole->output.data() + first * row, m * row), 0)
          << "rows " << first << ".." << first + m;
    }
    // Alone, token by token.
    int differing = 0;
    for (int64_t t = 0; t < kTokens; ++t) {
      MoeRunInput one = Rows(all, t, 1);
      one.batch_invariant = true;
      absl::StatusOr<MoeRunOutput> out = RunMoeOnGpu(**gpu, one, nullptr, poison);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->output.size(), row);
      if (std::memcmp(out->output.data(), whole->output.data() + t * row, row) != 0) ++differing;
      EXPECT_TRUE(std::equal(out->topk_ids.begin(), out->topk_ids.end(),
                             whole->topk_ids.begin() + t * kTopK));
    }
    EXPECT_EQ(differing, 0) << "tokens whose lone row differs from the merged launch's";
    if (c.name == "bf16") {
      // The control: without batch invariance a lone token takes the decode
      // kernels and split-K, which sum in other orders, so some rows differ
      // (the equality above is not a property of any two runs).
      int differing_without = 0;
      for (int64_t t = 0; t < kTokens; ++t) {
        absl::StatusOr<MoeRunOutput> out = RunMoeOnGpu(**gpu, Rows(all, t, 1), nullptr, poison);
        ASSERT_TRUE(out.ok()) << out.status();
        if (std::memcmp(out->output.data(), whole->output.data() + t * row, row) != 0) {
          ++differing_without;
        }
      }
      EXPECT_GT(differing_without, 0) << "lone rows without batch invariance all equal";
      std::printf("bf16 control: %d of %lld lone rows differ without batch invariance\n",
                  differing_without, static_cast<long long>(kTokens));
    }
    // The merged launch against the CPU reference, routed as the GPU routed
    // (a near-tie may pick another expert on either side).
    MoeRunInput routed = all;
    routed.logits_shape.clear();
    routed.router_logits.clear();
    routed.topk_shape = {kTokens, kTopK};
    routed.topk_ids.assign(reinterpret_cast<const char*>(whole->topk_ids.data()),
                           whole->topk_ids.size() * 4);
    routed.topk_weights.assign(reinterpret_cast<const char*>(whole->topk_weights.data()),
                               whole->topk_weights.size() * 4);
    absl::StatusOr<MoeRunOutput> ref = RunMoeOnCpu(*set, routed);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const int64_t n = kTokens * kHidden;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = moe::LoadFloat(ref->output.data(), c.act, i);
      ss += v * v;
    }
    const double rms = std::sqrt(ss / n);
    // fp8 sets run their GEMMs on the fp8 tensor cores here (bf16
    // activations): that bound, and its re-quantisation flips.
    const bool fp8 = !c.scheme.empty() && c.scheme.rfind("fp8", 0) == 0;
    // fp8 rounding flips come as events in one token's row: a slot whose
    // re-quantised intermediate rounds some elements to the neighbouring
    // fp8 step on one side moves that slot's whole output, and where the
    // slot carries most of the token's routing weight the move shows in the
    // token's row, in the outputs where the slot's down weights are largest
    // (the random fp8 weights take every e4m3 code: heavy-tailed). So the
    // allowance counts rows with flips (MoeMaxRoundingFlips of the outputs,
    // as before, now in rows), and caps a row's flips at a small share of
    // it. Measured (docs/PERF.md, session 43, the seed there passes at the
    // edge: 2 rows): 11 outputs in one row, whose top slot (routing weight
    // 0.85) was 2.55% off the CPU in relative RMS with a gpu / cpu ratio of
    // 0.996, its other slots 0.09-1.0%; on the CPU alone one bf16 step of
    // one input element moved this set's slot outputs by up to 1.1-2.9%.
    // What still fails: any output past the flip tolerance, more than 2
    // rows, more than 16 outliers in a row (a wrong scale or expert on a
    // heavy slot moves most of the row). An error on a light slot can hide
    // in either bound, as it could before.
    constexpr int kMaxRowFlips = kHidden / 128;
    int bad = 0, flips = 0, flip_rows = 0, most_row_flips = 0;
    std::vector<int> outliers(kTokens, 0);  // per token: outputs past the element bound
    for (int64_t t = 0; t < kTokens; ++t) {
      int row_flips = 0;
      for (int64_t i = t * kHidden; i < (t + 1) * kHidden; ++i) {
        const double want = moe::LoadFloat(ref->output.data(), c.act, i);
        const double have = moe::LoadFloat(whole->output.data(), c.act, i);
        const double d = std::fabs(have - want);
        if (d <= (fp8 ? test_util::MoeFp8TensorCoreElementTolerance(want, rms)
                      : test_util::MoeLayerElementTolerance(want, rms))) {
          continue;
        }
        ++outliers[t];
        if (fp8 && d <= test_util::MoeFp8FlipTolerance(want, rms, /*tensor_cores=*/true)) {
          ++row_flips;
        } else {
          ++bad;
        }
      }
      flips += row_flips;
      flip_rows += row_flips > 0;
      most_row_flips = std::max(most_row_flips, row_flips);
    }
    const int max_flip_rows = fp8 ? static_cast<int>(test_util::MoeMaxRoundingFlips(n)) : 0;
    // A few seconds, printed for any outlier (allowed ones too).
    if (bad + flips > 0) Localise(*set, **gpu, routed, *whole, outliers, c.act);
    EXPECT_EQ(bad, 0) << "of " << n << " elements outside the tolerance against the CPU reference";
    EXPECT_LE(flip_rows, max_flip_rows) << "token rows with fp8 re-quantisation outliers";
    EXPECT_LE(most_row_flips, kMaxRowFlips) << "fp8 re-quantisation outliers in one token row";
    std::printf(
        "%s: %lld tokens, rows equal alone and merged; vs CPU: rms %.4g, %d outside, "
        "%d flips in %d rows\n",
        c.name.c_str(), static_cast<long long>(kTokens), rms, bad, flips, flip_rows);
  }
}

}  // namespace
}  // namespace kplan
