// The router's 64-bit candidate keys (kernels/cuda/moe/moe_routing_key.h)
// against the CPU reference's top-k order (moe::TopKIndices): on random rows
// full of the values that test an order (NaNs of both signs, -0 and +0,
// infinities, subnormals, exact ties), the k largest keys are the reference's
// k picks in the reference's order; every pair of special values compares
// as the reference compares them; no candidate's key is 0 ("none"). Plain
// C++, runs without a GPU. The warp top-k's lane steps are checked too, with
// its two redux.sync maxima emulated over 32 lanes.
#include "kernels/cuda/moe/moe_routing_key.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/moe/moe_reference.h"

namespace kplan::kernels::cuda::detail::routing {
namespace {

const std::vector<float>& Specials() {
  static const std::vector<float> v = [] {
    const float inf = std::numeric_limits<float>::infinity();
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    return std::vector<float>{qnan,
                              -qnan,
                              inf,
                              -inf,
                              0.0f,
                              -0.0f,
                              std::numeric_limits<float>::denorm_min(),
                              -std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::min(),
                              std::numeric_limits<float>::max(),
                              -std::numeric_limits<float>::max(),
                              1.0f,
                              -1.0f,
                              0.5f,
                              std::nextafter(1.0f, 2.0f)};
  }();
  return v;
}

// The picks the keys give: indices by descending key.
std::vector<int32_t> KeyTopK(const std::vector<float>& v, int k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(),
            [&](int32_t a, int32_t b) { return CandidateKey(v[a], a) > CandidateKey(v[b], b); });
  idx.resize(k);
  return idx;
}

TEST(MoeRoutingKey, PairsOfSpecialValuesCompareAsTheReference) {
  for (float a : Specials()) {
    for (float b : Specials()) {
      const std::vector<float> row = {a, b};
      int32_t ref = -1;
      moe::TopKIndices(row.data(), 2, 1, &ref);
      EXPECT_EQ(KeyTopK(row, 1)[0], ref) << a << " at 0 against " << b << " at 1";
    }
  }
}

TEST(MoeRoutingKey, TopKOfRandomRowsIsTheReferences) {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  int rows = 0;
  for (int n : {1, 2, 7, 32, 128, 255, 512}) {
    for (int rep = 0; rep < 40; ++rep) {
      std::vector<float> row(n);
      for (float& x : row) {
        const int p = pick(rng);
        if (p < 3) {  // specials
          x = Specials()[std::uniform_int_distribution<size_t>(0, Specials().size() - 1)(rng)];
        } else if (p < 5) {  // exact ties
          x = static_cast<float>(pick(rng) % 3) - 1.0f;
        } else {
          x = u(rng);
        }
      }
      for (int k : {1, 2, 8, 32}) {
        if (k > n) continue;
        std::vector<int32_t> ref(k);
        moe::TopKIndices(row.data(), n, k, ref.data());
        EXPECT_EQ(KeyTopK(row, k), ref) << "n=" << n << " k=" << k << " rep=" << rep;
        ++rows;
      }
    }
  }
  EXPECT_GT(rows, 500);
}

TEST(MoeRoutingKey, NoCandidateKeyIsNone) {
  for (float v : Specials()) {
    for (int index : {0, 1, 31, 511}) {
      EXPECT_GT(CandidateKey(v, index), uint64_t{0});
      EXPECT_EQ(KeyIndex(static_cast<uint32_t>(CandidateKey(v, index))), index);
    }
  }
}

// WarpTopK's lane steps (LaneCandidates, HeadPayload, DropCandidate)
// with its two warp maxima emulated over 32 lanes: the picks are the
// reference's, in its order, each with its expert's payload.
// kN: candidates per lane (E <= 32 * kN), each instantiation the routing
// kernel has (moe_routing.cuh, PerLaneFor).
template <int kN>
void ExpectEmulatedWarpPicksAreTheReferences(std::initializer_list<int> sizes) {
  std::mt19937 rng(777 + kN);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int E : sizes) {
    ASSERT_LE(E, 32 * kN);
    for (int k : {1, 2, 8, 32}) {
      if (k > E) continue;
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> row(E);
        for (float& x : row) {
          const int p = pick(rng);
          x = p == 0  ? Specials()[pick(rng) % Specials().size()]
              : p < 3 ? static_cast<float>(pick(rng) % 3)
                      : u(rng);
        }
        float key[32][kN], pay[32][kN];
        uint64_t ck[32][kN], head[32];
        for (int l = 0; l < 32; ++l) {
          for (int s = 0; s < kN; ++s) {
            const int e = l + 32 * s;
            key[l][s] = e < E ? row[e] : 0.0f;
            pay[l][s] = static_cast<float>(e) + 0.5f;  // the payload names its expert
          }
          head[l] = LaneCandidates(key[l], E, l, ck[l]);
        }
        std::vector<int32_t> got;
        for (int j = 0; j < k; ++j) {
          uint32_t top = 0, lo = 0;
          for (int l = 0; l < 32; ++l) top = std::max(top, static_cast<uint32_t>(head[l] >> 32));
          for (int l = 0; l < 32; ++l) {
            if (static_cast<uint32_t>(head[l] >> 32) == top) {
              lo = std::max(lo, static_cast<uint32_t>(head[l]));
            }
          }
          const int id = KeyIndex(lo), w = id & 31;
          ASSERT_EQ(HeadPayload(ck[w], head[w], pay[w]), static_cast<float>(id) + 0.5f);
          got.push_back(id);
          head[w] = DropCandidate(ck[w], w, id);
        }
        std::vector<int32_t> ref(k);
        moe::TopKIndices(row.data(), E, k, ref.data());
        EXPECT_EQ(got, ref) << "kN=" << kN << " E=" << E << " k=" << k << " rep=" << rep;
      }
    }
  }
}

TEST(MoeRoutingKey, PerLaneForIsTheSmallestInstantiationThatHoldsE) {
  for (int E = 1; E <= 512; ++E) {
    const int kn = PerLaneFor(E);
    EXPECT_TRUE(kn == 1 || kn == 4 || kn == 8 || kn == 16) << E;
    EXPECT_LE(E, 32 * kn) << E;
    for (int smaller : {1, 4, 8}) {
      if (smaller < kn) {
        EXPECT_GT(E, 32 * smaller) << E;
      }
    }
  }
}

TEST(MoeRoutingKey, EmulatedWarpPicksAreTheReferences) {
  ExpectEmulatedWarpPicksAreTheReferences<1>({1, 8, 31, 32});
  ExpectEmulatedWarpPicksAreTheReferences<4>({33, 72, 127, 128});
  ExpectEmulatedWarpPicksAreTheReferences<8>({129, 160, 256});
  ExpectEmulatedWarpPicksAreTheReferences<16>({257, 384, 512});
}

}  // namespace
}  // namespace kplan::kernels::cuda::detail::routing
