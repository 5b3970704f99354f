// The one-kernel decode layer's plan (moe_decode_layer.cu): how a layer's
// shape maps onto one CTA per multiprocessor, its shared memory and its ring
// of bulk-copy stages (host), and how a CTA's work is cut into the ring's
// chunks (host and device: the producer and the consumers enumerate the same
// chunks with these functions). Plain C++ so that it is unit-tested on the
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

#if defined(__CUDACC__)
#define KPLAN_DECODE_HD __host__ __device__
#else
#define KPLAN_DECODE_HD
#endif

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
// shared memory per CTA; stage_kib (0: 16; at most 1024) and max_stages are
// the benchmark's knobs. Empty when no ring of two stages fits beside the rest.
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
  const int64_t want = int64_t{stage_kib > 0 ? std::min(stage_kib, 1024) : 16} << 10;
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

// --- A CTA's work (host and device) --------------------------------------

// CTA `cta` of `grid`'s share [b, e) of n things split evenly.
KPLAN_DECODE_HD inline void DecodeShare(int64_t n, int cta, int grid, int64_t& b, int64_t& e) {
  b = n * cta / grid;
  e = n * (cta + 1) / grid;
}

// Step 1's chunk at item `item` (slot item / I, column item % I): the
// consecutive items of one slot from there, at most `most`, not past `end`.
struct DecodeUpChunk {
  int slot, n0, count;
};
KPLAN_DECODE_HD inline DecodeUpChunk DecodeUpChunkAt(int64_t item, int64_t end, int64_t I,
                                                     int most) {
  DecodeUpChunk c;
  c.slot = static_cast<int>(item / I);
  c.n0 = static_cast<int>(item % I);
  c.count = static_cast<int>(std::min<int64_t>(most, std::min<int64_t>(I - c.n0, end - item)));
  return c;
}

// A run of one owner's output columns [na, nb) inside a CTA's range [c0,
// c1) of [owners x H] (owner: a token with combine, else a slot); its down
// rows are enumerated from row0: slot j's rows na..nb-1 after slot j - 1's
// (R slots per column). A range crosses at most `owners` of them.
struct DecodeSegment {
  int owner;
  int na, nb;
  int row0;
};
// Writes the segments of [c0, c1) to out; returns their count.
KPLAN_DECODE_HD inline int DecodeSegments(int64_t c0, int64_t c1, int64_t H, int R,
                                          DecodeSegment* out) {
  int ns = 0, row0 = 0;
  for (int64_t c = c0; c < c1;) {
    const int64_t o = c / H, na = c % H, nb = std::min<int64_t>(H, na + (c1 - c));
    out[ns++] =
        DecodeSegment{static_cast<int>(o), static_cast<int>(na), static_cast<int>(nb), row0};
    row0 += R * static_cast<int>(nb - na);
    c += nb - na;
  }
  return ns;
}

// Step 3's chunk at down row r of a CTA: rows n .. n + count - 1 of slot j
// of segment seg (contiguous in w2), at most `most`.
struct DecodeDownChunk {
  int seg, j, n, count;
};
KPLAN_DECODE_HD inline DecodeDownChunk DecodeDownChunkAt(const DecodeSegment* segs, int nseg,
                                                         int64_t r, int most) {
  DecodeDownChunk c;
  c.seg = 0;
  while (c.seg + 1 < nseg && segs[c.seg + 1].row0 <= r) ++c.seg;
  const DecodeSegment& s = segs[c.seg];
  const int w = s.nb - s.na;
  const int rr = static_cast<int>(r - s.row0);
  c.j = rr / w;
  c.n = s.na + rr % w;
  c.count = std::min(most, w - rr % w);
  return c;
}

}  // namespace kplan::kernels::cuda::detail

#undef KPLAN_DECODE_HD
