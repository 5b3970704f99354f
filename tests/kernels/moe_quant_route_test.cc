// The quantised MoE layer's route choice (kernels/cuda/moe/moe_quant_route.h):
// matvec for slots on distinct experts, the decode block by slots per hit
// expert, the fallbacks when a kernel does not apply, and the forced modes.
// Plain C++, runs without a GPU.
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
  EXPECT_EQ(MoeQuantDecodeBlockFor(128, 8), 16);
  EXPECT_EQ(MoeQuantDecodeBlockFor(129, 8), 32);
  EXPECT_EQ(MoeQuantDecodeBlockFor(160, 8), 32);
  // Past 20 per expert: not decode-sized.
  EXPECT_EQ(MoeQuantDecodeBlockFor(161, 8), 0);
  EXPECT_EQ(MoeQuantDecodeBlockFor(4096 * 8, 128), 0);
  EXPECT_EQ(MoeQuantDecodeBlockFor(0, 8), 0);
  EXPECT_EQ(MoeQuantDecodeBlockFor(5, 0), 0);
}

// The decode tiles' k-split: blocks of 8 on rows of 512 bytes or more, and
// any rows grid under 32 warps an SM; blocks of 16 and 32 otherwise in rows.
TEST(MoeQuantRoute, DecodeKSplitByBlockAndRowBytes) {
  const int64_t big = 64 * 132;  // warps of a rows grid past the occupancy floor
  // Mixtral-8x7B int4 16 tokens, GEMM 1 (K 4096: 2048-byte rows), blocks of 8.
  EXPECT_TRUE(MoeQuantDecodeKSplit(8, 2048, big, 132));
  // Qwen3-30B-A3B GEMM 2 (K 768): int8 rows of 768 bytes split, int4's 384 do not.
  EXPECT_TRUE(MoeQuantDecodeKSplit(8, 768, big, 132));
  EXPECT_TRUE(MoeQuantDecodeKSplit(8, 512, big, 132));
  EXPECT_FALSE(MoeQuantDecodeKSplit(8, 511, big, 132));
  EXPECT_FALSE(MoeQuantDecodeKSplit(8, 384, big, 132));
  // Blocks of 16 and 32 keep rows on any row length...
  EXPECT_FALSE(MoeQuantDecodeKSplit(16, 7168, big, 132));
  EXPECT_FALSE(MoeQuantDecodeKSplit(32, 7168, big, 132));
  // ...unless the rows grid leaves the chip under 32 warps an SM.
  EXPECT_TRUE(MoeQuantDecodeKSplit(16, 7168, 32 * 132 - 1, 132));
  EXPECT_FALSE(MoeQuantDecodeKSplit(16, 7168, 32 * 132, 132));
  EXPECT_TRUE(MoeQuantDecodeKSplit(8, 384, 100, 132));
  EXPECT_TRUE(MoeQuantDecodeKSplit(32, 7168, 32 * 132 - 1, 132));
  EXPECT_FALSE(MoeQuantDecodeKSplit(8, 511, 32 * 132, 132));
  EXPECT_TRUE(MoeQuantDecodeKSplit(16, 384, 31, 1));
  EXPECT_FALSE(MoeQuantDecodeKSplit(16, 384, 32, 0));  // no SM count: one SM's floor
}

// The int prefill route's GEMMs on the int4 weights while the slots per hit
// expert stay small, on the dequantised copy past that: the measured cases
// of moe_quant_route.h, and one switch as the batch grows.
TEST(MoeQuantRoute, IntWeightsInTheGemmsUpToTheSlotLimit) {
  EXPECT_TRUE(MoeIntWeightsInGemms(512 * 2, 8));     // Mixtral-8x7B 512 tokens (128 a hit expert)
  EXPECT_TRUE(MoeIntWeightsInGemms(4096 * 8, 256));  // DeepSeek-V3 4096 tokens (128)
  EXPECT_TRUE(MoeIntWeightsInGemms(2048 * 8, 128));  // Qwen3-30B-A3B 2048 tokens (128)
  EXPECT_TRUE(MoeIntWeightsInGemms(3072 * 8, 128));  // Qwen3-30B-A3B 3072 tokens: at the limit
  EXPECT_FALSE(MoeIntWeightsInGemms(3072 * 8 + 1, 128));
  EXPECT_FALSE(MoeIntWeightsInGemms(4096 * 8, 128));  // Qwen3-30B-A3B 4096 tokens (256)
  EXPECT_FALSE(MoeIntWeightsInGemms(1024 * 2, 8));    // Mixtral-8x7B 1024 tokens (256)
  EXPECT_FALSE(MoeIntWeightsInGemms(4096 * 2, 8));    // Mixtral-8x7B 4096 tokens
  EXPECT_FALSE(MoeIntWeightsInGemms(0, 8));
  EXPECT_FALSE(MoeIntWeightsInGemms(16, 0));
  for (int E : {6, 8, 128, 256}) {
    int switches = 0;
    bool prev = MoeIntWeightsInGemms(1, E);
    for (int64_t numel = 2; numel <= 300 * E; ++numel) {
      const bool now = MoeIntWeightsInGemms(numel, E);
      switches += now != prev;
      EXPECT_FALSE(now && !prev) << "E=" << E << " numel=" << numel;
      prev = now;
    }
    EXPECT_EQ(switches, 1) << "E=" << E;
    EXPECT_TRUE(MoeIntWeightsInGemms(kMoeIntWeightsMaxSlots * E, E));
  }
}

