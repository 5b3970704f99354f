#include "resolve/proto/convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kplan::rpc {
namespace {

using ::testing::ElementsAre;

TEST(ConvertTest, KernelConfigDefaultsAndRoundTrip) {
  v1::KernelConfig p;
  KernelConfig c = KernelConfigFromProto(p);
  EXPECT_EQ(c.moe_backend, "auto");
  EXPECT_TRUE(c.enable_cutedsl_warmup);
  EXPECT_FALSE(c.enable_flashinfer_autotune.has_value());
  EXPECT_FALSE(c.linear_backend_per_quant.has_value());

  p.set_moe_backend("triton");
  p.set_enable_jit_warmup(false);
  p.set_enable_flashinfer_autotune(false);
  p.mutable_ir_op_priority()->add_rms_norm(" vllm_c , native");
  p.mutable_ir_op_priority()->add_fused_add_rms_norm("a");
  p.mutable_ir_op_priority()->add_fused_add_rms_norm("b,c");
  (*p.mutable_linear_backend_per_quant())["fp8"] = "marlin";
  c = KernelConfigFromProto(p);
  EXPECT_THAT(c.ir_op_priority.of("rms_norm"), ElementsAre("vllm_c", "native"));
  EXPECT_THAT(c.ir_op_priority.of("fused_add_rms_norm"), ElementsAre("a", "b,c"));
  EXPECT_FALSE(c.enable_jit_warmup);
  EXPECT_EQ(c.enable_flashinfer_autotune, false);
  EXPECT_EQ(c.linear_backend_per_quant->at("fp8"), "marlin");

  v1::KernelConfig back;
  KernelConfigToProto(c, &back);
  EXPECT_EQ(back.moe_backend(), "triton");
  EXPECT_FALSE(back.enable_jit_warmup());
  EXPECT_TRUE(back.has_enable_flashinfer_autotune());
  EXPECT_THAT(back.ir_op_priority().rms_norm(), ElementsAre("vllm_c", "native"));
  EXPECT_EQ(back.linear_backend_per_quant().at("fp8"), "marlin");
}

TEST(ConvertTest, ParallelSizesDefaultToOne) {
  ParallelConfig c = ParallelConfigFromProto(v1::ParallelConfig());
  EXPECT_EQ(c.tp_size, 1);
  EXPECT_EQ(c.dp_size, 1);
  EXPECT_EQ(c.all2all_backend, "allgather_reducescatter");
}

TEST(ConvertTest, PlatformRoundTripAndUnknownLibraryWarning) {
  v1::Platform p;
  p.set_kind(v1::PLATFORM_KIND_ROCM);
  p.set_gcn_arch_name("gfx950");
  p.mutable_device_capability()->set_major(9);
  p.mutable_device_capability()->set_minor(5);
  p.add_libraries("aiter");
  p.add_libraries("flashinfur");
  std::vector<std::string> warnings;
  Platform c = PlatformFromProto(p, &warnings).value();
  EXPECT_TRUE(c.is_rocm());
  EXPECT_EQ(c.capability->AsInt(), 95);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], ::testing::HasSubstr("flashinfur"));
  v1::Platform back;
  PlatformToProto(c, &back);
  EXPECT_EQ(back.kind(), v1::PLATFORM_KIND_ROCM);
  EXPECT_EQ(back.gcn_arch_name(), "gfx950");
  EXPECT_THAT(back.libraries(), ElementsAre("aiter", "flashinfur"));
}

}  // namespace
}  // namespace kplan::rpc
