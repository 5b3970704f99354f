// Router scoring and top-k selection (vllm-kernel-plan.md §6.1, §2.4).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "base/status.h"

namespace kplan::moe {
namespace {

// a ranks before b: larger first, NaN largest, then lower index.
bool Before(float va, int a, float vb, int b) {
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return a < b;
}

void Softmax(const float* g, int n, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, g[i]);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = std::exp(g[i] - mx);
    sum += out[i];
  }
  for (int i = 0; i < n; ++i) out[i] /= sum;
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void Score(ScoringFunc f, const float* g, int n, float* out) {
  switch (f) {
    case ScoringFunc::kSoftmax:
      Softmax(g, n, out);
      return;
    case ScoringFunc::kSigmoid:
      for (int i = 0; i < n; ++i) out[i] = Sigmoid(g[i]);
      return;
    case ScoringFunc::kSqrtSoftplus:
      for (int i = 0; i < n; ++i) out[i] = std::sqrt(Softplus(g[i]));
      return;
  }
}

void Finish(const RoutingSpec& s, float* w) {
  const int k = s.top_k;
  if (s.renormalize) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += w[j];
    for (int j = 0; j < k; ++j) w[j] /= sum;
  }
  if (s.routed_scaling_factor != 1.0f) {
    for (int j = 0; j < k; ++j) w[j] *= s.routed_scaling_factor;
  }
}

}  // namespace

void TopKIndices(const float* values, int n, int k, int32_t* out_ids) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [values](int32_t a, int32_t b) { return Before(values[a], a, values[b], b); });
  std::copy(idx.begin(), idx.begin() + k, out_ids);
}

absl::Status ValidateRoutingSpec(const RoutingSpec& s) {
  if (s.num_experts <= 0) {
    return InvalidField("routing.num_experts",
                        absl::StrCat("num_experts must be positive, got ", s.num_experts));
  }
  if (s.top_k <= 0 || s.top_k > s.num_experts) {
    return InvalidField(
        "routing.top_k",
        absl::StrCat("top_k must be in [1, num_experts=", s.num_experts, "], got ", s.top_k));
  }
  if (!std::isfinite(s.routed_scaling_factor)) {
    return InvalidField("routing.routed_scaling_factor", "routed_scaling_factor must be finite");
  }
  if (s.method == RoutingMethod::kGroupedTopK) {
    const int g = s.num_expert_group;
    if (g <= 0 || s.topk_group <= 0) {
      return InvalidField(g <= 0 ? "routing.num_expert_group" : "routing.topk_group",
                          "num_expert_group and topk_group must be provided when "
                          "use_grouped_topk is True");
    }
    if (s.num_experts % g != 0) {
      return InvalidField(
          "routing.num_expert_group",
          absl::StrCat("num_expert_group ", g, " does not divide num_experts ", s.num_experts));
    }
    if (s.topk_group > g) {
      return InvalidField("routing.topk_group", absl::StrCat("topk_group ", s.topk_group,
                                                             " exceeds num_expert_group ", g));
    }
    const int per_group = s.num_experts / g;
    if (s.e_score_correction_bias != nullptr && per_group < 2) {
      return InvalidField("routing.num_expert_group",
                          "grouped top-k with a correction bias sums the top-2 scores of each "
                          "group and needs at least 2 experts per group");
    }
    if (s.top_k > s.topk_group * per_group) {
      return InvalidField("routing.top_k",
                          absl::StrCat("top_k ", s.top_k, " exceeds the ", s.topk_group * per_group,
                                       " experts of the topk_group selected groups"));
    }
  }
  return absl::OkStatus();
}

absl::Status RouteTokens(const RoutingSpec& s, const float* logits, int64_t num_tokens,
                         float* topk_weights, int32_t* topk_ids) {
  KPLAN_RETURN_IF_ERROR(ValidateRoutingSpec(s));
  if (num_tokens < 0) return InvalidField("num_tokens", "num_tokens must not be negative");
  if (num_tokens > 0 && (logits == nullptr || topk_weights == nullptr || topk_ids == nullptr)) {
    return InvalidField("router_logits", "logits and the top-k outputs must not be null");
  }
  const int E = s.num_experts, k = s.top_k;
  const float* bias = s.e_score_correction_bias;
  std::vector<float> scores(E), choice(E), group_scores;
  for (int64_t m = 0; m < num_tokens; ++m) {
    const float* g = logits + m * E;
    float* w = topk_weights + m * k;
    int32_t* ids = topk_ids + m * k;
    switch (s.method) {
      case RoutingMethod::kTopK: {
        Score(s.scoring, g, E, scores.data());
        for (int e = 0; e < E; ++e) choice[e] = bias ? scores[e] + bias[e] : scores[e];
        TopKIndices(choice.data(), E, k, ids);
        for (int j = 0; j < k; ++j) w[j] = scores[ids[j]];
        Finish(s, w);
        break;
      }
      case RoutingMethod::kTopKThenSoftmax: {
        TopKIndices(g, E, k, ids);
        for (int j = 0; j < k; ++j) choice[j] = g[ids[j]];
        Softmax(choice.data(), k, w);
        break;
      }
      case RoutingMethod::kLlama4: {
        TopKIndices(g, E, k, ids);
        for (int j = 0; j < k; ++j) w[j] = Sigmoid(g[ids[j]]);
        break;
      }
      case RoutingMethod::kGroupedTopK: {
        Score(s.scoring, g, E, scores.data());
        for (int e = 0; e < E; ++e) choice[e] = bias ? scores[e] + bias[e] : scores[e];
        const int G = s.num_expert_group, per = E / G;
        group_scores.assign(G, 0.0f);
        int32_t top2[2];
        for (int gi = 0; gi < G; ++gi) {
          const float* c = choice.data() + gi * per;
          if (bias) {
            TopKIndices(c, per, 2, top2);
            group_scores[gi] = c[top2[0]] + c[top2[1]];
          } else {
            TopKIndices(c, per, 1, top2);
            group_scores[gi] = c[top2[0]];
          }
        }
        std::vector<int32_t> groups(s.topk_group);
        TopKIndices(group_scores.data(), G, s.topk_group, groups.data());
        std::vector<float> masked(E, -std::numeric_limits<float>::infinity());
        for (int32_t gi : groups) {
          for (int e = gi * per; e < (gi + 1) * per; ++e) masked[e] = choice[e];
        }
        TopKIndices(masked.data(), E, k, ids);
        for (int j = 0; j < k; ++j) w[j] = scores[ids[j]];  // unbiased = choice without bias
        Finish(s, w);
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kplan::moe
