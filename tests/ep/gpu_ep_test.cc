// Expert parallelism on two GPUs (server/moe/ep/gpu_ep.h, label gpu): one
// thread and NcclCommunicator per GPU as the ranks of one process, each with
// its slice of the experts resident, against the single-GPU layer
// (RunMoeOnGpu over all experts on GPU 0) on the same fresh random bf16
// inputs (never zeros; the seed is printed, GPU_EP_TEST_SEED=<n> repeats it).
//  * Shapes: Mixtral-8x7B (E=8, k=2, H=4096, I=14336), DeepSeek-V3 (E=256,
//    k=8, H=7168, I=2048, DeepSeekV3 grouped routing with bias), Qwen3-30B-A3B
//    (E=128, k=8, H=2048, I=768); tokens per rank from 0 to 512, uneven
//    splits, a rank without tokens, routing on the GPU from logits and given
//    top-k ids, all tokens' first slot on one expert.
//  * kplan_all2allv is bit-exact with the single-GPU result when both calls
//    of the layer pick the same GEMM configuration (each expert row is the
//    same row of the same GEMM, the combine is the same kernel);
//    allgather_reducescatter adds per-rank fp32 partials, exact for k <= 2,
//    otherwise within one bf16 rounding. The GEMMs choose block size and
//    split-K from the call's slot count, which differs between the single
//    GPU (all slots) and a rank (its rows), so bit-exactness is reported per
//    case and the check is the GEMM-order bound of moe_layer_gpu_test.
//  * Each case runs twice: the second run allocates nothing (steady-state
//    workspace) and gives the same bits.
//  * passthrough (the kplan_ep transport, no host collective in the step)
//    runs every case too, with the transport capacity reserved for the
//    case's largest rank; its expert rows come from one EnqueueMoeLayer call
//    over the whole receive buffer (n*T tokens of k slots, local ids), so
//    its GEMM configuration follows the capacity, not the routed rows.
//  * Failures: bad input on one rank fails both with the group still usable;
//    an aborted rank makes its peer fail (timeout) and a new group works.
//    passthrough: the failing rank joins the round with no tokens, so its
//    peer returns OK and the next step on the same communicators works.
// One line per case: shape, strategy, tokens per rank, bit-exact, rel L2,
// max abs error, mismatching elements, EP step time (rank 0, events).
#include "server/moe/ep/gpu_ep.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/comm/nccl_communicator.h"
#include "server/moe/expert_set.h"
#include "server/moe/gpu_runner.h"
#include "server/moe/moe_runner.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/tolerance.h"

