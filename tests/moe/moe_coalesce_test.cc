// Coalescing of concurrent RunMoE calls (server/moe/moe_coalesce.h) on the CPU
// path: merged launches give every caller the bits it gets alone with
// coalescing off (memcmp, fresh random sets and tokens of several kinds), the
// counters prove the merge happened, incompatible calls never share a launch,
// and a member that is cancelled, past its deadline, of 0 tokens or over the
// cap neither breaks nor joins the others. The coalescer itself with a fake
// launch: an error reaches every member, timing per caller.
#include "server/moe/moe_coalesce.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/float16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "resolve/platform/local.h"
#include "tests/moe/cpu_run_moe_test.h"
#include "tests/moe/random_moe.h"

namespace kplan {
namespace {

using ::testing::HasSubstr;

constexpr int kExperts = 16;
constexpr int64_t kHidden = 128;
constexpr int64_t kInter = 64;

ExpertsSpec Spec(const std::string& id, kernels::DType dtype, const std::string& scheme = "") {
  ExpertsSpec s;
  s.experts_id = id;
  s.num_experts = kExperts;
  s.hidden = kHidden;
  s.intermediate = kInter;
  s.dtype = dtype;
  s.quant.scheme = scheme;
  s.quant.block_n = s.quant.block_k = 64;
  s.quant.group_size = 32;
  return s;
}

// M tokens on the test's set shape (moe/random_moe.h).
MoeRunInput RandomInput(int64_t m, kernels::DType act, const std::string& method, int top_k,
                        std::mt19937& rng) {
  return RandomMoeInput(kExperts, kHidden, m, act, method, top_k, rng);
}

using Outcome = RunMoeOutcome;

class CoalesceTest : public CpuRunMoeTest {
 protected:
  void SetUp() override {
    CpuRunMoeTest::SetUp();
    env_.routes = &routes_;
    rng_.seed(std::random_device{}());
  }

  void StartCoalescing(absl::Duration window, int64_t max_tokens) {
    absl::StatusOr<std::unique_ptr<MoeCoalescer>> c =
        MoeCoalescer::Create(*executor_, {window, max_tokens}, [this](int members) {
          std::lock_guard<std::mutex> lock(mu_);
          ++launch_sizes_[members];
        });
    ASSERT_TRUE(c.ok()) << c.status();
    coalescer_ = *std::move(c);
    env_.coalescer = coalescer_.get();
  }

  RunMoeRequest Request(std::shared_ptr<const ExpertSet> set, MoeRunInput input) {
    RunMoeRequest r;
    r.experts = std::move(set);
    r.input = std::move(input);
    return r;
  }

