// The host side of the warp-specialised grouped GEMM's tile schedule
// (kernels/cuda/moe/moe_ws_schedule.h): tile counts, grid size, and that the
// walk the device takes visits every (token tile, weight-row tile) once, in
// groups of units (one token tile, or two in clusters of two) with the
// weight-row tile as the slow index. Plain C++, runs without a GPU.
#include "kernels/cuda/moe/moe_ws_schedule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace kplan::kernels::cuda::ws {
namespace {

TEST(MoeWsSchedule, CountsAndGrid) {
  // Mixtral-8x7B, 4096 tokens, top-2: 8192 slots, block 256, at most 40 blocks.
  WsSchedule s = MakeWsSchedule(40, 256, 28672, 132);
  EXPECT_EQ(s.token_tiles, 80);
  EXPECT_EQ(s.n_tiles, 112);
  EXPECT_EQ(s.group, kWsGroup);  // 112 weight-row tiles: token tiles grouped
  EXPECT_EQ(s.grid, 132);
  // Mixtral GEMM 2 (N 4096: 16 row tiles, 16 x 8 <= 132): weight-row tile fast.
  EXPECT_EQ(MakeWsSchedule(40, 256, 4096, 132).group, 1);
  EXPECT_EQ(MakeWsSchedule(40, 256, 4352, 132).group, kWsGroup);  // 17 row tiles
  EXPECT_EQ(MakeWsSchedule(40, 256, 4096, 132, 8).group, 8);      // explicit
  EXPECT_EQ(WsTotalWork(s), 80 * 112);
  // Block 128: one token tile per block; N not a multiple of the tile.
  s = MakeWsSchedule(3, 128, 144, 132);
  EXPECT_EQ(s.token_tiles, 3);
  EXPECT_EQ(s.n_tiles, 1);
  EXPECT_EQ(s.grid, 3);  // fewer tiles than SMs: one CTA each
  EXPECT_EQ(MakeWsSchedule(0, 128, 4096, 132).grid, 0);
  EXPECT_EQ(MakeWsSchedule(5, 128, 4096, 132, -3).group, 1);
}

TEST(MoeWsSchedule, ClipToPostPadded) {
  const WsSchedule s = MakeWsSchedule(40, 256, 4096, 132);
  EXPECT_EQ(WsClip(s, 0).token_tiles, 0);
  EXPECT_EQ(WsClip(s, 1).token_tiles, 1);
  EXPECT_EQ(WsClip(s, 128).token_tiles, 1);
  EXPECT_EQ(WsClip(s, 129).token_tiles, 2);
  EXPECT_EQ(WsClip(s, 256 * 33).token_tiles, 66);
  EXPECT_EQ(WsClip(s, 1 << 20).token_tiles, 80);  // never above the bound
  EXPECT_EQ(WsClip(s, 1 << 20).n_tiles, s.n_tiles);
}

TEST(MoeWsSchedule, WalkIsABijectionInGroupOrder) {
  for (int64_t tiles : {1, 2, 7, 8, 9, 16, 23, 80}) {
    for (int64_t n_tiles : {1, 3, 16, 112}) {
      for (int group : {1, 3, 8}) {
        WsSchedule s;
        s.token_tiles = tiles;
        s.n_tiles = n_tiles;
        s.group = group;
        std::set<std::pair<int64_t, int64_t>> seen;
        int64_t prev_group = 0, prev_n = 0;
        for (int64_t i = 0; i < WsTotalWork(s); ++i) {
          const WsTile t = WsTileAt(s, i);
          ASSERT_GE(t.token_tile, 0);
          ASSERT_LT(t.token_tile, tiles);
          ASSERT_GE(t.n_tile, 0);
          ASSERT_LT(t.n_tile, n_tiles);
          ASSERT_TRUE(seen.insert({t.token_tile, t.n_tile}).second)
              << "tile visited twice: " << t.token_tile << "," << t.n_tile;
          // Groups in order; inside a group the weight-row tile never goes back.
          const int64_t g = t.token_tile / group;
          ASSERT_GE(g, prev_group);
          if (g == prev_group) {
            ASSERT_GE(t.n_tile, prev_n);
          } else {
            ASSERT_EQ(t.n_tile, 0);
          }
          prev_group = g;
          prev_n = t.n_tile;
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), tiles * n_tiles);
      }
    }
  }
}

