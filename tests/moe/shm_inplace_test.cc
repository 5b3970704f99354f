// RunMoE's tensors in a client's POSIX shared memory read and written in
// place (server/moe/moe_runner.h: HostBytes, MoeHostOutput), through the
// RunMoE core on the CPU path without gRPC, on fresh random sets and tokens:
// the output written into the window is bit for bit the run on the server's
// own bytes (and nothing around the window changes), a skipped run writes its
// zeros there, a region unregistered and unlinked while the call waits stays
// mapped until it ends, a window truncated while the call waits fails the
// call with the field named (never the server), a call that ended leaves the
// window as it was, and coalesced members read in place get their own rows.
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status.h"
#include "gtest/gtest.h"
#include "server/moe/moe_coalesce.h"
#include "server/moe/shm_regions.h"
#include "tests/moe/cpu_run_moe_test.h"
#include "tests/moe/random_moe.h"
#include "tests/moe/test_shm_object.h"

namespace kplan {
namespace {

constexpr int kExperts = 8;
constexpr int64_t kHidden = 64;
constexpr int64_t kInter = 32;
constexpr int64_t kBytes = 4 * 4096;  // the client's object
constexpr int64_t kOut = 8192;        // where output windows start in it
constexpr char kUntouched = 0x5a;     // what the client left in the object

class ShmInPlaceTest : public CpuRunMoeTest {
 protected:
  void SetUp() override {
    CpuRunMoeTest::SetUp();
    rng_.seed(std::random_device{}());
    set_ = RandomExpertSet(PlainSpec("shm-inplace", kExperts, kHidden, kInter), rng_);
    env_.routes = &routes_;
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(regions_.Register(ShmRegionInfo{"r", object_.key(), 0, kBytes, "", 0}).ok());
  }

  ShmView View(int64_t offset, int64_t size, const std::string& region = "r") {
    absl::StatusOr<ShmView> v = regions_.Resolve(region, offset, size, "x");
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *std::move(v) : ShmView{};
  }
  // `in` with its hidden states put into the object at `at` (and its router
  // logits at `logits_at` unless negative) and read there, through region
  // `region` (which starts at the object's start).
  MoeRunInput InPlace(MoeRunInput in, int64_t at, int64_t logits_at = -1,
                      const std::string& region = "r") {
    for (auto [t, offset] : {std::pair{&in.hidden_states, at}, {&in.router_logits, logits_at}}) {
      if (offset < 0) continue;
      std::memcpy(client_ + offset, t->data(), t->size());
      *t = HostBytes(View(offset, static_cast<int64_t>(t->size()), region));
    }
    return in;
  }
  // The output of `in` into the object's window at `at`.
  void OutputAt(MoeRunInput& in, int64_t at) {
    in.host_output.view = View(at, static_cast<int64_t>(in.hidden_shape[0] * kHidden * 2));
  }
  MoeRunInput Random(int64_t m) {
    return RandomMoeInput(kExperts, kHidden, m, kernels::DType::kBFloat16, "Renormalize", 2, rng_);
  }
  RunMoeRequest Request(MoeRunInput in) {
    RunMoeRequest r;
    r.experts = set_;
    r.input = std::move(in);
    return r;
  }
  RunMoeOutcome Run(MoeRunInput in) { return Start(Request(std::move(in))).get(); }
  std::string Window(int64_t at, size_t n) const { return std::string(client_ + at, n); }
  // Holds the CPU worker until the returned promise is set: calls queue.
  std::shared_ptr<std::promise<void>> HoldWorker() {
    auto release = std::make_shared<std::promise<void>>();
    std::shared_future<void> released = release->get_future().share();
    EXPECT_TRUE(
        executor_->Submit(0, [released](const DeviceSlot&, absl::Duration) { released.wait(); })
            .ok());
    return release;
  }