// Kernel sets: what runs an int set, an fp8 set (no dequant route) and an
// fp8 set on the tensor cores.
constexpr MoeQuantKernels kInt{.matvec = true, .decode = true, .dequant = true};
constexpr MoeQuantKernels kFp8{.matvec = true, .decode = true};
constexpr MoeQuantKernels kFp8Tc{.matvec = true, .decode = true, .fp8_tc = true};

MoeQuantKernels Without(MoeQuantKernels k, bool matvec, bool decode) {
  if (matvec) k.matvec = false;
  if (decode) k.decode = false;
  return k;
}

// The layers of session 46's measurement: Qwen3-30B-A3B's two GEMMs (K 2048,
// 768) on the tiles, Mixtral-8x7B's (4096, 14336) on the pairs, DeepSeek-V3's
// GEMM 1 (7168) on the pairs and its GEMM 2 (2048) on the tiles.
TEST(MoeQuantRoute, Int4MatvecPairsFromFourSpans) {
  EXPECT_FALSE(MoeQuantMatvecInt4Pairs(768));
  EXPECT_FALSE(MoeQuantMatvecInt4Pairs(2048));
  EXPECT_FALSE(MoeQuantMatvecInt4Pairs(4064));  // the largest int4 K below (groups of 32)
  EXPECT_TRUE(MoeQuantMatvecInt4Pairs(4096));
  EXPECT_TRUE(MoeQuantMatvecInt4Pairs(7168));
  EXPECT_TRUE(MoeQuantMatvecInt4Pairs(14336));
}

TEST(MoeQuantRoute, MatvecSplitBySize) {
  // Qwen3-30B-A3B one token, int4: GEMM 1 768 tiles of 1024-byte rows, GEMM 2
  // 1024 tiles of 384-byte rows: split in two up to 1056 warps.
  EXPECT_EQ(MoeQuantMatvecSplit(768, 1024), 2);
  EXPECT_EQ(MoeQuantMatvecSplit(1024, 384), 2);
  // Mixtral-8x7B one token, int4 GEMM 1: 3584 tiles fill the grid unsplit.
  EXPECT_EQ(MoeQuantMatvecSplit(3584, 2048), 1);
  // Few tiles: up to kMoeQuantMatvecWarps, two chunks a warp at least.
  EXPECT_EQ(MoeQuantMatvecSplit(1, 1 << 20), kMoeQuantMatvecWarps);
  EXPECT_EQ(MoeQuantMatvecSplit(1, 64 * 8), 4);  // 8 chunks
  EXPECT_EQ(MoeQuantMatvecSplit(1, 64 * 3), 1);  // 3 chunks
}

TEST(MoeQuantRoute, SlotsOnDistinctExperts) {
  EXPECT_TRUE(MoeSlotsOnDistinctExperts(1, 8, 256));  // one token: its ids are distinct
  EXPECT_TRUE(MoeSlotsOnDistinctExperts(1, 8, 8));
  EXPECT_TRUE(MoeSlotsOnDistinctExperts(2, 8, 256));   // 16^2 <= 256
  EXPECT_FALSE(MoeSlotsOnDistinctExperts(3, 8, 256));  // 24^2 > 256
  EXPECT_FALSE(MoeSlotsOnDistinctExperts(2, 2, 8));    // Mixtral: 4^2 > 8
  EXPECT_FALSE(MoeSlotsOnDistinctExperts(0, 8, 256));
}

