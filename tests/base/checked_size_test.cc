#include "base/checked_size.h"

#include <gtest/gtest.h>

#include "base/client_text.h"
#include "base/status.h"

namespace kplan {
namespace {

TEST(CheckedSize, MulAndAddDetectOverflow) {
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(CheckedMul(INT64_MIN, -1).has_value());
  EXPECT_EQ(CheckedAdd(INT64_MAX - 1, 1), INT64_MAX);
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
}

TEST(CheckedSize, ElementsOfOrdinaryShapes) {
  EXPECT_EQ(*ShapeElements({}, "x"), 1);
  EXPECT_EQ(*ShapeElements({3, 5, 7}, "x"), 105);
  EXPECT_EQ(*ShapeElements({4, 0, 9}, "x"), 0);
}

TEST(CheckedSize, ProductThatWrapsIsRejectedNamingTheField) {
  // 2^61 * 8 bytes wraps to 0 in int64: the bug class this type exists for.
  absl::StatusOr<int64_t> b = ShapeBytes({int64_t{1} << 61}, 8, "hidden_states");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(b.status()), "hidden_states.shape");
  EXPECT_FALSE(ShapeElements({int64_t{1} << 32, int64_t{1} << 32}, "x").ok());
}

TEST(CheckedSize, EmptyTensorsWithHugeLeadingDimsAreRejected) {
  // [2^62, 0] has no elements but 2^62 rows: a kernel looping over rows spins.
  EXPECT_FALSE(ShapeElements({int64_t{1} << 62, 0}, "x").ok());
  EXPECT_FALSE(ShapeElements({int64_t{1} << 30, int64_t{1} << 30, 0}, "x").ok());
  EXPECT_EQ(*ShapeElements({1 << 20, 0}, "x"), 0);
}

TEST(CheckedSize, NegativeDimsAndTooManyDims) {
  absl::StatusOr<int64_t> n = ShapeElements({4, -1}, "inputs.x");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(FieldOf(n.status()), "inputs.x.shape");
  EXPECT_NE(n.status().message().find("dim 1 is negative"), absl::string_view::npos);
  std::vector<int64_t> many(kMaxTensorDims + 1, 1);
  EXPECT_FALSE(ShapeElements(many, "x").ok());
  EXPECT_TRUE(ShapeElements(std::vector<int64_t>(kMaxTensorDims, 1), "x").ok());
}

TEST(CheckedSize, LimitsAreHonoured) {
  ShapeLimits limits;
  limits.max_elements = 100;
  limits.max_bytes = 200;
  EXPECT_TRUE(ShapeBytes({10, 10}, 2, "x", limits).ok());
  EXPECT_FALSE(ShapeBytes({10, 10}, 4, "x", limits).ok());
  EXPECT_FALSE(ShapeElements({101}, "x", limits).ok());
}

TEST(CheckedSize, TensorBytesMustMatchTheData) {
  EXPECT_EQ(*CheckTensorBytes({2, 3}, 4, 24, "x"), 6);
  absl::StatusOr<int64_t> short_data = CheckTensorBytes({2, 3}, 4, 20, "router_logits");
  ASSERT_FALSE(short_data.ok());
  EXPECT_EQ(FieldOf(short_data.status()), "router_logits.data");
  // The wrapped product (0) must not match empty data.
  EXPECT_FALSE(CheckTensorBytes({int64_t{1} << 61, 8}, 2, 0, "x").ok());
}

TEST(ClientText, ShortensAndEscapes) {
  EXPECT_EQ(ClientText("plain"), "plain");
  EXPECT_EQ(ClientText("a\nb\x1b[31m\\"), "a\\x0ab\\x1b[31m\\x5c");
  const std::string text = ClientText(std::string(5000, 'x'));
  EXPECT_EQ(text, std::string(128, 'x') + "...(+4872 bytes)");
}

}  // namespace
}  // namespace kplan
