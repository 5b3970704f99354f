// Expert-parallel MoE over thread ranks against the single-rank CPU
// reference (moe::MoeReference over all experts), for both dispatch
// strategies. kplan_all2allv must match bit for bit (each expert row is
// computed as the reference computes it and combined by the reference's own
// CombineTopK). allgather_reducescatter sums per-rank fp32 partials, so it
// matches bit for bit when k <= 2 (commutative two-term sums, exact zeros)
// and within fp32 re-association error otherwise. Failures must reach every
// rank without hanging.
#include "server/moe/ep/ep_dispatch.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/comm/in_process_communicator.h"
#include "base/status.h"

namespace kplan::moe::ep {
namespace {

using ::testing::HasSubstr;
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

struct Case {
  const char* name;
  int ranks = 2;
  int num_experts = 8;
  int64_t num_tokens = 13;
  int top_k = 2;
  kernels::DType dtype = kernels::DType::kFloat32;
  bool apply_on_input = false;
  bool one_expert = false;  // every slot 0 goes to the same expert
  bool route_from_logits = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Random layer and batch, all experts and all tokens, as the reference sees it.
struct World {
  Case c;
  int64_t H = 24, I = 12;
  std::vector<char> hidden, w13, w2;
  std::vector<float> b13, b2, logits, topk_weights;
  std::vector<int32_t> topk_ids;

  explicit World(const Case& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int E = c.num_experts, k = c.top_k;
    const int64_t M = c.num_tokens, es = kernels::DTypeSize(c.dtype);
    auto fill = [&](std::vector<char>& v, int64_t n, float scale) {
      v.resize(n * es);
      for (int64_t i = 0; i < n; ++i) StoreFloat(v.data(), c.dtype, i, u(rng) * scale);
    };
    fill(hidden, M * H, 1.0f);
    fill(w13, E * 2 * I * H, 1.0f / std::sqrt(float(H)));
    fill(w2, E * H * I, 1.0f / std::sqrt(float(I)));
    b13.resize(E * 2 * I);
    b2.resize(E * H);
    for (float& b : b13) b = 0.1f * u(rng);
    for (float& b : b2) b = 0.1f * u(rng);
    logits.resize(M * E);
    for (float& l : logits) l = 2.0f * u(rng);
    topk_ids.resize(M * k);
    topk_weights.resize(M * k);
    for (int64_t m = 0; m < M; ++m) {
      std::vector<int32_t> perm(E);
      for (int e = 0; e < E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      if (c.one_expert) {
        std::swap(perm[0], *std::find(perm.begin(), perm.end(), E / 2));
      }
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) {
        topk_ids[m * k + j] = perm[j];
        topk_weights[m * k + j] = 0.1f + std::abs(u(rng));
        sum += topk_weights[m * k + j];
      }
      for (int j = 0; j < k; ++j) topk_weights[m * k + j] /= sum;
    }
  }

  MoeWeights Weights(int first, int count) const {
    const int64_t es = kernels::DTypeSize(c.dtype);
    MoeWeights w;
    w.dtype = c.dtype;
    w.num_local_experts = count;
    w.w13 = w13.data() + first * 2 * I * H * es;
    w.w2 = w2.data() + first * H * I * es;
    w.b13 = b13.data() + first * 2 * I;
    w.b2 = b2.data() + first * H;
    return w;
  }

  RoutingSpec Routing() const {
    RoutingSpec spec;
    spec.method = RoutingMethod::kTopK;
    spec.scoring = ScoringFunc::kSoftmax;
    spec.renormalize = true;
    return spec;
  }