namespace kplan::moe::ep {
namespace {

using comm::NcclCommunicator;

constexpr int kRanks = 2;

int DeviceCount() { return test_util::CudaDeviceCount(); }
uint64_t Seed() { return test_util::TestSeed("gpu_ep_test", "GPU_EP_TEST_SEED"); }
uint64_t Mix(uint64_t x) { return test_util::SplitMix(x); }

// n random bf16 values (test_util::RandomBf16), stream `stream_id` of the seed.
std::string RandomBf16(int64_t n, int base, uint64_t stream_id) {
  return test_util::RandomBf16(n, base, Mix(Seed() ^ (stream_id * 0x100000001b3ull)));
}

std::vector<float> RandomFloats(int64_t n, float lo, float hi, uint64_t stream_id) {
  std::vector<float> v(n);
  const uint64_t key = Mix(Seed() ^ (stream_id << 32));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = lo + (hi - lo) * static_cast<float>(Mix(key + i) >> 40) / static_cast<float>(1 << 24);
  }
  return v;
}

int Log2Ceil(double x) { return static_cast<int>(std::ceil(std::log2(x))); }

struct Shape {
  const char* name;
  int E, k;
  int64_t H, I;
};

std::unique_ptr<ExpertSet> MakeExperts(const Shape& s, uint64_t stream_id) {
  ExpertsSpec spec;
  spec.experts_id = s.name;
  spec.num_experts = s.E;
  spec.hidden = s.H;
  spec.intermediate = s.I;
  spec.activation = "silu";
  spec.dtype = kernels::DType::kBFloat16;
  std::map<std::string, std::string> t;
  t["w13"] = RandomBf16(s.E * 2 * s.I * s.H, -Log2Ceil(std::sqrt(double(s.H))), stream_id + 1);
  t["w2"] = RandomBf16(s.E * s.H * s.I, -Log2Ceil(std::sqrt(double(s.I))), stream_id + 2);
  return std::make_unique<ExpertSet>(std::move(spec), std::move(t));
}

// Destroys the ranks' communicators concurrently: a GpuEpCommunicator
// releases its passthrough transports first, which is collective.
void DestroyComms(std::vector<std::unique_ptr<GpuEpCommunicator>>& comms) {
  std::vector<std::thread> threads;
  for (auto& c : comms) {
    threads.emplace_back([&c] { c.reset(); });
  }
  for (auto& t : threads) t.join();
  comms.clear();
}

// Two ranks: communicators, expert slices and workspaces on GPUs 0 and 1.
struct Group {
  std::vector<std::unique_ptr<GpuEpCommunicator>> comms;
  std::vector<std::unique_ptr<GpuExperts>> experts;
  std::vector<std::unique_ptr<GpuEpWorkspace>> workspaces;
  std::vector<GpuEpLayer> layers;
  ~Group() { DestroyComms(comms); }
};

absl::Status Connect(Group& g, std::chrono::milliseconds timeout) {
  absl::StatusOr<std::string> id = NcclCommunicator::CreateUniqueId();
  if (!id.ok()) return id.status();
  DestroyComms(g.comms);
  g.comms.resize(kRanks);
  std::vector<absl::Status> st(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      comm::NcclOptions o;
      o.timeout = timeout;
      auto c = NcclCommunicator::Create(r, kRanks, *id, r, nullptr, o);
      if (c.ok()) {
        g.comms[r] = std::make_unique<GpuEpCommunicator>(std::move(*c));
      } else {
        st[r] = c.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void MakeGroup(const ExpertSet& set, Group& g,
               std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const ExpertsSpec& spec = set.spec();
  auto pl = ExpertPlacement::Linear(spec.num_experts, kRanks);
  ASSERT_TRUE(pl.ok());
  for (int r = 0; r < kRanks; ++r) {
    auto e = GpuExperts::Create(set, r, pl->FirstExpert(r), pl->NumLocalExperts(r));
    ASSERT_TRUE(e.ok()) << e.status();
    g.experts.push_back(std::move(*e));
    g.workspaces.push_back(std::make_unique<GpuEpWorkspace>(r));
    GpuEpLayer L;
    L.hidden = spec.hidden;
    L.intermediate = spec.intermediate;
    L.num_experts = spec.num_experts;
    L.act_dtype = spec.dtype;
    L.activation = set.activation();
    L.placement = *pl;
    L.local_experts = g.experts.back().get();
    L.workspace = g.workspaces.back().get();
    g.layers.push_back(L);
  }
  absl::Status st = Connect(g, timeout);
  ASSERT_TRUE(st.ok()) << st;
}

// The whole batch, as the single GPU sees it.
struct Batch {
  std::vector<int64_t> tokens;  // per rank
  int64_t M = 0;
  int k = 0;
  std::string hidden;         // bf16 [M, H]
  std::vector<float> logits;  // [M, E], or empty with given ids
  MoeRouting routing;
  RoutingSpec spec;          // points into routing
  std::vector<int32_t> ids;  // given ids, or empty
  std::vector<float> weights;
};

Batch MakeBatch(const Shape& s, std::vector<int64_t> tokens, bool deepseek, int one_expert,
                uint64_t stream_id) {
  Batch b;
  b.tokens = std::move(tokens);
  for (int64_t t : b.tokens) b.M += t;
  b.k = s.k;
  b.hidden = RandomBf16(b.M * s.H, -1, stream_id + 10);
  b.routing.top_k = s.k;
  if (one_expert < 0) {
    b.logits = RandomFloats(b.M * s.E, -3.0f, 3.0f, stream_id + 11);
    if (deepseek) {
      b.routing.routing_method = "DeepSeekV3";
      b.routing.num_expert_group = 8;
      b.routing.topk_group = 4;
      b.routing.routed_scaling_factor = 2.5f;
      b.routing.e_score_correction_bias = RandomFloats(s.E, -0.1f, 0.1f, stream_id + 12);
    } else {
      b.routing.routing_method = "RenormalizeNaive";
    }
    b.spec = *RoutingSpecFor(b.routing, s.E);
  } else {
    // Given ids: slot 0 of every token on `one_expert`, the others distinct.
    std::mt19937 rng(static_cast<uint32_t>(Mix(Seed() + stream_id)));
    b.ids.resize(b.M * s.k);
    b.weights.resize(b.M * s.k);
    std::vector<int32_t> perm(s.E);
    for (int64_t m = 0; m < b.M; ++m) {
      for (int e = 0; e < s.E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      std::swap(perm[0], *std::find(perm.begin(), perm.end(), one_expert));
      float sum = 0;
      for (int j = 0; j < s.k; ++j) {
        b.ids[m * s.k + j] = perm[j];
        b.weights[m * s.k + j] = 0.05f + std::uniform_real_distribution<float>(0, 1)(rng);
        sum += b.weights[m * s.k + j];
      }
      for (int j = 0; j < s.k; ++j) b.weights[m * s.k + j] /= sum;
    }
  }
  return b;
}

MoeRunOutput SingleGpu(const GpuExperts& full, const Shape& s, const Batch& b) {
  MoeRunInput in;
  in.act_dtype = kernels::DType::kBFloat16;
  in.hidden_shape = {b.M, s.H};
  in.hidden_states = b.hidden;
  if (b.ids.empty()) {
    in.logits_shape = {b.M, s.E};
    in.router_logits.assign(reinterpret_cast<const char*>(b.logits.data()), b.logits.size() * 4);
    in.routing = b.routing;
  } else {
    in.topk_shape = {b.M, s.k};
    in.topk_ids.assign(reinterpret_cast<const char*>(b.ids.data()), b.ids.size() * 4);
    in.topk_weights.assign(reinterpret_cast<const char*>(b.weights.data()), b.weights.size() * 4);
  }
  cudaSetDevice(full.device());
  auto out = RunMoeOnGpu(full, in, nullptr);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move(*out) : MoeRunOutput{};
}

struct EpResult {
  std::vector<absl::Status> status = std::vector<absl::Status>(kRanks);
  std::vector<GpuEpStats> stats = std::vector<GpuEpStats>(kRanks);
  std::string output;  // [M, H] bf16, ranks' slices concatenated
};

// One step on every rank; `tweak(rank, inputs)` may spoil a rank's inputs.
EpResult RunEp(Group& g, const Shape& s, const Batch& b, EpStrategy strategy,
               const std::function<void(int, MoeInputsForThisRank&)>& tweak = nullptr) {
  EpResult res;
  res.output.assign(b.M * s.H * 2, '\x7f');
  std::vector<std::thread> threads;
  int64_t begin = 0;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r, begin] {
      cudaSetDevice(r);
      MoeInputsForThisRank in;
      in.num_tokens = b.tokens[r];
      in.hidden_states = b.hidden.data() + begin * s.H * 2;
      if (b.ids.empty()) {
        in.router_logits = b.logits.data() + begin * s.E;
        in.routing = b.spec;
      } else {
        in.topk_ids = b.ids.data() + begin * s.k;
        in.topk_weights = b.weights.data() + begin * s.k;
      }
      in.output = res.output.data() + begin * s.H * 2;
      if (tweak) tweak(r, in);
      GpuEpLayer L = g.layers[r];
      L.top_k = s.k;
      res.status[r] = RunMoeExpertParallelOnGpu(L, in, *g.comms[r], strategy, &res.stats[r]);
    });
    begin += b.tokens[r];
  }
  for (auto& t : threads) t.join();
  return res;
}

struct Diff {
  bool bit_exact = false;
  double rel = 0, max_abs = 0;
  int64_t mismatched = 0, beyond_ulp = 0, out_of_tol = 0;
};

Diff Compare(const std::string& got, const std::string& ref) {
  Diff d;
  d.bit_exact = got == ref;
  const int64_t n = static_cast<int64_t>(ref.size() / 2);
  double d2 = 0, r2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = LoadFloat(ref.data(), kernels::DType::kBFloat16, i);
    r2 += r * r;
  }
  const double rms = std::sqrt(r2 / std::max<int64_t>(n, 1));
  for (int64_t i = 0; i < n; ++i) {
    const float g = LoadFloat(got.data(), kernels::DType::kBFloat16, i);
    const float r = LoadFloat(ref.data(), kernels::DType::kBFloat16, i);
    const double e = std::fabs(static_cast<double>(g) - r);
    if (std::memcmp(got.data() + 2 * i, ref.data() + 2 * i, 2) != 0) ++d.mismatched;
    // One rounding of a re-associated fp32 sum: one bf16 ulp of the value
    // plus the fp32 re-association error (a few 2^-24 of the terms, which
    // are of the output's typical size) where the sum cancels.
    if (!(e <= std::ldexp(std::fabs(r), -7) + std::ldexp(rms, -18))) ++d.beyond_ulp;
    // What a different GEMM configuration may give (moe_layer_gpu_test's
    // bound): intermediate roundings that flip with the fp32 order.
    if (!(e <= test_util::MoeLayerElementTolerance(r, rms))) ++d.out_of_tol;
    d2 += e * e;
    d.max_abs = std::max(d.max_abs, e);
  }
  d.rel = std::sqrt(d2 / std::max(r2, 1e-300));
  return d;
}

// Bit-exactness needs the single-GPU call and the rank's EnqueueMoeLayer
// call to pick the same GEMM configuration (block size and split-K are
// chosen from the call's slot count, gpu_layer.cc), so a mismatch is
// reported, and only a difference beyond what another configuration gives
// fails.
void ExpectMatches(const Diff& d, const std::string& label) {
  EXPECT_EQ(d.out_of_tol, 0) << label << ": " << d.mismatched << " elements differ, rel " << d.rel;
  EXPECT_LE(d.rel, 1e-2) << label;
}

// Runs both strategies (twice each) on one batch and checks them.
void CheckCase(Group& g, const GpuExperts& full, const Shape& s, const Batch& b,
               const std::string& what) {
  const MoeRunOutput ref = SingleGpu(full, s, b);
  ASSERT_EQ(ref.output.size(), static_cast<size_t>(b.M * s.H * 2));
  for (EpStrategy strategy :
       {EpStrategy::kAll2AllV, EpStrategy::kAllGatherReduceScatter, EpStrategy::kPassthrough}) {
    if (strategy == EpStrategy::kPassthrough) {
      // The capacity every rank's transport is sized for (the same on both).
      const int64_t T = std::max(b.tokens[0], b.tokens[1]);
      for (int r = 0; r < kRanks; ++r) {
        GpuEpLayer L = g.layers[r];
        L.top_k = s.k;
        const absl::Status st = ReserveGpuEpWorkspace(L, kRanks, T, strategy);
        ASSERT_TRUE(st.ok()) << st;
      }
    }
    const std::string label = absl::StrCat(s.name, " ", EpStrategyName(strategy), " ", what,
                                           " tokens=(", b.tokens[0], ",", b.tokens[1], ")");
    EpResult first = RunEp(g, s, b, strategy);
    for (int r = 0; r < kRanks; ++r)
      ASSERT_TRUE(first.status[r].ok()) << label << ": " << first.status[r];
    EpResult second = RunEp(g, s, b, strategy);
    for (int r = 0; r < kRanks; ++r)
      ASSERT_TRUE(second.status[r].ok()) << label << ": " << second.status[r];
    const Diff d = Compare(first.output, ref.output);
    std::printf(
        "%-58s bit_exact=%-3s rel=%.2e max_abs=%.2e mismatched=%lld/%lld beyond_1ulp=%lld ep=%.3f "
        "ms "
        "(dispatch %.3f, experts %.3f, combine %.3f) ws=%.0f MiB\n",
        label.c_str(), d.bit_exact ? "yes" : "no", d.rel, d.max_abs,
        static_cast<long long>(d.mismatched), static_cast<long long>(b.M * s.H),
        static_cast<long long>(d.beyond_ulp), second.stats[0].total_ms, second.stats[0].dispatch_ms,
        second.stats[0].experts_ms, second.stats[0].combine_ms,
        second.stats[0].workspace_bytes / 1048576.0);
    std::fflush(stdout);
    EXPECT_EQ(second.output, first.output) << label << ": not deterministic";
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(second.stats[r].workspace_allocations, first.stats[r].workspace_allocations)
          << label << ": the repeated step allocated (rank " << r << ")";
    }
    ExpectMatches(d, label);
  }
}

class GpuEpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() < kRanks) GTEST_SKIP() << "needs two GPUs, found " << DeviceCount();
    Seed();
  }
};

struct TokenCase {
  std::vector<int64_t> tokens;
  int one_expert = -1;  // >= 0: given ids with every slot 0 on this expert
};

void RunModel(const Shape& s, bool deepseek, const std::vector<TokenCase>& cases) {
  const auto t0 = std::chrono::steady_clock::now();
  auto set = MakeExperts(s, 1000);
  auto full = GpuExperts::Create(*set, 0);
  ASSERT_TRUE(full.ok()) << full.status();
  Group g;
  MakeGroup(*set, g);
  if (testing::Test::HasFatalFailure()) return;
  std::printf("%s: experts %.2f GB, set up in %.1f s\n", s.name, (*full)->bytes() / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  uint64_t id = 100;
  for (const TokenCase& c : cases) {
    const Batch b = MakeBatch(s, c.tokens, deepseek, c.one_expert, id += 100);
    const std::string what = c.one_expert >= 0
                                 ? absl::StrCat("ids,slot0->e", c.one_expert)
                                 : std::string(deepseek ? "DeepSeekV3-routing" : "routed");
    CheckCase(g, **full, s, b, what);
  }
}

TEST_F(GpuEpTest, Mixtral8x7B) {
  RunModel({"Mixtral-8x7B", 8, 2, 4096, 14336}, false,
           {{{0, 0}},
            {{1, 0}},
            {{0, 1}},
            {{7, 3}},
            {{64, 64}},
            {{512, 300}},
            {{128, 128}, 5},
            {{1, 200}, 1}});
}

TEST_F(GpuEpTest, DeepSeekV3) {
  RunModel({"DeepSeek-V3", 256, 8, 7168, 2048}, true,
           {{{1, 1}}, {{0, 5}}, {{33, 64}}, {{256, 200}}, {{64, 64}, 250}});
}

TEST_F(GpuEpTest, Qwen3_30B_A3B) {
  RunModel({"Qwen3-30B-A3B", 128, 8, 2048, 768}, false,
           {{{1, 0}}, {{7, 3}}, {{64, 64}}, {{512, 384}}, {{200, 100}, 3}});
}

// Bad input on one rank, then an aborted rank, then a new group.
TEST_F(GpuEpTest, FailuresReachEveryRankAndANewGroupWorks) {
  const Shape s{"small", 8, 2, 256, 128};
  auto set = MakeExperts(s, 9000);
  auto full = GpuExperts::Create(*set, 0);
  ASSERT_TRUE(full.ok()) << full.status();
  Group g;
  MakeGroup(*set, g, std::chrono::seconds(5));
  if (HasFatalFailure()) return;
  const Batch b = MakeBatch(s, {37, 21}, false, -1, 9100);
  const MoeRunOutput ref = SingleGpu(**full, s, b);

  // 1. Rank 1's top-k ids are out of range: both fail, the group stays usable.
  const Batch given = MakeBatch(s, {5, 6}, false, 2, 9200);
  std::vector<int32_t> bad(given.ids.begin() + 5 * s.k, given.ids.end());
  bad[3] = 99;
  EpResult r1 = RunEp(g, s, given, EpStrategy::kAll2AllV, [&](int r, MoeInputsForThisRank& in) {
    if (r == 1) in.topk_ids = bad.data();
  });
  EXPECT_EQ(r1.status[1].code(), absl::StatusCode::kInvalidArgument) << r1.status[1];
  EXPECT_NE(std::string(r1.status[1].message()).find("topk_ids"), std::string::npos)
      << r1.status[1];
  EXPECT_EQ(r1.status[0].code(), absl::StatusCode::kInvalidArgument) << r1.status[0];
  EXPECT_NE(std::string(r1.status[0].message()).find("rejected by rank 1"), std::string::npos)
      << r1.status[0];
  std::printf("bad input on rank 1: rank 0: %s | rank 1: %s\n", r1.status[0].ToString().c_str(),
              r1.status[1].ToString().c_str());
  EpResult ok1 = RunEp(g, s, b, EpStrategy::kAll2AllV);
  ASSERT_TRUE(ok1.status[0].ok() && ok1.status[1].ok()) << ok1.status[0] << " " << ok1.status[1];
  ExpectMatches(Compare(ok1.output, ref.output), "after bad input");

  // 1b. passthrough: rank 1's bad ids (and, next, more tokens than the
  // capacity) fail rank 1 only; it joins the round with no tokens, so rank 0
  // finishes its step (rows of rank 1's experts still computed) and the
  // next step on the same communicators works.
  for (int r = 0; r < kRanks; ++r) {
    GpuEpLayer L = g.layers[r];
    L.top_k = s.k;
    ASSERT_TRUE(ReserveGpuEpWorkspace(L, kRanks, 40, EpStrategy::kPassthrough).ok());
  }
  EpResult p1 = RunEp(g, s, given, EpStrategy::kPassthrough, [&](int r, MoeInputsForThisRank& in) {
    if (r == 1) in.topk_ids = bad.data();
  });
  EXPECT_EQ(p1.status[1].code(), absl::StatusCode::kInvalidArgument) << p1.status[1];
  EXPECT_TRUE(p1.status[0].ok()) << p1.status[0];
  std::printf("passthrough, bad ids on rank 1: rank 0: %s | rank 1: %s\n",
              p1.status[0].ToString().c_str(), p1.status[1].ToString().c_str());
  {
    const MoeRunOutput gref = SingleGpu(**full, s, given);
    const int64_t n0 = given.tokens[0] * s.H * 2;
    const Diff d0 = Compare(p1.output.substr(0, n0), gref.output.substr(0, n0));
    ExpectMatches(d0, "passthrough rank 0 beside a failing rank 1");
  }
  const Batch big = MakeBatch(s, {10, 41}, false, -1, 9300);
  EpResult p2 = RunEp(g, s, big, EpStrategy::kPassthrough);
  EXPECT_EQ(p2.status[1].code(), absl::StatusCode::kInvalidArgument) << p2.status[1];
  EXPECT_NE(std::string(p2.status[1].message()).find("capacity"), std::string::npos)
      << p2.status[1];
  EXPECT_TRUE(p2.status[0].ok()) << p2.status[0];
  EpResult p3 = RunEp(g, s, b, EpStrategy::kPassthrough);
  ASSERT_TRUE(p3.status[0].ok() && p3.status[1].ok()) << p3.status[0] << " " << p3.status[1];
  ExpectMatches(Compare(p3.output, ref.output), "passthrough after bad input");
  EXPECT_EQ(g.comms[0]->transports_created(), 1);

  // 2. Rank 0's communicator is aborted while rank 1 is inside a step: rank 1
  // fails at its timeout (5 s) instead of hanging, rank 0's own step fails.
  EpResult r2;
  r2.output.assign(b.M * s.H * 2, '\0');
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    cudaSetDevice(1);
    MoeInputsForThisRank in;
    in.num_tokens = b.tokens[1];
    in.hidden_states = b.hidden.data() + b.tokens[0] * s.H * 2;
    in.router_logits = b.logits.data() + b.tokens[0] * s.E;
    in.routing = b.spec;
    in.output = r2.output.data() + b.tokens[0] * s.H * 2;
    GpuEpLayer L = g.layers[1];
    L.top_k = s.k;
    r2.status[1] =
        RunMoeExpertParallelOnGpu(L, in, *g.comms[1], EpStrategy::kAllGatherReduceScatter);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  g.comms[0]->Abort("test: rank 0 aborted");
  {
    cudaSetDevice(0);
    MoeInputsForThisRank in;
    in.num_tokens = b.tokens[0];
    in.hidden_states = b.hidden.data();
    in.router_logits = b.logits.data();
    in.routing = b.spec;
    in.output = r2.output.data();
    GpuEpLayer L = g.layers[0];
    L.top_k = s.k;
    r2.status[0] =
        RunMoeExpertParallelOnGpu(L, in, *g.comms[0], EpStrategy::kAllGatherReduceScatter);
  }
  waiter.join();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("abort on rank 0 (%.1f s): rank 0: %s | rank 1: %s\n", waited,
              r2.status[0].ToString().c_str(), r2.status[1].ToString().c_str());
  EXPECT_EQ(r2.status[0].code(), absl::StatusCode::kAborted) << r2.status[0];
  EXPECT_FALSE(r2.status[1].ok());
  EXPECT_LT(waited, 60.0);

  // 3. A new group on the same GPUs, experts and workspaces works.
  absl::Status st = Connect(g, std::chrono::seconds(60));
  ASSERT_TRUE(st.ok()) << st;
  for (EpStrategy strategy :
       {EpStrategy::kAllGatherReduceScatter, EpStrategy::kAll2AllV, EpStrategy::kPassthrough}) {
    EpResult ok2 = RunEp(g, s, b, strategy);
    ASSERT_TRUE(ok2.status[0].ok() && ok2.status[1].ok()) << ok2.status[0] << " " << ok2.status[1];
    const Diff d = Compare(ok2.output, ref.output);
    std::printf("new group after the abort: %s OK, bit_exact=%s rel=%.2e\n",
                std::string(EpStrategyName(strategy)).c_str(), d.bit_exact ? "yes" : "no", d.rel);
    ExpectMatches(d, absl::StrCat("new group ", EpStrategyName(strategy)));
  }
}

}  // namespace
}  // namespace kplan::moe::ep
