// The host side of the one-kernel decode layer
// (kernels/cuda/moe/moe_decode_layer_plan.h): over a sweep of shapes, the
// shared-memory layout holds every part it must, aligned and in order, within
// the CTA's budget; a stage holds whole items and at least one down row; the
// ring takes all the stages that fit (up to the cap); a layer that leaves no
// room for two stages gets no plan; a CTA's chunks cover its items and down
// rows exactly once. Plain C++, runs without a GPU.
#include "kernels/cuda/moe/moe_decode_layer_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kplan::kernels::cuda::detail {
namespace {

constexpr int kSms = 132;
constexpr int64_t kH200Smem = 232448 - 1280;  // opt-in limit less the kernel's static part
constexpr int kWarps = 9;
constexpr int kMaxSlotsForTest = 16;  // kMoeDecodeMaxSlots: owners per layer

std::string Name(const DecodeLayerShape& s) {
  return "M=" + std::to_string(s.tokens) + " k=" + std::to_string(s.top_k) +
         " E=" + std::to_string(s.num_experts) + " H=" + std::to_string(s.hidden) +
         " I=" + std::to_string(s.intermediate) + (s.gated ? " gated" : " plain") +
         (s.combine ? " combine" : " rows") + (s.grouped_routing ? " grouped" : "");
}

// Every property a plan must have, checked from the shape.
void CheckPlan(const DecodeLayerShape& s, int64_t smem, int stage_kib, int max_stages) {
  SCOPED_TRACE(Name(s) + " smem=" + std::to_string(smem));
  const std::optional<DecodeLayerPlan> p =
      PlanDecodeLayer(s, kSms, smem, kWarps, stage_kib, max_stages);
  const int64_t numel = s.tokens * s.top_k, elem = s.elem_bytes;
  const int64_t item = (s.gated ? 2 : 1) * s.hidden * elem, row = s.intermediate * elem;
  const int64_t owners = s.combine ? s.tokens : numel;
  const int64_t cols = (owners * s.hidden + kSms - 1) / kSms;
  const int64_t y_bytes = cols * (s.combine ? s.top_k : 1) * 4;
  const int64_t h_need = std::max<int64_t>(numel * s.intermediate * elem,
                                           s.grouped_routing ? kWarps * s.num_experts * 4 : 0);
  // The parts alone, unaligned, and two stages of the least size that holds
  // an item (rounded up to whole items) and a down row.
  const int64_t min_stage = (std::max(item, row) + item - 1) / item * item;
  const int64_t least = s.tokens * s.hidden * elem + h_need + y_bytes + 2 * min_stage;
  if (!p.has_value()) {
    EXPECT_GT(least, smem - 3 * 128) << "no plan, though the parts fit";
    return;
  }
  EXPECT_EQ(p->grid, kSms);
  // In order, aligned, each part room enough.
  EXPECT_EQ(p->off_h % 128, 0u);
  EXPECT_EQ(p->off_y % 128, 0u);
  EXPECT_EQ(p->off_ring % 128, 0u);
  EXPECT_GE(p->off_h, s.tokens * s.hidden * elem);
  EXPECT_GE(p->off_y - p->off_h, h_need);
  EXPECT_GE(p->off_ring - p->off_y, y_bytes);
  // Stages: aligned, whole items, one down row at least, the minimum size.
  EXPECT_EQ(p->stage_bytes % 128, 0u);
  EXPECT_GE(p->stage_bytes, min_stage);
  const int64_t wanted = int64_t{stage_kib > 0 ? stage_kib : 16} << 10;
  if (p->stage_bytes < wanted) {  // the smaller stage only where two big ones do not fit
    const int64_t big = (std::max(wanted, min_stage) + item - 1) / item * item;
    EXPECT_LT(smem - p->off_ring, 2 * big);
  }
  EXPECT_GE(p->chunk_items, 1);
  EXPECT_GE(p->chunk_rows, 1);
  EXPECT_EQ(p->chunk_items, p->stage_bytes / item);
  EXPECT_EQ(p->chunk_rows, p->stage_bytes / row);
  EXPECT_LT(p->stage_bytes - p->chunk_items * item, 128) << "a stage wastes room for an item";
  // The ring: within budget, and as long as fits (or the cap).
  EXPECT_GE(p->stages, 2);
  EXPECT_LE(p->stages, std::min(kDecodeLayerMaxStages, std::max(2, max_stages)));
  EXPECT_EQ(p->smem_bytes, p->off_ring + int64_t{p->stages} * p->stage_bytes);
  EXPECT_LE(p->smem_bytes, smem);
  if (p->stages < std::min(kDecodeLayerMaxStages, std::max(2, max_stages))) {
    EXPECT_GT(p->smem_bytes + p->stage_bytes, smem) << "a stage more would have fit";
  }
}

TEST(MoeDecodeLayerPlan, PropertiesOverShapes) {
  int plans = 0, refusals = 0;
  for (int64_t H : {8, 16, 200, 2048, 4096, 7168, 16384}) {
    for (int64_t I : {8, 72, 768, 2048, 8192, 14336}) {
      for (auto [M, k] : {std::pair<int64_t, int>{1, 8}, {1, 2}, {2, 8}, {16, 1}, {4, 4}}) {
        for (bool gated : {true, false}) {
          for (bool combine : {true, false}) {
            for (int64_t smem : {kH200Smem, int64_t{100} << 10}) {
              DecodeLayerShape s;
              s.tokens = M;
              s.top_k = k;
              s.num_experts = 256;
              s.hidden = H;
              s.intermediate = I;
              s.gated = gated;
              s.combine = combine;
              s.grouped_routing = gated && combine;
              CheckPlan(s, smem, 0, kDecodeLayerMaxStages);
              CheckPlan(s, smem, 64, 3);  // the knobs
              const bool ok = PlanDecodeLayer(s, kSms, smem, kWarps).has_value();
              plans += ok;
              refusals += !ok;
            }
          }
        }
      }
    }
  }
  // The sweep covers both outcomes.
  EXPECT_GT(plans, 100);
  EXPECT_GT(refusals, 10);
}

TEST(MoeDecodeLayerPlan, ModelShapesAtOneToken) {
  auto plan = [](int64_t H, int64_t I, int k) {
    DecodeLayerShape s;
    s.tokens = 1;
    s.top_k = k;
    s.num_experts = 128;
    s.hidden = H;
    s.intermediate = I;
    return PlanDecodeLayer(s, kSms, kH200Smem, kWarps);
  };
  // Qwen3-30B-A3B: 8 KiB items, 1.5 KiB rows: 16 KiB stages of 2 items.
  const auto qwen3 = plan(2048, 768, 8);
  ASSERT_TRUE(qwen3.has_value());
  EXPECT_EQ(qwen3->chunk_items, 2);
  EXPECT_EQ(qwen3->chunk_rows, 16384 / 1536);
  // Mixtral-8x7B: 28 KiB down rows make the stage; it holds two 16 KiB items.
  const auto mixtral = plan(4096, 14336, 2);
  ASSERT_TRUE(mixtral.has_value());
  EXPECT_EQ(mixtral->stage_bytes, 2u * 16384);
  EXPECT_EQ(mixtral->chunk_items, 2);
  EXPECT_EQ(mixtral->chunk_rows, 1);
  // DeepSeek-V3: a 28 KiB item is the stage.
  const auto deepseek = plan(7168, 2048, 8);
  ASSERT_TRUE(deepseek.has_value());
  EXPECT_EQ(deepseek->chunk_items, 1);
  EXPECT_EQ(deepseek->chunk_rows, 7);
  // Nothing to plan.
  DecodeLayerShape empty;
  EXPECT_FALSE(PlanDecodeLayer(empty, kSms, kH200Smem, kWarps).has_value());
}

// Every CTA's chunks, as the producer and the consumers enumerate them:
// the grid's shares partition the items and the output columns; a step-1
// chunk is consecutive items of one slot, at most chunk_items; a step-3
// chunk is consecutive rows of one (segment, slot), at most chunk_rows; the
// rows of all segments cover each (column, slot) of the CTA exactly once.
TEST(MoeDecodeLayerPlan, ChunksCoverEveryItemAndRowOnce) {
  struct Case {
    int64_t M;
    int k;
    int64_t H, I;
    bool combine;
    int grid, items_per_chunk, rows_per_chunk;
  };
  const Case cases[] = {{1, 8, 2048, 768, true, 132, 2, 10}, {1, 2, 4096, 14336, true, 132, 2, 1},
                        {2, 8, 7168, 2048, true, 132, 1, 7}, {16, 1, 16, 64, true, 132, 3, 5},
                        {3, 2, 200, 72, false, 132, 1, 4},   {4, 4, 256, 128, true, 7, 5, 3},
                        {1, 8, 64, 32, true, 132, 9, 100}};
  for (const Case& c : cases) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " k=" + std::to_string(c.k) +
                 " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I));
    const int64_t numel = c.M * c.k, owners = c.combine ? c.M : numel;
    const int R = c.combine ? c.k : 1;
    std::vector<int> item_seen(numel * c.I, 0), row_seen(owners * c.H * R, 0);
    int64_t prev_ie = 0, prev_ce = 0;
    for (int cta = 0; cta < c.grid; ++cta) {
      int64_t i0, i1, c0, c1;
      DecodeShare(numel * c.I, cta, c.grid, i0, i1);
      DecodeShare(owners * c.H, cta, c.grid, c0, c1);
      EXPECT_EQ(i0, prev_ie);  // shares are consecutive
      EXPECT_EQ(c0, prev_ce);
      prev_ie = i1;
      prev_ce = c1;
      for (int64_t item = i0; item < i1;) {
        const DecodeUpChunk ch = DecodeUpChunkAt(item, i1, c.I, c.items_per_chunk);
        ASSERT_GE(ch.count, 1);
        ASSERT_LE(ch.count, c.items_per_chunk);
        ASSERT_LE(ch.n0 + ch.count, c.I) << "a chunk crosses slots";
        for (int p = 0; p < ch.count; ++p) ++item_seen[int64_t{ch.slot} * c.I + ch.n0 + p];
        item += ch.count;
      }
      DecodeSegment segs[kMaxSlotsForTest];
      const int ns = DecodeSegments(c0, c1, c.H, R, segs);
      ASSERT_LE(ns, owners);
      const int64_t rows = R * (c1 - c0);
      for (int64_t r = 0; r < rows;) {
        const DecodeDownChunk ch = DecodeDownChunkAt(segs, ns, r, c.rows_per_chunk);
        ASSERT_GE(ch.count, 1);
        ASSERT_LE(ch.count, c.rows_per_chunk);
        const DecodeSegment& g = segs[ch.seg];
        ASSERT_LT(ch.j, R);
        ASSERT_GE(ch.n, g.na);
        ASSERT_LE(ch.n + ch.count, g.nb) << "a chunk crosses (segment, slot) blocks";
        for (int q = 0; q < ch.count; ++q) {
          ++row_seen[(int64_t{g.owner} * c.H + ch.n + q) * R + ch.j];
        }
        r += ch.count;
      }
    }
    EXPECT_EQ(prev_ie, numel * c.I);
    EXPECT_EQ(prev_ce, owners * c.H);
    EXPECT_EQ(std::count(item_seen.begin(), item_seen.end(), 1),
              static_cast<int64_t>(item_seen.size()))
        << "an item missed or taken twice";
    EXPECT_EQ(std::count(row_seen.begin(), row_seen.end(), 1),
              static_cast<int64_t>(row_seen.size()))
        << "a (column, slot) row missed or taken twice";
  }
}

}  // namespace
}  // namespace kplan::kernels::cuda::detail
