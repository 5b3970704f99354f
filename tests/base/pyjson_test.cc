#include "base/pyjson.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace kplan {
namespace {

TEST(PyJsonTest, SortsKeysAndUsesPythonSeparators) {
  PyJson::Object o;
  o["b"] = "test";
  o["a"] = 1;
  EXPECT_EQ(PyJson(o).Dumps(), R"({"a": 1, "b": "test"})");
}

// Reference §4.3 vector 1.
TEST(PyJsonTest, HashVectorSimpleObject) {
  PyJson::Object o{{"a", 1}, {"b", "test"}};
  EXPECT_EQ(HashFactors(PyJson(o)),
            "eb2d4c57ea9d69765c7db325847773be77ad55a0f5419f615f3478706a01f679");
}

// Reference §4.3 vector 2: floats, lists, null, bools and a non-ASCII string.
TEST(PyJsonTest, HashVectorMixedTypes) {
  PyJson::Object o{
      {"x", 1.0}, {"y", PyJson::Array{1, 2}}, {"z", nullptr}, {"t", true}, {"u", "\xc3\xa9"}};
  EXPECT_EQ(PyJson(o).Dumps(), R"({"t": true, "u": "\u00e9", "x": 1.0, "y": [1, 2], "z": null})");
  EXPECT_EQ(HashFactors(PyJson(o)),
            "100051466bec0d6317ca0a44cfeb5fb9b1e85809c1c910b15536724ec0704e09");
}

TEST(PyJsonTest, EscapesLikeEnsureAscii) {
  EXPECT_EQ(PyJson("a\"b\\c\n\t\x01\x7f").Dumps(), R"("a\"b\\c\n\t\u0001\u007f")");
  // U+1F600 becomes a surrogate pair.
  EXPECT_EQ(PyJson("\xf0\x9f\x98\x80").Dumps(), R"("\ud83d\ude00")");
}

TEST(PyJsonTest, FloatReprMatchesCPython) {
  EXPECT_EQ(PyFloatRepr(1.0), "1.0");
  EXPECT_EQ(PyFloatRepr(0.1), "0.1");
  EXPECT_EQ(PyFloatRepr(1e-5), "1e-05");
  EXPECT_EQ(PyFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PyFloatRepr(1e20), "1e+20");
  EXPECT_EQ(PyFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PyFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PyFloatRepr(123.456), "123.456");
  EXPECT_EQ(PyFloatRepr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(PyFloatRepr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(PyFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PyFloatRepr(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(PyFloatRepr(-std::numeric_limits<double>::infinity()), "-Infinity");
}

TEST(PyJsonTest, Sha256OfEmptyInput) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

}  // namespace
}  // namespace kplan