TEST(MoeQuantRoute, AutoPicksByBatchAndSupport) {
  const auto a = MoeQuantRouteMode::kAuto;
  // Slots on distinct experts: matvec on every scheme, the tensor cores too.
  EXPECT_EQ(MoeQuantRouteFor(kInt, 1, 8, 256, a), MoeQuantRoute::kMatvec);
  EXPECT_EQ(MoeQuantRouteFor(kFp8Tc, 1, 8, 256, a), MoeQuantRoute::kMatvec);
  EXPECT_EQ(MoeQuantRouteFor(kFp8Tc, 2, 8, 256, a), MoeQuantRoute::kMatvec);
  EXPECT_EQ(MoeQuantRouteFor(kFp8, 1, 2, 8, a), MoeQuantRoute::kMatvec);
  // Shared experts at decode sizes: the decode tiles.
  EXPECT_EQ(MoeQuantRouteFor(kInt, 2, 2, 8, a), MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(kInt, 8, 8, 256, a), MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(Without(kInt, true, false), 1, 8, 256, a), MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(kInt, 4096, 8, 128, a), MoeQuantRoute::kDequant);
  // fp8: no dequant route; large batches stay on the grouped GEMMs.
  EXPECT_EQ(MoeQuantRouteFor(kFp8, 4096, 8, 128, a), MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(kFp8, 2, 8, 128, a), MoeQuantRoute::kDecode);
  // fp8 on tensor cores: the grouped GEMMs past the matvec sizes unless forced.
  EXPECT_EQ(MoeQuantRouteFor(kFp8Tc, 3, 8, 256, a), MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(kFp8Tc, 64, 8, 256, a), MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(kFp8Tc, 3, 8, 256, MoeQuantRouteMode::kDecode),
            MoeQuantRoute::kDecode);
  // int sets: matvec where the slots are distinct, the decode tiles up to
  // 20 slots per hit expert (their largest block with its margin), then the
  // dequant route; the decode tiles past that only when forced.
  EXPECT_EQ(MoeQuantRouteFor(kInt, 16, 2, 8, a), MoeQuantRoute::kDecode);      // 4 per expert
  EXPECT_EQ(MoeQuantRouteFor(kInt, 64, 2, 8, a), MoeQuantRoute::kDecode);      // 16
  EXPECT_EQ(MoeQuantRouteFor(kInt, 80, 2, 8, a), MoeQuantRoute::kDecode);      // 20
  EXPECT_EQ(MoeQuantRouteFor(kInt, 81, 2, 8, a), MoeQuantRoute::kDequant);     // 20.25
  EXPECT_EQ(MoeQuantRouteFor(kInt, 256, 8, 128, a), MoeQuantRoute::kDecode);   // 16
  EXPECT_EQ(MoeQuantRouteFor(kInt, 512, 8, 128, a), MoeQuantRoute::kDequant);  // 32
  EXPECT_EQ(MoeQuantRouteFor(kInt, 128, 2, 8, MoeQuantRouteMode::kDecode), MoeQuantRoute::kDecode);
  // Unsupported matvec and decode (fp32 activations, odd group sizes).
  EXPECT_EQ(MoeQuantRouteFor(Without(kInt, true, true), 1, 8, 256, a), MoeQuantRoute::kDequant);
  EXPECT_EQ(MoeQuantRouteFor(MoeQuantKernels{}, 1, 8, 256, a), MoeQuantRoute::kEmulation);
}

TEST(MoeQuantRoute, ForcedModesApplyWhereTheKernelRuns) {
  EXPECT_EQ(MoeQuantRouteFor(kInt, 1, 8, 256, MoeQuantRouteMode::kEmulation),
            MoeQuantRoute::kEmulation);
  EXPECT_EQ(MoeQuantRouteFor(kInt, 1, 8, 256, MoeQuantRouteMode::kDequant),
            MoeQuantRoute::kDequant);
  EXPECT_EQ(MoeQuantRouteFor(kInt, 1, 8, 256, MoeQuantRouteMode::kDecode), MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(kInt, 4096, 8, 128, MoeQuantRouteMode::kDecode),
            MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(kFp8Tc, 300, 2, 8, MoeQuantRouteMode::kMatvec),
            MoeQuantRoute::kMatvec);
  // Forced but not runnable: the automatic choice.
  EXPECT_EQ(MoeQuantRouteFor(Without(kInt, false, true), 8, 8, 256, MoeQuantRouteMode::kDecode),
            MoeQuantRoute::kDequant);
  EXPECT_EQ(MoeQuantRouteFor(Without(kInt, true, false), 1, 8, 256, MoeQuantRouteMode::kMatvec),
            MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(kFp8, 2, 8, 128, MoeQuantRouteMode::kDequant), MoeQuantRoute::kDecode);
  EXPECT_EQ(MoeQuantRouteFor(kInt, 0, 8, 256, MoeQuantRouteMode::kMatvec), MoeQuantRoute::kDequant);
}

TEST(MoeQuantRoute, ModeFromCodeOverridesEnv) {
  SetMoeQuantRouteMode(MoeQuantRouteMode::kDequant);
  EXPECT_EQ(MoeQuantRouteModeNow(), MoeQuantRouteMode::kDequant);
  SetMoeQuantRouteMode(MoeQuantRouteMode::kMatvec);
  EXPECT_EQ(MoeQuantRouteModeNow(), MoeQuantRouteMode::kMatvec);
  SetMoeQuantRouteMode(MoeQuantRouteMode::kFromEnv);
}

}  // namespace
}  // namespace kplan::kernels::cuda
