// The CLI's --json: protobuf JSON, with dtypes spelled as the tables spell them.
#include "client/cli/format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kplan::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(CliJson, DTypesAreTheTablesWords) {
  v1::ListExpertsResponse list;
  v1::ExpertsInfo* a = list.add_experts();
  a->set_experts_id("DTYPE_FLOAT16");  // a value, never rewritten
  a->set_dtype(v1::DTYPE_BFLOAT16);
  list.add_experts()->set_dtype(v1::DTYPE_FLOAT8_E4M3);
  const std::string json = ToJson(list);
  EXPECT_THAT(json, HasSubstr("\"dtype\": \"bfloat16\""));
  EXPECT_THAT(json, HasSubstr("\"dtype\": \"float8_e4m3\""));
  EXPECT_THAT(json, HasSubstr("\"experts_id\": \"DTYPE_FLOAT16\""));
  EXPECT_THAT(json, Not(HasSubstr("DTYPE_BFLOAT16")));
  EXPECT_THAT(FormatExperts(list.experts()), HasSubstr("bfloat16"));
}

}  // namespace
}  // namespace kplan::cli
