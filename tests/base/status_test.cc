#include "base/status.h"

#include <new>
#include <stdexcept>

#include "gtest/gtest.h"

namespace kplan {
namespace {

absl::Status StatusOf(void (*thrower)()) {
  try {
    thrower();
  } catch (...) {
    return StatusOfCurrentException("doing it", "it failed");
  }
  return absl::OkStatus();
}

TEST(StatusOfCurrentException, MapsWhatIsThrown) {
  const absl::Status memory = StatusOf([] { throw std::bad_alloc(); });
  EXPECT_TRUE(absl::IsResourceExhausted(memory));
  EXPECT_EQ(memory.message(), "out of memory doing it");
  const absl::Status std_error = StatusOf([] { throw std::runtime_error("boom"); });
  EXPECT_TRUE(absl::IsInternal(std_error));
  EXPECT_EQ(std_error.message(), "it failed: boom");
  const absl::Status other = StatusOf([] { throw 7; });
  EXPECT_TRUE(absl::IsInternal(other));
  EXPECT_EQ(other.message(), "it failed");
}

}  // namespace
}  // namespace kplan
