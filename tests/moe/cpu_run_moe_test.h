// The fixture of the RunMoE core tests on the CPU (run_moe_test,
// moe_coalesce_test): an executor of the CPU worker alone, the local CPU
// platform and its executable backends, and Start, which runs one call and
// hands its answer back through a future.
#pragma once

#include <future>
#include <memory>

#include "gtest/gtest.h"
#include "resolve/platform/local.h"
#include "server/moe/run_moe.h"

namespace kplan {

struct RunMoeOutcome {
  absl::StatusOr<RunMoeResult> result = absl::UnknownError("not run");
  MoeRunTiming timing;
};

class CpuRunMoeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceExecutor>> executor =
        DeviceExecutor::Create({}, DeviceExecutor::Options{});
    ASSERT_TRUE(executor.ok()) << executor.status();
    executor_ = *std::move(executor);
    platform_ = LocalPlatform({}, /*have_cuda_kernels=*/false);
    env_.executor = executor_.get();
    env_.platform = &platform_;
    env_.executable_backends = ExecutableMoeBackends(/*have_devices=*/false);
  }

  // Starts `request`: its answer, the status its `fail` got (unless the call
  // brings its own), or RunMoe's synchronous refusal comes through the future.
  std::future<RunMoeOutcome> Start(RunMoeRequest request, RunMoeCall call = {}) {
    auto promise = std::make_shared<std::promise<RunMoeOutcome>>();
    std::future<RunMoeOutcome> future = promise->get_future();
    if (!call.fail) {
      call.fail = [promise](const absl::Status& s) { promise->set_value(RunMoeOutcome{s, {}}); };
    }
    absl::Status queued =
        RunMoe(env_, std::move(request), std::move(call),
               [promise](absl::StatusOr<RunMoeResult> result, const MoeRunTiming& timing) {
                 promise->set_value(RunMoeOutcome{std::move(result), timing});
               });
    if (!queued.ok()) promise->set_value(RunMoeOutcome{queued, {}});
    return future;
  }

  std::unique_ptr<DeviceExecutor> executor_;  // declared first: outlives what submits to it
  Platform platform_;
  RunMoeEnv env_;
};

}  // namespace kplan
