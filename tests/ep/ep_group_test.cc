// EpGroup on CPU thread-ranks: steps run one at a time and in submission
// order on every rank; a failing rank fails the step with its rank and cause
// and the group rebuilds its communicators before the next step; a rank that
// never picks up a step is DEADLINE_EXCEEDED naming it; a full queue is
// RESOURCE_EXHAUSTED; a MoE step equals the single-rank CPU reference.
#include "server/moe/ep/ep_group.h"

#include <atomic>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kplan::moe::ep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::unique_ptr<EpGroup> MakeGroup(int n, EpGroupOptions options = {}) {
  absl::StatusOr<std::unique_ptr<EpGroup>> g = EpGroup::Create(MakeCpuEpRanks(n), options);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::move(g).value();
}

// Every rank all-gathers its rank id: the communicator works and is this
// rank's.
absl::Status GatherRanks(int rank, comm::Communicator* comm) {
  if (comm == nullptr) return absl::InternalError("no communicator");
  if (comm->rank() != rank) return absl::InternalError("communicator of another rank");
  const int32_t mine = rank;
  std::vector<int32_t> all(comm->size());
  absl::Status st = comm->AllGather(&mine, all.data(), 1, kernels::DType::kInt32);
  if (!st.ok()) return st;
  for (int r = 0; r < comm->size(); ++r) {
    if (all[r] != r) return absl::InternalError("bad gather");
  }
  return absl::OkStatus();
}

TEST(EpGroupTest, StepsRunOneAtATimeInSubmissionOrderOnEveryRank) {
  constexpr int kRanks = 3, kSteps = 40;
  auto group = MakeGroup(kRanks);
  std::vector<std::vector<int>> seen(kRanks);  // each rank writes its own
  std::atomic<int> entered[kSteps] = {}, left[kSteps] = {};
  std::atomic<bool> overlap{false};
  std::vector<std::promise<absl::Status>> results(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_TRUE(group
                    ->Submit(
                        [&, s](int rank, comm::Communicator* comm) {
                          // The previous step is over on every rank.
                          if (s > 0 && left[s - 1].load() != kRanks) overlap = true;
                          ++entered[s];
                          seen[rank].push_back(s);
                          absl::Status st = GatherRanks(rank, comm);
                          ++left[s];
                          return st;
                        },
                        [&, s](absl::Status st, absl::Duration, absl::Duration) {
                          results[s].set_value(st);
                        },
                        s % 5 != 4 ? EpStepComm::kCollectives : EpStepComm::kNone)
                    .ok());
  }
  for (int s = 0; s < kSteps; ++s) {
    absl::Status st = results[s].get_future().get();
    if (s % 5 == 4) {
      EXPECT_TRUE(absl::IsInternal(st)) << "a local step has no communicator: " << st;
    } else {
      EXPECT_TRUE(st.ok()) << "step " << s << ": " << st;
    }
    EXPECT_EQ(entered[s].load(), kRanks);
  }
  EXPECT_FALSE(overlap.load());
  std::vector<int> order(kSteps);
  for (int s = 0; s < kSteps; ++s) order[s] = s;
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], order) << "rank " << r;
}

TEST(EpGroupTest, RankErrorFailsTheStepAndTheGroupIsRebuilt) {
  auto group = MakeGroup(3);
  EXPECT_EQ(group->generation(), 1);
  ASSERT_TRUE(group->Run(GatherRanks).ok());
  EXPECT_EQ(group->generation(), 1);

  // Rank 1 fails after its peers entered a collective: they are aborted
  // instead of waiting out the timeout, and the cause is rank 1's.
  absl::Status st = group->Run([](int rank, comm::Communicator* comm) -> absl::Status {
    if (rank == 1) return absl::InternalError("expert kernel exploded");
    return GatherRanks(rank, comm);
  });
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_THAT(Msg(st), HasSubstr("rank 1 (cpu) of 3: expert kernel exploded"));
  EXPECT_THAT(Msg(st), HasSubstr("rebuilt"));

  // Fresh communicators, and the group serves again.
  ASSERT_TRUE(group->Run(GatherRanks).ok());
  EXPECT_EQ(group->generation(), 2);

  // A transport fault (the communicator's own hook): UNAVAILABLE naming the
  // rank, then the group serves again.
  ASSERT_TRUE(group->InjectFault(2, absl::UnavailableError("link down")));
  st = group->Run(GatherRanks);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_THAT(Msg(st), HasSubstr("rank 2 (cpu)"));
  EXPECT_THAT(Msg(st), HasSubstr("link down"));
  ASSERT_TRUE(group->Run(GatherRanks).ok());
  EXPECT_EQ(group->generation(), 3);

  // A failing local step (no communicator) does not rebuild anything.
  st = group->Run(
      [](int rank, comm::Communicator*) {
        return rank == 0 ? absl::ResourceExhaustedError("out of memory") : absl::OkStatus();
      },
      EpStepComm::kNone);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_THAT(Msg(st), HasSubstr("rank 0 (cpu): out of memory"));
  ASSERT_TRUE(group->Run(GatherRanks).ok());
  EXPECT_EQ(group->generation(), 3);
}