  MoeRouteCache routes_;
  std::mt19937 rng_;
  std::shared_ptr<ExpertSet> set_;
  TestShmObject object_{"shm-inplace-test", kBytes, kUntouched};
  char* const client_ = object_.data();  // the client's own mapping
  ShmRegistry regions_;
};

TEST_F(ShmInPlaceTest, TheWindowGetsTheBitsOfTheOwnedRun) {
  const MoeRunInput in = Random(5);
  const size_t out_bytes = 5 * kHidden * 2;
  RunMoeOutcome owned = Run(in);
  ASSERT_TRUE(owned.result.ok()) << owned.result.status();
  ASSERT_FALSE(owned.result->output.in_place);
  ASSERT_EQ(owned.result->output.output.size(), out_bytes);

  MoeRunInput shm = InPlace(in, 128, 4096);
  ASSERT_TRUE(shm.router_logits.in_place());
  OutputAt(shm, kOut + 64);
  RunMoeOutcome got = Run(shm);
  ASSERT_TRUE(got.result.ok()) << got.result.status();
  EXPECT_TRUE(got.result->output.in_place);
  EXPECT_TRUE(got.result->output.output.empty());
  EXPECT_EQ(Window(kOut + 64, out_bytes), owned.result->output.output);
  EXPECT_EQ(got.result->output.topk_ids, owned.result->output.topk_ids);
  EXPECT_EQ(got.result->output.topk_weights, owned.result->output.topk_weights);
  // Nothing around the window, and the input as the client left it.
  EXPECT_EQ(Window(kOut, 64), std::string(64, kUntouched));
  EXPECT_EQ(Window(kOut + 64 + out_bytes, 64), std::string(64, kUntouched));
  EXPECT_EQ(Window(128, in.hidden_states.size()), std::string(in.hidden_states.bytes()));

  // A skipped run (skip_device) writes its zeros there too.
  RunMoeRequest skipped = Request(shm);
  skipped.skip_device = true;
  RunMoeOutcome zeros = Start(std::move(skipped)).get();
  ASSERT_TRUE(zeros.result.ok()) << zeros.result.status();
  EXPECT_TRUE(zeros.result->output.in_place);
  EXPECT_EQ(Window(kOut + 64, out_bytes), std::string(out_bytes, '\0'));
  EXPECT_EQ(Window(kOut + 64 + out_bytes, 64), std::string(64, kUntouched));
}

// A call reading and writing a window is charged what the same call with
// its bytes in the request is: the server still holds their size (copies,
// staging, workspace), and the size decides the job's lane and whether it
// may run inline (a large call never runs on the gRPC thread).
TEST_F(ShmInPlaceTest, InPlaceCallsAreChargedTheirSize) {
  const MoeRunInput in = Random(5);
  MoeRunInput shm = InPlace(in, 128);
  OutputAt(shm, kOut);
  EXPECT_EQ(RunMoeHeldBytes(shm), RunMoeHeldBytes(in));
  EXPECT_GE(RunMoeHeldBytes(shm), 2 * static_cast<int64_t>(in.hidden_states.size()));
}

TEST_F(ShmInPlaceTest, ARegionUnregisteredAndUnlinkedWhileTheCallWaitsStaysMapped) {
  const MoeRunInput in = Random(3);
  RunMoeOutcome owned = Run(in);
  ASSERT_TRUE(owned.result.ok()) << owned.result.status();
  MoeRunInput shm = InPlace(in, 0);
  OutputAt(shm, kOut);
  std::shared_ptr<std::promise<void>> release = HoldWorker();
  std::future<RunMoeOutcome> queued = Start(Request(std::move(shm)));
  regions_.UnregisterAll();
  ASSERT_EQ(shm_unlink(object_.key().c_str()), 0);
  EXPECT_TRUE(regions_.List().empty());
  release->set_value();
  RunMoeOutcome got = queued.get();
  ASSERT_TRUE(got.result.ok()) << got.result.status();
  EXPECT_TRUE(got.result->output.in_place);
  EXPECT_EQ(Window(kOut, owned.result->output.output.size()), owned.result->output.output);
}

// Truncation below a window that a queued call reads or writes: the call
// fails naming the field, and no page past the object's end is touched.
TEST_F(ShmInPlaceTest, AWindowTruncatedWhileTheCallWaitsFailsTheCallNotTheServer) {
  {
    SCOPED_TRACE("hidden states");
    std::shared_ptr<std::promise<void>> release = HoldWorker();
    std::future<RunMoeOutcome> queued = Start(Request(InPlace(Random(3), 4096)));
    object_.Truncate(4096);
    release->set_value();
    RunMoeOutcome got = queued.get();
    EXPECT_EQ(got.result.status().code(), absl::StatusCode::kFailedPrecondition)
        << got.result.status();
    EXPECT_EQ(FieldOf(got.result.status()).value_or(""), "hidden_states.shm.region");
  }
  {
    SCOPED_TRACE("router logits");
    object_.Truncate(kBytes);
    // The hidden states through a registration of the object's first 4096
    // bytes, which stays whole; the logits through the whole object's.
    ASSERT_TRUE(regions_.Register(ShmRegionInfo{"low", object_.key(), 0, 4096, "", 0}).ok());
    MoeRunInput in = InPlace(InPlace(Random(3), 128, -1, "low"), -1, 6144);
    std::shared_ptr<std::promise<void>> release = HoldWorker();
    std::future<RunMoeOutcome> queued = Start(Request(std::move(in)));
    object_.Truncate(4096);  // below the logits, above the hidden states
    release->set_value();
    RunMoeOutcome got = queued.get();
    EXPECT_EQ(got.result.status().code(), absl::StatusCode::kFailedPrecondition)
        << got.result.status();
    EXPECT_EQ(FieldOf(got.result.status()).value_or(""), "router_logits.shm.region");
  }
  {
    SCOPED_TRACE("output");
    object_.Truncate(kBytes);
    MoeRunInput in = Random(2);
    OutputAt(in, kOut);
    std::shared_ptr<std::promise<void>> release = HoldWorker();
    std::future<RunMoeOutcome> queued = Start(Request(std::move(in)));
    object_.Truncate(kOut);
    release->set_value();
    RunMoeOutcome got = queued.get();
    EXPECT_EQ(got.result.status().code(), absl::StatusCode::kFailedPrecondition)
        << got.result.status();
    EXPECT_EQ(FieldOf(got.result.status()).value_or(""), "output_shm.region");
  }
}

TEST_F(ShmInPlaceTest, ACallThatEndedLeavesTheWindowAsItWas) {
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "skipped run" : "run");
    MoeRunInput in = InPlace(Random(4), 0);
    OutputAt(in, kOut);
    in.host_output.cancelled = [] { return true; };
    RunMoeRequest r = Request(std::move(in));
    r.skip_device = skip;
    RunMoeOutcome got = Start(std::move(r)).get();
    EXPECT_EQ(got.result.status().code(), absl::StatusCode::kCancelled) << got.result.status();
    EXPECT_EQ(Window(kOut, 4 * kHidden * 2), std::string(4 * kHidden * 2, kUntouched));
  }
}

