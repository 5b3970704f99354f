// Distinct experts hit by the moe_quant_gpu_test DeepSeekV3 routing (random
// logits U[-3,3), correction bias 0.1*U[-1,1)) vs plain softmax top-8.
#include <cstdio>
#include <random>
#include <set>
#include <vector>
#include "kernels/cpu/moe/moe_reference.h"
using namespace kplan;
int main() {
  const int E = 256, k = 8;
  for (int seed = 1; seed <= 3; ++seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-3, 3), b(-0.1f, 0.1f);
    std::vector<float> bias(E);
    for (float& x : bias) x = b(rng);
    for (int M : {1, 64, 256}) {
      std::vector<float> logits(M * E), w(M * k);
      std::vector<int32_t> ids(M * k);
      for (float& x : logits) x = u(rng);
      for (int variant = 0; variant < 3; ++variant) {
        moe::RoutingSpec s;
        s.num_experts = E; s.top_k = k;
        if (variant < 2) {
          s.method = kernels::RoutingMethod::kGroupedTopK;
          s.scoring = kernels::ScoringFunc::kSigmoid;
          s.renormalize = true;
          s.routed_scaling_factor = 2.5f;
          s.num_expert_group = 8; s.topk_group = 4;
          s.e_score_correction_bias = variant == 0 ? bias.data() : nullptr;
        } else {
          s.renormalize = true;
        }
        auto st = moe::RouteTokens(s, logits.data(), M, w.data(), ids.data());
        if (!st.ok()) { std::printf("%s\n", st.ToString().c_str()); return 1; }
        std::set<int32_t> d(ids.begin(), ids.end());
        std::printf("seed %d M=%3d %-28s hit %3zu of %d\n", seed, M,
                    variant == 0 ? "DeepSeekV3 + bias (the test)" : variant == 1 ? "DeepSeekV3, no bias" : "softmax top-8 (the bench)",
                    d.size(), E);
      }
    }
  }
}
