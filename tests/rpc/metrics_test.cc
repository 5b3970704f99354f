// Metrics' per-method series (server/rpc/metrics.h): what the exposition
// shows after observations through the cached histograms. Every hop and
// latency family of a method under its own name, counted and summed (each
// with its own number of observations and durations exact in binary, so a
// swapped name or slot shows); methods apart; no series for what was not
// observed; threads racing on first observations make one series each.
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

constexpr const char* kHopNames[] = {"decode",      "route",  "queue",    "device",
                                     "answer_wait", "encode", "serialize"};

// The value of the exposition line that starts with `series` ("name{labels}"),
// or -1 when there is none.
double Value(const std::string& page, const std::string& series) {
  const std::string key = series + " ";
  const size_t at = page.find("\n" + key);
  if (at == std::string::npos) return -1;
  const size_t from = at + 1 + key.size();
  return std::stod(page.substr(from, page.find('\n', from) - from));
}

std::string Hop(const char* stat, const char* hop, const std::string& method) {
  return absl::StrCat("kplan_hop_seconds_", stat, "{hop=\"", hop, "\",method=\"", method, "\"}");
}

TEST(MetricsTest, EveryHopUnderItsNameAndMethodsApart) {
  Metrics m({"test", "rev", "", ""});
  // Hop h: h + 1 observations of 2^-(h+1) s.
  for (int h = 0; h < Metrics::kNumHops; ++h) {
    for (int n = 0; n <= h; ++n) {
      m.ObserveHop("RunMoE", static_cast<Metrics::Hop>(h), absl::Seconds(1.0 / (2 << h)));
    }
  }
  m.ObserveHop("RunMoE.shm_channel", Metrics::Hop::kAnswerWait, absl::Milliseconds(250));
  const std::string page = m.Render();
  for (int h = 0; h < Metrics::kNumHops; ++h) {
    SCOPED_TRACE(kHopNames[h]);
    EXPECT_EQ(Value(page, Hop("count", kHopNames[h], "RunMoE")), h + 1);
    EXPECT_EQ(Value(page, Hop("sum", kHopNames[h], "RunMoE")), (h + 1) * (1.0 / (2 << h)));
  }
  EXPECT_EQ(Value(page, Hop("count", "answer_wait", "RunMoE.shm_channel")), 1);
  EXPECT_EQ(Value(page, Hop("sum", "answer_wait", "RunMoE.shm_channel")), 0.25);
  EXPECT_THAT(page, Not(HasSubstr("hop=\"decode\",method=\"RunMoE.shm_channel\"")));
}

TEST(MetricsTest, LatencyFamiliesApartByMethod) {
  Metrics m({"test", "rev", "", ""});
  m.RequestStarted();
  m.RequestFinished("RunMoE", "OK", absl::Milliseconds(500));
  for (int i = 0; i < 2; ++i) m.ObserveQueue("RunMoE", absl::Milliseconds(250));
  for (int i = 0; i < 3; ++i) m.ObserveDevice("RunMoE", absl::Milliseconds(125));
  m.ObserveDevice("RunIrOp", absl::Milliseconds(500));
  const std::string page = m.Render();
  EXPECT_EQ(Value(page, "kplan_requests_total{code=\"OK\",method=\"RunMoE\"}"), 1);
  EXPECT_EQ(Value(page, "kplan_request_duration_seconds_count{method=\"RunMoE\"}"), 1);
  EXPECT_EQ(Value(page, "kplan_request_duration_seconds_sum{method=\"RunMoE\"}"), 0.5);
  EXPECT_EQ(Value(page, "kplan_request_queue_seconds_count{method=\"RunMoE\"}"), 2);
  EXPECT_EQ(Value(page, "kplan_request_queue_seconds_sum{method=\"RunMoE\"}"), 0.5);
  EXPECT_EQ(Value(page, "kplan_request_device_seconds_count{method=\"RunMoE\"}"), 3);
  EXPECT_EQ(Value(page, "kplan_request_device_seconds_sum{method=\"RunMoE\"}"), 0.375);
  EXPECT_EQ(Value(page, "kplan_request_device_seconds_count{method=\"RunIrOp\"}"), 1);
  EXPECT_EQ(Value(page, "kplan_request_queue_seconds_count{method=\"RunIrOp\"}"), -1);
  EXPECT_EQ(Value(page, "kplan_request_duration_seconds_count{method=\"RunIrOp\"}"), -1);
}

TEST(MetricsTest, RacingFirstObservationsMakeOneSeriesEach) {
  Metrics m({"test", "rev", "", ""});
  constexpr int kThreads = 8, kMethods = 3, kRounds = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m] {
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kMethods; ++i) {
          for (int h = 0; h < Metrics::kNumHops; ++h) {
            m.ObserveHop(absl::StrCat("M", i), static_cast<Metrics::Hop>(h), absl::Microseconds(1));
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::string page = m.Render();
  int series = 0;
  for (size_t at = page.find("kplan_hop_seconds_count{"); at != std::string::npos;
       at = page.find("kplan_hop_seconds_count{", at + 1)) {
    ++series;
  }
  EXPECT_EQ(series, kMethods * Metrics::kNumHops);
  for (int i = 0; i < kMethods; ++i) {
    for (int h = 0; h < Metrics::kNumHops; ++h) {
      EXPECT_EQ(Value(page, Hop("count", kHopNames[h], absl::StrCat("M", i))), kThreads * kRounds)
          << "M" << i << " " << kHopNames[h];
    }
  }
}

}  // namespace
}  // namespace kplan::rpc
