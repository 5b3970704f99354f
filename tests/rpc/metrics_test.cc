// Metrics' per-method series (server/rpc/metrics.h): what the exposition
// shows after observations through the cached histograms: one series per
// (method, hop) observed, counted and summed, none for a hop not observed;
// the latency families by method; threads racing on a method's first
// observation make one series.
#include "server/rpc/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kplan::rpc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, HopsAreCountedPerMethodAndHop) {
  Metrics m({"test", "rev", "", ""});
  m.ObserveHop("RunMoE", Metrics::Hop::kDecode, absl::Milliseconds(250));  // exact in binary
  m.ObserveHop("RunMoE", Metrics::Hop::kDecode, absl::Milliseconds(500));
  m.ObserveHop("RunMoE.shm_channel", Metrics::Hop::kAnswerWait, absl::Microseconds(7));
  m.ObserveHop("RunMoE", Metrics::Hop::kSerialize, absl::Microseconds(2));
  const std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("kplan_hop_seconds_count{hop=\"decode\",method=\"RunMoE\"} 2"));
  EXPECT_THAT(page, HasSubstr("kplan_hop_seconds_sum{hop=\"decode\",method=\"RunMoE\"} 0.75"));
  EXPECT_THAT(
      page,
      HasSubstr("kplan_hop_seconds_count{hop=\"answer_wait\",method=\"RunMoE.shm_channel\"} 1"));
  EXPECT_THAT(page, HasSubstr("kplan_hop_seconds_count{hop=\"serialize\",method=\"RunMoE\"} 1"));
  // Not observed: no series.
  EXPECT_THAT(page, Not(HasSubstr("hop=\"route\"")));
  EXPECT_THAT(page, Not(HasSubstr("hop=\"decode\",method=\"RunMoE.shm_channel\"")));
}

TEST(MetricsTest, LatencyFamiliesByMethod) {
  Metrics m({"test", "rev", "", ""});
  m.RequestStarted();
  m.RequestFinished("RunMoE", "OK", absl::Microseconds(40));
  m.ObserveQueue("RunMoE", absl::Microseconds(1));
  m.ObserveQueue("RunMoE", absl::Microseconds(2));
  m.ObserveDevice("RunIrOp", absl::Microseconds(9));
  const std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("kplan_requests_total{code=\"OK\",method=\"RunMoE\"} 1"));
  EXPECT_THAT(page, HasSubstr("kplan_request_duration_seconds_count{method=\"RunMoE\"} 1"));
  EXPECT_THAT(page, HasSubstr("kplan_request_queue_seconds_count{method=\"RunMoE\"} 2"));
  EXPECT_THAT(page, HasSubstr("kplan_request_device_seconds_count{method=\"RunIrOp\"} 1"));
  EXPECT_THAT(page, Not(HasSubstr("kplan_request_device_seconds_count{method=\"RunMoE\"}")));
}

TEST(MetricsTest, RacingFirstObservationsMakeOneSeries) {
  Metrics m({"test", "rev", "", ""});
  constexpr int kThreads = 8, kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kEach; ++i) {
        m.ObserveHop(absl::StrCat("M", i % 3),
                     static_cast<Metrics::Hop>((i + t) % Metrics::kNumHops), absl::Microseconds(1));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::string page = m.Render();
  // Every observation counted once, whatever thread made its series.
  int64_t total = 0;
  for (size_t at = page.find("kplan_hop_seconds_count{"); at != std::string::npos;
       at = page.find("kplan_hop_seconds_count{", at + 1)) {
    const size_t sp = page.find("} ", at);
    total += std::stoll(page.substr(sp + 2, page.find('\n', sp) - sp - 2));
  }
  EXPECT_EQ(total, int64_t{kThreads} * kEach);
}

}  // namespace
}  // namespace kplan::rpc
