#include "server/exec/task_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kplan {
namespace {

TEST(TaskPool, RunsTasksOnItsThreadsAtOnce) {
  constexpr int kThreads = 3;
  TaskPool pool(kThreads, "test-pool");
  ASSERT_EQ(pool.size(), kThreads);
  // Each task waits until all kThreads have started: only a pool that runs
  // them on kThreads threads at once gets past the barrier.
  auto started = std::make_shared<std::atomic<int>>(0);
  std::vector<std::future<std::thread::id>> ran;
  for (int i = 0; i < kThreads; ++i) {
    auto done = std::make_shared<std::promise<std::thread::id>>();
    ran.push_back(done->get_future());
    pool.Run([started, done] {
      ++*started;
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (started->load() < kThreads && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      done->set_value(std::this_thread::get_id());
    });
  }
  std::vector<std::thread::id> ids;
  for (auto& f : ran) ids.push_back(f.get());
  EXPECT_EQ(started->load(), kThreads);
  for (const std::thread::id& id : ids) EXPECT_NE(id, std::this_thread::get_id());
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  EXPECT_NE(ids[0], ids[2]);
}

TEST(TaskPool, TheDestructorRunsWhatWasQueued) {
  std::atomic<int> ran{0};
  {
    TaskPool pool(1, "test-pool");
    // The first task holds the only thread while the others queue behind it.
    pool.Run([] { absl::SleepFor(absl::Milliseconds(50)); });
    for (int i = 0; i < 100; ++i) pool.Run([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(TaskPool, OneThreadRunsTasksInOrder) {
  std::vector<int> order;
  {
    TaskPool pool(1, "test-pool");
    for (int i = 0; i < 50; ++i) pool.Run([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(TaskPool, AFullQueueRunsTheTaskOnTheCaller) {
  TaskPool pool(1, "test-pool", /*max_queued=*/1);
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto holding = std::make_shared<std::promise<void>>();
  pool.Run([holding, released] {  // holds the thread
    holding->set_value();
    released.wait();
  });
  holding->get_future().wait();
  auto queued_on = std::make_shared<std::promise<std::thread::id>>();
  std::future<std::thread::id> queued = queued_on->get_future();
  std::thread::id full_on;
  pool.Run([queued_on] { queued_on->set_value(std::this_thread::get_id()); });  // queued
  pool.Run([&full_on] { full_on = std::this_thread::get_id(); });               // full: runs here
  EXPECT_EQ(full_on, std::this_thread::get_id());
  release->set_value();
  EXPECT_NE(queued.get(), std::this_thread::get_id());
}

TEST(TaskPool, WhatATaskThrowsReachesItsErrorCallback) {
  TaskPool pool(1, "test-pool");
  std::promise<absl::Status> memory, other;
  pool.Run([] { throw std::bad_alloc(); },
           [&memory](const absl::Status& s) { memory.set_value(s); });
  pool.Run([] { throw std::runtime_error("boom"); },
           [&other](const absl::Status& s) { other.set_value(s); });
  // A throwing error callback and a task without one are logged, not fatal.
  pool.Run([] { throw std::runtime_error("again"); },
           [](const absl::Status&) { throw std::runtime_error("callback"); });
  pool.Run([] { throw std::runtime_error("no callback"); });
  EXPECT_TRUE(absl::IsResourceExhausted(memory.get_future().get()));
  const absl::Status s = other.get_future().get();
  EXPECT_TRUE(absl::IsInternal(s));
  EXPECT_NE(s.message().find("boom"), absl::string_view::npos);
  std::promise<void> alive;
  pool.Run([&alive] { alive.set_value(); });
  EXPECT_EQ(alive.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

}  // namespace
}  // namespace kplan
