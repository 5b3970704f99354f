// Tests for the CPU reference MoE kernels (kernels/cpu/moe/moe_reference.h):
// hand-computed routing, alignment, activation and expert cases, exact dtype
// conversions, and a property test against a naive loop implementation.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "base/status.h"

namespace kplan::moe {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

float Sig(float x) { return 1.0f / (1.0f + std::exp(-x)); }
double SigD(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<float> SoftmaxRef(const std::vector<float>& g) {
  double sum = 0;
  for (float v : g) sum += std::exp(static_cast<double>(v));
  std::vector<float> p;
  for (float v : g) p.push_back(static_cast<float>(std::exp(static_cast<double>(v)) / sum));
  return p;
}

// ----------------------------------------------------------------- dtypes

TEST(MoeDTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), b) << b;
  }
}

TEST(MoeDTypeTest, HalfRoundsToNearestEvenAndOverflowsToInf) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);      // tie -> even (0)
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);   // rounds up to 2^-14
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = HalfToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), b) << b;
  }
}

TEST(MoeDTypeTest, Fp8E4m3DecodeEncode) {
  EXPECT_EQ(Fp8E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(Fp8E4m3ToFloat(0x3c), 1.5f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0xff)));
  for (int b = 0; b < 256; ++b) {
    const float f = Fp8E4m3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToFp8E4m3(f), b) << b;
    ASSERT_EQ(FloatToFp8E4m3(f, /*saturate=*/false), b) << b;
  }
  EXPECT_EQ(FloatToFp8E4m3(1.0625f), 0x38);  // tie between 1.0 and 1.125 -> even
  EXPECT_EQ(FloatToFp8E4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25 -> even (1.25)
  EXPECT_EQ(FloatToFp8E4m3(std::ldexp(1.0f, -10)), 0x00);      // subnormal tie -> 0
  EXPECT_EQ(FloatToFp8E4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // subnormal tie -> 2
  EXPECT_EQ(FloatToFp8E4m3(-0.0f), 0x80);
  // Saturation (vLLM's quantisers clamp to ±448) vs torch's raw cast.
  EXPECT_EQ(FloatToFp8E4m3(500.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4m3(-1e9f), 0xfe);
  EXPECT_EQ(FloatToFp8E4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToFp8E4m3(500.0f, false), 0x7f);
  EXPECT_EQ(FloatToFp8E4m3(470.0f, false), 0x7f);  // rounds past 448
  EXPECT_EQ(FloatToFp8E4m3(464.0f, false), 0x7e);  // tie -> even (448)
  EXPECT_EQ(FloatToFp8E4m3(-460.0f, false), 0xfe);
  EXPECT_EQ(FloatToFp8E4m3(std::nanf("")) & 0x7f, 0x7f);
}

TEST(MoeDTypeTest, RoundToDTypeAndLoadStore) {
  EXPECT_EQ(RoundToDType(1.0f + std::ldexp(1.0f, -9), kernels::DType::kBFloat16), 1.0f);
  EXPECT_EQ(RoundToDType(1.0f + std::ldexp(1.0f, -9), kernels::DType::kFloat16),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(RoundToDType(0.1f, kernels::DType::kFloat32), 0.1f);
  uint16_t buf[2];
  StoreFloat(buf, kernels::DType::kBFloat16, 1, 3.0f);
  EXPECT_EQ(buf[1], 0x4040);
  EXPECT_EQ(LoadFloat(buf, kernels::DType::kBFloat16, 1), 3.0f);
}

// The row forms are the element forms, bit for bit: every 16-bit pattern
// loaded, and rounding of random, special and boundary floats.
TEST(MoeDTypeTest, RowFormsAreTheElementForms) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> row(all.size());
  std::vector<float> f32 = {1.5f, -0.0f, std::numeric_limits<float>::infinity(), 3.0e-40f};
  for (kernels::DType t : {kernels::DType::kFloat16, kernels::DType::kBFloat16}) {
    LoadFloats(all.data(), t, 0, 65536, row.data());
    for (int i = 0; i < 65536; ++i) {
      const float one = LoadFloat(all.data(), t, i);
      ASSERT_EQ(std::memcmp(&row[i], &one, 4), 0) << kernels::DTypeName(t) << " " << i;
    }
    LoadFloats(all.data(), t, 100, 5, row.data());  // an offset
    for (int i = 0; i < 5; ++i) {
      const float one = LoadFloat(all.data(), t, 100 + i);
      EXPECT_EQ(std::memcmp(&row[i], &one, 4), 0);
    }
  }
  LoadFloats(f32.data(), kernels::DType::kFloat32, 1, 3, row.data());
  EXPECT_EQ(std::memcmp(row.data(), f32.data() + 1, 12), 0);

  std::mt19937 rng(7);
  std::vector<float> x(4096);
  for (float& v : x) {
    const uint32_t bits = rng();
    std::memcpy(&v, &bits, 4);  // every exponent: NaN, inf, subnormals
  }
  x[0] = 65504.0f;  // fp16's largest, then just past its rounding boundary
  x[1] = 65520.0f;
  x[2] = 1.0f + std::ldexp(1.0f, -8);  // a bf16 tie
  for (kernels::DType t :
       {kernels::DType::kFloat16, kernels::DType::kBFloat16, kernels::DType::kFloat32}) {
    std::vector<float> y = x;
    RoundToDTypeInPlace(y.data(), static_cast<int64_t>(y.size()), t);
    for (size_t i = 0; i < x.size(); ++i) {
      const float one = RoundToDType(x[i], t);
      ASSERT_EQ(std::memcmp(&y[i], &one, 4), 0) << kernels::DTypeName(t) << " " << x[i];
    }
  }
}

TEST(MoeDTypeTest, Int4PacksLowNibbleFirst) {
  const std::vector<uint8_t> packed = PackInt4({1, 2, 3, 0xf, 7});
  EXPECT_THAT(packed, ElementsAre(0x21, 0xf3, 0x07));
  EXPECT_EQ(Int4At(packed.data(), 0), 1);
  EXPECT_EQ(Int4At(packed.data(), 1), 2);
  EXPECT_EQ(Int4At(packed.data(), 3), 0xf);
  EXPECT_EQ(Int4At(packed.data(), 4), 7);
}

// ----------------------------------------------------------------- routing

struct Routed {
  std::vector<float> w;
  std::vector<int32_t> ids;
};

Routed Route(const RoutingSpec& spec, const std::vector<float>& logits) {
  const int64_t m = static_cast<int64_t>(logits.size()) / spec.num_experts;
  Routed r{std::vector<float>(m * spec.top_k), std::vector<int32_t>(m * spec.top_k)};
  absl::Status s = RouteTokens(spec, logits.data(), m, r.w.data(), r.ids.data());
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

TEST(MoeRoutingTest, SoftmaxTopKWithAndWithoutRenormalize) {
  RoutingSpec spec{.num_experts = 4, .top_k = 2};
  const std::vector<float> g = {1, 2, 3, 0, /*token 1*/ 0.5f, -1, 0.25f, 2};
  Routed r = Route(spec, g);
  EXPECT_THAT(r.ids, ElementsAre(2, 1, 3, 0));
  const std::vector<float> p0 = SoftmaxRef({1, 2, 3, 0});
  const std::vector<float> p1 = SoftmaxRef({0.5f, -1, 0.25f, 2});
  EXPECT_NEAR(r.w[0], p0[2], 1e-6);
  EXPECT_NEAR(r.w[1], p0[1], 1e-6);
  EXPECT_NEAR(r.w[2], p1[3], 1e-6);
  EXPECT_NEAR(r.w[3], p1[0], 1e-6);
  EXPECT_NEAR(r.w[0], 0.6439142f, 1e-6);  // e^3 / (1 + e + e^2 + e^3)

  spec.renormalize = true;
  r = Route(spec, g);
  EXPECT_THAT(r.ids, ElementsAre(2, 1, 3, 0));
  EXPECT_NEAR(r.w[0], 0.7310586f, 1e-6);  // e^3/(e^2+e^3) = sigmoid(1)
  EXPECT_NEAR(r.w[1], 1 - 0.7310586f, 1e-6);
  EXPECT_NEAR(r.w[2] + r.w[3], 1.0f, 1e-6);
  EXPECT_NEAR(r.w[2], Sig(1.5f), 1e-6);
}

TEST(MoeRoutingTest, TiesPickTheLowestIndexFirst) {
  RoutingSpec spec{.num_experts = 4, .top_k = 2};
  EXPECT_THAT(Route(spec, {0.5f, 0.5f, 0.5f, 0.5f}).ids, ElementsAre(0, 1));
  EXPECT_THAT(Route(spec, {1, 3, 3, 2}).ids, ElementsAre(1, 2));
  EXPECT_THAT(Route(spec, {3, 1, 2, 3}).ids, ElementsAre(0, 3));
  int32_t ids[3];
  const float v[5] = {1, std::nanf(""), 2, 2, 0};
  TopKIndices(v, 5, 3, ids);
  EXPECT_THAT(ids, ElementsAre(1, 2, 3));  // NaN ranks first, as torch.topk
}

TEST(MoeRoutingTest, SigmoidTopK) {
  RoutingSpec spec{.num_experts = 4, .top_k = 2, .scoring = ScoringFunc::kSigmoid};
  Routed r = Route(spec, {0, 2, -1, 1});
  EXPECT_THAT(r.ids, ElementsAre(1, 3));
  EXPECT_NEAR(r.w[0], 0.8807971f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.7310586f, 1e-6);
  spec.renormalize = true;
  r = Route(spec, {0, 2, -1, 1});
  EXPECT_NEAR(r.w[0], Sig(2) / (Sig(2) + Sig(1)), 1e-6);
  EXPECT_NEAR(r.w[1], Sig(1) / (Sig(2) + Sig(1)), 1e-6);
}

TEST(MoeRoutingTest, CorrectionBiasSelectsButDoesNotWeigh) {
  const float bias[4] = {0.5f, 0, 0, 0};
  RoutingSpec spec{.num_experts = 4,
                   .top_k = 2,
                   .scoring = ScoringFunc::kSigmoid,
                   .e_score_correction_bias = bias};
  Routed r = Route(spec, {0, 0, 2, 1});  // biased: 1.0, 0.5, 0.88, 0.73
  EXPECT_THAT(r.ids, ElementsAre(0, 2));
  EXPECT_NEAR(r.w[0], 0.5f, 1e-7);
  EXPECT_NEAR(r.w[1], Sig(2), 1e-7);
  spec.renormalize = true;
  spec.routed_scaling_factor = 2.5f;
  r = Route(spec, {0, 0, 2, 1});
  EXPECT_NEAR(r.w[0], 2.5f * 0.5f / (0.5f + Sig(2)), 1e-6);
  EXPECT_NEAR(r.w[1], 2.5f * Sig(2) / (0.5f + Sig(2)), 1e-6);
  EXPECT_NEAR(r.w[0] + r.w[1], 2.5f, 1e-6);
}

TEST(MoeRoutingTest, DeepSeekV3GroupedTopKSumsTopTwoBiasedScores) {
  // Biased scores c per group of 2: {0.9, 0.1} {0.6, 0.55} {0.7, 0.5} {0.2, 0.3}:
  // top-2 sums pick groups 2 (1.2) and 1 (1.15); the max rule would pick 0 and 2.
  const float c[8] = {0.9f, 0.1f, 0.6f, 0.55f, 0.7f, 0.5f, 0.2f, 0.3f};
  std::vector<float> g(8);
  float bias[8], s[8];
  for (int e = 0; e < 8; ++e) {
    g[e] = (e - 3.5f) * 0.3f;
    s[e] = Sig(g[e]);
    bias[e] = c[e] - s[e];
  }
  RoutingSpec spec{.num_experts = 8,
                   .top_k = 2,
                   .method = RoutingMethod::kGroupedTopK,
                   .scoring = ScoringFunc::kSigmoid,
                   .renormalize = true,
                   .e_score_correction_bias = bias,
                   .routed_scaling_factor = 2.5f,
                   .num_expert_group = 4,
                   .topk_group = 2};
  Routed r = Route(spec, g);
  EXPECT_THAT(r.ids, ElementsAre(4, 2));
  EXPECT_NEAR(r.w[0], 2.5f * s[4] / (s[4] + s[2]), 1e-6);  // unbiased scores
  EXPECT_NEAR(r.w[1], 2.5f * s[2] / (s[4] + s[2]), 1e-6);
  spec.topk_group = 1;  // only group 2
  spec.renormalize = false;
  spec.routed_scaling_factor = 1.0f;
  r = Route(spec, g);
  EXPECT_THAT(r.ids, ElementsAre(4, 5));
  EXPECT_NEAR(r.w[0], s[4], 1e-7);
  EXPECT_NEAR(r.w[1], s[5], 1e-7);
}

TEST(MoeRoutingTest, GroupedTopKWithoutBiasUsesGroupMax) {
  // Groups {3,-3} {1.9,1.9} {2,1.5} {-1,-2}: max picks groups 0 and 2 (a top-2
  // sum would pick group 1 over group 2).
  const std::vector<float> g = {3, -3, 1.9f, 1.9f, 2, 1.5f, -1, -2};
  RoutingSpec spec{.num_experts = 8,
                   .top_k = 2,
                   .method = RoutingMethod::kGroupedTopK,
                   .num_expert_group = 4,
                   .topk_group = 2};
  Routed r = Route(spec, g);
  EXPECT_THAT(r.ids, ElementsAre(0, 4));
  const std::vector<float> p = SoftmaxRef(g);
  EXPECT_NEAR(r.w[0], p[0], 1e-6);
  EXPECT_NEAR(r.w[1], p[4], 1e-6);
}

TEST(MoeRoutingTest, Llama4TopOneSigmoid) {
  RoutingSpec spec{.num_experts = 4, .top_k = 1, .method = RoutingMethod::kLlama4};
  Routed r = Route(spec, {0.3f, -1, 2, 1.9f, /*token 1*/ -3, -2, -5, -4});
  EXPECT_THAT(r.ids, ElementsAre(2, 1));
  EXPECT_NEAR(r.w[0], 0.8807971f, 1e-6);
  EXPECT_NEAR(r.w[1], Sig(-2), 1e-7);
}

TEST(MoeRoutingTest, TopKThenSoftmax) {
  RoutingSpec spec{.num_experts = 4, .top_k = 2, .method = RoutingMethod::kTopKThenSoftmax};
  Routed r = Route(spec, {1, 3, 2, 0});
  EXPECT_THAT(r.ids, ElementsAre(1, 2));
  EXPECT_NEAR(r.w[0], 0.7310586f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.2689414f, 1e-6);
}

TEST(MoeRoutingTest, DeepSeekV4SqrtSoftplus) {
  const float bias[4] = {0, 0, 0, 0};
  RoutingSpec spec{.num_experts = 4,
                   .top_k = 2,
                   .scoring = ScoringFunc::kSqrtSoftplus,
                   .e_score_correction_bias = bias};
  Routed r = Route(spec, {0, 1, -1, 25});
  EXPECT_THAT(r.ids, ElementsAre(3, 1));
  EXPECT_NEAR(r.w[0], 5.0f, 1e-6);  // softplus(25) = 25 above the threshold 20
  EXPECT_NEAR(r.w[1], std::sqrt(std::log1p(std::exp(1.0f))), 1e-6);
  Routed z = Route(spec, {0, -10, -10, -10});
  EXPECT_NEAR(z.w[0], 0.8325546f, 1e-6);  // sqrt(ln 2)
  spec.renormalize = true;
  r = Route(spec, {0, 1, -1, 25});
  const float s1 = std::sqrt(std::log1p(std::exp(1.0f)));
  EXPECT_NEAR(r.w[0], 5.0f / (5.0f + s1), 1e-6);
}

TEST(MoeRoutingTest, InvalidSpecsNameTheField) {
  float w[8];
  int32_t ids[8];
  const float g[8] = {};
  auto field = [&](RoutingSpec s) {
    absl::Status st = RouteTokens(s, g, 1, w, ids);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    return FieldOf(st).value_or("");
  };
  EXPECT_EQ(field({.num_experts = 4, .top_k = 5}), "routing.top_k");
  EXPECT_EQ(field({.num_experts = 4, .top_k = 0}), "routing.top_k");
  EXPECT_EQ(field({.num_experts = 0, .top_k = 1}), "routing.num_experts");
  EXPECT_EQ(field({.num_experts = 8,
                   .top_k = 2,
                   .method = RoutingMethod::kGroupedTopK,
                   .num_expert_group = 3,
                   .topk_group = 1}),
            "routing.num_expert_group");
  EXPECT_EQ(field({.num_experts = 8,
                   .top_k = 2,
                   .method = RoutingMethod::kGroupedTopK,
                   .num_expert_group = 4,
                   .topk_group = 5}),
            "routing.topk_group");
  EXPECT_EQ(field({.num_experts = 8,
                   .top_k = 3,
                   .method = RoutingMethod::kGroupedTopK,
                   .num_expert_group = 4,
                   .topk_group = 1}),
            "routing.top_k");
  absl::Status missing =
      ValidateRoutingSpec({.num_experts = 8, .top_k = 2, .method = RoutingMethod::kGroupedTopK});
  EXPECT_EQ(missing.message(),
            "num_expert_group and topk_group must be provided when use_grouped_topk is True");
}

// ----------------------------------------------------------------- align

TEST(MoeAlignTest, WorkedExampleFromTheSpec) {
  const std::vector<int32_t> ids = {1, 2, 3, 0, 1, 3, 0, 2, 3, 0, 1, 2};
  MoeAlignResult r = MoeAlignBlockSize(ids.data(), 12, 4, 4).value();
  std::vector<int32_t> want = {3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12};
  want.resize(12 + 4 * 3, 12);  // max_padded = numel + E·(bs-1), tail = sentinel numel
  EXPECT_THAT(r.sorted_token_ids, ElementsAreArray(want));
  EXPECT_THAT(r.expert_ids, ElementsAre(0, 1, 2, 3, -1, -1));
  EXPECT_EQ(r.num_tokens_post_padded, 16);
}

TEST(MoeAlignTest, PadSortedIdsAndSmallNumel) {
  const std::vector<int32_t> ids = {1, 2, 3, 0, 1, 3, 0, 2, 3, 0, 1, 2};
  MoeAlignResult r =
      MoeAlignBlockSize(ids.data(), 12, 5, 4, nullptr, /*pad_sorted_ids=*/true).value();
  EXPECT_EQ(r.sorted_token_ids.size(), 30u);  // 12 + 4·4 = 28 rounded up to 30
  EXPECT_EQ(r.expert_ids.size(), 6u);
  EXPECT_EQ(r.num_tokens_post_padded, 20);
  EXPECT_THAT(std::vector<int32_t>(r.sorted_token_ids.begin(), r.sorted_token_ids.begin() + 10),
              ElementsAre(3, 6, 9, 12, 12, 0, 4, 10, 12, 12));
  r = MoeAlignBlockSize(ids.data(), 12, 5, 4).value();
  EXPECT_EQ(r.sorted_token_ids.size(), 28u);

  const std::vector<int32_t> two = {5, 5};  // numel 2 < E 8: min(2·4, 2 + 8·3)
  r = MoeAlignBlockSize(two.data(), 2, 4, 8).value();
  EXPECT_THAT(r.sorted_token_ids, ElementsAre(0, 1, 2, 2, 2, 2, 2, 2));
  EXPECT_THAT(r.expert_ids, ElementsAre(5, -1));
  EXPECT_EQ(r.num_tokens_post_padded, 4);
}

TEST(MoeAlignTest, ExpertMapMarksOrDropsNonLocalExperts) {
  const std::vector<int32_t> ids = {1, 2, 3, 0, 1, 3, 0, 2, 3, 0, 1, 2};
  const int32_t map[4] = {-1, 0, -1, 1};
  MoeAlignResult r = MoeAlignBlockSize(ids.data(), 12, 4, 4, map).value();
  EXPECT_THAT(r.expert_ids, ElementsAre(-1, 0, -1, 1, -1, -1));
  EXPECT_EQ(r.num_tokens_post_padded, 16);
  EXPECT_EQ(r.sorted_token_ids[4], 0);

  r = MoeAlignBlockSize(ids.data(), 12, 4, 4, map, false, /*ignore_invalid_experts=*/true).value();
  std::vector<int32_t> want = {0, 4, 10, 12, 2, 5, 8, 12};
  want.resize(24, 12);
  EXPECT_THAT(r.sorted_token_ids, ElementsAreArray(want));
  EXPECT_THAT(r.expert_ids, ElementsAre(0, 1, -1, -1, -1, -1));
  EXPECT_EQ(r.num_tokens_post_padded, 8);
}

TEST(MoeAlignTest, RejectsBadArguments) {
  const int32_t ids[1] = {0};
  EXPECT_EQ(FieldOf(MoeAlignBlockSize(ids, 1, 0, 4).status()).value(), "block_size");
  EXPECT_EQ(FieldOf(MoeAlignBlockSize(ids, 1, 4, 0).status()).value(), "num_experts");
}

// ----------------------------------------------------------------- activations

std::vector<float> Act(MoeActivation a, const std::vector<float>& in, int64_t out_width,
                       ActivationParams p = {}) {
  const int64_t in_width = IsGated(a) ? 2 * out_width : out_width;
  const int64_t rows = static_cast<int64_t>(in.size()) / in_width;
  std::vector<float> out(rows * out_width);
  absl::Status s = ApplyActivation(a, p, in.data(), rows, in_width, out.data(), out_width);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

double GeluErfD(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double GeluTanhD(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double SiluD(double x) { return x * SigD(x); }

TEST(MoeActivationTest, GatedFormulas) {
  const std::vector<double> xs = {-3.0, -0.5, 0.0, 1.0, 2.5};
  const std::vector<double> ys = {2.0, -1.5, 0.75, 2.0, -0.25};
  std::vector<float> in;  // one row: x1 | x2
  for (double x : xs) in.push_back(static_cast<float>(x));
  for (double y : ys) in.push_back(static_cast<float>(y));
  const std::vector<float> silu = Act(MoeActivation::kSilu, in, 5);
  const std::vector<float> gelu = Act(MoeActivation::kGelu, in, 5);
  const std::vector<float> gelu_tanh = Act(MoeActivation::kGeluTanh, in, 5);
  const std::vector<float> relu2 = Act(MoeActivation::kRelu2, in, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(silu[i], SiluD(xs[i]) * ys[i], 1e-6) << i;
    EXPECT_NEAR(gelu[i], GeluErfD(xs[i]) * ys[i], 1e-6) << i;
    EXPECT_NEAR(gelu_tanh[i], GeluTanhD(xs[i]) * ys[i], 1e-6) << i;
    EXPECT_NEAR(relu2[i], (xs[i] > 0 ? xs[i] * xs[i] : 0.0) * ys[i], 1e-6) << i;
  }
  // Worked by hand: silu(1)·2 = 2·σ(1); gelu(1) = Φ(1); gelu_tanh(1).
  EXPECT_NEAR(silu[3], 1.4621172f, 1e-6);
  EXPECT_NEAR(gelu[3], 2 * 0.8413447f, 1e-6);
  EXPECT_NEAR(gelu_tanh[3], 2 * 0.8411920f, 1e-6);
  EXPECT_NEAR(relu2[4], -1.5625f, 1e-6);
}

TEST(MoeActivationTest, NoMulVariants) {
  const std::vector<float> in = {-2, -0.5f, 0, 1, 3};
  const std::vector<float> silu = Act(MoeActivation::kSiluNoMul, in, 5);
  const std::vector<float> gelu = Act(MoeActivation::kGeluNoMul, in, 5);
  const std::vector<float> gelu_tanh = Act(MoeActivation::kGeluTanhNoMul, in, 5);
  const std::vector<float> relu2 = Act(MoeActivation::kRelu2NoMul, in, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(silu[i], SiluD(in[i]), 1e-6);
    EXPECT_NEAR(gelu[i], GeluErfD(in[i]), 1e-6);
    EXPECT_NEAR(gelu_tanh[i], GeluTanhD(in[i]), 1e-6);
  }
  EXPECT_THAT(relu2, ElementsAre(0, 0, 0, 1, 9));
  EXPECT_NEAR(silu[3], 0.7310586f, 1e-6);
}

TEST(MoeActivationTest, SwigluOaiIsInterleavedAndClamped) {
  // Pairs (gate, up): (1, 0), (10, -10), (-2, 0.5), (3, 8).
  const std::vector<float> in = {1, 0, 10, -10, -2, 0.5f, 3, 8};
  const std::vector<float> out = Act(MoeActivation::kSwigluOai, in, 4);
  auto ref = [](double g, double u) {
    g = std::min(g, 7.0);
    u = std::clamp(u, -7.0, 7.0);
    return (u + 1) * g * SigD(1.702 * g);
  };
  EXPECT_NEAR(out[0], ref(1, 0), 1e-6);
  EXPECT_NEAR(out[1], ref(10, -10), 1e-5);
  EXPECT_NEAR(out[2], ref(-2, 0.5), 1e-6);
  EXPECT_NEAR(out[3], ref(3, 8), 1e-5);
  EXPECT_NEAR(out[0], 0.8457954f, 2e-6);             // σ(1.702)
  EXPECT_NEAR(out[1], -6 * 7 * SigD(11.914), 1e-5);  // clamped to g = 7, u = -7
  ActivationParams p;
  p.alpha = 1.0f;
  p.clamp_limit = 2.0f;
  const std::vector<float> custom = Act(MoeActivation::kSwigluOai, in, 4, p);
  EXPECT_NEAR(custom[3], 3 * 2 * SigD(2), 1e-5);  // g = min(3, 2), u = clamp(8) = 2
}

TEST(MoeActivationTest, SwigluOaiUninterleaveNeedsClampLimit) {
  const std::vector<float> in = {1, 10, -2, /*up*/ 0, -10, 0.5f};
  std::vector<float> out(3);
  absl::Status s =
      ApplyActivation(MoeActivation::kSwigluOaiUninterleave, {}, in.data(), 1, 6, out.data(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  ActivationParams p;
  p.clamp_limit = 7.0f;
  p.alpha = 1.5f;
  p.beta = 0.5f;
  out = Act(MoeActivation::kSwigluOaiUninterleave, in, 3, p);
  auto ref = [](double g, double u) {
    g = std::min(g, 7.0);
    u = std::clamp(u, -7.0, 7.0);
    return g * SigD(1.5 * g) * (u + 0.5);
  };
  EXPECT_NEAR(out[0], ref(1, 0), 1e-6);
  EXPECT_NEAR(out[1], ref(10, -10), 1e-5);
  EXPECT_NEAR(out[2], ref(-2, 0.5), 1e-6);
}

TEST(MoeActivationTest, SwigluStepAndClampedSilu) {
  const std::vector<float> in = {10, 1, -3, /*x2*/ 2, -9, 4};
  const std::vector<float> step = Act(MoeActivation::kSwigluStep, in, 3);
  EXPECT_NEAR(step[0], 14.0f, 1e-6);  // min(silu(10), 7) · 2
  EXPECT_NEAR(step[1], SiluD(1) * -7, 1e-6);
  EXPECT_NEAR(step[2], SiluD(-3) * 4, 1e-6);
  ActivationParams p;
  p.clamp_limit = 5.0f;
  const std::vector<float> silu = Act(MoeActivation::kSilu, in, 3, p);
  EXPECT_NEAR(silu[0], SiluD(5) * 2, 1e-5);  // silu(min(10, 5))
  EXPECT_NEAR(silu[1], SiluD(1) * -5, 1e-6);
  EXPECT_NEAR(silu[2], SiluD(-3) * 4, 1e-6);
  EXPECT_NEAR(silu[0], 2 * 4.9665356f, 1e-5);
}

TEST(MoeActivationTest, ShapeErrorsAndNames) {
  std::vector<float> in(4), out(4);
  absl::Status s = ApplyActivation(MoeActivation::kSilu, {}, in.data(), 1, 4, out.data(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("silu expects 2x ratio"));
  s = ApplyActivation(MoeActivation::kRelu2NoMul, {}, in.data(), 1, 4, out.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ApplyActivation(MoeActivation::kRelu2NoMul, {}, in.data(), 1, 4, out.data(), 4).ok());
  EXPECT_TRUE(IsGated(MoeActivation::kRelu2));
  EXPECT_FALSE(IsGated(MoeActivation::kGeluTanhNoMul));
  EXPECT_EQ(ParseMoeActivation("gelu_pytorch_tanh").value(), MoeActivation::kGeluTanh);
  EXPECT_EQ(ParseMoeActivation("swiglustep").value(), MoeActivation::kSwigluStep);
  EXPECT_EQ(ParseMoeActivation("nope").status().message(),
            "Unknown MoE activation: 'nope'. Valid activations: ['silu', 'gelu', 'gelu_tanh', "
            "'relu2', 'swigluoai', 'swigluoai_uninterleave', 'swiglustep', 'silu_no_mul', "
            "'gelu_no_mul', 'gelu_tanh_no_mul', 'relu2_no_mul']");
  for (MoeActivation a :
       {MoeActivation::kSilu, MoeActivation::kSwigluOaiUninterleave, MoeActivation::kRelu2NoMul}) {
    EXPECT_EQ(ParseMoeActivation(MoeActivationName(a)).value(), a);
  }
}

// ----------------------------------------------------------------- experts

// E=2, H=2, I=1, fp32. Expert 0: gate row [1, 0], up row [0, 1], w2 [1, 2]ᵀ.
// Expert 1: gate row [0, 1], up row [1, 1], w2 [-1, 0.5]ᵀ.
struct Tiny {
  std::vector<float> x = {1, 2};
  std::vector<float> w13 = {1, 0, 0, 1, /*e1*/ 0, 1, 1, 1};
  std::vector<float> w2 = {1, 2, /*e1*/ -1, 0.5f};
  std::vector<int32_t> ids = {0, 1};
  std::vector<float> wts = {0.25f, 0.75f};

  MoeProblem Problem() {
    MoeProblem p;
    p.num_tokens = 1;
    p.hidden = 2;
    p.intermediate = 1;
    p.num_experts = 2;
    p.top_k = 2;
    p.act_dtype = kernels::DType::kFloat32;
    p.hidden_states = x.data();
    p.topk_ids = ids.data();
    p.topk_weights = wts.data();
    p.weights.dtype = kernels::DType::kFloat32;
    p.weights.num_local_experts = 2;
    p.weights.w13 = w13.data();
    p.weights.w2 = w2.data();
    return p;
  }
};

std::vector<float> RunF32(const MoeProblem& p) {
  std::vector<float> out(p.num_tokens * p.hidden, -99.0f);
  absl::Status s = MoeReference(p, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(MoeExpertsTest, TinyProblemByHand) {
  Tiny t;
  // y0 = silu(1)·2 · [1, 2];  y1 = silu(2)·3 · [-1, 0.5].
  const double a0 = SiluD(1) * 2, a1 = SiluD(2) * 3;
  const std::vector<float> out = RunF32(t.Problem());
  EXPECT_NEAR(out[0], 0.25 * a0 - 0.75 * a1, 1e-6);
  EXPECT_NEAR(out[1], 0.25 * 2 * a0 + 0.75 * 0.5 * a1, 1e-6);
  EXPECT_NEAR(out[0], -3.5980575f, 1e-5);
  EXPECT_NEAR(out[1], 2.7128520f, 1e-5);

  std::vector<float> per_slot(4);
  ASSERT_TRUE(RunExperts(t.Problem(), t.ids.data(), t.wts.data(), per_slot.data()).ok());
  EXPECT_NEAR(per_slot[0], a0, 1e-6);
  EXPECT_NEAR(per_slot[1], 2 * a0, 1e-6);
  EXPECT_NEAR(per_slot[2], -a1, 1e-6);
  EXPECT_NEAR(per_slot[3], 0.5 * a1, 1e-6);
}

TEST(MoeExpertsTest, BiasesAndBf16Output) {
  Tiny t;
  const std::vector<float> b13 = {0.5f, -1, /*e1*/ 0, 0.25f};
  const std::vector<float> b2 = {1, 0, /*e1*/ 0, -2};
  MoeProblem p = t.Problem();
  p.weights.b13 = b13.data();
  p.weights.b2 = b2.data();
  // e0: gate 1.5, up 1 -> silu(1.5); e1: gate 2, up 3.25 -> silu(2)·3.25.
  const double a0 = SiluD(1.5), a1 = SiluD(2) * 3.25;
  const double y00 = a0 + 1, y01 = 2 * a0, y10 = -a1, y11 = 0.5 * a1 - 2;
  const std::vector<float> out = RunF32(p);
  EXPECT_NEAR(out[0], 0.25 * y00 + 0.75 * y10, 1e-6);
  EXPECT_NEAR(out[1], 0.25 * y01 + 0.75 * y11, 1e-6);

  // bf16 activations and weights: every intermediate is a bf16 value.
  std::vector<uint16_t> xb, w13b, w2b;
  for (float v : t.x) xb.push_back(FloatToBf16(v));
  for (float v : t.w13) w13b.push_back(FloatToBf16(v));
  for (float v : t.w2) w2b.push_back(FloatToBf16(v));
  p.act_dtype = kernels::DType::kBFloat16;
  p.hidden_states = xb.data();
  p.weights.dtype = kernels::DType::kBFloat16;
  p.weights.w13 = w13b.data();
  p.weights.w2 = w2b.data();
  std::vector<uint16_t> ob(2);
  ASSERT_TRUE(MoeReference(p, ob.data()).ok());
  auto bf = [](double v) { return RoundToDType(static_cast<float>(v), kernels::DType::kBFloat16); };
  const float h0 = bf(SiluD(1.5)), h1 = bf(bf(SiluD(2) * 3.25));
  const float o0 = bf(0.25f * bf(h0 + 1) + 0.75f * bf(-h1));
  EXPECT_EQ(Bf16ToFloat(ob[0]), o0);
  EXPECT_NEAR(Bf16ToFloat(ob[1]), 0.25 * y01 + 0.75 * y11, 2e-2);
}

TEST(MoeExpertsTest, Bf16RoundsTheIntermediateAsTorch) {
  // H=1, I=2: gates [1, 2], ups [1, 1], w2 [1, -0.5]. torch_experts rounds
  // act() to bf16 before the second GEMM: bf(silu(1)) - 0.5·bf(silu(2))
  // = 0.73046875 - 0.87890625, where the unrounded value would give -0.1494.
  const std::vector<uint16_t> x = {FloatToBf16(1)};
  const std::vector<uint16_t> w13 = {FloatToBf16(1), FloatToBf16(2), FloatToBf16(1),
                                     FloatToBf16(1)};
  const std::vector<uint16_t> w2 = {FloatToBf16(1), FloatToBf16(-0.5f)};
  const int32_t ids[1] = {0};
  const float wts[1] = {1.0f};
  MoeProblem p;
  p.num_tokens = 1;
  p.hidden = 1;
  p.intermediate = 2;
  p.num_experts = 1;
  p.top_k = 1;
  p.act_dtype = kernels::DType::kBFloat16;
  p.hidden_states = x.data();
  p.topk_ids = ids;
  p.topk_weights = wts;
  p.weights.dtype = kernels::DType::kBFloat16;
  p.weights.num_local_experts = 1;
  p.weights.w13 = w13.data();
  p.weights.w2 = w2.data();
  uint16_t out = 0;
  ASSERT_TRUE(MoeReference(p, &out).ok());
  auto bf = [](double v) { return RoundToDType(static_cast<float>(v), kernels::DType::kBFloat16); };
  EXPECT_EQ(Bf16ToFloat(out), bf(bf(SiluD(1)) - 0.5f * bf(SiluD(2))));
  EXPECT_EQ(Bf16ToFloat(out), -0.1484375f);
}

TEST(MoeExpertsTest, ExpertMapZerosNonLocalExperts) {
  Tiny t;
  MoeProblem p = t.Problem();
  const int32_t map[2] = {-1, 0};  // this rank holds global expert 1 only
  p.expert_map = map;
  p.weights.num_local_experts = 1;
  p.weights.w13 = t.w13.data() + 4;
  p.weights.w2 = t.w2.data() + 2;
  const double a1 = SiluD(2) * 3;
  const std::vector<float> out = RunF32(p);
  EXPECT_NEAR(out[0], 0.75 * -a1, 1e-6);
  EXPECT_NEAR(out[1], 0.75 * 0.5 * a1, 1e-6);
  std::vector<float> per_slot(4, 7.0f);
  ASSERT_TRUE(RunExperts(p, t.ids.data(), t.wts.data(), per_slot.data()).ok());
  EXPECT_EQ(per_slot[0], 0.0f);
  EXPECT_EQ(per_slot[1], 0.0f);

  const int32_t bad_map[2] = {-1, 1};
  p.expert_map = bad_map;
  EXPECT_EQ(FieldOf(MoeReference(p, per_slot.data())).value(), "expert_map");
}

TEST(MoeExpertsTest, ApplyRouterWeightOnInput) {
  Tiny t;
  MoeProblem p = t.Problem();
  p.top_k = 1;
  const int32_t ids[1] = {1};
  const float wts[1] = {0.5f};
  p.topk_ids = ids;
  p.topk_weights = wts;
  p.apply_router_weight_on_input = true;
  // x' = [0.5, 1]: gate 1, up 1.5; the output is not weighted again.
  const double a = SiluD(1) * 1.5;
  std::vector<float> out = RunF32(p);
  EXPECT_NEAR(out[0], -a, 1e-6);
  EXPECT_NEAR(out[1], 0.5 * a, 1e-6);
  p.apply_router_weight_on_input = false;
  out = RunF32(p);
  EXPECT_NEAR(out[0], 0.5 * -SiluD(2) * 3, 1e-6);

  MoeProblem bad = t.Problem();
  bad.apply_router_weight_on_input = true;
  absl::Status s = MoeReference(bad, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "apply_router_weight_on_input is only implemented for topk=1");
  EXPECT_EQ(FieldOf(s).value(), "apply_router_weight_on_input");
}

TEST(MoeExpertsTest, RoutesFromLogits) {
  Tiny t;
  MoeProblem p = t.Problem();
  p.topk_ids = nullptr;
  p.topk_weights = nullptr;
  p.top_k = 1;
  const float logits[2] = {0.0f, 1.0f};
  p.router_logits = logits;
  p.routing.renormalize = false;
  std::vector<float> out(2), w(1);
  std::vector<int32_t> ids(1);
  ASSERT_TRUE(MoeReference(p, out.data(), w.data(), ids.data()).ok());
  EXPECT_EQ(ids[0], 1);
  EXPECT_NEAR(w[0], Sig(1), 1e-6);
  EXPECT_NEAR(out[0], Sig(1) * -SiluD(2) * 3, 1e-6);
}

TEST(MoeExpertsTest, NoMulActivationUsesNarrowW13) {
  // relu2_no_mul: w13 [E, I, H]. E=1, H=2, I=2.
  const std::vector<float> x = {1, -2}, w13 = {1, 1, 2, -1}, w2 = {1, 0, 0.5f, 1};
  const int32_t ids[1] = {0};
  const float wts[1] = {1.0f};
  MoeProblem p;
  p.num_tokens = 1;
  p.hidden = 2;
  p.intermediate = 2;
  p.num_experts = 1;
  p.top_k = 1;
  p.act_dtype = kernels::DType::kFloat32;
  p.hidden_states = x.data();
  p.topk_ids = ids;
  p.topk_weights = wts;
  p.activation = MoeActivation::kRelu2NoMul;
  p.weights.num_local_experts = 1;
  p.weights.w13 = w13.data();
  p.weights.w2 = w2.data();
  // h = [relu(-1)², relu(4)²] = [0, 16]; y = [0, 16].
  EXPECT_THAT(RunF32(p), ElementsAre(0.0f, 16.0f));
}

TEST(MoeExpertsTest, ValidationNamesFields) {
  Tiny t;
  std::vector<float> out(2);
  MoeProblem p = t.Problem();
  p.top_k = 3;
  EXPECT_EQ(FieldOf(MoeReference(p, out.data())).value(), "top_k");
  p = t.Problem();
  p.weights.num_local_experts = 1;
  EXPECT_EQ(FieldOf(MoeReference(p, out.data())).value(), "weights.num_local_experts");
  p = t.Problem();
  p.activation = MoeActivation::kSwigluOaiUninterleave;
  absl::Status s = MoeReference(p, out.data());
  EXPECT_EQ(s.message(), "SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  p = t.Problem();
  p.weights.quant.scheme = MoeQuantScheme::kFp8W8A8;
  EXPECT_EQ(FieldOf(MoeReference(p, out.data())).value(), "weights.dtype");
  p = t.Problem();
  std::vector<int32_t> bad_ids = {0, 2};
  p.topk_ids = bad_ids.data();
  EXPECT_EQ(FieldOf(MoeReference(p, out.data())).value(), "topk_ids");
}

// ----------------------------------------------------------------- quantised

// fp8 reference written independently here: activations quantised per token
// (block_k == 0, per-tensor weight scales [E]) or per 1 x block_k group
// (block weight scales [E, ceil(N/bn), ceil(K/bk)]), per-tile scaled sums as
// native_w8a8_block_matmul, fp32 output.
struct NaiveFp8 {
  int64_t M, H, I;
  int E, k;
  int bn = 0, bk = 0;  // 0: per-token activations, per-tensor weights
  std::function<std::vector<float>(const std::vector<float>&)> act;

  void Quant(const std::vector<float>& row, std::vector<float>& qv, std::vector<float>& sc) const {
    const int64_t K = static_cast<int64_t>(row.size()), g = bk > 0 ? bk : K;
    qv.assign(K, 0);
    sc.clear();
    for (int64_t t = 0; t < K; t += g) {
      float amax = 0;
      for (int64_t i = t; i < std::min(K, t + g); ++i) amax = std::max(amax, std::fabs(row[i]));
      const float s = bk > 0 ? std::max(amax, 1e-10f) / 448.0f
                             : std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
      sc.push_back(s);
      for (int64_t i = t; i < std::min(K, t + g); ++i) {
        qv[i] = Fp8E4m3ToFloat(FloatToFp8E4m3(row[i] / s));
      }
    }
  }
  std::vector<float> Mm(const std::vector<float>& qv, const std::vector<float>& sc,
                        const uint8_t* w, const float* ws, int64_t N, int64_t K) const {
    std::vector<float> c(N, 0.0f);
    if (bk == 0) {  // dequantise both, then a plain GEMM
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t i = 0; i < K; ++i)
          acc += static_cast<double>(qv[i] * sc[0]) * (Fp8E4m3ToFloat(w[n * K + i]) * ws[0]);
        c[n] = static_cast<float>(acc);
      }
      return c;
    }
    const int64_t kb = (K + bk - 1) / bk;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t t = 0; t < kb; ++t) {
        double part = 0;
        for (int64_t i = t * bk; i < std::min(K, (t + 1) * bk); ++i)
          part += static_cast<double>(qv[i]) * Fp8E4m3ToFloat(w[n * K + i]);
        c[n] += static_cast<float>(part) * (sc[t] * ws[(n / bn) * kb + t]);
      }
    }
    return c;
  }
  std::vector<float> Run(const std::vector<float>& x, const std::vector<uint8_t>& q13,
                         const std::vector<float>& s13, int64_t n13, const std::vector<uint8_t>& q2,
                         const std::vector<float>& s2, const std::vector<int32_t>& ids,
                         const std::vector<float>& wts) const {
    auto per_expert = [&](int64_t N, int64_t K) {
      return bk == 0 ? int64_t{1} : ((N + bn - 1) / bn) * ((K + bk - 1) / bk);
    };
    std::vector<float> out(M * H, 0.0f);
    for (int64_t m = 0; m < M; ++m) {
      for (int j = 0; j < k; ++j) {
        const int e = ids[m * k + j];
        std::vector<float> qv, sc;
        Quant(std::vector<float>(x.begin() + m * H, x.begin() + (m + 1) * H), qv, sc);
        const std::vector<float> t1 =
            Mm(qv, sc, q13.data() + e * n13 * H, s13.data() + e * per_expert(n13, H), n13, H);
        Quant(act(t1), qv, sc);
        const std::vector<float> y =
            Mm(qv, sc, q2.data() + e * H * I, s2.data() + e * per_expert(H, I), H, I);
        for (int64_t c = 0; c < H; ++c) out[m * H + c] += wts[m * k + j] * y[c];
      }
    }
    return out;
  }
};

std::vector<float> Relu2Rows(const std::vector<float>& t) {
  std::vector<float> h;
  for (float v : t) h.push_back(v > 0 ? v * v : 0.0f);
  return h;
}

// E=2, H=4, I=2, relu2_no_mul and small integers: t1 in [-3, 3], so the
// intermediate is in {0, 1, 4, 9} and fp8 quantisation with power-of-two
// static scales is lossless: the fp8 result must equal the fp32 one.
struct ExactFp8 {
  std::vector<float> x = {1, -2, 1, 2, /*t1*/ 2, 1, -1, 1};
  // w13 [2, 2, 4] and w2 [2, 4, 2] in {0, ±1}.
  std::vector<float> w13 = {1, 0, 1, 0, 0, -1, 0, 1, /*e1*/ 1, 1, 0, 0, 0, 0, -1, 1};
  std::vector<float> w2 = {1, 0, 0, 1, 1, -1, 0, 1, /*e1*/ 1, 1, -1, 0, 0, 1, 1, 0};
  std::vector<int32_t> ids = {0, 1, 1, 0};
  std::vector<float> wts = {0.5f, 0.25f, 1.0f, 2.0f};

  MoeProblem Problem(const void* w13p, const void* w2p, kernels::DType wd) {
    MoeProblem p;
    p.num_tokens = 2;
    p.hidden = 4;
    p.intermediate = 2;
    p.num_experts = 2;
    p.top_k = 2;
    p.act_dtype = kernels::DType::kFloat32;
    p.hidden_states = x.data();
    p.topk_ids = ids.data();
    p.topk_weights = wts.data();
    p.activation = MoeActivation::kRelu2NoMul;
    p.weights.dtype = wd;
    p.weights.num_local_experts = 2;
    p.weights.w13 = w13p;
    p.weights.w2 = w2p;
    return p;
  }
};

std::vector<uint8_t> ToFp8(const std::vector<float>& v, float scale) {
  std::vector<uint8_t> q;
  for (float f : v) q.push_back(FloatToFp8E4m3(f / scale));
  return q;
}

TEST(MoeQuantTest, Fp8PerTensorRoundTripIsExact) {
  ExactFp8 t;
  const std::vector<float> ref =
      RunF32(t.Problem(t.w13.data(), t.w2.data(), kernels::DType::kFloat32));
  ASSERT_NE(ref, std::vector<float>(8, 0.0f));
  const std::vector<uint8_t> q13 = ToFp8(t.w13, 0.5f), q2 = ToFp8(t.w2, 0.5f);
  for (size_t i = 0; i < t.w13.size(); ++i) EXPECT_EQ(Fp8E4m3ToFloat(q13[i]) * 0.5f, t.w13[i]);
  const float s13[2] = {0.5f, 0.5f}, s2[2] = {0.5f, 0.5f};
  MoeProblem p = t.Problem(q13.data(), q2.data(), kernels::DType::kFp8E4m3);
  p.weights.quant.scheme = MoeQuantScheme::kFp8W8A8;
  p.weights.quant.w13_scale = s13;
  p.weights.quant.w2_scale = s2;
  p.weights.quant.a1_scale = 1.0f / 64;  // x·64 <= 128
  p.weights.quant.a2_scale = 1.0f / 16;  // 9·16 = 144
  EXPECT_EQ(RunF32(p), ref);

  // Per-channel: a power-of-two scale per output row.
  std::vector<float> c13(4), c2(8);
  std::vector<uint8_t> r13(t.w13.size()), r2(t.w2.size());
  for (int row = 0; row < 4; ++row) {
    c13[row] = std::ldexp(1.0f, row % 3 - 1);
    for (int h = 0; h < 4; ++h) r13[row * 4 + h] = FloatToFp8E4m3(t.w13[row * 4 + h] / c13[row]);
  }
  for (int row = 0; row < 8; ++row) {
    c2[row] = std::ldexp(1.0f, -(row % 4));
    for (int i = 0; i < 2; ++i) r2[row * 2 + i] = FloatToFp8E4m3(t.w2[row * 2 + i] / c2[row]);
  }
  MoeProblem pc = p;
  pc.weights.w13 = r13.data();
  pc.weights.w2 = r2.data();
  pc.weights.quant.weight_scale = Fp8WeightScale::kPerChannel;
  pc.weights.quant.w13_scale = c13.data();
  pc.weights.quant.w2_scale = c2.data();
  EXPECT_EQ(RunF32(pc), ref);

  // A static scale that saturates (9 / (1/64) = 576 > 448) changes the result.
  p.weights.quant.a2_scale = 1.0f / 64;
  EXPECT_NE(RunF32(p), ref);
  // So does a weight scale that leaves no exact representation.
  p.weights.quant.a2_scale = 1.0f / 16;
  const float coarse[2] = {3.0f, 3.0f};  // 1/3 is not an fp8 value
  const std::vector<uint8_t> k13 = ToFp8(t.w13, 3.0f);
  p.weights.w13 = k13.data();
  p.weights.quant.w13_scale = coarse;
  EXPECT_NE(RunF32(p), ref);
}

TEST(MoeQuantTest, Fp8DynamicPerTokenMatchesNaive) {
  ExactFp8 t;
  const std::vector<uint8_t> q13 = ToFp8(t.w13, 0.5f), q2 = ToFp8(t.w2, 0.5f);
  const std::vector<float> s13 = {0.5f, 0.5f}, s2 = {0.5f, 0.5f};
  MoeProblem p = t.Problem(q13.data(), q2.data(), kernels::DType::kFp8E4m3);
  p.weights.quant.scheme = MoeQuantScheme::kFp8W8A8;
  p.weights.quant.act_scale = Fp8ActScale::kPerToken;
  p.weights.quant.w13_scale = s13.data();
  p.weights.quant.w2_scale = s2.data();
  NaiveFp8 n{2, 4, 2, 2, 2, 0, 0, Relu2Rows};
  const std::vector<float> want = n.Run(t.x, q13, s13, 2, q2, s2, t.ids, t.wts);
  const std::vector<float> got = RunF32(p);
  const std::vector<float> exact =
      RunF32(t.Problem(t.w13.data(), t.w2.data(), kernels::DType::kFloat32));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-6) << i;
  }
  EXPECT_NE(got, exact);  // 4 · 448/9 is not an fp8 value: dynamic scales do round
}

TEST(MoeQuantTest, Fp8DynamicPerTensorUsesOneScaleForAllRows) {
  // Dynamic per-tensor scales are max|x|/448 over all tokens for the input and
  // over every routed row of the intermediate: the same as static scales set
  // to those values.
  ExactFp8 t;
  float amax1 = 0, amax2 = 0;
  for (float v : t.x) amax1 = std::max(amax1, std::fabs(v));
  for (int slot = 0; slot < 4; ++slot) {
    const int64_t m = slot / 2, e = t.ids[slot];
    for (int i = 0; i < 2; ++i) {
      float acc = 0;
      for (int h = 0; h < 4; ++h) acc += t.x[m * 4 + h] * t.w13[(e * 2 + i) * 4 + h];
      amax2 = std::max(amax2, acc > 0 ? acc * acc : 0.0f);
    }
  }
  ASSERT_GT(amax2, 1.0f);
  const std::vector<uint8_t> q13 = ToFp8(t.w13, 0.5f), q2 = ToFp8(t.w2, 0.5f);
  const float s13[2] = {0.5f, 0.5f}, s2[2] = {0.5f, 0.5f};
  MoeProblem p = t.Problem(q13.data(), q2.data(), kernels::DType::kFp8E4m3);
  p.weights.quant.scheme = MoeQuantScheme::kFp8W8A8;
  p.weights.quant.w13_scale = s13;
  p.weights.quant.w2_scale = s2;
  const std::vector<float> dynamic = RunF32(p);
  p.weights.quant.a1_scale = amax1 / 448.0f;
  p.weights.quant.a2_scale = amax2 / 448.0f;
  EXPECT_EQ(RunF32(p), dynamic);
  p.weights.quant.a2_scale = amax2 / 300.0f;
  EXPECT_NE(RunF32(p), dynamic);
}

TEST(MoeQuantTest, Fp8BlockScalesAreAppliedPerTile) {
  ExactFp8 t;
  // 2x2 blocks with a different power-of-two scale per block.
  const int bn = 2, bk = 2;
  auto quant_blocks = [&](const std::vector<float>& w, int E, int N, int K,
                          std::vector<float>& scales) {
    std::vector<uint8_t> q(w.size());
    const int nb = N / bn, kb = K / bk;
    scales.assign(E * nb * kb, 0);
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < nb; ++i)
        for (int j = 0; j < kb; ++j) {
          const float s = std::ldexp(1.0f, (e + i + 2 * j) % 3 - 2);  // 1/4, 1/2, 1
          scales[(e * nb + i) * kb + j] = s;
          for (int n = i * bn; n < (i + 1) * bn; ++n)
            for (int k = j * bk; k < (j + 1) * bk; ++k) {
              const size_t idx = (static_cast<size_t>(e) * N + n) * K + k;
              q[idx] = FloatToFp8E4m3(w[idx] / s);
              EXPECT_EQ(Fp8E4m3ToFloat(q[idx]) * s, w[idx]);
            }
        }
    return q;
  };
  std::vector<float> s13, s2;
  const std::vector<uint8_t> q13 = quant_blocks(t.w13, 2, 2, 4, s13);
  const std::vector<uint8_t> q2 = quant_blocks(t.w2, 2, 4, 2, s2);
  MoeProblem p = t.Problem(q13.data(), q2.data(), kernels::DType::kFp8E4m3);
  p.weights.quant.scheme = MoeQuantScheme::kFp8W8A8;
  p.weights.quant.weight_scale = Fp8WeightScale::kBlock;
  p.weights.quant.block_n = bn;
  p.weights.quant.block_k = bk;
  p.weights.quant.w13_scale = s13.data();
  p.weights.quant.w2_scale = s2.data();
  NaiveFp8 n{2, 4, 2, 2, 2, bn, bk, Relu2Rows};
  const std::vector<float> want = n.Run(t.x, q13, s13, 2, q2, s2, t.ids, t.wts);
  const std::vector<float> got = RunF32(p);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-6) << i;
  }
  // Swapping two block scales must change the result.
  std::swap(s13[0], s13[1]);
  EXPECT_NE(RunF32(p), got);

  p.weights.quant.act_scale = Fp8ActScale::kPerToken;
  absl::Status s = MoeReference(p, std::vector<float>(8).data());
  EXPECT_EQ(s.message(), "illegal quantization");
  EXPECT_EQ(FieldOf(s).value(), "weights.quant.act_scale");
}

TEST(MoeQuantTest, Int4AndInt8WeightOnlyByHand) {
  // E=1, H=2, I=2, relu2_no_mul for exact values, group size 2.
  // int4 without zero points: w = (nibble - 8) · scale.
  const std::vector<float> x = {1, 2};
  // w13 [1, 2, 2] nibbles: row0 {9, 7} -> {1, -1}·s; row1 {12, 8} -> {4, 0}·s.
  const std::vector<uint8_t> q13 = PackInt4({9, 7, 12, 8});
  // w2 [1, 2, 2] nibbles: row0 {10, 8} -> {2, 0}; row1 {8, 5} -> {0, -3}.
  const std::vector<uint8_t> q2 = PackInt4({10, 8, 8, 5});
  const float s13[2] = {0.5f, 0.25f}, s2[2] = {1.0f, 2.0f};
  const int32_t ids[1] = {0};
  const float wts[1] = {1.0f};
  MoeProblem p;
  p.num_tokens = 1;
  p.hidden = 2;
  p.intermediate = 2;
  p.num_experts = 1;
  p.top_k = 1;
  p.act_dtype = kernels::DType::kFloat32;
  p.hidden_states = x.data();
  p.topk_ids = ids;
  p.topk_weights = wts;
  p.activation = MoeActivation::kRelu2NoMul;
  p.weights.dtype = kernels::DType::kInt4Packed;
  p.weights.num_local_experts = 1;
  p.weights.w13 = q13.data();
  p.weights.w2 = q2.data();
  p.weights.quant.scheme = MoeQuantScheme::kInt4WeightOnly;
  p.weights.quant.group_size = 2;
  p.weights.quant.w13_scale = s13;
  p.weights.quant.w2_scale = s2;
  // t1 = [(1·1 - 1·2)·0.5, (4·1 + 0)·0.25] = [-0.5, 1] -> relu² = [0, 1]
  // y = [2·0 + 0·1, (0·0 - 3·1)·2] = [0, -6].
  EXPECT_THAT(RunF32(p), ElementsAre(0.0f, -6.0f));

  // With zero points (nibble - zp): zp 9 for w13 row 0 -> {0, -2}·0.5.
  const uint8_t z13[2] = {9, 8}, z2[2] = {8, 8};
  p.weights.quant.w13_zero = z13;
  p.weights.quant.w2_zero = z2;
  // x = [2, -1]: t1 = [(0·2 + -2·-1)·0.5, 4·2·0.25] = [1, 2] -> h = [1, 4]
  // y = [2·1 + 0·4, (0·1 - 3·4)·2] = [2, -24].
  const std::vector<float> x2 = {2, -1};
  p.hidden_states = x2.data();
  EXPECT_THAT(RunF32(p), ElementsAre(2.0f, -24.0f));
  const uint8_t z2b[2] = {6, 8};  // w2 row 0 becomes {4, 2}: y0 = 4·1 + 2·4
  p.weights.quant.w2_zero = z2b;
  EXPECT_THAT(RunF32(p), ElementsAre(12.0f, -24.0f));
  // Without zero points (implied 8): t1[0] = (1·2 + -1·-1)·0.5 = 1.5 -> 2.25.
  p.weights.quant.w13_zero = nullptr;
  p.weights.quant.w2_zero = nullptr;
  EXPECT_THAT(RunF32(p), ElementsAre(4.5f, -24.0f));

  // int8, signed, no zero points.
  const int8_t i13[4] = {1, -1, 4, 0}, i2[4] = {2, 0, 0, -3};
  p.hidden_states = x.data();
  p.weights.dtype = kernels::DType::kInt8;
  p.weights.w13 = i13;
  p.weights.w2 = i2;
  p.weights.quant.scheme = MoeQuantScheme::kInt8WeightOnly;
  p.weights.quant.w13_zero = nullptr;
  p.weights.quant.w2_zero = nullptr;
  EXPECT_THAT(RunF32(p), ElementsAre(0.0f, -6.0f));

  p.weights.quant.group_size = 3;
  EXPECT_EQ(FieldOf(MoeReference(p, std::vector<float>(2).data())).value(),
            "weights.quant.group_size");
}

// ----------------------------------------------------------------- property

// Independent naive implementation of torch_moe for fp32: double accumulation,
// plain loops, no blocking.
std::vector<float> NaiveMoe(int64_t M, int64_t H, int64_t I, int E, int k, const float* x,
                            const float* w13, const float* w2, const float* b13, const float* b2,
                            const std::vector<int32_t>& ids, const std::vector<float>& wts) {
  std::vector<float> out(M * H, 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> acc(H, 0.0);
    for (int j = 0; j < k; ++j) {
      const int e = ids[m * k + j];
      std::vector<double> h(I);
      for (int64_t i = 0; i < I; ++i) {
        double gate = b13 ? b13[e * 2 * I + i] : 0, up = b13 ? b13[e * 2 * I + I + i] : 0;
        for (int64_t c = 0; c < H; ++c) {
          gate += static_cast<double>(x[m * H + c]) * w13[(e * 2 * I + i) * H + c];
          up += static_cast<double>(x[m * H + c]) * w13[(e * 2 * I + I + i) * H + c];
        }
        h[i] = gate / (1 + std::exp(-gate)) * up;
      }
      for (int64_t c = 0; c < H; ++c) {
        double y = b2 ? b2[e * H + c] : 0;
        for (int64_t i = 0; i < I; ++i) y += h[i] * w2[(e * H + c) * I + i];
        acc[c] += wts[m * k + j] * y;
      }
    }
    for (int64_t c = 0; c < H; ++c) out[m * H + c] = static_cast<float>(acc[c]);
  }
  return out;
}

TEST(MoePropertyTest, MatchesNaiveLoopsForFp32) {
  const int64_t M = 37, H = 72, I = 40;
  const int E = 8, k = 3;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto randv = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float& f : v) f = nd(rng) * scale;
    return v;
  };
  const std::vector<float> x = randv(M * H, 1.0f), logits = randv(M * E, 2.0f);
  const std::vector<float> w13 = randv(E * 2 * I * H, 0.15f), w2 = randv(E * H * I, 0.15f);
  const std::vector<float> b13 = randv(E * 2 * I, 0.1f), b2 = randv(E * H, 0.1f);
  MoeProblem p;
  p.num_tokens = M;
  p.hidden = H;
  p.intermediate = I;
  p.num_experts = E;
  p.top_k = k;
  p.act_dtype = kernels::DType::kFloat32;
  p.hidden_states = x.data();
  p.router_logits = logits.data();
  p.routing.renormalize = true;
  p.weights.num_local_experts = E;
  p.weights.w13 = w13.data();
  p.weights.w2 = w2.data();
  p.weights.b13 = b13.data();
  p.weights.b2 = b2.data();
  std::vector<float> out(M * H), wts(M * k);
  std::vector<int32_t> ids(M * k);
  ASSERT_TRUE(MoeReference(p, out.data(), wts.data(), ids.data()).ok());

  // Routing, checked independently: softmax, top-k, renormalise.
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> row(logits.begin() + m * E, logits.begin() + (m + 1) * E);
    const std::vector<float> prob = SoftmaxRef(row);
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += prob[order[j]];
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(ids[m * k + j], order[j]);
      ASSERT_NEAR(wts[m * k + j], prob[order[j]] / sum, 1e-6);
    }
  }
  const std::vector<float> want =
      NaiveMoe(M, H, I, E, k, x.data(), w13.data(), w2.data(), b13.data(), b2.data(), ids, wts);
  double max_abs = 0;
  for (float v : want) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  ASSERT_GT(max_abs, 0.1);
  for (int64_t i = 0; i < M * H; ++i) {
    ASSERT_NEAR(out[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-6 * max_abs) << i;
  }

  // Thread count never changes a bit.
  for (int threads : {1, 3, 8}) {
    p.num_threads = threads;
    std::vector<float> again(M * H);
    ASSERT_TRUE(MoeReference(p, again.data()).ok());
    ASSERT_EQ(std::memcmp(again.data(), out.data(), out.size() * sizeof(float)), 0) << threads;
  }

  // bf16 activations and weights: per-slot expert outputs are bf16 values,
  // the result stays within bf16 error of the exact one.
  {
    std::vector<uint16_t> xb, w13b, w2b, b13b, b2b, ob(M * H);
    for (float v : x) xb.push_back(FloatToBf16(v));
    for (float v : w13) w13b.push_back(FloatToBf16(v));
    for (float v : w2) w2b.push_back(FloatToBf16(v));
    MoeProblem pb = p;
    pb.num_threads = 0;
    pb.act_dtype = kernels::DType::kBFloat16;
    pb.hidden_states = xb.data();
    pb.weights.dtype = kernels::DType::kBFloat16;
    pb.weights.w13 = w13b.data();
    pb.weights.w2 = w2b.data();
    ASSERT_TRUE(MoeReference(pb, ob.data()).ok());
    std::vector<float> per_slot(M * k * H);
    ASSERT_TRUE(RunExperts(pb, ids.data(), wts.data(), per_slot.data()).ok());
    for (float v : per_slot) ASSERT_EQ(v, RoundToDType(v, kernels::DType::kBFloat16));
    for (int64_t i = 0; i < M * H; ++i) {
      ASSERT_NEAR(Bf16ToFloat(ob[i]), want[i], 0.02 * std::fabs(want[i]) + 0.01 * max_abs) << i;
    }
  }

  // Expert parallel: two ranks, each with half the experts, sum to the whole.
  std::vector<float> sum(M * H, 0.0f);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<int32_t> map(E, -1);
    for (int e = 0; e < E / 2; ++e) map[rank * E / 2 + e] = e;
    MoeProblem r = p;
    r.expert_map = map.data();
    r.weights.num_local_experts = E / 2;
    r.weights.w13 = w13.data() + rank * (E / 2) * 2 * I * H;
    r.weights.w2 = w2.data() + rank * (E / 2) * H * I;
    r.weights.b13 = b13.data() + rank * (E / 2) * 2 * I;
    r.weights.b2 = b2.data() + rank * (E / 2) * H;
    std::vector<float> part(M * H);
    ASSERT_TRUE(MoeReference(r, part.data()).ok());
    for (int64_t i = 0; i < M * H; ++i) sum[i] += part[i];
  }
  for (int64_t i = 0; i < M * H; ++i) {
    ASSERT_NEAR(sum[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-6 * max_abs) << i;
  }
}

