#include "server/exec/device_executor.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "base/status.h"

namespace kplan {
namespace {

TEST(DeviceExecutorTest, RunsInOrderOnTheCpuWorker) {
  auto ex = DeviceExecutor::Create({}, 16).value();
  ASSERT_EQ(ex->size(), 1u);
  std::vector<int> seen;
  std::promise<void> done;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(ex->Submit(0, [&, i](const DeviceSlot& slot, absl::Duration) {
                    EXPECT_EQ(slot.name, "cpu");
                    seen.push_back(i);
                    if (i == 9) done.set_value();
                  }).ok());
  }
  done.get_future().wait();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(seen[i], i);
}

TEST(DeviceExecutorTest, FullQueueIsResourceExhausted) {
  auto ex = DeviceExecutor::Create({}, 2).value();
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  auto blocker = [&, gate](const DeviceSlot&, absl::Duration) {
    gate.wait();
    ++ran;
  };
  ASSERT_TRUE(ex->Submit(0, blocker).ok());  // running (or queued)
  // Fill the queue until it refuses; at most 3 fit (one running + two queued).
  int accepted = 1;
  absl::Status s;
  while ((s = ex->Submit(0, blocker)).ok()) ++accepted;
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LE(accepted, 3);
  release.set_value();
  ex.reset();  // drains what was queued
  EXPECT_EQ(ran.load(), accepted);
}

TEST(DeviceExecutorTest, ResolvesDeviceNames) {
  std::vector<LocalDevice> gpus = {{0, "g", {9, 0}, 1, 1}, {1, "g", {9, 0}, 1, 1}};
  auto ex = DeviceExecutor::Create(gpus, 4).value();
  EXPECT_EQ(ex->Resolve("", "device").value(), 1u);  // the first GPU
  EXPECT_EQ(ex->slot(ex->Resolve("cuda:1", "device").value()).cuda_device, 1);
  EXPECT_EQ(ex->Resolve("cpu", "device").value(), 0u);
  absl::StatusOr<size_t> bad = ex->Resolve("cuda:7", "device");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FieldOf(bad.status()).value(), "device");
  auto cpu_only = DeviceExecutor::Create({}, 4).value();
  EXPECT_EQ(cpu_only->Resolve("", "device").value(), 0u);
}

// Holds the worker in its first job until Release(): everything submitted
// meanwhile is queued, so the order the worker picks is the lane policy's
// alone (no timing involved).
class Gate {
 public:
  DeviceExecutor::Work Blocker() {
    return [this](const DeviceSlot&, absl::Duration) {
      started_.set_value();
      open_.wait();
    };
  }
  void WaitStarted() { started_future_.wait(); }
  void Release() { release_.set_value(); }

 private:
  std::promise<void> started_;
  std::future<void> started_future_ = started_.get_future();
  std::promise<void> release_;
  std::shared_future<void> open_ = release_.get_future().share();
};

// Records which job ran, in order.
struct Order {
  std::mutex mu;
  std::vector<std::string> ran;
  DeviceExecutor::Job Job(const std::string& name, int64_t bytes) {
    DeviceExecutor::Job job;
    job.bytes = bytes;
    job.work = [this, name](const DeviceSlot&, absl::Duration) {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(name);
    };
    return job;
  }
};

constexpr int64_t kLarge = DeviceExecutor::kLargeJobBytes;

TEST(DeviceExecutorTest, QueuedBytesBeyondTheBudgetAreResourceExhausted) {
  DeviceExecutor::Options options;
  options.max_queue_depth = 16;
  options.max_queued_bytes = 1000;
  auto ex = DeviceExecutor::Create({}, options).value();
  Gate gate;
  DeviceExecutor::Job blocker;
  blocker.work = gate.Blocker();
  blocker.bytes = 600;  // held while it runs
  ASSERT_TRUE(ex->Submit(0, std::move(blocker)).ok());
  gate.WaitStarted();
  Order order;
  absl::Status over = ex->Submit(0, order.Job("over", 500));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("max_queued_bytes"), absl::string_view::npos) << over;
  EXPECT_TRUE(ex->Submit(0, order.Job("fits", 400)).ok());
  EXPECT_EQ(ex->queued_bytes(), 1000);
  gate.Release();
  // Released when the work finished: the whole budget is free again.
  std::promise<void> fence;
  ASSERT_TRUE(ex->Submit(0, [&](const DeviceSlot&, absl::Duration) { fence.set_value(); }).ok());
  fence.get_future().wait();
  EXPECT_EQ(ex->queued_bytes(), 0);
  EXPECT_TRUE(ex->Submit(0, order.Job("all", 1000)).ok());
  ex.reset();
  EXPECT_EQ(order.ran, (std::vector<std::string>{"fits", "all"}));
}