  MoeRouteCache routes_;
  std::unique_ptr<MoeCoalescer> coalescer_;  // after executor_, which it submits to
  std::mt19937 rng_;
  std::mutex mu_;
  std::map<int, int> launch_sizes_;  // members -> launches (the observer's)
};

void ExpectSameBits(const MoeRunOutput& got, const MoeRunOutput& want) {
  EXPECT_EQ(got.num_tokens, want.num_tokens);
  EXPECT_EQ(got.top_k, want.top_k);
  ASSERT_EQ(got.output.size(), want.output.size());
  EXPECT_EQ(std::memcmp(got.output.data(), want.output.data(), want.output.size()), 0);
  EXPECT_EQ(got.topk_ids, want.topk_ids);
  ASSERT_EQ(got.topk_weights.size(), want.topk_weights.size());
  if (want.topk_weights.empty()) return;  // an M = 0 member: data() may be null
  EXPECT_EQ(
      std::memcmp(got.topk_weights.data(), want.topk_weights.data(), want.topk_weights.size() * 4),
      0);
}

struct Kind {
  std::string name;
  kernels::DType weights, act;
  std::string scheme, activation_scale, method;  // method "": given top-k ids
  int top_k;
};

TEST_F(CoalesceTest, MergedCallsGetTheBitsTheyGetAloneWithCoalescingOff) {
  const std::vector<Kind> kinds = {
      {"bf16 Renormalize", kernels::DType::kBFloat16, kernels::DType::kBFloat16, "", "",
       "Renormalize", 4},
      {"fp32 given ids", kernels::DType::kFloat32, kernels::DType::kFloat32, "", "", "", 2},
      {"fp16 weights, bf16 act, DeepSeekV3", kernels::DType::kFloat16, kernels::DType::kBFloat16,
       "", "", "DeepSeekV3", 4},
      {"fp8 per-channel per-token", kernels::DType::kFp8E4m3, kernels::DType::kBFloat16,
       "fp8_per_channel", "per_token", "Default", 2},
      {"fp8 block", kernels::DType::kFp8E4m3, kernels::DType::kBFloat16, "fp8_block", "per_tensor",
       "Sigmoid", 2},
      {"int4 group", kernels::DType::kInt4Packed, kernels::DType::kFloat16, "int4_group", "",
       "Renormalize", 2},
  };
  constexpr int kCallers = 12;
  for (const Kind& kind : kinds) {
    SCOPED_TRACE(kind.name);
    ExpertsSpec spec = Spec(kind.name, kind.weights, kind.scheme);
    if (!kind.activation_scale.empty()) spec.quant.activation_scale = kind.activation_scale;
    std::shared_ptr<ExpertSet> set = RandomExpertSet(spec, rng_);
    std::vector<MoeRunInput> inputs;
    int64_t tokens = 0;
    for (int c = 0; c < kCallers; ++c) {
      const int64_t m = 1 + c % 3;
      tokens += m;
      inputs.push_back(RandomInput(m, kind.act, kind.method, kind.top_k, rng_));
      // One correction bias for all: another bias is another routing.
      inputs.back().routing.e_score_correction_bias =
          inputs.front().routing.e_score_correction_bias;
    }
    // Alone, coalescing off.
    env_.coalescer = nullptr;
    std::vector<MoeRunOutput> alone;
    for (const MoeRunInput& in : inputs) {
      Outcome o = Start(Request(set, in)).get();
      ASSERT_TRUE(o.result.ok()) << o.result.status();
      EXPECT_EQ(o.timing.coalesced_requests, 0);  // not through the coalescer
      alone.push_back(o.result->output);
    }
    // All at once, coalescing on: the cap is exactly their tokens, so they
    // make one launch (which goes once full) and the window never ends it.
    StartCoalescing(absl::Seconds(30), tokens);
    std::vector<std::future<Outcome>> merged;
    for (const MoeRunInput& in : inputs) merged.push_back(Start(Request(set, in)));
    for (int c = 0; c < kCallers; ++c) {
      Outcome o = merged[c].get();
      ASSERT_TRUE(o.result.ok()) << o.result.status();
      ExpectSameBits(o.result->output, alone[c]);
      EXPECT_EQ(o.result->plan.backend, "emulation");
      EXPECT_EQ(o.timing.device_start, o.timing.device_end - o.timing.device);
      EXPECT_EQ(o.timing.coalesced_requests, kCallers);
    }
    EXPECT_EQ(coalescer_->launches(), 1);
    EXPECT_EQ(coalescer_->coalesced_launches(), 1);
    EXPECT_EQ(coalescer_->coalesced_requests(), kCallers);
    coalescer_.reset();
  }
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(launch_sizes_[kCallers], static_cast<int>(kinds.size()));
}

TEST_F(CoalesceTest, TheWindowEndsAGroupAndTheCapSplitsOne) {
  std::shared_ptr<ExpertSet> set = RandomExpertSet(Spec("s", kernels::DType::kBFloat16), rng_);
  StartCoalescing(absl::Seconds(3), /*max_tokens=*/4);
  std::vector<MoeRunInput> inputs;
  for (int c = 0; c < 6; ++c) {
    inputs.push_back(RandomInput(1, kernels::DType::kBFloat16, "Renormalize", 2, rng_));
  }
  // A call over the cap runs alone, at once.
  inputs.push_back(RandomInput(5, kernels::DType::kBFloat16, "Renormalize", 2, rng_));
  const absl::Time start = absl::Now();
  std::vector<std::future<Outcome>> out;
  for (const MoeRunInput& in : inputs) out.push_back(Start(Request(set, in)));
  Outcome big = out.back().get();
  ASSERT_TRUE(big.result.ok()) << big.result.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // did not wait for the window
  EXPECT_EQ(big.timing.coalesced_requests, 0);       // over the cap: never coalesced
  // Each answer says how many shared its launch: 4 and 4 for the full one,
  // 2 and 2 for the window's.
  std::map<int, int> shared;
  for (auto& f : out) {
    if (f.valid()) {
      Outcome o = f.get();
      ASSERT_TRUE(o.result.ok());
      ++shared[o.timing.coalesced_requests];
    }
  }
  EXPECT_EQ(shared, (std::map<int, int>{{2, 2}, {4, 4}}));
  // 4 went once full, 2 at the window's end.
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(coalescer_->launches(), 2);
  EXPECT_EQ(coalescer_->coalesced_requests(), 6);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(launch_sizes_[4], 1);
  EXPECT_EQ(launch_sizes_[2], 1);
}

TEST_F(CoalesceTest, IncompatibleCallsNeverShareALaunch) {
  std::mt19937& rng = rng_;
  std::shared_ptr<ExpertSet> set = RandomExpertSet(Spec("s", kernels::DType::kBFloat16), rng);
  std::shared_ptr<ExpertSet> twin = RandomExpertSet(Spec("s", kernels::DType::kBFloat16), rng);
  const auto bf16 = kernels::DType::kBFloat16;
  std::vector<RunMoeRequest> requests;
  requests.push_back(Request(set, RandomInput(1, bf16, "Renormalize", 2, rng)));
  requests.push_back(Request(twin, RandomInput(1, bf16, "Renormalize", 2, rng)));  // other set
  requests.push_back(Request(set, RandomInput(1, kernels::DType::kFloat32, "Renormalize", 2, rng)));
  requests.push_back(Request(set, RandomInput(1, bf16, "Renormalize", 4, rng)));  // top_k
  requests.push_back(Request(set, RandomInput(1, bf16, "Default", 2, rng)));      // method
  requests.push_back(Request(set, RandomInput(1, bf16, "", 2, rng)));             // given ids
  const MoeRunInput deep = RandomInput(1, bf16, "DeepSeekV3", 2, rng);
  requests.push_back(Request(set, deep));
  MoeRunInput bias = deep;
  bias.routing.e_score_correction_bias[3] += 1e-3f;  // the same but for one bias value
  requests.push_back(Request(set, std::move(bias)));
  MoeRunInput scaled = deep;
  scaled.routing.routed_scaling_factor = 1.f;
  requests.push_back(Request(set, std::move(scaled)));
  MoeRunInput on_input = RandomInput(1, bf16, "Renormalize", 1, rng);
  on_input.apply_router_weight_on_input = true;
  requests.push_back(Request(set, std::move(on_input)));
  MoeRunInput renorm1 = RandomInput(1, bf16, "Renormalize", 1, rng);
  requests.push_back(Request(set, std::move(renorm1)));  // as the last, without it
  RunMoeRequest other_backend = Request(set, RandomInput(1, bf16, "Renormalize", 2, rng));
  other_backend.moe_backend = "emulation";  // the same route as auto: may share
  requests.push_back(std::move(other_backend));
  const size_t n = requests.size();
  // Keys first: each differs from the first's, but the emulation one.
  std::vector<std::optional<std::string>> keys;
  for (const RunMoeRequest& r : requests) {
    absl::StatusOr<MoeRoute> route = ChooseMoeRoute(r.experts->spec(), r.input, r.moe_backend, {},
                                                    platform_, env_.executable_backends);
    ASSERT_TRUE(route.ok()) << route.status();
    keys.push_back(MoeCoalesceKey(*r.experts, *route, r.input, 0, 256));
    ASSERT_TRUE(keys.back().has_value());
  }
  for (size_t i = 1; i + 1 < n; ++i) EXPECT_NE(*keys[i], *keys[0]) << "request " << i;
  EXPECT_NE(*keys[7], *keys[6]);
  EXPECT_NE(*keys[8], *keys[6]);
  EXPECT_NE(*keys[n - 3], *keys[n - 2]);
  EXPECT_EQ(*keys[n - 1], *keys[0]);
  // And running: n - 1 launches, one of them the two compatible calls.
  StartCoalescing(absl::Milliseconds(300), 256);
  std::vector<std::future<Outcome>> out;
  for (RunMoeRequest& r : requests) out.push_back(Start(std::move(r)));
  for (auto& f : out) {
    Outcome o = f.get();
    ASSERT_TRUE(o.result.ok()) << o.result.status();
  }
  EXPECT_EQ(coalescer_->launches(), static_cast<int64_t>(n - 1));
  EXPECT_EQ(coalescer_->coalesced_launches(), 1);
  EXPECT_EQ(coalescer_->coalesced_requests(), 2);
}

TEST_F(CoalesceTest, WhatNeverCoalesces) {
  const auto bf16 = kernels::DType::kBFloat16;
  const MoeRunInput one = RandomInput(1, bf16, "Renormalize", 2, rng_);
  // fp8 with a dynamic per-tensor activation scale: the scale is the
  // batch's maximum, so a row would depend on its partners.
  for (const bool static_scales : {false, true}) {
    ExpertsSpec spec = Spec("fp8", kernels::DType::kFp8E4m3, "fp8_per_tensor");
    spec.quant.activation_scale = "per_tensor";
    if (static_scales) spec.quant.a1_scale = spec.quant.a2_scale = 0.05f;
    std::shared_ptr<ExpertSet> set = RandomExpertSet(spec, rng_);
    absl::StatusOr<MoeRoute> route =
        ChooseMoeRoute(spec, one, "auto", {}, platform_, env_.executable_backends);
    ASSERT_TRUE(route.ok()) << route.status();
    EXPECT_EQ(MoeCoalesceKey(*set, *route, one, 0, 256).has_value(), static_scales);
  }
  std::shared_ptr<ExpertSet> set = RandomExpertSet(Spec("s", bf16), rng_);
  absl::StatusOr<MoeRoute> route =
      ChooseMoeRoute(set->spec(), one, "auto", {}, platform_, env_.executable_backends);
  ASSERT_TRUE(route.ok());
  EXPECT_TRUE(MoeCoalesceKey(*set, *route, one, 0, 1).has_value());
  const MoeRunInput two = RandomInput(2, bf16, "Renormalize", 2, rng_);
  EXPECT_FALSE(MoeCoalesceKey(*set, *route, two, 0, 1).has_value());  // over the cap
  MoeRoute ep = *route;
  ep.kind = MoeRouteKind::kExpertParallel;
  EXPECT_FALSE(MoeCoalesceKey(*set, ep, one, 0, 256).has_value());
  // skip_device calls take the plain path: nothing reaches the coalescer.
  StartCoalescing(absl::Seconds(30), 256);
  RunMoeRequest skipped = Request(set, one);
  skipped.skip_device = true;
  Outcome o = Start(std::move(skipped)).get();
  ASSERT_TRUE(o.result.ok()) << o.result.status();
  EXPECT_EQ(coalescer_->launches(), 0);
}

TEST_F(CoalesceTest, CancelledExpiredAndEmptyMembersLeaveTheOthersAlone) {
  std::shared_ptr<ExpertSet> set = RandomExpertSet(Spec("s", kernels::DType::kBFloat16), rng_);
  const auto bf16 = kernels::DType::kBFloat16;
  std::vector<MoeRunInput> inputs;
  for (int64_t m : {2, 0, 1, 3, 0, 1}) {
    inputs.push_back(RandomInput(m, bf16, "Renormalize", 2, rng_));
  }
  std::vector<MoeRunOutput> alone;
  for (const MoeRunInput& in : inputs) {
    Outcome o = Start(Request(set, in)).get();
    ASSERT_TRUE(o.result.ok()) << o.result.status();
    alone.push_back(o.result->output);
  }
  StartCoalescing(absl::Milliseconds(300), 256);
  std::vector<std::future<Outcome>> out;
  for (size_t c = 0; c < inputs.size(); ++c) {
    RunMoeCall call;
    // A deadline before the window ends: its group (members 0-3) goes at once.
    if (c == 3) call.deadline = absl::Now() + absl::Milliseconds(100);
    out.push_back(Start(Request(set, inputs[c]), std::move(call)));
  }
  for (size_t c = 0; c < inputs.size(); ++c) {
    Outcome o = out[c].get();
    ASSERT_TRUE(o.result.ok()) << c << ": " << o.result.status();
    ExpectSameBits(o.result->output, alone[c]);
    if (c == 3) {
      EXPECT_LT(o.timing.queue, absl::Milliseconds(100));  // never waited the window
    }
  }
  // Members 4-5 joined the sent group if it had not started yet, else made
  // their own launch at the window's end: both of them, or 5 alone when 4
  // still joined (a launch of one is no coalesced request).
  const int64_t launches = coalescer_->launches();
  EXPECT_GE(launches, 1);
  EXPECT_LE(launches, 2);
  const int64_t merged = coalescer_->coalesced_requests();
  if (launches == 1) {
    EXPECT_EQ(merged, 6);
  } else {
    EXPECT_TRUE(merged == 6 || merged == 5) << merged;
  }

  // A member cancelled before its launch is dropped; the others run.
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::future<Outcome>> next;
  for (size_t c = 0; c < 3; ++c) {
    RunMoeCall call;
    if (c == 1) call.cancelled = [cancel] { return cancel->load(); };
    next.push_back(Start(Request(set, inputs[c]), std::move(call)));
  }
  cancel->store(true);
  Outcome dropped = next[1].get();
  EXPECT_TRUE(absl::IsCancelled(dropped.result.status())) << dropped.result.status();
  for (size_t c : {size_t{0}, size_t{2}}) {
    Outcome o = next[c].get();
    ASSERT_TRUE(o.result.ok()) << o.result.status();
    ExpectSameBits(o.result->output, alone[c]);
    EXPECT_EQ(o.timing.coalesced_requests, 2);  // the dropped member is not counted
  }
  EXPECT_EQ(coalescer_->launches(), launches + 1);
  EXPECT_EQ(coalescer_->coalesced_requests(), merged + 2);
}

// The coalescer alone, with fake launches.
class CoalescerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceExecutor>> executor =
        DeviceExecutor::Create({}, DeviceExecutor::Options{});
    ASSERT_TRUE(executor.ok());
    executor_ = *std::move(executor);
  }
  static MoeCoalesceMember Member(int64_t m, std::shared_ptr<std::promise<Outcome>> promise) {
    MoeCoalesceMember member;
    member.input.act_dtype = kernels::DType::kFloat32;
    member.input.hidden_shape = {m, 1};
    member.input.hidden_states.assign(static_cast<size_t>(m * 4), static_cast<char>(m));
    member.input.topk_shape = {m, 1};
    member.input.topk_ids.assign(static_cast<size_t>(m * 4), '\0');
    member.input.topk_weights.assign(static_cast<size_t>(m * 4), '\0');
    member.fail = [promise](const absl::Status& s) { promise->set_value(Outcome{s, {}}); };
    member.finish = [promise](absl::StatusOr<MoeRunOutput> out, const MoeRunTiming& t,
                              const DeviceSlot&) {
      if (!out.ok()) {
        promise->set_value(Outcome{out.status(), t});
        return;
      }
      RunMoeResult r;
      r.output = *std::move(out);
      promise->set_value(Outcome{std::move(r), t});
    };
    return member;
  }
  // A launch that gives back its input's rows (recording its token counts).
  static MoeLaunchFn Echo(std::vector<int64_t>* sizes = nullptr) {
    return [sizes](const DeviceSlot&, const MoeRunInput& in,
                   absl::Time) -> absl::StatusOr<MoeRunOutput> {
      if (sizes != nullptr) sizes->push_back(in.hidden_shape[0]);
      MoeRunOutput o;
      o.num_tokens = in.hidden_shape[0];
      o.top_k = 1;
      o.output = std::string(in.hidden_states.bytes());
      o.topk_ids.assign(o.num_tokens, 7);
      o.topk_weights.assign(o.num_tokens, 0.5f);
      o.experts_kernel = absl::StrCat("Kernel", o.num_tokens);  // what a GPU layer reports
      return o;
    };
  }
  TaskPool answers_{3, "test-answer"};  // declared first: outlives the executor's work
  std::unique_ptr<DeviceExecutor> executor_;
};

