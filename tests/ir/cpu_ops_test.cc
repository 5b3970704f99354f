// The CPU reference (native provider) against values computed by hand, and
// the fp16/bf16 conversions it relies on.
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ir_float.h"
#include "kernels/cpu/ir_ops.h"
#include "server/ir/builtin_ops.h"
#include "tests/ir/test_util.h"

namespace kplan {
namespace {

using kernels::cpu::Bf16ToFloat;
using kernels::cpu::FloatToBf16;
using kernels::cpu::FloatToHalf;
using kernels::cpu::HalfToFloat;
using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::FloatNear;
using testing_ir::Host;
using testing_ir::Values;

TEST(IrFloatTest, HalfRoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN
    ASSERT_EQ(FloatToHalf(HalfToFloat(h)), h) << bits;
  }
  EXPECT_EQ(HalfToFloat(0x3c00), 1.f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.f, -24));            // smallest subnormal
  EXPECT_EQ(FloatToHalf(1.f + std::ldexp(1.f, -11)), 0x3c00);      // tie to even: down
  EXPECT_EQ(FloatToHalf(1.f + 3 * std::ldexp(1.f, -11)), 0x3c02);  // tie to even: up
  EXPECT_EQ(FloatToHalf(65520.f), 0x7c00);                         // rounds to inf
  EXPECT_EQ(FloatToHalf(65519.f), 0x7bff);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(IrFloatTest, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.f + std::ldexp(1.f, -8))), 1.f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.f + 3 * std::ldexp(1.f, -8))), 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

// Runs op on the CPU through RunIrOp with the native provider.
class IrCpuOpsTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = *MakeBuiltinIrRegistry({}); }
  IrOpResult Run(IrOpRequest r) {
    r.priority = std::vector<std::string>{"native"};
    absl::StatusOr<IrOpResult> out = RunIrOp(*registry_, r);
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->provider, "native");
    return *std::move(out);
  }
  std::unique_ptr<IrRegistry> registry_;
};

TEST_F(IrCpuOpsTest, RmsNormFloat32) {
  IrOpRequest r;
  r.op = "rms_norm";
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {2, 2}, {3, 4, 0, 5})}};
  r.epsilon = 0.0;
  // var = (9 + 16) / 2 = 12.5 and (0 + 25) / 2 = 12.5: y = x / sqrt(12.5).
  EXPECT_THAT(
      Values(Run(r).outputs[0].tensor),
      ElementsAre(FloatEq(0.84852814f), FloatEq(1.13137085f), FloatEq(0.f), FloatEq(1.41421356f)));

  r.tensors.push_back({"weight", Host(kernels::DType::kFloat32, {2}, {2, 0.5f})});
  EXPECT_THAT(
      Values(Run(r).outputs[0].tensor),
      ElementsAre(FloatEq(1.69705627f), FloatEq(0.56568542f), FloatEq(0.f), FloatEq(0.70710678f)));

  // variance over x[..., :1]: var = 9 and 0 (+ eps 1: 10 and 1).
  r.tensors.pop_back();
  r.variance_size = 1;
  r.epsilon = 1.0;
  EXPECT_THAT(Values(Run(r).outputs[0].tensor),
              ElementsAre(FloatEq(3 / std::sqrt(10.f)), FloatEq(4 / std::sqrt(10.f)), FloatEq(0.f),
                          FloatEq(5.f)));
}

TEST_F(IrCpuOpsTest, RmsNormRoundsLikeTorch) {
  IrOpRequest r;
  r.op = "rms_norm";
  r.epsilon = 0.0;
  // var = 7.5, 1/sqrt(7.5) = 0.36514837: y = 0.36514837, 0.73029674, 1.0954451,
  // 1.4605935, which bfloat16 rounds to 187/512, 187/256, 140/128, 187/128.
  r.tensors = {{"x", Host(kernels::DType::kBFloat16, {4}, {1, 2, 3, 4})}};
  EXPECT_THAT(Values(Run(r).outputs[0].tensor),
              ElementsAre(0.365234375f, 0.73046875f, 1.09375f, 1.4609375f));
  // y.to(bfloat16) * weight: the rounded values doubled exactly.
  r.tensors.push_back({"weight", Host(kernels::DType::kBFloat16, {4}, {2, 2, 2, 2})});
  EXPECT_THAT(Values(Run(r).outputs[0].tensor),
              ElementsAre(0.73046875f, 1.4609375f, 2.1875f, 2.921875f));
  // A float32 weight: fp32 product, then one rounding to bfloat16.
  r.tensors[1] = {"weight", Host(kernels::DType::kFloat32, {4}, {3, 3, 3, 3})};
  EXPECT_THAT(Values(Run(r).outputs[0].tensor), ElementsAre(1.09375f, 2.1875f, 3.28125f, 4.375f));
  IrOpResult out = Run(r);
  EXPECT_EQ(out.outputs[0].tensor.dtype, kernels::DType::kBFloat16);
  // float16 with its rms tolerance: 0.36514837 * (1, 2, 3, 4).
  r.tensors = {{"x", Host(kernels::DType::kFloat16, {4}, {1, 2, 3, 4})}};
  EXPECT_THAT(Values(Run(r).outputs[0].tensor),
              ElementsAre(FloatNear(0.36514837f, 1e-2), FloatNear(0.73029674f, 1e-2),
                          FloatNear(1.0954451f, 1e-2), FloatNear(1.4605935f, 1e-2)));
}

