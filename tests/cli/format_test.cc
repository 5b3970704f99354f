// The CLI's --json: protobuf JSON, with dtypes spelled as the tables spell them;
// the tables' rows.
#include "client/cli/format.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

// `kplan run-moe` says whether the call shared a launch, in the table and
// in --json (MoETiming.coalesced_requests).
TEST(CliTable, MoeRunSaysWhetherItWasCoalesced) {
  MoeRunSummary s;
  s.experts_id = "x";
  s.plan.set_backend("kplan");
  for (const auto& [shared, says] :
       std::vector<std::pair<int, std::string>>{{0, "no (coalescing off or not applicable)"},
                                                {1, "no (ran alone)"},
                                                {5, "yes (5 requests in one launch)"}}) {
    s.timing.set_coalesced_requests(shared);
    EXPECT_THAT(FormatMoeRun(s), HasSubstr(says)) << shared;
    EXPECT_THAT(MoeRunToJson(s), HasSubstr(absl::StrCat("\"coalesced_requests\": ", shared)));
  }
}

}  // namespace
}  // namespace kplan::cli