  std::vector<char> Reference() const {
    MoeProblem p;
    p.num_tokens = c.num_tokens;
    p.hidden = H;
    p.intermediate = I;
    p.num_experts = c.num_experts;
    p.top_k = c.top_k;
    p.act_dtype = c.dtype;
    p.hidden_states = hidden.data();
    if (c.route_from_logits) {
      p.router_logits = logits.data();
      p.routing = Routing();
    } else {
      p.topk_ids = topk_ids.data();
      p.topk_weights = topk_weights.data();
    }
    p.weights = Weights(0, c.num_experts);
    p.apply_router_weight_on_input = c.apply_on_input;
    std::vector<char> out(c.num_tokens * H * kernels::DTypeSize(c.dtype));
    absl::Status st = MoeReference(p, out.data());
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  EpLayer Layer(const ExpertPlacement& pl, int rank) const {
    EpLayer L;
    L.hidden = H;
    L.intermediate = I;
    L.num_experts = c.num_experts;
    L.top_k = c.top_k;
    L.act_dtype = c.dtype;
    L.apply_router_weight_on_input = c.apply_on_input;
    L.placement = pl;
    L.local_weights = Weights(pl.FirstExpert(rank), pl.NumLocalExperts(rank));
    return L;
  }

  MoeInputsForThisRank Inputs(const TokenRange& tr, std::vector<char>& out) const {
    const int k = c.top_k;
    const int64_t es = kernels::DTypeSize(c.dtype);
    MoeInputsForThisRank in;
    in.num_tokens = tr.count;
    in.hidden_states = hidden.data() + tr.begin * H * es;
    if (c.route_from_logits) {
      in.router_logits = logits.data() + tr.begin * c.num_experts;
      in.routing = Routing();
    } else {
      in.topk_ids = topk_ids.data() + tr.begin * k;
      in.topk_weights = topk_weights.data() + tr.begin * k;
    }
    in.output = out.data() + tr.begin * H * es;
    return in;
  }
};

std::vector<std::unique_ptr<comm::InProcessCommunicator>> Group(int n, int timeout_ms) {
  comm::InProcessOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  auto g = comm::InProcessGroup::Create(n, o);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::move(g).value();
}

// Runs the EP step on one thread per rank. `tweak` may edit a rank's inputs.
std::vector<absl::Status> RunEp(
    const World& w, EpStrategy strategy, std::vector<char>& out,
    std::vector<std::unique_ptr<comm::InProcessCommunicator>>& comms,
    const std::function<void(int, MoeInputsForThisRank&)>& tweak = nullptr) {
  const int n = static_cast<int>(comms.size());
  auto pl = ExpertPlacement::Linear(w.c.num_experts, n);
  EXPECT_TRUE(pl.ok());
  const auto split = SplitTokens(w.c.num_tokens, n);
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const EpLayer layer = w.Layer(*pl, r);
      MoeInputsForThisRank in = w.Inputs(split[r], out);
      if (tweak) tweak(r, in);
      st[r] = RunMoeExpertParallel(layer, in, *comms[r], strategy);
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

void ExpectMatches(const World& w, const std::vector<char>& got, const std::vector<char>& want,
                   bool exact) {
  ASSERT_EQ(got.size(), want.size());
  if (exact && !got.empty()) {  // memcmp of empty vectors' null data() is UB
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0) << "not bit-identical";
  }
  const int64_t n = static_cast<int64_t>(got.size()) / kernels::DTypeSize(w.c.dtype);
  // fp32: re-associated fp32 sums; bf16: at most one ulp (2^-8 relative) from
  // a rounding boundary crossed by that difference.
  const float rel = w.c.dtype == kernels::DType::kFloat32 ? 1e-5f : 1.0f / 128;
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = LoadFloat(got.data(), w.c.dtype, i), b = LoadFloat(want.data(), w.c.dtype, i);
    if (!(std::abs(a - b) <= rel * std::max(1e-3f, std::abs(b)))) {
      if (++bad <= 5) ADD_FAILURE() << "element " << i << ": " << a << " vs reference " << b;
    }
  }
  EXPECT_EQ(bad, 0);
}

class EpMatchesReference
    : public ::testing::TestWithParam<std::tuple<Case, EpStrategy, kernels::DType>> {};

TEST_P(EpMatchesReference, SameOutputAsSingleRank) {
  Case c = std::get<0>(GetParam());
  c.dtype = std::get<2>(GetParam());
  const EpStrategy strategy = std::get<1>(GetParam());
  const World w(c, 1234 + c.ranks * 7 + c.top_k);
  const std::vector<char> want = w.Reference();
  std::vector<char> got(want.size(), 0x5a);
  auto comms = Group(c.ranks, 10000);
  auto st = RunEp(w, strategy, got, comms);
  for (int r = 0; r < c.ranks; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  const bool exact = strategy == EpStrategy::kAll2AllV || c.top_k <= 2;
  ExpectMatches(w, got, want, exact);
  // The communicator is still usable after a good step.
  EXPECT_TRUE(comms[0]->group().failure().ok());
}

const Case kCases[] = {
    {.name = "k2_2ranks", .ranks = 2},
    {.name = "k2_3ranks", .ranks = 3},
    {.name = "k2_4ranks", .ranks = 4},
    {.name = "k4_2ranks", .ranks = 2, .top_k = 4},
    {.name = "k3_3ranks", .ranks = 3, .top_k = 3},
    {.name = "k4_4ranks", .ranks = 4, .num_tokens = 17, .top_k = 4},
    {.name = "E10_3ranks_uneven", .ranks = 3, .num_experts = 10, .num_tokens = 11, .top_k = 3},
    {.name = "M1_4ranks", .ranks = 4, .num_tokens = 1, .top_k = 2},
    {.name = "M0_3ranks", .ranks = 3, .num_tokens = 0},
    {.name = "E3_4ranks_rank_without_experts", .ranks = 4, .num_experts = 3, .top_k = 2},
    {.name = "one_expert_k1", .ranks = 3, .top_k = 1, .one_expert = true},
    {.name = "one_expert_k3", .ranks = 4, .top_k = 3, .one_expert = true},
    {.name = "weight_on_input_k1", .ranks = 3, .top_k = 1, .apply_on_input = true},
    {.name = "routed_from_logits", .ranks = 3, .top_k = 2, .route_from_logits = true},
};

INSTANTIATE_TEST_SUITE_P(Cases, EpMatchesReference,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(EpStrategy::kAllGatherReduceScatter,
                                                              EpStrategy::kAll2AllV),
                                            ::testing::Values(kernels::DType::kFloat32,
                                                              kernels::DType::kBFloat16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::string(EpStrategyName(std::get<1>(info.param))) + "_" +
                                  (std::get<2>(info.param) == kernels::DType::kFloat32 ? "fp32"
                                                                                       : "bf16");
                         });

class EpFailure : public ::testing::TestWithParam<EpStrategy> {};

TEST_P(EpFailure, RankFailingMidStepFailsEveryRankFast) {
  const Case c{.name = "fault", .ranks = 4, .num_tokens = 9, .top_k = 2};
  const World w(c, 99);
  std::vector<char> out(w.Reference().size());
  for (int after = 1; after <= 3; ++after) {  // header is call 0: fail a later one
    auto comms = Group(c.ranks, /*timeout_ms=*/20000);
    comms[0]->group().InjectFault(2, absl::UnavailableError("NIC went away"), after);
    const auto start = std::chrono::steady_clock::now();
    auto st = RunEp(w, GetParam(), out, comms);
    // Abort, not the 20 s timeout, must release the peers.
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(st[2].code(), absl::StatusCode::kUnavailable) << st[2];
    EXPECT_THAT(Msg(st[2]), HasSubstr("NIC went away"));
    for (int r : {0, 1, 3}) {
      EXPECT_FALSE(st[r].ok()) << "rank " << r;
      EXPECT_EQ(st[r].code(), absl::StatusCode::kAborted) << st[r];
    }
  }
}

TEST_P(EpFailure, RankThatNeverJoinsTimesOut) {
  const Case c{.name = "absent", .ranks = 3, .num_tokens = 5};
  const World w(c, 5);
  std::vector<char> out(w.Reference().size());
  auto comms = Group(c.ranks, /*timeout_ms=*/150);
  auto pl = ExpertPlacement::Linear(c.num_experts, c.ranks);
  const auto split = SplitTokens(c.num_tokens, c.ranks);
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    threads.emplace_back([&, r] {
      st[r] = RunMoeExpertParallel(w.Layer(*pl, r), w.Inputs(split[r], out), *comms[r], GetParam());
    });
  }
  for (auto& t : threads) t.join();
  bool saw_deadline = false;
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[r].ok());
    saw_deadline |= st[r].code() == absl::StatusCode::kDeadlineExceeded;
    EXPECT_THAT(Msg(st[r]), HasSubstr("rank 2"));
  }
  EXPECT_TRUE(saw_deadline);
}

TEST_P(EpFailure, BadInputsOnOneRankFailAllRanksAndKeepTheGroup) {
  const Case c{.name = "bad", .ranks = 3, .num_tokens = 7};
  const World w(c, 7);
  std::vector<char> out(w.Reference().size());
  auto comms = Group(c.ranks, 10000);
  std::vector<int32_t> bad_ids;
  auto st = RunEp(w, GetParam(), out, comms, [&](int r, MoeInputsForThisRank& in) {
    if (r != 1) return;
    bad_ids.assign(in.topk_ids, in.topk_ids + in.num_tokens * c.top_k);
    bad_ids[1] = 99;
    in.topk_ids = bad_ids.data();
  });
  EXPECT_EQ(st[1].code(), absl::StatusCode::kInvalidArgument) << st[1];
  EXPECT_THAT(Msg(st[1]), HasSubstr("topk_ids[0][1] = 99"));
  for (int r : {0, 2}) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kInvalidArgument) << st[r];
    EXPECT_THAT(Msg(st[r]), HasSubstr("rejected by rank 1"));
  }
  // The group survives a rejected step: a good step follows.
  const std::vector<char> want = w.Reference();
  st = RunEp(w, GetParam(), out, comms);
  for (int r = 0; r < c.ranks; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
  ExpectMatches(w, out, want, /*exact=*/true);
}

