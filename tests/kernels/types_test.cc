// kernels/common/types.h: the shared element types, their sizes and names,
// and the values the kernels receive as ints.
#include "kernels/common/types.h"

#include "gtest/gtest.h"

namespace kplan::kernels {
namespace {

// The IR ops and the emulation GEMM read fp32 / fp16 / bf16 as 0 / 1 / 2, the
// routing and activation kernels compare against these values.
static_assert(static_cast<int>(DType::kFloat32) == 0);
static_assert(static_cast<int>(DType::kFloat16) == 1);
static_assert(static_cast<int>(DType::kBFloat16) == 2);
static_assert(static_cast<int>(RoutingMethod::kLlama4) == 3);
static_assert(static_cast<int>(ScoringFunc::kSqrtSoftplus) == 2);
static_assert(static_cast<int>(MoeActivation::kSiluNoMul) == 7);
static_assert(static_cast<int>(MoeActivation::kRelu2NoMul) == 10);

TEST(DTypeTest, SizesAndNames) {
  struct Row {
    DType dtype;
    int64_t size;
    const char* name;
  };
  const Row rows[] = {
      {DType::kFloat32, 4, "float32"},   {DType::kFloat16, 2, "float16"},
      {DType::kBFloat16, 2, "bfloat16"}, {DType::kFp8E4m3, 1, "float8_e4m3fn"},
      {DType::kInt8, 1, "int8"},         {DType::kInt4Packed, 1, "int4"},
      {DType::kUint8, 1, "uint8"},       {DType::kInt32, 4, "int32"},
      {DType::kInt64, 8, "int64"},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(DTypeSize(r.dtype), r.size) << r.name;
    EXPECT_EQ(DTypeName(r.dtype), r.name);
  }
}

TEST(DTypeTest, Subsets) {
  EXPECT_TRUE(IsFloatDType(DType::kFloat32));
  EXPECT_TRUE(IsFloatDType(DType::kBFloat16));
  EXPECT_FALSE(IsFloatDType(DType::kFp8E4m3));
  EXPECT_TRUE(IsHalfDType(DType::kFloat16));
  EXPECT_TRUE(IsHalfDType(DType::kBFloat16));
  EXPECT_FALSE(IsHalfDType(DType::kFloat32));
  EXPECT_FALSE(IsHalfDType(DType::kInt8));
}

}  // namespace
}  // namespace kplan::kernels