TEST_F(CoalescerTest, RejectsBadOptions) {
  EXPECT_THAT(MoeCoalescer::Create(*executor_, {absl::ZeroDuration(), 8}).status().message(),
              HasSubstr("window"));
  for (int64_t bad : {int64_t{0}, MoeCoalescer::kMaxTokens + 1}) {
    EXPECT_THAT(MoeCoalescer::Create(*executor_, {absl::Milliseconds(1), bad}).status().message(),
                HasSubstr("coalesce_max_tokens"));
  }
  EXPECT_TRUE(
      MoeCoalescer::Create(*executor_, {absl::Milliseconds(1), MoeCoalescer::kMaxTokens}).ok());
}

TEST_F(CoalescerTest, ALaunchErrorReachesEveryMemberAndTimingIsPerCaller) {
  absl::StatusOr<std::unique_ptr<MoeCoalescer>> c =
      MoeCoalescer::Create(*executor_, {absl::Milliseconds(100), 256});
  ASSERT_TRUE(c.ok());
  auto launches = std::make_shared<std::atomic<int>>(0);
  auto launch = [launches](const DeviceSlot&, const MoeRunInput& in,
                           absl::Time) -> absl::StatusOr<MoeRunOutput> {
    ++*launches;
    EXPECT_TRUE(in.batch_invariant);
    EXPECT_EQ(in.hidden_shape[0], 3);
    return absl::ResourceExhaustedError("out of device memory");
  };
  std::vector<std::future<Outcome>> out;
  for (int64_t m : {1, 2}) {
    auto p = std::make_shared<std::promise<Outcome>>();
    out.push_back(p->get_future());
    (*c)->Add("k", 0, launch, Member(m, p));
    absl::SleepFor(absl::Milliseconds(20));
  }
  Outcome a = out[0].get(), b = out[1].get();
  EXPECT_TRUE(absl::IsResourceExhausted(a.result.status()));
  EXPECT_TRUE(absl::IsResourceExhausted(b.result.status()));
  EXPECT_EQ(*launches, 1);
  // Shared: the launch's device times; the caller's own: when it came and how long it waited.
  EXPECT_EQ(a.timing.device_start, b.timing.device_start);
  EXPECT_EQ(a.timing.device_end, b.timing.device_end);
  EXPECT_LT(a.timing.queued, b.timing.queued);
  EXPECT_GT(a.timing.queue, b.timing.queue);
  EXPECT_GE(a.timing.queue, absl::Milliseconds(100));
  EXPECT_EQ(a.timing.queued + a.timing.queue, a.timing.device_start);
}