TEST(DeviceExecutorTest, SmallWorkRunsBeforeQueuedLargeWork) {
  auto ex = DeviceExecutor::Create({}, 64).value();
  Gate gate;
  ASSERT_TRUE(ex->Submit(0, gate.Blocker()).ok());
  gate.WaitStarted();
  Order order;
  ASSERT_TRUE(ex->Submit(0, order.Job("large1", 62 * kLarge)).ok());
  ASSERT_TRUE(ex->Submit(0, order.Job("large2", kLarge)).ok());
  ASSERT_TRUE(ex->Submit(0, order.Job("small1", 100)).ok());
  ASSERT_TRUE(ex->Submit(0, order.Job("small2", kLarge - 1)).ok());
  gate.Release();
  ex.reset();
  // FIFO within each lane; small work does not wait behind queued large work.
  EXPECT_EQ(order.ran, (std::vector<std::string>{"small1", "small2", "large1", "large2"}));
}

TEST(DeviceExecutorTest, LargeWorkIsNotStarvedBySmallWork) {
  auto ex = DeviceExecutor::Create({}, 64).value();
  Gate gate;
  ASSERT_TRUE(ex->Submit(0, gate.Blocker()).ok());
  gate.WaitStarted();
  Order order;
  ASSERT_TRUE(ex->Submit(0, order.Job("large", kLarge)).ok());
  const int smalls = DeviceExecutor::kMaxSmallOvertakes + 4;
  for (int i = 0; i < smalls; ++i) {
    ASSERT_TRUE(ex->Submit(0, order.Job(absl::StrCat("s", i), 1)).ok());
  }
  gate.Release();
  ex.reset();
  ASSERT_EQ(order.ran.size(), static_cast<size_t>(smalls + 1));
  // The large head runs once kMaxSmallOvertakes small jobs have overtaken it.
  EXPECT_EQ(order.ran[DeviceExecutor::kMaxSmallOvertakes], "large");
  for (int i = 0; i < DeviceExecutor::kMaxSmallOvertakes; ++i) {
    EXPECT_EQ(order.ran[i], absl::StrCat("s", i));
  }
}

// A job that is dropped or throws reports through `fail`, exactly once, and
// its work does not run (or runs no further); the worker goes on.
struct Outcome {
  std::atomic<int> ran{0};
  std::atomic<int> failed{0};
  absl::Status status;
  std::promise<void> done;
  DeviceExecutor::Job Job(std::function<void()> body = [] {}) {
    DeviceExecutor::Job job;
    job.work = [this, body](const DeviceSlot&, absl::Duration) {
      ++ran;
      body();
      done.set_value();
    };
    job.fail = [this](const absl::Status& s) {
      ++failed;
      status = s;
      done.set_value();
    };
    return job;
  }
  void Wait() { done.get_future().wait(); }
};

TEST(DeviceExecutorTest, ExpiredWorkIsDroppedWithDeadlineExceeded) {
  auto ex = DeviceExecutor::Create({}, 8).value();
  Gate gate;
  ASSERT_TRUE(ex->Submit(0, gate.Blocker()).ok());
  gate.WaitStarted();
  Outcome expired;
  DeviceExecutor::Job job = expired.Job();
  job.deadline = absl::Now() - absl::Seconds(1);
  job.cancelled = [] { return true; };  // gRPC marks expired calls cancelled too
  ASSERT_TRUE(ex->Submit(0, std::move(job)).ok());
  gate.Release();
  expired.Wait();
  EXPECT_EQ(expired.ran.load(), 0);
  EXPECT_EQ(expired.failed.load(), 1);
  EXPECT_EQ(expired.status.code(), absl::StatusCode::kDeadlineExceeded) << expired.status;
}

TEST(DeviceExecutorTest, CancelledWorkIsDropped) {
  auto ex = DeviceExecutor::Create({}, 8).value();
  Gate gate;
  ASSERT_TRUE(ex->Submit(0, gate.Blocker()).ok());
  gate.WaitStarted();
  std::atomic<bool> cancelled{false};
  Outcome outcome;
  DeviceExecutor::Job job = outcome.Job();
  job.deadline = absl::Now() + absl::Hours(1);
  job.cancelled = [&] { return cancelled.load(); };
  ASSERT_TRUE(ex->Submit(0, std::move(job)).ok());
  cancelled = true;  // the client gave up while the job was queued
  gate.Release();
  outcome.Wait();
  EXPECT_EQ(outcome.ran.load(), 0);
  EXPECT_EQ(outcome.failed.load(), 1);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kCancelled) << outcome.status;
}

