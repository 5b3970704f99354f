// The server's log formats: JSON lines with time, level, message and the
// event's fields; text lines with the fields as key=value.
#include "server/rpc/logging.h"

#include <memory>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"

namespace kplan::rpc {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// Points the default logger at a string for the test, then restores it.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
  }
  void TearDown() override { spdlog::set_default_logger(saved_); }
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> saved_;
};

TEST_F(LoggingTest, JsonLineHasTimeLevelMessageAndFields) {
  SetLogFormat(LogFormat::kJson);
  LogWithFields(spdlog::level::warn, "ResolveKernelConfig failed",
                {{"method", "ResolveKernelConfig"},
                 {"code", "INVALID_ARGUMENT"},
                 {"error", "a \"quoted\"\nline"}});
  spdlog::info("plain {}", 7);
  std::istringstream lines(out_.str());
  std::string first, second, extra;
  ASSERT_TRUE(std::getline(lines, first));
  ASSERT_TRUE(std::getline(lines, second));
  EXPECT_FALSE(std::getline(lines, extra)) << "one object per line";
  nlohmann::json a = nlohmann::json::parse(first);
  EXPECT_EQ(a["level"], "warning");
  EXPECT_EQ(a["message"], "ResolveKernelConfig failed");
  EXPECT_EQ(a["method"], "ResolveKernelConfig");
  EXPECT_EQ(a["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(a["error"], "a \"quoted\"\nline");
  EXPECT_THAT(a["time"].get<std::string>(),
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"));
  EXPECT_TRUE(a["thread"].is_number());
  nlohmann::json b = nlohmann::json::parse(second);
  EXPECT_EQ(b["level"], "info");
  EXPECT_EQ(b["message"], "plain 7");
  EXPECT_FALSE(b.contains("method")) << "fields belong to their own line only";
}

TEST_F(LoggingTest, JsonSurvivesInvalidUtf8) {
  SetLogFormat(LogFormat::kJson);
  LogWithFields(spdlog::level::warn, "bad bytes", {{"error", std::string("\xff\xfe", 2)}});
  nlohmann::json a = nlohmann::json::parse(out_.str());
  EXPECT_EQ(a["message"], "bad bytes");
  EXPECT_FALSE(a["error"].get<std::string>().empty());
}

TEST_F(LoggingTest, TextLineHasFieldsAsKeyValue) {
  SetLogFormat(LogFormat::kText);
  LogWithFields(spdlog::level::warn, "RunMoE failed",
                {{"code", "NOT_FOUND"}, {"error", "no set \"x\""}, {"field", ""}});
  spdlog::info("plain");
  const std::string text = out_.str();
  EXPECT_THAT(text, HasSubstr("[warning] RunMoE failed code=NOT_FOUND error=\"no set \\\"x\\\"\" "
                              "field=\"\"\n"));
  EXPECT_THAT(text, HasSubstr("[info] plain\n"));
}

// A token bucket: a burst of `per_second` lines, then one each 1/per_second
// seconds; the refused ones are counted into the next line let through.
TEST(LogRateLimiterTest, BurstThenRateWithTheCountOfThoseLeftOut) {
  LogRateLimiter limiter(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t left_out = -1;
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(limiter.Allow(t0, &left_out)) << i;
    EXPECT_EQ(left_out, 0);
  }
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(limiter.Allow(t0 + absl::Milliseconds(i), &left_out));
  EXPECT_TRUE(limiter.Allow(t0 + absl::Milliseconds(251), &left_out));  // a quarter second: one
  EXPECT_EQ(left_out, 7);
  EXPECT_FALSE(limiter.Allow(t0 + absl::Milliseconds(260), &left_out));
  // A long quiet time refills the burst, not more.
  const absl::Time t1 = t0 + absl::Hours(1);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(limiter.Allow(t1, &left_out)) << i;
  EXPECT_FALSE(limiter.Allow(t1, &left_out));
  // A clock that steps back gives nothing at once, and refills from there
  // on (had it waited for the later time, the log would stay shut an hour).
  EXPECT_FALSE(limiter.Allow(t0, &left_out));
  EXPECT_TRUE(limiter.Allow(t0 + absl::Milliseconds(251), &left_out));
  EXPECT_EQ(left_out, 2);
}

TEST(LogRateLimiterTest, BelowOneASecondStillLetsOneThrough) {
  LogRateLimiter limiter(0.5);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t left_out = 0;
  EXPECT_TRUE(limiter.Allow(t0, &left_out));
  EXPECT_FALSE(limiter.Allow(t0 + absl::Seconds(1), &left_out));
  EXPECT_TRUE(limiter.Allow(t0 + absl::Seconds(2), &left_out));
  EXPECT_EQ(left_out, 1);
}

// A client failing calls in a loop gets the burst logged, then nothing but
// the count; without a limiter every one is logged.
TEST_F(LoggingTest, FailedCallsPastTheRateAreCountedNotLogged) {
  SetLogFormat(LogFormat::kJson);
  absl::Time now = absl::FromUnixSeconds(1000);
  LogRateLimiter limiter(2, [&now] { return now; });
  for (int i = 0; i < 50; ++i) {
    LogFailedCall(&limiter, "RunMoE failed", {{"code", "INVALID_ARGUMENT"}});
  }
  int lines = 0;
  std::istringstream in(out_.str());
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 2);
  out_.str("");
  now += absl::Milliseconds(550);  // one more line's worth
  LogFailedCall(&limiter, "RunMoE failed", {{"code", "NOT_FOUND"}});
  std::istringstream after(out_.str());
  std::string count_line, call_line;
  ASSERT_TRUE(std::getline(after, count_line));
  ASSERT_TRUE(std::getline(after, call_line));
  EXPECT_EQ(nlohmann::json::parse(count_line)["count"], "48");
  EXPECT_EQ(nlohmann::json::parse(call_line)["code"], "NOT_FOUND");
  out_.str("");
  for (int i = 0; i < 50; ++i) LogFailedCall(nullptr, "RunMoE failed", {{"code", "X"}});
  std::istringstream all(out_.str());
  lines = 0;
  for (std::string line; std::getline(all, line);) ++lines;
  EXPECT_EQ(lines, 50);
}

TEST(LogFormatTest, Parse) {
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(ParseLogFormat("xml").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kplan::rpc