TEST_F(CoalescerTest, TheWorkerLaunchesAgainWhileAMemberIsAnswered) {
  MoeCoalescer::Options options{absl::Milliseconds(1), 256};
  options.answers = &answers_;
  absl::StatusOr<std::unique_ptr<MoeCoalescer>> c = MoeCoalescer::Create(*executor_, options);
  ASSERT_TRUE(c.ok());
  std::vector<int64_t> sizes;
  const MoeLaunchFn launch = Echo(&sizes);
  // The first call's answer blocks until `release`: an answer sent from the
  // device worker would keep the second call's launch waiting behind it.
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto answering = std::make_shared<std::promise<void>>();
  auto first = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> first_out = first->get_future();
  MoeCoalesceMember slow = Member(1, first);
  slow.finish = [answering, released, finish = std::move(slow.finish)](
                    absl::StatusOr<MoeRunOutput> out, const MoeRunTiming& t,
                    const DeviceSlot& where) {
    answering->set_value();
    released.wait();
    finish(std::move(out), t, where);
  };
  (*c)->Add("a", 0, launch, std::move(slow));
  ASSERT_EQ(answering->get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto second = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> second_out = second->get_future();
  (*c)->Add("b", 0, launch, Member(2, second));
  const std::future_status got = second_out.wait_for(std::chrono::seconds(10));
  release->set_value();
  ASSERT_EQ(got, std::future_status::ready) << "the second launch waited for the first answer";
  EXPECT_TRUE(second_out.get().result.ok());
  EXPECT_TRUE(first_out.get().result.ok());
  EXPECT_THAT(sizes, ::testing::ElementsAre(1, 2));
}

TEST_F(CoalescerTest, ALaunchQueuedBehindABusyDeviceTakesLatePartners) {
  absl::StatusOr<std::unique_ptr<MoeCoalescer>> c =
      MoeCoalescer::Create(*executor_, {absl::Milliseconds(10), 256});
  ASSERT_TRUE(c.ok());
  // The CPU worker is busy until `release`.
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  ASSERT_TRUE(
      executor_->Submit(0, [released](const DeviceSlot&, absl::Duration) { released.wait(); })
          .ok());
  std::vector<int64_t> sizes;
  const MoeLaunchFn launch = Echo(&sizes);
  std::vector<std::future<Outcome>> out;
  for (int64_t m : {1, 2, 3}) {
    auto p = std::make_shared<std::promise<Outcome>>();
    out.push_back(p->get_future());
    (*c)->Add("k", 0, launch, Member(m, p));
    absl::SleepFor(absl::Milliseconds(40));  // past the window: the group is queued by now
  }
  release->set_value();
  for (auto& f : out) ASSERT_TRUE(f.get().result.ok());
  EXPECT_THAT(sizes, ::testing::ElementsAre(6));  // one launch of all three
  EXPECT_EQ((*c)->coalesced_requests(), 3);
}

TEST_F(CoalescerTest, ALargeCapIsChargedWithinTheExecutorsBudget) {
  // A queued group is charged for the partners it may still take, but at
  // most a quarter of the budget: with a cap of 2^20 tokens a 1-token group
  // would otherwise be charged far past these 64 KiB and refused.
  DeviceExecutor::Options options;
  options.max_queued_bytes = 64 << 10;
  absl::StatusOr<std::unique_ptr<DeviceExecutor>> executor = DeviceExecutor::Create({}, options);
  ASSERT_TRUE(executor.ok());
  absl::StatusOr<std::unique_ptr<MoeCoalescer>> c =
      MoeCoalescer::Create(**executor, {absl::Milliseconds(1), MoeCoalescer::kMaxTokens});
  ASSERT_TRUE(c.ok());
  std::vector<int64_t> sizes;
  const MoeLaunchFn launch = Echo(&sizes);
  std::vector<std::future<Outcome>> out;
  for (int64_t m : {1, 2}) {
    auto p = std::make_shared<std::promise<Outcome>>();
    out.push_back(p->get_future());
    (*c)->Add("k", 0, launch, Member(m, p));
  }
  for (auto& f : out) {
    Outcome o = f.get();
    EXPECT_TRUE(o.result.ok()) << o.result.status();
  }
  EXPECT_FALSE(sizes.empty());
}

TEST_F(CoalescerTest, ASplitGivesEachMemberItsRows) {
  // Three answer threads for four members: shares of one, one and two.
  MoeCoalescer::Options options{absl::Seconds(30), 7};
  options.answers = &answers_;
  absl::StatusOr<std::unique_ptr<MoeCoalescer>> c = MoeCoalescer::Create(*executor_, options);
  ASSERT_TRUE(c.ok());
  // The launch echoes its input: each member must get back its own bytes.
  const MoeLaunchFn launch = Echo();
  std::vector<std::future<Outcome>> out;
  for (int64_t m : {1, 0, 3, 2}) {  // 7 toward the cap (0 counts 1): the group goes once full
    auto p = std::make_shared<std::promise<Outcome>>();
    out.push_back(p->get_future());
    (*c)->Add("k", 0, launch, Member(m, p));
  }
  int64_t i = 0;
  for (int64_t m : {1, 0, 3, 2}) {
    Outcome o = out[i++].get();
    ASSERT_TRUE(o.result.ok()) << o.result.status();
    EXPECT_EQ(o.result->output.num_tokens, m);
    EXPECT_EQ(o.result->output.output,
              std::string(static_cast<size_t>(m * 4), static_cast<char>(m)));
    EXPECT_EQ(o.result->output.topk_ids.size(), static_cast<size_t>(m));
    // The launch's experts class (of its 6 tokens) and its size reach every member.
    EXPECT_EQ(o.result->output.experts_kernel, "Kernel6");
    EXPECT_EQ(o.timing.coalesced_requests, 4);
  }
  EXPECT_EQ((*c)->coalesced_launches(), 1);
  EXPECT_EQ((*c)->coalesced_requests(), 4);
}

}  // namespace
}  // namespace kplan
