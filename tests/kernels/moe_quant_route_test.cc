// The quantised MoE layer's route choice (kernels/cuda/moe/moe_quant_route.h):
// the decode block by slots per hit expert, the fallbacks when a kernel does
// not apply, and the forced modes. Plain C++, runs without a GPU.
#include "kernels/cuda/moe/moe_quant_route.h"

#include <gtest/gtest.h>

namespace kplan::kernels::cuda {
namespace {

TEST(MoeQuantRoute, DecodeBlockBySlotsPerExpert) {
  // One token, top-8 over 256 experts: 8 distinct experts, one slot each.
  EXPECT_EQ(MoeQuantDecodeBlockFor(8, 256), 8);
  // DeepSeek-V3 64 tokens: 512 slots over 256 experts, 2 per expert.
  EXPECT_EQ(MoeQuantDecodeBlockFor(512, 256), 8);
  // Qwen3 64 tokens: 512 over 128: 4 per expert.
  EXPECT_EQ(MoeQuantDecodeBlockFor(512, 128), 8);
  EXPECT_EQ(MoeQuantDecodeBlockFor(513, 128), 16);
  // Mixtral 64 tokens: 128 slots over 8 experts: 16 each.
  EXPECT_EQ(MoeQuantDecodeBlockFor(128, 8), 32);
  EXPECT_EQ(MoeQuantDecodeBlockFor(160, 8), 32);
  // Past 20 per expert: not decode-sized.
  EXPECT_EQ(MoeQuantDecodeBlockFor(161, 8), 0);
  EXPECT_EQ(MoeQuantDecodeBlockFor(4096 * 8, 128), 0);
  EXPECT_EQ(MoeQuantDecodeBlockFor(0, 8), 0);
  EXPECT_EQ(MoeQuantDecodeBlockFor(5, 0), 0);
}

TEST(MoeQuantRoute, AutoPicksByBatchAndSupport) {
  const auto a = MoeQuantRouteMode::kAuto;
  EXPECT_EQ(MoeQuantRouteFor(true, true, false, 8, 256, a), MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(true, true, false, 4096 * 8, 128, a), MoeQuantRoute::kDequant);
  // fp8: no dequant route; large batches stay on the grouped GEMMs.
  EXPECT_EQ(MoeQuantRouteFor(true, false, false, 4096 * 8, 128, a), MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(true, false, false, 16, 128, a), MoeQuantRoute::kDecode);
  // fp8 on tensor cores: the grouped GEMMs at every size unless forced.
  EXPECT_EQ(MoeQuantRouteFor(true, false, true, 8, 256, a), MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(true, false, true, 512, 256, a), MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(true, false, true, 8, 256, MoeQuantRouteMode::kDecode),
            MoeQuantRoute::kDecode);
  // Unsupported decode (fp32 activations, odd group sizes): dequant or emulation.
  EXPECT_EQ(MoeQuantRouteFor(false, true, false, 8, 256, a), MoeQuantRoute::kDequant);
  EXPECT_EQ(MoeQuantRouteFor(false, false, false, 8, 256, a), MoeQuantRoute::kEmulation);
}

TEST(MoeQuantRoute, ForcedModesApplyWhereTheKernelRuns) {
  EXPECT_EQ(MoeQuantRouteFor(true, true, false, 8, 256, MoeQuantRouteMode::kEmulation),
            MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(true, true, false, 8, 256, MoeQuantRouteMode::kDequant),
            MoeQuantRoute::kDequant);
  EXPECT_EQ(MoeQuantRouteFor(true, true, false, 4096 * 8, 128, MoeQuantRouteMode::kDecode),
            MoeQuantRoute::kDecode);
  // Forced but not runnable: the automatic choice.
  EXPECT_EQ(MoeQuantRouteFor(false, true, false, 8, 256, MoeQuantRouteMode::kDecode),
            MoeQuantRoute::kDequant);
  EXPECT_EQ(MoeQuantRouteFor(true, false, false, 8, 256, MoeQuantRouteMode::kDequant),
            MoeQuantRoute::kDecode);
}

TEST(MoeQuantRoute, ModeFromCodeOverridesEnv) {
  SetMoeQuantRouteMode(MoeQuantRouteMode::kDequant);
  EXPECT_EQ(MoeQuantRouteModeNow(), MoeQuantRouteMode::kDequant);
  SetMoeQuantRouteMode(MoeQuantRouteMode::kFromEnv);
}

}  // namespace
}  // namespace kplan::kernels::cuda