// Members read in place are copied into the merged batch; a merged launch's
// rows come back in the result (the caller writes the members' windows).
TEST_F(ShmInPlaceTest, CoalescedMembersReadInPlaceGetTheirRows) {
  constexpr int kCallers = 4;
  std::vector<MoeRunInput> inputs;
  std::vector<std::string> alone;
  int64_t tokens = 0, at = 0;
  for (int c = 0; c < kCallers; ++c) {
    const int64_t m = 1 + c;
    tokens += m;
    inputs.push_back(Random(m));
    RunMoeOutcome o = Run(inputs.back());
    ASSERT_TRUE(o.result.ok()) << o.result.status();
    alone.push_back(o.result->output.output);
    inputs.back() = InPlace(inputs.back(), at);
    at += static_cast<int64_t>(inputs.back().hidden_states.size());
    if (c % 2 == 0) OutputAt(inputs.back(), kOut + c * 1024);
  }
  absl::StatusOr<std::unique_ptr<MoeCoalescer>> coalescer =
      MoeCoalescer::Create(*executor_, {absl::Seconds(30), tokens});
  ASSERT_TRUE(coalescer.ok()) << coalescer.status();
  env_.coalescer = coalescer->get();
  std::vector<std::future<RunMoeOutcome>> merged;
  for (const MoeRunInput& in : inputs) merged.push_back(Start(Request(in)));
  for (int c = 0; c < kCallers; ++c) {
    SCOPED_TRACE(c);
    RunMoeOutcome o = merged[c].get();
    ASSERT_TRUE(o.result.ok()) << o.result.status();
    EXPECT_FALSE(o.result->output.in_place);
    EXPECT_EQ(o.result->output.output, alone[c]);
  }
  EXPECT_EQ((*coalescer)->coalesced_requests(), kCallers);
  // A member launched alone writes its own window.
  MoeRunInput one = inputs[0];
  coalescer->reset();
  ASSERT_TRUE((coalescer = MoeCoalescer::Create(*executor_, {absl::Seconds(30), 1})).ok());
  env_.coalescer = coalescer->get();
  RunMoeOutcome o = Run(one);
  ASSERT_TRUE(o.result.ok()) << o.result.status();
  EXPECT_TRUE(o.result->output.in_place);
  EXPECT_EQ(Window(kOut, alone[0].size()), alone[0]);
  env_.coalescer = nullptr;
}

}  // namespace
}  // namespace kplan