// fp8 with per-token-group activations and 128x128 block weight scales on
// random data against a straightforward native_w8a8_block_matmul written here.
TEST(MoePropertyTest, Fp8BlockMatchesNaiveBlockMatmul) {
  const int64_t M = 9, H = 256, I = 192;
  const int E = 4, k = 2, B = 128;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(M * H);
  for (float& f : x) f = nd(rng);
  auto make_w = [&](int64_t N, int64_t K, std::vector<uint8_t>& q, std::vector<float>& s) {
    const int64_t nb = (N + B - 1) / B, kb = (K + B - 1) / B;
    q.resize(E * N * K);
    s.resize(E * nb * kb);
    for (float& v : s) v = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng) / 448.0f;
    for (auto& b : q) b = FloatToFp8E4m3(nd(rng) * 60.0f);
  };
  std::vector<uint8_t> q13, q2;
  std::vector<float> s13, s2;
  make_w(2 * I, H, q13, s13);
  make_w(H, I, q2, s2);
  std::vector<int32_t> ids(M * k);
  std::vector<float> wts(M * k);
  for (int64_t m = 0; m < M; ++m) {
    ids[m * k] = static_cast<int32_t>(m % E);
    ids[m * k + 1] = static_cast<int32_t>((m + 1 + m / E) % E);
    wts[m * k] = 0.6f;
    wts[m * k + 1] = 0.4f;
  }
  MoeProblem p;
  p.num_tokens = M;
  p.hidden = H;
  p.intermediate = I;
  p.num_experts = E;
  p.top_k = k;
  p.act_dtype = kernels::DType::kFloat32;
  p.hidden_states = x.data();
  p.topk_ids = ids.data();
  p.topk_weights = wts.data();
  p.weights.dtype = kernels::DType::kFp8E4m3;
  p.weights.num_local_experts = E;
  p.weights.w13 = q13.data();
  p.weights.w2 = q2.data();
  p.weights.quant.scheme = MoeQuantScheme::kFp8W8A8;
  p.weights.quant.weight_scale = Fp8WeightScale::kBlock;
  p.weights.quant.w13_scale = s13.data();
  p.weights.quant.w2_scale = s2.data();
  std::vector<float> out(M * H);
  ASSERT_TRUE(MoeReference(p, out.data()).ok());

  NaiveFp8 n{M, H, I, E, k, B, B, [](const std::vector<float>& t1) {
               std::vector<float> h(I);
               for (int64_t i = 0; i < I; ++i) h[i] = static_cast<float>(SiluD(t1[i]) * t1[I + i]);
               return h;
             }};
  const std::vector<float> want = n.Run(x, q13, s13, 2 * I, q2, s2, ids, wts);
  double max_abs = 0;
  for (float v : want) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  ASSERT_GT(max_abs, 0.1);
  int mismatches = 0;
  for (int64_t i = 0; i < M * H; ++i) {
    if (std::fabs(out[i] - want[i]) > 1e-4 * std::fabs(want[i]) + 1e-5 * max_abs) ++mismatches;
  }
  // An fp8 rounding decision of the intermediate may flip on summation order;
  // allow a handful of such elements, never a systematic difference.
  EXPECT_LE(mismatches, static_cast<int>(M * H / 100)) << "of " << M * H;
  for (int64_t i = 0; i < M * H; ++i) ASSERT_NEAR(out[i], want[i], 0.05 * max_abs) << i;
}

}  // namespace
}  // namespace kplan::moe
