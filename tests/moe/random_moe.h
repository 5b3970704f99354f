// Random MoE data for the RunMoE tests (moe_coalesce_test, the GPU
// variants): a resident set of any spec with every tensor filled as its
// dtype needs, and inputs routed by random logits or given top-k ids.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/float16.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_runner.h"

namespace kplan {

// An unquantised set's spec (silu, no bias).
inline ExpertsSpec PlainSpec(std::string id, int experts, int64_t hidden, int64_t intermediate,
                             kernels::DType dtype = kernels::DType::kBFloat16) {
  return ExpertsSpec{.experts_id = std::move(id),
                     .num_experts = experts,
                     .hidden = hidden,
                     .intermediate = intermediate,
                     .activation = "silu",
                     .dtype = dtype,
                     .quant = {},
                     .has_bias = false};
}

// Random bytes of every tensor of `spec`, sized and typed as the set needs:
// weights ~ N(0, 1/K) in their dtype (fp8 never NaN), positive scales,
// small biases, any int8 / int4 / zero-point bytes.
inline std::shared_ptr<ExpertSet> RandomExpertSet(const ExpertsSpec& spec, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::map<std::string, std::string> tensors;
  for (const TensorSpec& t : ExpectedTensors(spec)) {
    const bool half = t.dtype == kernels::DType::kBFloat16 || t.dtype == kernels::DType::kFloat16;
    const int64_t n = t.bytes() / (t.dtype == kernels::DType::kFloat32 ? 4 : half ? 2 : 1);
    std::string bytes(static_cast<size_t>(t.bytes()), '\0');
    const float k = static_cast<float>(t.shape.back());
    for (int64_t i = 0; i < n; ++i) {
      switch (t.dtype) {
        case kernels::DType::kFloat32: {
          float v = normal(rng) * 0.1f;  // a bias
          if (t.name.find("scale") != std::string::npos) {
            // fp8 values reach 448, int8 127: scales bring weights to ~1/sqrt(K).
            v = scale(rng) * (spec.quant.scheme.rfind("fp8", 0) == 0 ? 0.02f : 0.01f) /
                std::sqrt(static_cast<float>(spec.hidden));
          } else if (t.name == "w13" || t.name == "w2") {
            v = normal(rng) / std::sqrt(k);
          }
          std::memcpy(&bytes[i * 4], &v, 4);
          break;
        }
        case kernels::DType::kBFloat16:
        case kernels::DType::kFloat16: {
          const float v = normal(rng) / std::sqrt(k);
          const uint16_t h = t.dtype == kernels::DType::kBFloat16 ? FloatToBf16(v) : FloatToHalf(v);
          std::memcpy(&bytes[i * 2], &h, 2);
          break;
        }
        case kernels::DType::kFp8E4m3: {
          uint8_t b = static_cast<uint8_t>(byte(rng));
          if ((b & 0x7f) == 0x7f) b ^= 1;  // e4m3's NaN codes
          bytes[i] = static_cast<char>(b);
          break;
        }
        default:
          bytes[i] = static_cast<char>(byte(rng));
      }
    }
    tensors[t.name] = std::move(bytes);
  }
  return std::make_shared<ExpertSet>(spec, std::move(tensors));
}

inline std::string RandomFloats(int64_t n, kernels::DType dtype, std::mt19937& rng,
                                float sd = 1.f) {
  std::normal_distribution<float> normal(0.f, sd);
  std::string out(static_cast<size_t>(n * kernels::DTypeSize(dtype)), '\0');
  for (int64_t i = 0; i < n; ++i) moe::StoreFloat(out.data(), dtype, i, normal(rng));
  return out;
}

// M tokens of random hidden states [M, hidden] for a set of `experts`,
// routed by random logits (`method`, top_k; DeepSeekV3 with 4 groups, top 2
// groups, scale 2.5 and a random correction bias) or, with method "", by
// random distinct top-k ids with weights in [0.1, 1).
inline MoeRunInput RandomMoeInput(int experts, int64_t hidden, int64_t m, kernels::DType act,
                                  const std::string& method, int top_k, std::mt19937& rng) {
  MoeRunInput in;
  in.act_dtype = act;
  in.hidden_shape = {m, hidden};
  in.hidden_states = RandomFloats(m * hidden, act, rng);
  if (!method.empty()) {
    in.logits_shape = {m, experts};
    in.router_logits = RandomFloats(m * experts, kernels::DType::kFloat32, rng, 2.f);
    in.routing.routing_method = method;
    in.routing.top_k = top_k;
    if (method == "DeepSeekV3") {
      in.routing.num_expert_group = 4;
      in.routing.topk_group = 2;
      in.routing.routed_scaling_factor = 2.5f;
      std::normal_distribution<float> normal(0.f, 0.1f);
      for (int e = 0; e < experts; ++e) in.routing.e_score_correction_bias.push_back(normal(rng));
    }
    return in;
  }
  in.topk_shape = {m, top_k};
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::uniform_real_distribution<float> w(0.1f, 1.f);
  std::vector<int32_t> all(experts);
  for (int64_t t = 0; t < m; ++t) {
    for (int e = 0; e < experts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < top_k; ++j) {
      ids.push_back(all[j]);
      weights.push_back(w(rng));
    }
  }
  in.topk_ids.assign(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
  in.topk_weights.assign(reinterpret_cast<const char*>(weights.data()), weights.size() * 4);
  return in;
}

}  // namespace kplan
