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

// `kplan experts` shows each set's state: ready, or how far its load came.
TEST(CliTable, ExpertsShowTheirState) {
  v1::ListExpertsResponse list;
  v1::ExpertsInfo* ready = list.add_experts();
  ready->set_experts_id("a");
  ready->set_state(v1::EXPERTS_STATE_READY);
  v1::ExpertsInfo* loading = list.add_experts();
  loading->set_experts_id("b");
  loading->set_state(v1::EXPERTS_STATE_LOADING);
  loading->mutable_progress()->set_bytes_done(400);
  loading->mutable_progress()->set_bytes_total(1000);
  loading->mutable_progress()->set_experts_done(3);
  loading->mutable_progress()->set_experts_total(8);
  v1::ExpertsInfo* queued = list.add_experts();
  queued->set_experts_id("c");
  queued->set_state(v1::EXPERTS_STATE_LOADING);
  queued->mutable_progress()->set_preload(true);
  const std::string table = FormatExperts(list.experts());
  EXPECT_THAT(table, HasSubstr("ready"));
  EXPECT_THAT(table, HasSubstr("loading 40% (3/8 experts)"));
  EXPECT_THAT(table, HasSubstr("preload queued"));
  EXPECT_THAT(ToJson(list), HasSubstr("\"bytes_done\": \"400\""));
}

}  // namespace
}  // namespace kplan::cli