TEST(MoeWsSchedule, ConsecutiveCtasShareAWeightTile) {
  // The first `group` linear tiles are one weight-row tile over the group's
  // token tiles: CTAs launched together read that weight tile once from HBM.
  const WsSchedule s = MakeWsSchedule(40, 256, 28672, 132);
  ASSERT_GT(s.group, 1);
  for (int64_t i = 0; i < s.group; ++i) {
    EXPECT_EQ(WsTileAt(s, i).n_tile, 0);
    EXPECT_EQ(WsTileAt(s, i).token_tile, i);
  }
  EXPECT_EQ(WsTileAt(s, s.group).n_tile, 1);
  EXPECT_EQ(WsTileAt(s, s.group).token_tile, 0);
}

TEST(MoeWsSchedule, PersistentGridCoversEveryTileOnce) {
  // Every CTA c walks c, c + grid, ...: together each tile exactly once.
  const WsSchedule s = WsClip(MakeWsSchedule(40, 256, 4096, 132), 256 * 29 + 5);
  std::vector<int> hits(static_cast<size_t>(WsTotalWork(s)), 0);
  for (int c = 0; c < s.grid; ++c) {
    for (int64_t i = c; i < WsTotalWork(s); i += s.grid) {
      const WsTile t = WsTileAt(s, i);
      ++hits[static_cast<size_t>(t.token_tile * s.n_tiles + t.n_tile)];
    }
  }
  for (int h : hits) EXPECT_EQ(h, 1);
}

TEST(MoeWsSchedule, ClustersOfTwo) {
  // Mixtral GEMM 1 again: 132 resident CTAs are 66 clusters; groups of
  // kWsGroup units (8 token tiles).
  WsSchedule s = MakeWsSchedule(40, 256, 28672, 132, kWsAutoGroup, 2);
  EXPECT_EQ(s.cluster, 2);
  EXPECT_EQ(s.token_tiles, 80);
  EXPECT_EQ(WsUnits(s), 40);
  EXPECT_EQ(s.group, kWsGroup);
  EXPECT_EQ(s.grid, 132);
  EXPECT_EQ(WsTotalWork(s), 40 * 112);
  EXPECT_EQ(MakeWsSchedule(40, 256, 28672, 131, kWsAutoGroup, 2).grid, 130);  // whole clusters
  EXPECT_EQ(MakeWsSchedule(40, 256, 4096, 132, kWsAutoGroup, 2).group, 1);
  // Three token tiles: two units, the second with one tile; one row tile.
  s = MakeWsSchedule(3, 128, 144, 132, kWsAutoGroup, 2);
  EXPECT_EQ(WsUnits(s), 2);
  EXPECT_EQ(s.grid, 4);
}

TEST(MoeWsSchedule, ClustersPayOnLongMainLoops) {
  EXPECT_TRUE(WsClusterPays(4096));   // Mixtral GEMM 1
  EXPECT_TRUE(WsClusterPays(14336));  // Mixtral GEMM 2
  EXPECT_TRUE(WsClusterPays(7168));   // DeepSeek-V3 GEMM 1
  EXPECT_FALSE(WsClusterPays(2048));  // DeepSeek-V3 GEMM 2, Qwen3 GEMM 1
  EXPECT_FALSE(WsClusterPays(768));   // Qwen3 GEMM 2
}

TEST(MoeWsSchedule, ClusterWalkPairsTilesOfOneRowTile) {
  for (int64_t tiles : {1, 2, 7, 16, 17, 80}) {
    for (int64_t n_tiles : {1, 3, 112}) {
      for (int group : {1, 2, 3}) {
        WsSchedule s;
        s.token_tiles = tiles;
        s.n_tiles = n_tiles;
        s.group = group;
        s.cluster = 2;
        std::set<std::pair<int64_t, int64_t>> seen;
        for (int64_t i = 0; i < WsTotalWork(s); ++i) {
          const WsTile t0 = WsTileAt(s, i, 0), t1 = WsTileAt(s, i, 1);
          // The cluster's CTAs: adjacent token tiles, 2u and 2u + 1, one row tile.
          ASSERT_EQ(t0.token_tile % 2, 0);
          ASSERT_EQ(t1.token_tile, t0.token_tile + 1);
          ASSERT_EQ(t0.n_tile, t1.n_tile);
          ASSERT_LT(t0.n_tile, n_tiles);
          ASSERT_LT(t0.token_tile, tiles);
          for (const WsTile& t : {t0, t1}) {
            if (t.token_tile >= tiles) {  // only the odd count's last unit
              ASSERT_EQ(t.token_tile, tiles);
              ASSERT_EQ(tiles % 2, 1);
              continue;
            }
            ASSERT_TRUE(seen.insert({t.token_tile, t.n_tile}).second);
          }
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), tiles * n_tiles);
      }
    }
  }
}

