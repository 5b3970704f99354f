#include "server/exec/device_executor.h"

#include <atomic>
#include <future>

#include "gtest/gtest.h"
#include "server/base/status.h"

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

}  // namespace
}  // namespace kplan
