// The CLI's --json: protobuf JSON, with dtypes spelled as the tables spell them;
// the tables' rows.
#include "client/cli/format.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
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
  const std::string json = ToJson(list);
  EXPECT_THAT(json, HasSubstr("\"bytes_done\": \"400\""));
  // --json names the states as the table does, not by the enum's names.
  EXPECT_THAT(json, HasSubstr("\"state\": \"ready\""));
  EXPECT_THAT(json, HasSubstr("\"state\": \"loading\""));
  EXPECT_THAT(json, Not(HasSubstr("EXPERTS_STATE_")));
  // One table: a header, then a row per set.
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << table;
  EXPECT_THAT(lines[0], ::testing::StartsWith("ID  "));
  EXPECT_THAT(lines[3], ::testing::StartsWith("c  "));
  // An expert-parallel set's shards follow the table, under its id.
  v1::ExpertShard* shard = ready->add_shards();
  shard->set_rank(1);
  shard->set_device("cuda:1");
  EXPECT_THAT(FormatExperts(list.experts()),
              HasSubstr("\na shards (expert parallel, 1 ranks):\n  RANK  DEVICE"));
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

// `kplan explain --json`: one document with what the table shows (every
// layer's plan with its candidates, the warnings), in resolve --json's field
// names; it parses as JSON, whatever the warnings' bytes.
TEST(CliJson, ExplainIsOneDocumentOfThePlans) {
  v1::ResolveKernelConfigResponse r;
  r.set_config_hash("not explained");
  v1::MoEPlan* first = r.mutable_moe_plan();
  first->set_backend("TRITON");
  first->set_experts_kernel("TritonExperts");
  v1::MoECandidate* c = first->add_candidates();
  c->set_backend("FLASHINFER_CUTLASS");
  c->set_reason("kernel does not support \"silu\" \xe2\x80\x94 see\n");
  r.add_moe_layer_plans()->set_backend("DEEPGEMM");
  r.add_warnings("AITER MoE is not enabled \xe2\x80\x94 set VLLM_ROCM_USE_AITER=1");
  const std::string json = ExplainToJson(r);
  google::protobuf::Struct doc;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &doc).ok()) << json;
  ASSERT_EQ(doc.fields().size(), 2u) << json;
  const google::protobuf::ListValue& plans = doc.fields().at("moe_plans").list_value();
  ASSERT_EQ(plans.values_size(), 2);
  const auto& p0 = plans.values(0).struct_value().fields();
  EXPECT_EQ(p0.at("backend").string_value(), "TRITON");
  EXPECT_EQ(p0.at("experts_kernel").string_value(), "TritonExperts");  // proto field names
  EXPECT_EQ(p0.at("candidates")
                .list_value()
                .values(0)
                .struct_value()
                .fields()
                .at("reason")
                .string_value(),
            c->reason());
  EXPECT_EQ(plans.values(1).struct_value().fields().at("backend").string_value(), "DEEPGEMM");
  const google::protobuf::ListValue& warnings = doc.fields().at("warnings").list_value();
  ASSERT_EQ(warnings.values_size(), 1);
  EXPECT_EQ(warnings.values(0).string_value(), r.warnings(0));
  EXPECT_THAT(json, Not(HasSubstr("config_hash")));  // resolve's, not the explanation
  // The same document with no warnings: an empty list, still one document.
  r.clear_warnings();
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ExplainToJson(r), &doc).ok());
  EXPECT_EQ(doc.fields().at("warnings").list_value().values_size(), 0);
}

// JSON objects of the CLI escape as JSON does (run-moe's experts_id).
TEST(CliJson, RunMoeJsonParsesWhateverTheId) {
  MoeRunSummary s;
  s.experts_id = "layer \"0\" \xc3\xa9";
  google::protobuf::Struct doc;
  const std::string json = MoeRunToJson(s);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &doc).ok()) << json;
  EXPECT_EQ(doc.fields().at("experts_id").string_value(), s.experts_id);
}

}  // namespace
}  // namespace kplan::cli