TEST(MoeWsSchedule, DecodeOfATilePastTheEndReadsNothing) {
  WsSchedule s;
  s.token_tiles = 3;
  s.n_tiles = 2;
  s.cluster = 2;
  const int32_t sorted[3 * kWsTileT] = {};  // slot 0 everywhere
  const int32_t experts[3] = {0, 0, 1};
  // Work item 2 is unit 1 (token tiles 2 and 3), row tile 0 (groups of 1).
  WsTileInfo t = WsDecode(s, 2, 0, sorted, experts, 128, 1, 2);
  EXPECT_EQ(t.tt, 2);
  EXPECT_EQ(t.e, 1);
  EXPECT_TRUE(t.local);
  EXPECT_FALSE(t.empty);
  t = WsDecode(s, 2, 1, sorted, experts, 128, 1, 2);  // token tile 3: none
  EXPECT_EQ(t.tt, 3);
  EXPECT_EQ(t.e, -1);
  EXPECT_FALSE(t.local);
  EXPECT_TRUE(t.empty);
}

// The tall tiles: a block of 192 is one token tile of 192 slots, whose
// expert and first slot the decode reads at 192 t; the clip counts tiles of
// 192; a CTA has a fourth warpgroup.
TEST(MoeWsSchedule, TallTilesAreBlocksOf192) {
  EXPECT_EQ(WsTileSlots(128), kWsTileT);
  EXPECT_EQ(WsTileSlots(256), kWsTileT);
  EXPECT_EQ(WsTileSlots(192), kWsTallTileT);
  EXPECT_EQ(WsThreadsFor(kWsTallTileT), 512);
  // Mixtral-8x7B at 512 tokens, top-2: 1024 slots, at most ceil((1024 + 8 *
  // 191) / 192) = 14 blocks of 192; GEMM 1's 112 weight-row tiles.
  WsSchedule s = MakeWsSchedule(14, 192, 28672, 132);
  EXPECT_EQ(s.token_tiles, 14);
  EXPECT_EQ(WsTotalWork(s), 14 * 112);
  EXPECT_EQ(WsClip<192>(s, 192 * 8).token_tiles, 8);
  EXPECT_EQ(WsClip<192>(s, 192 * 8 + 1).token_tiles, 9);
  EXPECT_EQ(WsClip<192>(s, 1 << 20).token_tiles, 14);
  // Three blocks: experts 0, 2, 1; block 1 begins with padding.
  std::vector<int32_t> sorted(3 * 192, 7);
  sorted[192] = 100;  // the sentinel (numel 100): no slot
  const int32_t experts[3] = {0, 2, 1};
  s = MakeWsSchedule(3, 192, 256, 132, 1);
  ASSERT_EQ(WsTotalWork(s), 3);
  for (int64_t i = 0; i < 3; ++i) {
    const WsTileInfo t = WsDecode<192>(s, i, 0, sorted.data(), experts, 192, 100, 3);
    EXPECT_EQ(t.tt, i);
    EXPECT_EQ(t.n0, 0);
    EXPECT_EQ(t.e, experts[i]);
    EXPECT_TRUE(t.local);
    EXPECT_EQ(t.empty, i == 1);
  }
  // With tiles of 128 the same buffer's tile 1 starts at 128: a slot.
  s = MakeWsSchedule(4, 128, 256, 132, 1);
  EXPECT_FALSE(WsDecode(s, 1, 0, sorted.data(), experts, 128, 100, 3).empty);
}

}  // namespace
}  // namespace kplan::kernels::cuda::ws
