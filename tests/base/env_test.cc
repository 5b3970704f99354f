#include "base/env.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "base/client_text.h"
#include "base/status.h"

namespace kplan {
namespace {

TEST(EnvVarsTest, SetFalseDiffersFromAbsent) {
  EnvVars env({{"VLLM_USE_DEEP_GEMM", "0"}});
  EXPECT_TRUE(env.IsSet("VLLM_USE_DEEP_GEMM"));
  EXPECT_FALSE(env.Flag("VLLM_USE_DEEP_GEMM", true));
  EXPECT_FALSE(env.IsSet("VLLM_MOE_USE_DEEP_GEMM"));
  EXPECT_TRUE(env.Flag("VLLM_MOE_USE_DEEP_GEMM", true));
}

TEST(EnvVarsTest, ParsesVllmBooleansAsEnvsPyDoes) {
  // bool(int(v)): Python int() syntax.
  for (const char* t : {"1", "2", " 1 ", "+3", "-1", "1_0", "007", "\t5\n"}) {
    EXPECT_TRUE(ParseEnvBool(t, EnvBoolForm::kInt)) << t;
  }
  for (const char* f : {"0", "-0", "0_0", "00", "true", "", "1__0", "_1", "1_", "0x1", "1.0"}) {
    EXPECT_FALSE(ParseEnvBool(f, EnvBoolForm::kInt)) << f;
  }
  // v.lower() in ("true", "1"): no stripping, no other spellings.
  for (const char* t : {"1", "true", "True", "TRUE"}) {
    EXPECT_TRUE(ParseEnvBool(t, EnvBoolForm::kTrueOrOne)) << t;
  }
  for (const char* f : {"0", "false", " 1", "yes", "on", "2", "banana", ""}) {
    EXPECT_FALSE(ParseEnvBool(f, EnvBoolForm::kTrueOrOne)) << f;
  }
  // v.strip().lower() in ("1", "true").
  EXPECT_TRUE(ParseEnvBool(" TRUE\n", EnvBoolForm::kStrippedTrueOrOne));
  EXPECT_FALSE(ParseEnvBool("yes", EnvBoolForm::kStrippedTrueOrOne));

  EXPECT_EQ(VllmEnvBoolForm("VLLM_USE_DEEP_GEMM"), EnvBoolForm::kInt);
  EXPECT_EQ(VllmEnvBoolForm("VLLM_USE_OINK_OPS"), EnvBoolForm::kTrueOrOne);
  EXPECT_EQ(VllmEnvBoolForm("VLLM_TEST_FORCE_FP8_MARLIN"), EnvBoolForm::kStrippedTrueOrOne);
  EXPECT_FALSE(EnvVars({{"VLLM_USE_OINK_OPS", "yes"}}).Flag("VLLM_USE_OINK_OPS", false));
  EXPECT_TRUE(EnvVars({{"VLLM_USE_DEEP_GEMM", " 2"}}).Flag("VLLM_USE_DEEP_GEMM", false));
}

TEST(EnvVarsTest, IntVariablesThatIntRefusesAreInvalid) {
  EXPECT_TRUE(ValidateVllmEnv(EnvVars({{"VLLM_USE_DEEP_GEMM", "0"}})).ok());
  EXPECT_TRUE(ValidateVllmEnv(EnvVars({{"VLLM_USE_OINK_OPS", "maybe"}})).ok());  // reads false
  absl::Status s = ValidateVllmEnv(EnvVars({{"VLLM_BATCH_INVARIANT", "true"}}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(s).value(), "env.VLLM_BATCH_INVARIANT");
  EXPECT_EQ(s.message(), "invalid literal for int() with base 10: 'true'");
  EXPECT_EQ(ValidateVllmEnv(EnvVars({{"VLLM_USE_DEEP_GEMM", ""}})).message(),
            "invalid literal for int() with base 10: ''");
  // A long value is cut to the client-text limit, escaped as Python's repr.
  const std::string message(
      ValidateVllmEnv(EnvVars({{"VLLM_USE_DEEP_GEMM", std::string(1000, 'x') + "\n"}})).message());
  EXPECT_EQ(message, absl::StrCat("invalid literal for int() with base 10: '",
                                  std::string(kMaxClientTextChars, 'x'), "'..."));
}

TEST(StatusFieldTest, FieldTravelsAndNests) {
  absl::Status s = InvalidField("moe_backend", "bad");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(s).value(), "moe_backend");
  EXPECT_EQ(FieldOf(NestField(s, "kernel_config")).value(), "kernel_config.moe_backend");
  EXPECT_FALSE(FieldOf(absl::InternalError("x")).has_value());
}

}  // namespace
}  // namespace kplan
