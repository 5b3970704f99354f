// The host side of the one-kernel decode layer (moe_decode_layer.cu): how a
// layer's shape maps onto one CTA per multiprocessor, its shared memory and
// its ring of bulk-copy stages. Plain C++ so that it is unit-tested on the
// CPU (tests/kernels/moe_decode_layer_plan_test.cc). Internal to
// kernels/cuda/moe.
//
// Dynamic shared memory, in order, each part 128-byte aligned:
//   hidden rows   [M, H]                        (one bulk copy, step 0)
//   h             [M*k, I], and before it the grouped router's scratch
//                 (routing_warps x E floats), which it outlives
//   y             [columns per CTA, k] fp32     (step 3's per-slot outputs)
//   ring          `stages` stages of stage_bytes
// A stage holds whole step-1 items (an item is the gate and up rows of one
// intermediate column, or the one row of a plain activation: 1 or 2 rows of
// H) and at least one down row (I): stage_bytes is the largest of 16 KiB
// (or the knob), one item and one down row, rounded up to whole items; if
// two such stages do not fit, the largest of one item and one down row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace kplan::kernels::cuda::detail {

struct DecodeLayerShape {
  int64_t tokens = 0;  // M
  int top_k = 0;
  int num_experts = 0;
  int64_t hidden = 0, intermediate = 0;  // H, I
  int elem_bytes = 2;
  bool gated = true;             // gate and up rows per item
  bool combine = true;           // output [M, H] (else [M*k, H])
  bool grouped_routing = false;  // the router needs its scratch
};

struct DecodeLayerPlan {
  int grid = 0;  // CTAs: one per multiprocessor
  uint32_t off_h = 0, off_y = 0, off_ring = 0, stage_bytes = 0;
  int stages = 0;
  int chunk_items = 0;  // step-1 items per stage
  int chunk_rows = 0;   // down rows per stage
  int64_t smem_bytes = 0;
};

inline constexpr int kDecodeLayerMaxStages = 48;

inline uint32_t DecodeAlignUp(int64_t v, int64_t a) {
  return static_cast<uint32_t>((v + a - 1) / a * a);
}

// The plan on `sms` multiprocessors with `dynamic_smem` bytes of dynamic
// shared memory per CTA; stage_kib (0: 16) and max_stages are the
// benchmark's knobs. Empty when no ring of two stages fits beside the rest.
inline std::optional<DecodeLayerPlan> PlanDecodeLayer(const DecodeLayerShape& s, int sms,
                                                      int64_t dynamic_smem, int routing_warps,
                                                      int stage_kib = 0,
                                                      int max_stages = kDecodeLayerMaxStages) {
  if (sms <= 0 || s.tokens <= 0 || s.top_k <= 0 || s.hidden <= 0 || s.intermediate <= 0) {
    return std::nullopt;
  }
  const int64_t numel = s.tokens * s.top_k, elem = s.elem_bytes;
  const int64_t owners = s.combine ? s.tokens : numel;
  const int64_t per_column = s.combine ? s.top_k : 1;
  const int64_t cols_per_cta = (owners * s.hidden + sms - 1) / sms;
  DecodeLayerPlan p;
  p.grid = sms;
  p.off_h = DecodeAlignUp(s.tokens * s.hidden * elem, 128);
  const int64_t h_bytes =
      std::max<int64_t>(numel * s.intermediate * elem,
                        s.grouped_routing ? int64_t{routing_warps} * s.num_experts * 4 : 0);
  p.off_y = DecodeAlignUp(p.off_h + h_bytes, 128);
  p.off_ring = DecodeAlignUp(p.off_y + cols_per_cta * per_column * 4, 128);
  const int64_t item_bytes = (s.gated ? 2 : 1) * s.hidden * elem;
  const int64_t row_bytes = s.intermediate * elem;
  const int64_t want = int64_t{stage_kib > 0 ? stage_kib : 16} << 10;
  const int cap = std::min(kDecodeLayerMaxStages, std::max(2, max_stages));
  const int64_t room = dynamic_smem - int64_t{p.off_ring};
  int64_t stages = 0;
  // The wanted size in whole items; where two of those do not fit, the
  // least size that holds one item and one down row.
  for (const int64_t least : {std::max(want, item_bytes), int64_t{0}}) {
    p.stage_bytes =
        DecodeAlignUp(DecodeAlignUp(std::max({least, item_bytes, row_bytes}), item_bytes), 128);
    stages = std::min<int64_t>(cap, room / p.stage_bytes);
    if (room >= 0 && stages >= 2) break;
  }
  if (room < 0 || stages < 2) return std::nullopt;
  p.stages = static_cast<int>(stages);
  p.chunk_items = static_cast<int>(p.stage_bytes / item_bytes);
  p.chunk_rows = static_cast<int>(p.stage_bytes / row_bytes);
  p.smem_bytes = p.off_ring + stages * int64_t{p.stage_bytes};
  return p;
}

}  // namespace kplan::kernels::cuda::detail