TEST(DeviceExecutorTest, ExceptionsBecomeStatusesAndTheWorkerGoesOn) {
  auto ex = DeviceExecutor::Create({}, 8).value();
  Outcome oom, broken, fine;
  ASSERT_TRUE(ex->Submit(0, oom.Job([] { throw std::bad_alloc(); })).ok());
  ASSERT_TRUE(ex->Submit(0, broken.Job([] { throw std::runtime_error("boom"); })).ok());
  ASSERT_TRUE(ex->Submit(0, fine.Job()).ok());
  oom.Wait();
  broken.Wait();
  fine.Wait();
  EXPECT_EQ(oom.status.code(), absl::StatusCode::kResourceExhausted) << oom.status;
  EXPECT_EQ(broken.status.code(), absl::StatusCode::kInternal) << broken.status;
  EXPECT_NE(broken.status.message().find("boom"), absl::string_view::npos);
  EXPECT_EQ(fine.ran.load(), 1);
  EXPECT_EQ(fine.failed.load(), 0);
  EXPECT_EQ(oom.failed.load() + broken.failed.load(), 2);
}

// inline_ok work runs inside Submit on the submitting thread when the
// worker is idle; behind running or queued work it queues as before, and
// the slot never runs two jobs at once.
TEST(DeviceExecutorTest, InlineWorkRunsOnTheSubmitterWhenIdle) {
  auto ex = DeviceExecutor::Create({}, 16).value();
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id ran_on;
  DeviceExecutor::Job job;
  job.inline_ok = true;
  job.bytes = 100;
  job.work = [&](const DeviceSlot& slot, absl::Duration) {
    EXPECT_EQ(slot.name, "cpu");
    ran_on = std::this_thread::get_id();
  };
  ASSERT_TRUE(ex->Submit(0, job).ok());
  EXPECT_EQ(ran_on, me);  // ran before Submit returned
  EXPECT_EQ(ex->inline_runs(), 1);
  EXPECT_EQ(ex->queued_bytes(), 0);

  // Busy worker: inline_ok work queues behind it and runs on the worker.
  std::promise<void> release, started;
  std::shared_future<void> gate = release.get_future().share();
  ASSERT_TRUE(ex->Submit(0, [&, gate](const DeviceSlot&, absl::Duration) {
                  started.set_value();
                  gate.wait();
                }).ok());
  started.get_future().wait();
  std::promise<std::thread::id> second;
  job.work = [&](const DeviceSlot&, absl::Duration) {
    second.set_value(std::this_thread::get_id());
  };
  ASSERT_TRUE(ex->Submit(0, job).ok());
  EXPECT_EQ(ex->queue_size(0), 1u);
  release.set_value();
  EXPECT_NE(second.get_future().get(), me);
  EXPECT_EQ(ex->inline_runs(), 1);

  // Large work runs inline on an idle worker only with inline_large_ok:
  // first a small job that runs inline shows the worker is idle, then the
  // large one.
  for (bool large_ok : {false, true}) {
    SCOPED_TRACE(large_ok ? "inline_large_ok" : "inline_ok only");
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    job.bytes = 100;
    job.inline_large_ok = false;
    job.work = [&](const DeviceSlot&, absl::Duration) { ran_on = std::this_thread::get_id(); };
    do {
      ran_on = std::thread::id();
      ASSERT_TRUE(ex->Submit(0, job).ok());
      while (ran_on == std::thread::id() && absl::Now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } while (ran_on != me && absl::Now() < give_up);
    ASSERT_EQ(ran_on, me) << "the worker never became idle";
    job.bytes = DeviceExecutor::kLargeJobBytes;
    job.inline_large_ok = large_ok;
    std::promise<std::thread::id> large;
    job.work = [&](const DeviceSlot&, absl::Duration) {
      large.set_value(std::this_thread::get_id());
    };
    ASSERT_TRUE(ex->Submit(0, job).ok());
    EXPECT_EQ(large.get_future().get() == me, large_ok);
    if (large_ok) {
      EXPECT_EQ(ex->queued_bytes(), 0);  // released before Submit returned
    }
  }
}

TEST(DeviceExecutorTest, InlineAndWorkerJobsNeverOverlapOnASlot) {
  auto ex = DeviceExecutor::Create({}, 256).value();
  std::atomic<int> running{0}, overlaps{0}, done{0};
  auto work = [&](const DeviceSlot&, absl::Duration) {
    if (running.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    running.fetch_sub(1);
    done.fetch_add(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        DeviceExecutor::Job job;
        job.inline_ok = (i + t) % 2 == 0;
        job.work = work;
        while (!ex->Submit(0, job).ok()) std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (done.load() < 200 && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(done.load(), 200) << "jobs were lost";
  EXPECT_EQ(overlaps.load(), 0);
  // How many ran inline depends on timing (none at all under TSan at times);
  // InlineWorkRunsOnTheSubmitterWhenIdle covers that they do.
}

}  // namespace
}  // namespace kplan
