#include "absl/strings/string_view.h"
#include "server/base/pyrepr.h"

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

TEST(PyReprTest, PydanticLiteralError) {
  EXPECT_EQ(PydanticLiteralError({"a"}), "Input should be 'a'");
  EXPECT_EQ(PydanticLiteralError({"a", "b"}), "Input should be 'a' or 'b'");
  EXPECT_EQ(PydanticLiteralError({"a", "b", "c"}), "Input should be 'a', 'b' or 'c'");
}

}  // namespace
}  // namespace kplan