// A communicator whose Abort is local when a rank aborts itself, as NCCL's
// is (ncclCommAbort does not reach the peers): only an abort from another
// thread (the group's coordinator) releases a rank waiting in a collective.
class LocalAbortCommunicator final : public comm::Communicator {
 public:
  explicit LocalAbortCommunicator(std::unique_ptr<comm::Communicator> inner)
      : inner_(std::move(inner)), owner_(std::this_thread::get_id()) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::string_view backend() const override { return "local_abort"; }
  absl::Status AllGather(const void* send, void* recv, int64_t count,
                         kernels::DType dtype) override {
    return inner_->AllGather(send, recv, count, dtype);
  }
  absl::Status ReduceScatter(const void* send, void* recv, int64_t count, kernels::DType dtype,
                             comm::ReduceOp op) override {
    return inner_->ReduceScatter(send, recv, count, dtype, op);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> sc,
                         absl::Span<const int64_t> sd, void* recv, absl::Span<const int64_t> rc,
                         absl::Span<const int64_t> rd, kernels::DType dtype) override {
    return inner_->AllToAllV(send, sc, sd, recv, rc, rd, dtype);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort(absl::string_view reason) override {
    if (std::this_thread::get_id() == owner_) return;
    aborted_by_group_ = true;
    inner_->Abort(reason);
  }
  bool aborted_by_group() const { return aborted_by_group_; }

 private:
  std::unique_ptr<comm::Communicator> inner_;
  std::atomic<bool> aborted_by_group_{false};
  const std::thread::id owner_;  // the rank's thread (JoinCommunicator runs there)
};

class LocalAbortRanks final : public EpRankKind {
 public:
  explicit LocalAbortRanks(int n) : cpu_(MakeCpuEpRanks(n)) {}
  int size() const override { return cpu_->size(); }
  std::string Device(int rank) const override { return cpu_->Device(rank); }
  absl::string_view communicator() const override { return "local_abort"; }
  absl::string_view moe_backend() const override { return cpu_->moe_backend(); }
  absl::string_view experts_kernel() const override { return cpu_->experts_kernel(); }
  absl::Status NewCommunicators(absl::Duration timeout) override {
    return cpu_->NewCommunicators(timeout);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> JoinCommunicator(int rank) override {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> c = cpu_->JoinCommunicator(rank);
    if (!c.ok()) return c.status();
    return std::unique_ptr<comm::Communicator>(new LocalAbortCommunicator(*std::move(c)));
  }
  absl::StatusOr<std::unique_ptr<EpRankExperts>> PlaceExperts(int rank, const ExpertSet& set,
                                                              const ExpertPlacement& p) override {
    return cpu_->PlaceExperts(rank, set, p);
  }
  absl::Status RunMoe(int rank, const ExpertSet& set, const EpRankExperts& experts,
                      const ExpertPlacement& p, const EpMoeOptions& options,
                      const MoeInputsForThisRank& inputs, comm::Communicator& comm) override {
    return cpu_->RunMoe(rank, set, experts, p, options, inputs, comm);
  }

 private:
  std::unique_ptr<EpRankKind> cpu_;
};

TEST(EpGroupTest, AFailedRankReleasesPeersWaitingInACollectiveAtOnce) {
  EpGroupOptions options;
  options.comm_timeout = absl::Seconds(20);  // what the peers would wait without the group
  options.step_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<EpGroup>> group =
      EpGroup::Create(std::make_unique<LocalAbortRanks>(3), options);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_TRUE((*group)->Run(GatherRanks).ok());

  const absl::Time start = absl::Now();
  absl::Status st = (*group)->Run([](int rank, comm::Communicator* comm) -> absl::Status {
    if (rank == 0) return absl::InternalError("expert kernel exploded");
    return GatherRanks(rank, comm);  // waits for rank 0
  });
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_THAT(Msg(st), HasSubstr("rank 0 (cpu) of 3: expert kernel exploded"));
  EXPECT_LT(took, absl::Seconds(10)) << "peers waited out their communicator's timeout";
  ASSERT_TRUE((*group)->Run(GatherRanks).ok());

  // A device round (passthrough): a rank that fails has completed the round,
  // and its peers may still be in it, so nothing is aborted until every rank
  // has finished.
  st = (*group)->Run(
      [](int rank, comm::Communicator* comm) -> absl::Status {
        if (rank == 2) return absl::InvalidArgumentError("bad ids");
        absl::SleepFor(absl::Milliseconds(200));
        if (static_cast<LocalAbortCommunicator*>(comm)->aborted_by_group()) {
          return absl::AbortedError("aborted during the round");
        }
        return absl::OkStatus();
      },
      EpStepComm::kDeviceRound);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(Msg(st), Not(HasSubstr("failed after it")));
  ASSERT_TRUE((*group)->Run(GatherRanks).ok());
}

TEST(EpGroupTest, RankThatNeverJoinsIsDeadlineExceededNamingIt) {
  EpGroupOptions options;
  options.join_timeout = absl::Milliseconds(300);
  options.step_timeout = absl::Milliseconds(300);
  options.comm_timeout = absl::Seconds(10);
  auto group = MakeGroup(3, options);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();

  // Rank 2 hangs inside step 1: the step times out naming it.
  absl::Status st = group->Run([released](int rank, comm::Communicator* comm) -> absl::Status {
    if (rank == 2) {
      released.wait();
      return absl::OkStatus();
    }
    return GatherRanks(rank, comm);
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_THAT(Msg(st), HasSubstr("rank 2 (cpu) still running"));

  // Still stuck: the next step cannot start on rank 2.
  st = group->Run(GatherRanks);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_THAT(Msg(st), HasSubstr("rank 2 (cpu) did not pick up the step"));

  // Once it is free again the group serves, on fresh communicators.
  release.set_value();
  const int64_t before = group->generation();
  st = group->Run(GatherRanks);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_GT(group->generation(), before);
}

TEST(EpGroupTest, FullQueueIsResourceExhausted) {
  EpGroupOptions options;
  options.max_queue_depth = 2;
  auto group = MakeGroup(2, options);
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> done{0};
  auto count = [&](absl::Status, absl::Duration, absl::Duration) { ++done; };
  auto wait = [released](int, comm::Communicator*) {
    released.wait();
    return absl::OkStatus();
  };
  ASSERT_TRUE(group
                  ->Submit(
                      [&](int rank, comm::Communicator*) {
                        if (rank == 0) started.set_value();
                        released.wait();
                        return absl::OkStatus();
                      },
                      count, EpStepComm::kNone)
                  .ok());
  started.get_future().wait();  // the first step is running, off the queue
  EXPECT_TRUE(group->Submit(wait, count).ok());
  EXPECT_TRUE(group->Submit(wait, count).ok());
  absl::Status full = group->Submit(wait, count);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  release.set_value();
  group.reset();  // finishes the queued steps
  EXPECT_EQ(done.load(), 3);
}

TEST(EpGroupTest, MoeStepEqualsTheSingleRankReference) {
  constexpr int kE = 5, kH = 16, kI = 8, kM = 7, kK = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 0.3f);
  auto random_bytes = [&](size_t n) {
    std::string s(n * 4, '\0');
    for (size_t i = 0; i < n; ++i) {
      const float v = d(rng);
      std::memcpy(&s[i * 4], &v, 4);
    }
    return s;
  };
  ExpertsSpec spec;
  spec.experts_id = "l0";
  spec.num_experts = kE;
  spec.hidden = kH;
  spec.intermediate = kI;
  spec.dtype = kernels::DType::kFloat32;
  auto set = std::make_shared<ExpertSet>(
      spec, std::map<std::string, std::string>{{"w13", random_bytes(kE * 2 * kI * kH)},
                                               {"w2", random_bytes(kE * kH * kI)}});
  MoeRunInput input;
  input.act_dtype = kernels::DType::kFloat32;
  input.hidden_shape = {kM, kH};
  input.hidden_states = random_bytes(kM * kH);
  input.logits_shape = {kM, kE};
  input.router_logits = random_bytes(kM * kE);
  input.routing.top_k = kK;
  absl::StatusOr<MoeRunOutput> want = RunMoeOnCpu(*set, input);
  ASSERT_TRUE(want.ok()) << want.status();

  auto group = MakeGroup(3);
  std::promise<absl::StatusOr<std::unique_ptr<EpExperts>>> placed;
  ASSERT_TRUE(group
                  ->PlaceExperts(set,
                                 [&](absl::StatusOr<std::unique_ptr<EpExperts>> p) {
                                   placed.set_value(std::move(p));
                                 })
                  .ok());
  absl::StatusOr<std::unique_ptr<EpExperts>> experts = placed.get_future().get();
  ASSERT_TRUE(experts.ok()) << experts.status();
  ASSERT_EQ((*experts)->shards().size(), 3u);
  EXPECT_EQ((*experts)->shards()[0].num_experts, 2);
  EXPECT_EQ((*experts)->shards()[2].first_expert, 4);
  EXPECT_EQ((*experts)->device_name(), "ep:cpu,cpu,cpu");
  set->AttachDeviceCopy(std::move(*experts));

  std::promise<absl::StatusOr<MoeRunOutput>> ran;
  ASSERT_TRUE(group
                  ->RunMoe(set, input, EpStrategy::kAll2AllV, /*return_routing=*/true,
                           [&](absl::StatusOr<MoeRunOutput> out, absl::Duration, absl::Duration) {
                             ran.set_value(std::move(out));
                           })
                  .ok());
  absl::StatusOr<MoeRunOutput> got = ran.get_future().get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->output, want->output) << "kplan_all2allv is bit-exact";
  EXPECT_EQ(got->topk_ids, want->topk_ids);
  EXPECT_EQ(got->topk_weights, want->topk_weights);

  // Input errors come back before anything is queued.
  MoeRunInput bad = input;
  bad.hidden_shape = {kM, kH + 1};
  absl::Status st = group->RunMoe(set, bad, EpStrategy::kAll2AllV, false,
                                  [](absl::StatusOr<MoeRunOutput>, absl::Duration, absl::Duration) {
                                    ADD_FAILURE() << "must not run";
                                  });
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;

  // A step whose caller is gone is dropped before any rank runs it (it used
  // to be computed and answered OK to nobody): past its deadline, or
  // cancelled. The group then runs the next step as before.
  auto run_with = [&](EpStepLimits limits) {
    std::promise<absl::StatusOr<MoeRunOutput>> done;
    EXPECT_TRUE(group
                    ->RunMoe(
                        set, input, EpStrategy::kAll2AllV, false,
                        [&](absl::StatusOr<MoeRunOutput> out, absl::Duration, absl::Duration ran) {
                          if (!out.ok()) {
                            EXPECT_EQ(ran, absl::ZeroDuration());
                          }
                          done.set_value(std::move(out));
                        },
                        std::move(limits))
                    .ok());
    return done.get_future().get().status();
  };
  EXPECT_TRUE(absl::IsDeadlineExceeded(run_with({absl::Now() - absl::Seconds(1), nullptr})));
  EXPECT_TRUE(absl::IsCancelled(run_with({absl::InfiniteFuture(), [] { return true; }})));
  EXPECT_TRUE(run_with({absl::Now() + absl::Seconds(30), [] { return false; }}).ok());
}

}  // namespace
}  // namespace kplan::moe::ep