INSTANTIATE_TEST_SUITE_P(Strategies, EpFailure,
                         ::testing::Values(EpStrategy::kAllGatherReduceScatter,
                                           EpStrategy::kAll2AllV),
                         [](const auto& info) { return std::string(EpStrategyName(info.param)); });

// CPU ranks have no device transport: passthrough fails every rank with
// FAILED_PRECONDITION naming the field, and the group stays usable.
TEST(EpPassthrough, CpuRanksRefuseItCleanly) {
  const Case c{.name = "pt", .ranks = 2, .num_tokens = 5};
  const World w(c, 11);
  std::vector<char> out(w.Reference().size());
  auto comms = Group(c.ranks, 10000);
  auto st = RunEp(w, EpStrategy::kPassthrough, out, comms);
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kFailedPrecondition) << st[r];
    EXPECT_EQ(FieldOf(st[r]).value_or(""), "parallel.all2all_backend") << st[r];
    EXPECT_THAT(Msg(st[r]), HasSubstr("passthrough"));
  }
  const std::vector<char> want = w.Reference();
  st = RunEp(w, EpStrategy::kAll2AllV, out, comms);
  for (int r = 0; r < c.ranks; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
  ExpectMatches(w, out, want, /*exact=*/true);
}

TEST(EpStrategy, NamesRoundTrip) {
  for (EpStrategy s : {EpStrategy::kAllGatherReduceScatter, EpStrategy::kAll2AllV}) {
    auto parsed = ParseEpStrategy(EpStrategyName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(EpStrategyName(EpStrategy::kAll2AllV), "kplan_all2allv");
  EXPECT_EQ(ParseEpStrategy("passthrough").value(), EpStrategy::kPassthrough);
  EXPECT_EQ(MakeEpDispatch(EpStrategy::kPassthrough), nullptr);
  EXPECT_EQ(ParseEpStrategy("deepep_low_latency").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kplan::moe::ep
