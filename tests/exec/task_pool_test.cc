#include "server/exec/task_pool.h"

#include <atomic>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kplan {
namespace {

TEST(TaskPool, RunsTasksOnItsThreadsAtOnce) {
  constexpr int kThreads = 3;
  TaskPool pool(kThreads, "test-pool");
  // Each task waits until all kThreads have started: only a pool that runs
  // them on kThreads threads at once gets past the barrier.
  std::atomic<int> started{0};
  std::vector<std::future<std::thread::id>> ran;
  for (int i = 0; i < kThreads; ++i) {
    auto done = std::make_shared<std::promise<std::thread::id>>();
    ran.push_back(done->get_future());
    pool.Schedule([&started, done] {
      ++started;
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (started.load() < kThreads && absl::Now() < give_up)
        absl::SleepFor(absl::Milliseconds(1));
      done->set_value(std::this_thread::get_id());
    });
  }
  std::vector<std::thread::id> ids;
  for (auto& f : ran) ids.push_back(f.get());
  EXPECT_EQ(started.load(), kThreads);
  for (const std::thread::id& id : ids) EXPECT_NE(id, std::this_thread::get_id());
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  EXPECT_NE(ids[0], ids[2]);
}

TEST(TaskPool, TheDestructorRunsWhatWasScheduled) {
  std::atomic<int> ran{0};
  {
    TaskPool pool(1, "test-pool");
    // The first task holds the only thread while the others queue behind it.
    pool.Schedule([] { absl::SleepFor(absl::Milliseconds(50)); });
    for (int i = 0; i < 100; ++i) pool.Schedule([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(TaskPool, OneThreadRunsTasksInOrder) {
  std::vector<int> order;
  {
    TaskPool pool(1, "test-pool");
    for (int i = 0; i < 50; ++i) pool.Schedule([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

}  // namespace
}  // namespace kplan
