#include "absl/strings/string_view.h"
#include "base/pyrepr.h"

#include "gtest/gtest.h"

namespace kplan {
namespace {

TEST(PyReprTest, StringsUsePythonQuoting) {
  EXPECT_EQ(PyRepr("triton"), "'triton'");
  EXPECT_EQ(PyRepr("it's"), "\"it's\"");
  EXPECT_EQ(PyRepr("a'b\"c"), "'a\\'b\"c'");
  EXPECT_EQ(PyRepr("tab\there"), "'tab\\there'");
  EXPECT_EQ(PyRepr(absl::string_view("\x01", 1)), "'\\x01'");
}

TEST(PyReprTest, ListsAndSortedLists) {
  EXPECT_EQ(PyRepr(std::vector<std::string>{}), "[]");
  EXPECT_EQ(PyRepr(std::vector<std::string>{"b", "a"}), "['b', 'a']");
  EXPECT_EQ(PyReprSorted({"b", "a", "C"}), "['C', 'a', 'b']");
}

TEST(PyReprTest, PydanticInputValueTruncatesLongReprs) {
  EXPECT_EQ(PydanticInputValue("x"), "'x'");
  // repr of 48 chars is 50 bytes: kept whole.
  EXPECT_EQ(PydanticInputValue(std::string(48, 'a')), "'" + std::string(48, 'a') + "'");
  // 102-byte repr: its first 25 bytes, "...", its last 24 (pydantic-core's rule).
  EXPECT_EQ(PydanticInputValue(std::string(100, 'x')),
            "'" + std::string(24, 'x') + "..." + std::string(23, 'x') + "'");
  // Never splits a UTF-8 character: byte 25 falls inside the 2-byte "\xc3\xa9".
  const std::string e_acute = "\xc3\xa9";
  std::string s = std::string(23, 'a') + e_acute + std::string(60, 'b');
  EXPECT_EQ(PydanticInputValue(s), "'" + std::string(23, 'a') + "..." + std::string(23, 'b') + "'");
}

TEST(PyReprTest, PydanticLiteralError) {
  EXPECT_EQ(PydanticLiteralError({"a"}), "Input should be 'a'");
  EXPECT_EQ(PydanticLiteralError({"a", "b"}), "Input should be 'a' or 'b'");
  EXPECT_EQ(PydanticLiteralError({"a", "b", "c"}), "Input should be 'a', 'b' or 'c'");
}

}  // namespace
}  // namespace kplan
