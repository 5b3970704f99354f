#include "base/env.h"

#include "gtest/gtest.h"
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

TEST(EnvVarsTest, ParsesVllmBooleans) {
  for (const char* t : {"1", "true", "True", "TRUE", " yes ", "on", "2"}) {
    EXPECT_TRUE(ParseEnvBool(t)) << t;
  }
  for (const char* f : {"0", "false", "False", "", "no", "off", "banana"}) {
    EXPECT_FALSE(ParseEnvBool(f)) << f;
  }
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