TEST_F(IrCpuOpsTest, FusedAddRmsNorm) {
  IrOpRequest r;
  r.op = "fused_add_rms_norm";
  r.epsilon = 0.0;
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {1, 2}, {1, 2})},
               {"x_residual", Host(kernels::DType::kFloat32, {1, 2}, {2, 2})}};
  IrOpResult out = Run(r);
  ASSERT_EQ(out.outputs.size(), 2u);
  EXPECT_EQ(out.outputs[0].name, "out");
  EXPECT_EQ(out.outputs[1].name, "residual");
  EXPECT_THAT(Values(out.outputs[0].tensor),
              ElementsAre(FloatEq(0.84852814f), FloatEq(1.13137085f)));
  EXPECT_THAT(Values(out.outputs[1].tensor), ElementsAre(3.f, 4.f));

  // The new residual is the fp32 sum rounded to x's dtype: 1 + 2^-9 -> 1 in bf16.
  r.tensors = {{"x", Host(kernels::DType::kBFloat16, {2}, {1, 1})},
               {"x_residual", Host(kernels::DType::kFloat32, {2}, {std::ldexp(1.f, -9), 0})}};
  out = Run(r);
  EXPECT_EQ(out.outputs[1].tensor.dtype, kernels::DType::kBFloat16);
  EXPECT_THAT(Values(out.outputs[1].tensor), ElementsAre(1.f, 1.f));
  EXPECT_THAT(Values(out.outputs[0].tensor), ElementsAre(1.f, 1.f));
}

TEST_F(IrCpuOpsTest, GeluAndMulSparse) {
  IrOpRequest r;
  r.op = "gelu_and_mul_sparse";
  // gate 1,2,3,4: mean 2.5; std_multiplier 0 (sparsity 0.5) -> cutoff 2.5;
  // relu(gate - 2.5) = 0, 0, 0.5, 1.5; gelu(0.5) = 0.34573123, gelu(1.5) = 1.39978920.
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {1, 8}, {1, 2, 3, 4, 1, 1, 2, -1})}};
  r.std_multiplier = 0.0;
  IrOpResult out = Run(r);
  EXPECT_THAT(out.outputs[0].tensor.shape, ElementsAre(1, 4));
  EXPECT_THAT(Values(out.outputs[0].tensor),
              ElementsAre(0.f, 0.f, FloatNear(0.69146246f, 1e-6), FloatNear(-1.39978920f, 1e-6)));
  r.approximate = "tanh";
  EXPECT_THAT(Values(Run(r).outputs[0].tensor),
              ElementsAre(0.f, 0.f, FloatNear(0.69142802f, 1e-6), FloatNear(-1.39957158f, 1e-6)));
  // std_multiplier 0.8416212 (Phi^-1(0.8)): std = sqrt(1.25),
  // cutoff = 2.5 + 1.118034 * 0.8416212 = 3.4409611;
  // only gate 4 survives: gelu(0.5590389) * 3 = 1.1939936.
  r.approximate.reset();
  r.std_multiplier = 0.8416212335729143;
  r.tensors = {{"x", Host(kernels::DType::kFloat32, {8}, {1, 2, 3, 4, 1, 1, 1, 3})}};
  EXPECT_THAT(Values(Run(r).outputs[0].tensor),
              ElementsAre(0.f, 0.f, 0.f, FloatNear(1.1939936f, 1e-5)));
}

TEST(IrCpuKernelTest, StridedInputsMatchContiguous) {
  // x is [2, 3] taken from a [2, 5] buffer at column 1 (row stride 5), then
  // the same values as a transposed view.
  const float buf[10] = {9, 1, 2, 3, 9, 9, -4, 5, 0.5f, 9};
  const float dense[6] = {1, 2, 3, -4, 5, 0.5f};
  kernels::IrRowsIn strided{buf + 1, kernels::DType::kFloat32, kernels::IrRowLayout::Rows(2, 5)};
  kernels::IrRowsIn contiguous{dense, kernels::DType::kFloat32, kernels::IrRowLayout::Rows(2, 3)};
  float a[6], b[6];
  kernels::cpu::RmsNorm(strided, 2, 3, {}, 1e-6f, 3, a);
  kernels::cpu::RmsNorm(contiguous, 2, 3, {}, 1e-6f, 3, b);
  EXPECT_THAT(a, ::testing::Pointwise(FloatEq(), b));

  const float transposed[6] = {1, -4, 2, 5, 3, 0.5f};  // [3, 2] storage of x^T
  kernels::IrRowsIn t{transposed, kernels::DType::kFloat32, {}};
  t.layout.lead_dims = 1;
  t.layout.lead_sizes[0] = 2;
  t.layout.lead_strides[0] = 1;
  t.layout.col_stride = 2;
  kernels::cpu::RmsNorm(t, 2, 3, {}, 1e-6f, 3, a);
  EXPECT_THAT(a, ::testing::Pointwise(FloatEq(), b));
}

}  // namespace
}  // namespace kplan
