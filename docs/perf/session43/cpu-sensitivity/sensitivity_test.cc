// Session 43 (docs/PERF.md): sensitivity of the coalescing test's fp8 per-channel set on the CPU. Kept out of the build; it ran as tests/moe/tmp_sens_test.cc (kplan_test(... unit ... LIBS kplan_moe_run)).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include "gtest/gtest.h"
#include "server/moe/gpu_runner.h"
#include "tests/moe/random_moe.h"
namespace kplan {
namespace {
constexpr int kExperts = 128, kTopK = 8;
constexpr int64_t kHidden = 2048, kInter = 768, kTokens = 40;
TEST(Tmp, Sens) {
  std::mt19937 rng(17808043586953073039ull);
  struct C { kernels::DType w, a; std::string scheme; };
  const C cases[] = {{kernels::DType::kBFloat16, kernels::DType::kBFloat16, ""},
                     {kernels::DType::kBFloat16, kernels::DType::kFloat32, ""},
                     {kernels::DType::kFp8E4m3, kernels::DType::kBFloat16, "fp8_per_channel"}};
  std::shared_ptr<ExpertSet> set;
  MoeRunInput all;
  for (const C& c : cases) {
    ExpertsSpec spec;
    spec.experts_id = "x";
    spec.num_experts = kExperts;
    spec.hidden = kHidden;
    spec.intermediate = kInter;
    spec.dtype = c.w;
    spec.quant.scheme = c.scheme;
    spec.quant.activation_scale = "per_token";
    set = RandomExpertSet(spec, rng);
    all = RandomMoeInput(kExperts, kHidden, kTokens, c.a, "Renormalize", kTopK, rng);
  }
  absl::StatusOr<MoeRunOutput> ref = RunMoeOnCpu(*set, all);
  ASSERT_TRUE(ref.ok());
  const int t = 29;
  MoeRunInput one = all;
  one.hidden_shape = {1, kHidden};
  one.hidden_states = std::string(all.hidden_states.bytes().substr(t * kHidden * 2, kHidden * 2));
  one.logits_shape.clear();
  one.router_logits.clear();
  one.topk_shape = {1, 1};
  const float w1 = 1.0f;
  one.topk_weights.assign(reinterpret_cast<const char*>(&w1), 4);
  std::mt19937 prng(1);
  for (int s = 0; s < kTopK; ++s) {
    const int32_t id = ref->topk_ids[t * kTopK + s];
    one.topk_ids.assign(reinterpret_cast<const char*>(&id), 4);
    absl::StatusOr<MoeRunOutput> base = RunMoeOnCpu(*set, one);
    ASSERT_TRUE(base.ok());
    double yy = 0;
    for (int64_t j = 0; j < kHidden; ++j) {
      const double v = moe::LoadFloat(base->output.data(), kernels::DType::kBFloat16, j);
      yy += v * v;
    }
    // 40 perturbations: one x element one bf16 step up.
    std::vector<double> rels;
    for (int p = 0; p < 40; ++p) {
      MoeRunInput q = one;
      std::string h(one.hidden_states.bytes());
      const int i = static_cast<int>(prng() % kHidden);
      uint16_t b;
      std::memcpy(&b, &h[i * 2], 2);
      b += 1;
      std::memcpy(&h[i * 2], &b, 2);
      q.hidden_states = h;
      absl::StatusOr<MoeRunOutput> o = RunMoeOnCpu(*set, q);
      ASSERT_TRUE(o.ok());
      double dd = 0;
      for (int64_t j = 0; j < kHidden; ++j) {
        const double d = moe::LoadFloat(o->output.data(), kernels::DType::kBFloat16, j) -
                         moe::LoadFloat(base->output.data(), kernels::DType::kBFloat16, j);
        dd += d * d;
      }
      rels.push_back(std::sqrt(dd / yy));
    }
    std::sort(rels.begin(), rels.end());
    std::printf("slot %d expert %d weight %.4f: rel diff from one x ulp: median %.3g, p90 %.3g, max %.3g\n",
                s, id, ref->topk_weights[t * kTopK + s], rels[20], rels[36], rels[39]);
  }
}
}  // namespace
}  // namespace kplan
