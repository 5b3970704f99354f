// Decode-sized quantised expert GEMMs in matrix-vector form
// (moe_quant_gemm.h, LaunchMoeQuantMatvec): for slots on distinct experts,
// where a tile of moe_quant_decode.cu would hold one slot. Each slot's
// weight rows are read once, with 16-byte loads; three kernel forms, each
// the faster of those measured for its weights (docs/PERF.md, sessions
// 11-12 and 41; int4 with group scales exact in T, as checkpoints store
// them: with arbitrary fp32 scales session 11's int4 rows were faster):
//   fp8: one warp per pair of weight rows (gated GEMM 1: the gate and up
//         rows of one intermediate column; else two consecutive rows), read
//         as the bf16 decode kernels read theirs: lane l loads bytes 16l ..
//         16l + 15 of each 512-byte span of both rows, two spans in flight,
//         and the same bytes of the quantised activation row
//         (LaunchMoeFp8Quantize). m16n8k32 e4m3 on the stored bytes, no
//         conversion: lane group g's bytes of the two rows are rows g and
//         g + 8 of A and the activation's column g of B, so the diagonal
//         D[g][g] / D[g + 8][g] holds the group's 64-byte dot products,
//         promoted to fp32 per lane (block scales per 64 k, which lie in one
//         k-block: acc += Σ·(xs·ws); per-tensor / per-channel scales once at
//         the end: Σ·(xs·ws)); the warp then sums its 8 diagonal lanes.
//         GEMM 2 of a layer takes the combine (MoeQuantMatvecCombines): a
//         CTA computes 4 rows of each of a token's k slots per warp group,
//         then sums the slots in order. (Against session 11's tiles of 16
//         rows, 64 bytes of 8 rows a load, the one-token layers took
//         3.5-9.5% less; dequantising fp8 in registers for fp32 FMAs is
//         bound by the conversion pipe.)
//   int4: rows of four 512-byte spans or more (K >= 4096,
//         MoeQuantMatvecInt4Pairs): the same pairs and loads, two pairs a
//         warp (kItemPairs; 16 bytes of a row a lane: 32 weights of one
//         group), dequantised in registers to T pairs (w = round_T((q -
//         zp)·s), IntGroupDequant: two weights per instruction where that
//         is exact) on mma.sync m16n8k16 in T with the activation row (64
//         bytes a lane) in the same k order; the diagonal accumulates in
//         fp32 on the tensor cores across K. GEMM 2 takes the combine as
//         fp8's does. Shorter rows: tiles of 16 rows per warp (gated GEMM 1:
//         the gate and the up rows of 8 intermediate columns), the weights
//         the 16-row operand dequantised the same way and the activation row
//         in every one of the 8 columns (column 0 is kept). Per 64-byte
//         chunk of a row, lane (g, c) takes vector c of rows g and g + 8
//         through a ring of kMvStages chunks filled by cp.async, the
//         activation loaded in the same k order; K is split over up to 8
//         warps of a CTA while the grid is small (MoeQuantMatvecSplit), the
//         partials summed in warp order. (One H100, docs/PERF.md session 46,
//         one-token layers: the pairs on both GEMMs took Mixtral-8x7B from
//         102.7 to 90.3 us and DeepSeek-V3 from 108.7 to 107.3, but
//         Qwen3-30B-A3B, rows of 1024 and 384 bytes, from 22.7 to 23.9; with
//         the rule 103.0 -> 90.2, 109.2 -> 106.1 and 22.9.)
//   int8: one warp per slot and weight row pair (gated: the gate and up row
//         of one intermediate column) or kRows rows, as the bf16 decode
//         kernels (moe_decode.cu): lane i takes the 16-byte vectors i,
//         i + 32, ... of its rows, kBatch per row in flight, w = round_T((q
//         - zp)·s) as the CPU reference rounds it, times the activations in
//         T with fp32 fmaf. (Tiles were slower here, session 11.)
// Each lane sums in a fixed order, then the warp (and the split warps) in a
// fixed one: results are deterministic and depend on the shape only. The
// epilogue rounds as the grouped GEMMs do (round(acc), bias round(round(acc)
// + round(b))) and, for GEMM 1 with apply_act, applies the activation.
// Slots whose expert is not local (or out of range) get zero rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_decode.cuh"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::decode::LocalExpert;
using detail::decode::Rounded;
using detail::quant::BiasedZero;
using detail::quant::WordOf;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBatch = 2;  // int8: vectors per warp and row in flight
constexpr int kRows = 4;   // int8: rows per warp without gating
static_assert(kWarps == kMoeQuantMatvecWarps, "the split rule's warps (moe_quant_route.h)");
constexpr int kTileRows = 16;  // int4 tiles: weight rows per mma tile (gated: 8 gate + 8 up)

enum WeightKind : int { kWFp8 = 0, kWInt8 = 1, kWInt4 = 2 };

struct Params {
  const void* a;  // fp8 bytes or T, [rows, K]
  const float* a_scale;
  int a_row_div;
  int64_t a_kb;  // fp8 block: k-blocks per activation row (and per scale row)
  MoeQuantWeights w;
  const float* bias;
  const int32_t* ids;
  const int32_t* map;
  int num_experts, num_local;
  int64_t numel, N, K;
  int64_t nbn;                   // fp8 block: scale blocks along N
  int64_t groups;                // int: groups per row
  detail::quant::GroupDiv gdiv;  // int: k to its group
  bool gated, plain;             // the activation: gated pair, or on each row
  MoeActivation act;
  MoeActParams ap;
  int64_t out_cols;               // I (gated) or N
  int64_t warps_per_slot;         // int8, not gated
  int64_t tiles_per_slot, tiles;  // int4 tiles
  int split;                      // int4 tiles: warps a tile's K is split over
  void* c;                        // [numel, out_cols]
};

// GEMM output element (slot, row) as the grouped GEMMs store it, as float.
// kEarlyWork: the kernel issued loads before its PDL wait (LoadProduced).
template <typename T, int WK, bool kEarlyWork = false>
__device__ __forceinline__ float Output(const Params& p, int e, int64_t arow, int64_t row,
                                        float v) {
  if (WK == kWFp8 && p.w.scale_kind != MoeWeightScale::kBlock) {
    const float xs = detail::LoadProduced<kEarlyWork>(p.a_scale + arow);
    const float ws = p.w.scale_kind == MoeWeightScale::kPerTensor
                         ? __ldg(p.w.scale + e)
                         : __ldg(p.w.scale + static_cast<int64_t>(e) * p.N + row);
    v = __fmul_rn(v, __fmul_rn(xs, ws));
  }
  return Rounded<T>(v, p.bias != nullptr ? p.bias + static_cast<int64_t>(e) * p.N + row : nullptr);
}

// --- fp8: row pairs, one warp a pair, as the bf16 decode kernels read
// their rows (moe_decode.cu).

// d += A·B, m16n8k32 e4m3, fp32 accumulation.
__device__ __forceinline__ void MmaFp8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// b0 and b1 summed over the warp (every lane gets the sums), in a fixed order.
__device__ __forceinline__ void WarpSum2(float& b0, float& b1) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    b0 += __shfl_xor_sync(0xffffffffu, b0, o);
    b1 += __shfl_xor_sync(0xffffffffu, b1, o);
  }
}

// The dot products of rows r0 and r1 of local expert e with activation row
// arow, valid in every lane. Lane l loads bytes 16l .. 16l + 15 of each
// 512-byte span of both rows (one load instruction reads 512 contiguous
// bytes of a row), kPairBatch spans in flight, and the same bytes of the
// activation row. In the mma, lane group g's bytes of r0 are row g of A, of
// r1 row g + 8, and of the activation column g of B (the three in the same k
// order, as a dot product needs), so D[g][g] and D[g + 8][g] (lane 4g + g/2,
// d[g & 1] and d[2 + (g & 1)]) are lane group g's 64-byte dot products. Each
// is promoted to the lane's fp32 sum (block scales per 64 k, which lie in
// one k-block); the warp then sums the 8 diagonal lanes in a fixed order.
// kPairs pairs at once (their loads in flight together). kWaitInside: the
// kernel's PDL wait and release run here, once the first spans' weight
// loads are out and before any activation or scale load (a GEMM 2 whose
// activation the kernel before it writes and whose weights it does not;
// pdl.cuh), and those loads are coherent (LoadProduced).
constexpr int kPairBatch = 2;
template <int kPairs, bool kWaitInside = false>
__device__ __forceinline__ void Fp8PairDots(const Params& p, int e, const int64_t (&r0)[kPairs],
                                            const int64_t (&r1)[kPairs], int64_t arow, int lane,
                                            float (&o0)[kPairs], float (&o1)[kPairs]) {
  bool pending = kWaitInside;
  const int g = lane >> 2;
  const bool diag = (lane & 3) == (g >> 1);
  const uint8_t* wb = static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(e) * p.N * p.K;
  const int4* w0[kPairs];
  const int4* w1[kPairs];
  const float* ws0[kPairs];
  const float* ws1[kPairs];
  const bool block = p.w.scale_kind == MoeWeightScale::kBlock;
#pragma unroll
  for (int q = 0; q < kPairs; ++q) {
    w0[q] = reinterpret_cast<const int4*>(wb + r0[q] * p.K);
    w1[q] = reinterpret_cast<const int4*>(wb + r1[q] * p.K);
    const int64_t eb = static_cast<int64_t>(e) * p.nbn;
    ws0[q] = block ? p.w.scale + (eb + r0[q] / p.w.block_n) * p.a_kb : nullptr;
    ws1[q] = block ? p.w.scale + (eb + r1[q] / p.w.block_n) * p.a_kb : nullptr;
  }
  const int4* x = reinterpret_cast<const int4*>(static_cast<const uint8_t*>(p.a) + arow * p.K);
  // 32-bit indices: a row's vectors fit (MoeQuantMatvecSupports).
  const int vecs = static_cast<int>(p.K / 16);
  float a0[kPairs], a1[kPairs];
#pragma unroll
  for (int q = 0; q < kPairs; ++q) a0[q] = a1[q] = 0.0f;
  for (int base = 0; base < vecs; base += 32 * kPairBatch) {
    int4 v0[kPairBatch][kPairs], v1[kPairBatch][kPairs], xv[kPairBatch];
    float s0[kPairBatch][kPairs], s1[kPairBatch][kPairs];  // block scales xs·ws
    // Span u's weights; past K zeros, and every lane runs the mmas.
    auto load_w = [&](int u) {
      const int i = base + 32 * u + lane;
      const bool in = i < vecs;
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        v0[u][q] = in ? __ldg(w0[q] + i) : make_int4(0, 0, 0, 0);
        v1[u][q] = in ? __ldg(w1[q] + i) : make_int4(0, 0, 0, 0);
      }
    };
    if constexpr (kWaitInside) {  // the weights first, then the wait (every lane runs every span)
#pragma unroll
      for (int u = 0; u < kPairBatch; ++u) load_w(u);
      if (pending) {
        detail::PdlWaitThenRelease();
        pending = false;
      }
    }
#pragma unroll
    for (int u = 0; u < kPairBatch; ++u) {
      const int i = base + 32 * u + lane;
      const bool in = i < vecs;
      if constexpr (!kWaitInside) load_w(u);
      xv[u] = in ? detail::LoadProduced<kWaitInside>(x + i) : make_int4(0, 0, 0, 0);
      // The lane group's k-block (its diagonal lane may lie past K where
      // its first lanes do not).
      const int ig = base + 32 * u + (lane & ~3);
      const bool gin = block && ig < vecs;
      const int kb = gin ? ig * 16 / p.w.block_k : 0;
      const float xs =
          gin ? detail::LoadProduced<kWaitInside>(p.a_scale + arow * p.a_kb + kb) : 0.0f;
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        s0[u][q] = gin ? __fmul_rn(xs, __ldg(ws0[q] + kb)) : 0.0f;
        s1[u][q] = gin ? __fmul_rn(xs, __ldg(ws1[q] + kb)) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kPairBatch; ++u) {
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int4 &va = v0[u][q], &vb = v1[u][q];
        MmaFp8(t, va.x, vb.x, va.y, vb.y, xv[u].x, xv[u].y);
        MmaFp8(t, va.z, vb.z, va.w, vb.w, xv[u].z, xv[u].w);
        const float d0 = (g & 1) ? t[1] : t[0], d1 = (g & 1) ? t[3] : t[2];
        if (block) {
          a0[q] = __fadd_rn(a0[q], __fmul_rn(d0, s0[u][q]));
          a1[q] = __fadd_rn(a1[q], __fmul_rn(d1, s1[u][q]));
        } else {
          a0[q] = __fadd_rn(a0[q], d0);
          a1[q] = __fadd_rn(a1[q], d1);
        }
      }
    }
  }
  if (pending)
    detail::PdlWaitThenRelease();  // no span (K is a positive multiple of 16: not reached)
#pragma unroll
  for (int q = 0; q < kPairs; ++q) {
    float b0 = diag ? a0[q] : 0.0f, b1 = diag ? a1[q] : 0.0f;
    WarpSum2(b0, b1);
    o0[q] = b0;
    o1[q] = b1;
  }
}

// --- int4: row pairs as the fp8 ones, dequantised to T pairs on mma.sync.

// Fp8PairDots' contract on int4 weights with group scales: lane l loads
// bytes 16l .. 16l + 15 of each 512-byte span of both rows (32 weights of
// one group each: a group is a multiple of 32 k), dequantises them to T
// pairs (IntGroupDequant, the packed form where every lane's groups take
// it: one warp-uniform branch per span and pair, the mma inside seeing
// every lane) and loads the 32 activations of the same k (64 bytes). In
// m16n8k16 lane group g's vectors of r0 are row g of A, of r1 row g + 8,
// and their activations column g of B: word q of a vector (pairs 4q ..
// 4q + 3) feeds k16 steps 2q and 2q + 1 (pairs 2j, 2j + 1 each, the
// activation's words 2j, 2j + 1 with them). The T products are exact;
// D[g][g] and D[g + 8][g] (lane 4g + g/2, d[g & 1] and d[2 + (g & 1)])
// accumulate lane group g's dot products in fp32 on the tensor cores across
// K, and the warp sums its 8 diagonal lanes in a fixed order.
template <typename T, int kPairs, int kInt4Spans, bool kWaitInside = false>
__device__ __forceinline__ void Int4PairDots(const Params& p, int e, const int64_t (&r0)[kPairs],
                                             const int64_t (&r1)[kPairs], int64_t arow, int lane,
                                             float (&o0)[kPairs], float (&o1)[kPairs]) {
  using Dequant = detail::quant::IntGroupDequant<T, true>;
  bool pending = kWaitInside;
  const int g = lane >> 2;
  const bool diag = (lane & 3) == (g >> 1);
  const int64_t bpr = p.K / 2;  // weight bytes per row
  const uint8_t* wb = static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(e) * p.N * bpr;
  const int4* w = reinterpret_cast<const int4*>(wb);
  const float* sc = p.w.scale + static_cast<int64_t>(e) * p.N * p.groups;
  const uint8_t* zp =
      p.w.zero != nullptr ? p.w.zero + static_cast<int64_t>(e) * p.N * p.groups : nullptr;
  // 32-bit offsets from the expert's first vector and group: its N x K / 32
  // vectors fit (MoeQuantMatvecSupports), and its fewer groups.
  const int vecs = static_cast<int>(bpr / 16);
  int w0[kPairs], w1[kPairs], g0[kPairs], g1[kPairs];  // the rows' first vector and group
#pragma unroll
  for (int q = 0; q < kPairs; ++q) {
    w0[q] = static_cast<int>(r0[q]) * vecs;
    w1[q] = static_cast<int>(r1[q]) * vecs;
    g0[q] = static_cast<int>(r0[q] * p.groups);
    g1[q] = static_cast<int>(r1[q] * p.groups);
  }
  const int4* x = reinterpret_cast<const int4*>(static_cast<const T*>(p.a) + arow * p.K);
  float d[kPairs][4];
#pragma unroll
  for (int q = 0; q < kPairs; ++q) d[q][0] = d[q][1] = d[q][2] = d[q][3] = 0.0f;
  for (int base = 0; base < vecs; base += 32 * kInt4Spans) {
    int4 v0[kInt4Spans][kPairs], v1[kInt4Spans][kPairs];
    // The weights first (kWaitInside: then the wait), past K zeros with
    // zero scales, and every lane runs the mmas.
#pragma unroll
    for (int u = 0; u < kInt4Spans; ++u) {
      const int i = base + 32 * u + lane;
      const bool in = i < vecs;
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        v0[u][q] = in ? __ldg(w + w0[q] + i) : make_int4(0, 0, 0, 0);
        v1[u][q] = in ? __ldg(w + w1[q] + i) : make_int4(0, 0, 0, 0);
      }
    }
    if (kWaitInside && pending) {
      detail::PdlWaitThenRelease();
      pending = false;
    }
    // Then every span's scales and zero points (from memory, as the weights:
    // the batch waits for one round trip), the activations (in the L2, or
    // the L1 after the slot's first warp; the combine's from the L2 only,
    // LoadProduced) with their span.
    float s0[kInt4Spans][kPairs], s1[kInt4Spans][kPairs], z0[kInt4Spans][kPairs],
        z1[kInt4Spans][kPairs];
#pragma unroll
    for (int u = 0; u < kInt4Spans; ++u) {
      const int i = base + 32 * u + lane;
      const bool in = i < vecs;
      const int gk = in ? static_cast<int>(p.gdiv(i * 32)) : 0;  // a vector lies in one group
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        s0[u][q] = in ? __ldg(sc + g0[q] + gk) : 0.0f;
        s1[u][q] = in ? __ldg(sc + g1[q] + gk) : 0.0f;
        z0[u][q] = BiasedZero(in ? zp : nullptr, g0[q] + gk, true);
        z1[u][q] = BiasedZero(in ? zp : nullptr, g1[q] + gk, true);
      }
    }
#pragma unroll
    for (int u = 0; u < kInt4Spans; ++u) {
      const int i = base + 32 * u + lane;
      int4 xv[4];
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        xv[h] = i < vecs ? detail::LoadProduced<kWaitInside>(x + 4 * i + h) : make_int4(0, 0, 0, 0);
      }
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        const Dequant q0(s0[u][q], z0[u][q]), q1(s1[u][q], z1[u][q]);
        auto dots = [&](bool packed) {
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            uint32_t a0[4], a1[4];
            q0.Pairs(WordOf(v0[u][q], h), a0, packed);
            q1.Pairs(WordOf(v1[u][q], h), a1, packed);
            const uint32_t lo[4] = {a0[0], a1[0], a0[1], a1[1]};
            const uint32_t hi[4] = {a0[2], a1[2], a0[3], a1[3]};
            detail::quant::Mma16816<T>(d[q], lo, WordOf(xv[h], 0), WordOf(xv[h], 1));
            detail::quant::Mma16816<T>(d[q], hi, WordOf(xv[h], 2), WordOf(xv[h], 3));
          }
        };
        if (__all_sync(0xffffffffu, q0.packed() && q1.packed())) {
          dots(true);
        } else {
          dots(false);
        }
      }
    }
  }
  if (pending) detail::PdlWaitThenRelease();  // no span (not reached: K is a multiple of 32)
#pragma unroll
  for (int q = 0; q < kPairs; ++q) {
    const float dg = (g & 1) ? d[q][1] : d[q][0], du = (g & 1) ? d[q][3] : d[q][2];
    float b0 = diag ? dg : 0.0f, b1 = diag ? du : 0.0f;
    WarpSum2(b0, b1);
    o0[q] = b0;
    o1[q] = b1;
  }
}

// --- the pair kernels (fp8 and int4).

// Row pairs a warp of PairKernel and of PairCombineKernel (both keep
// kPairBatch spans in flight). int4's activation is 4 bytes for every byte
// of weights, and every warp loads all of its row's, so int4 warps share it
// over 2 pairs (4 rows) in both kernels, as fp8's combine.
// docs/PERF.md, session 45: one pair a warp on two spans ran
// Qwen3-30B-A3B's int4 layer 10% slower than the tiles, 4 pairs on one span
// in both kernels 14% faster but Mixtral-8x7B's 12% slower.
template <int WK>
constexpr int kItemPairs = WK == kWFp8 ? 1 : 2;
constexpr int kCombinePairs = 2;
constexpr int kCombineRows = 2 * kCombinePairs;  // output columns of a combine warp

// The dot products of kPairs row pairs in the weights' form, kSpans spans
// in flight (fp8: kPairBatch).
template <typename T, int WK, int kPairs, int kSpans, bool kWaitInside = false>
__device__ __forceinline__ void PairDots(const Params& p, int e, const int64_t (&r0)[kPairs],
                                         const int64_t (&r1)[kPairs], int64_t arow, int lane,
                                         float (&o0)[kPairs], float (&o1)[kPairs]) {
  static_assert(WK == kWFp8 || WK == kWInt4, "pairs: fp8 or int4 weights");
  if constexpr (WK == kWFp8) {
    static_assert(kSpans == kPairBatch, "fp8 pairs: kPairBatch spans");
    Fp8PairDots<kPairs, kWaitInside>(p, e, r0, r1, arow, lane, o0, o1);
  } else {
    Int4PairDots<T, kPairs, kSpans, kWaitInside>(p, e, r0, r1, arow, lane, o0, o1);
  }
}

// A warp's items of a slot: gated, kItemPairs intermediate columns (their
// gate and up rows); else 2 kItemPairs rows.
template <int WK>
__host__ __device__ int64_t PairItemsPerSlot(bool gated, int64_t out_cols, int64_t N) {
  constexpr int P = kItemPairs<WK>;
  return gated ? (out_cols + P - 1) / P : (N + 2 * P - 1) / (2 * P);
}

// One warp per (slot, item): gated, pair h is the gate and up rows of
// intermediate column P q + h; else rows 2 (P q + h) and 2 (P q + h) + 1
// (past the end: row 0, dropped); lane h writes pair h's outputs. int4
// holds its registers without spilling at 2 CTAs an SM.
template <typename T, int WK>
__global__ void __launch_bounds__(kThreads, WK == kWFp8 ? 4 : 2)
    PairKernel(const __grid_constant__ Params p) {
  constexpr int P = kItemPairs<WK>;
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t per_slot = PairItemsPerSlot<WK>(p.gated, p.out_cols, p.N);
  if (item >= p.numel * per_slot) return;
  const int64_t s = item / per_slot, q = item % per_slot;
  const int e = LocalExpert(p.ids, p.map, p.num_experts, p.num_local, s);
  const int64_t arow = s / p.a_row_div;
  T* out = static_cast<T*>(p.c) + s * p.out_cols;
  auto row = [&](int64_t c, int half) -> int64_t {  // half 0: gate / row 2c, 1: up / row 2c + 1
    if (p.gated) return moe_math::GatedRow(p.act, c < p.out_cols ? c : 0, p.out_cols, half);
    return 2 * c + half < p.N ? 2 * c + half : 0;
  };
  int64_t r0[P], r1[P];
#pragma unroll
  for (int h = 0; h < P; ++h) {
    r0[h] = row(P * q + h, 0);
    r1[h] = row(P * q + h, 1);
  }
  float d0[P], d1[P];
#pragma unroll
  for (int h = 0; h < P; ++h) d0[h] = d1[h] = 0.0f;
  if (e >= 0) PairDots<T, WK, P, kPairBatch>(p, e, r0, r1, arow, lane, d0, d1);
  if (lane >= P) return;
  float a = d0[0], b = d1[0];  // pair `lane`'s (every lane holds every sum)
#pragma unroll
  for (int h = 1; h < P; ++h) {
    if (lane == h) a = d0[h], b = d1[h];
  }
  const int64_t c = P * q + lane;
  if (p.gated) {
    if (c >= p.out_cols) return;
    // act(0, 0) == 0 for every activation: slots of remote experts.
    out[c] =
        FromFloat<T>(e < 0 ? 0.0f
                           : moe_math::Gated(p.act, p.ap, Output<T, WK>(p, e, arow, row(c, 0), a),
                                             Output<T, WK>(p, e, arow, row(c, 1), b)));
    return;
  }
  const float d[2] = {a, b};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = 2 * c + h;
    if (n >= p.N) break;
    float v = 0.0f;
    if (e >= 0) {
      v = Output<T, WK>(p, e, arow, n, d[h]);
      if (p.plain) v = moe_math::Plain(p.act, v);
    }
    out[n] = FromFloat<T>(v);
  }
}

// GEMM 2 with the combine (where MoeQuantMatvecCombines): a CTA computes
// kCombineRows * G consecutive output columns of one token with k * G warps
// (G = max(1, 8 / k); the other 8 - k * G warps, where k does not divide 8,
// only join the barrier); warp (g, j) computes slot j's kCombineRows rows as
// pairs (their loads in flight together), each rounded as GEMM 2 stores it;
// the first kCombineRows * G threads then sum each column's k values in slot
// order as LaunchMoeCombine does (moe_decode.cu's down-combine kernel, on
// pairs).
template <typename T, int WK>
__global__ void __launch_bounds__(kThreads, 2)
    PairCombineKernel(const __grid_constant__ Params p, const float* weights, int k, int group) {
  constexpr int kPairs = kCombinePairs;
  __shared__ float y[kCombineRows * kWarps];  // [column][slot], k * group <= 8
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int g = warp / k, j = warp % k, cols = kCombineRows * group;
  const int64_t tiles = (p.N + cols - 1) / cols;
  const int64_t m = blockIdx.x / tiles, c0 = (blockIdx.x % tiles) * cols;
  const int64_t n0 = c0 + g * kCombineRows;
  // Before the PDL wait: the ids (LocalExpert<true>) and the first spans of
  // the weights (PairDots<..., true>); the activation and its scales after
  // it.
  bool waited = false;
  if (g < group) {
    const int64_t s = m * k + j;
    const int e = LocalExpert<true>(p.ids, p.map, p.num_experts, p.num_local, s);
    float d0[kPairs] = {}, d1[kPairs] = {};
    int64_t r0[kPairs], r1[kPairs];
#pragma unroll
    for (int q = 0; q < kPairs; ++q) {
      // Rows past N read row 0 and are dropped.
      r0[q] = n0 + 2 * q < p.N ? n0 + 2 * q : 0;
      r1[q] = n0 + 2 * q + 1 < p.N ? n0 + 2 * q + 1 : 0;
    }
    if (e >= 0) {
      PairDots<T, WK, kPairs, kPairBatch, true>(p, e, r0, r1, s, lane, d0, d1);
      waited = true;
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kCombineRows; ++r) {
        const int64_t n = n0 + r;
        if (n >= p.N) continue;
        const float d = r % 2 == 0 ? d0[r / 2] : d1[r / 2];
        y[(g * kCombineRows + r) * k + j] = e < 0 ? 0.0f : Output<T, WK, true>(p, e, s, n, d);
      }
    }
  }
  if (!waited) detail::PdlWaitThenRelease();
  __syncthreads();
  const int64_t n = c0 + threadIdx.x;
  if (threadIdx.x < cols && n < p.N) {
    float acc = 0.0f;
    for (int jj = 0; jj < k; ++jj) {
      const float v = y[threadIdx.x * k + jj];
      acc = __fadd_rn(acc, weights != nullptr ? __fmul_rn(v, weights[m * k + jj]) : v);
    }
    static_cast<T*>(p.c)[m * p.N + n] = FromFloat<T>(acc);
  }
}

// --- int4: mma tiles on dequantised pairs.

// The tile of a warp: rows[0] (its lanes' row g) and rows[1] (row g + 8) of
// local expert e against activation row arow, over the chunks ks, ks +
// split, ... of K; on return acc[0] / acc[2] of the lanes with c == 0 hold
// rows g / g + 8 (column 0 of D). Per 64-byte chunk of a row (128 k), lane
// (g, c) dequantises vector c of rows g and g + 8 (32 k, one group) to T
// pairs (IntGroupDequant) and loads the same 32 k of the activation row;
// word q of the vector (pairs 4q .. 4q + 3) feeds mma k16 steps 2q and 2q + 1
// (pairs 2j, 2j + 1 each: logical k 2c, 2c + 1 and 2c + 8, 2c + 9). The T
// products are exact and summed in fp32 on the tensor cores across K.
// The weights stream through a per-lane ring of kMvStages chunks filled by
// cp.async (`ring`, this lane's slots), the chunk's group scales and
// activations are loaded one chunk ahead into registers: a chunk waits for
// no round trip (docs/PERF.md, session 27: with kBatch chunks loaded, then
// used, the one-token layers ran at 40% of the DRAM peak).
constexpr int kMvStages = 4;
template <typename T>
__device__ __forceinline__ void Int4TileDots(const Params& p, int e, const int64_t (&rows)[2],
                                             int64_t arow, int ks, int lane, float (&acc)[4],
                                             uint4 (&ring)[kMvStages][2][kThreads]) {
  using Dequant = detail::quant::IntGroupDequant<T, true>;
  const int c = lane & 3;
  const int64_t bpr = p.K / 2;  // weight bytes per row
  const uint8_t* wb = static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(e) * p.N * bpr;
  const int4* w[2] = {reinterpret_cast<const int4*>(wb + rows[0] * bpr),
                      reinterpret_cast<const int4*>(wb + rows[1] * bpr)};
  const int4* x = reinterpret_cast<const int4*>(static_cast<const T*>(p.a) + arow * p.K);
  // 32-bit indices: a row's vectors fit (MoeQuantMatvecSupports).
  const int vecs = static_cast<int>(bpr / 16), chunks = (vecs + 3) / 4;
  const int64_t e_groups = static_cast<int64_t>(e) * p.N * p.groups;
  const int64_t g0 = e_groups + rows[0] * p.groups, g1 = e_groups + rows[1] * p.groups;
  // Vector index of this lane in chunk ch, and whether it holds weights
  // (past K or the warp's chunks: zeros, and every lane runs the mma).
  auto vec_of = [&](int ch) { return ch * 4 + c; };
  auto in_of = [&](int ch) { return ch < chunks && vec_of(ch) < vecs; };
  auto issue = [&](int ch, int stage) {
    const bool in = in_of(ch);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      detail::CpAsync16(
          static_cast<uint32_t>(__cvta_generic_to_shared(&ring[stage][r][threadIdx.x])),
          w[r] + (in ? vec_of(ch) : 0), in);
    }
    detail::CpAsyncCommit();
  };
  struct Ops {
    int4 xv[4];
    float s0, s1, z0, z1;  // the vector's group scales and biased zeros
  };
  auto load_ops = [&](int ch, Ops& o) {
    const bool in = in_of(ch);
    const int i = in ? vec_of(ch) : 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) o.xv[q] = in ? __ldg(x + 4 * i + q) : make_int4(0, 0, 0, 0);
    const int64_t gk = p.gdiv(i * 32);  // a vector lies in one group
    o.s0 = in ? __ldg(p.w.scale + g0 + gk) : 0.0f;
    o.s1 = in ? __ldg(p.w.scale + g1 + gk) : 0.0f;
    o.z0 = BiasedZero(in ? p.w.zero : nullptr, g0 + gk, true);
    o.z1 = BiasedZero(in ? p.w.zero : nullptr, g1 + gk, true);
  };
  const int step = p.split;
#pragma unroll
  for (int sg = 0; sg < kMvStages - 1; ++sg) issue(ks + sg * step, sg);
  Ops cur;
  load_ops(ks, cur);
  int it = 0;
#pragma unroll 1
  for (int ch = ks; ch < chunks; ch += step, ++it) {
    issue(ch + (kMvStages - 1) * step, (it + kMvStages - 1) % kMvStages);
    Ops nxt;
    load_ops(ch + step, nxt);
    detail::CpAsyncWait<kMvStages - 1>();
    const int stage = it % kMvStages;
    const uint4 v0 = ring[stage][0][threadIdx.x], v1 = ring[stage][1][threadIdx.x];
    const Dequant d0(cur.s0, cur.z0);
    const Dequant d1(cur.s1, cur.z1);
    // One warp-uniform branch per chunk on the packed form, the mma inside
    // seeing every lane (with a branch per word the one-token layers took
    // 1.04-1.17x longer: docs/PERF.md, session 13).
    auto dots = [&](bool packed) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t a0[4], a1[4];
        d0.Pairs(WordOf(v0, q), a0, packed);
        d1.Pairs(WordOf(v1, q), a1, packed);
        const uint32_t lo[4] = {a0[0], a1[0], a0[1], a1[1]}, hi[4] = {a0[2], a1[2], a0[3], a1[3]};
        detail::quant::Mma16816<T>(acc, lo, WordOf(cur.xv[q], 0), WordOf(cur.xv[q], 1));
        detail::quant::Mma16816<T>(acc, hi, WordOf(cur.xv[q], 2), WordOf(cur.xv[q], 3));
      }
    };
    if (__all_sync(0xffffffffu, d0.packed() && d1.packed())) {
      dots(true);
    } else {
      dots(false);
    }
    cur = nxt;
  }
  detail::CpAsyncWait<0>();
}

// A CTA of kWarps warps takes kWarps / split tiles of one slot, each tile's
// K split over `split` warps; the tile's first warp sums the partials in
// warp order and writes the outputs. Gated, tile t of a slot is the gate
// rows (row g) and the up rows (g + 8) of intermediate columns 8t .. 8t + 7;
// else rows 16t .. 16t + 15.
// The registers it needs (~96, 2 CTAs): a cap of 3 CTAs spills and
// measured slower (docs/PERF.md, sessions 13 and 27).
template <typename T>
__global__ void __launch_bounds__(kThreads) Int4TileKernel(const __grid_constant__ Params p) {
  __shared__ float red[kWarps][kTileRows];
  __shared__ uint4 ring[kMvStages][2][kThreads];  // the lanes' weights
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int ks = warp % p.split;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (kWarps / p.split) + warp / p.split;
  const bool live = tile < p.tiles;
  const int64_t s = live ? tile / p.tiles_per_slot : 0, t = tile % p.tiles_per_slot;
  const int e = live ? LocalExpert(p.ids, p.map, p.num_experts, p.num_local, s) : -1;
  const int64_t arow = s / p.a_row_div;
  const int g = lane >> 2;
  // Row r of the tile (past N: row 0, dropped).
  auto row_of = [&](int r) -> int64_t {
    if (p.gated) {
      const int64_t col = t * 8 + (r & 7);
      const int64_t cc = col < p.out_cols ? col : 0;
      return moe_math::GatedRow(p.act, cc, p.out_cols, r < 8 ? 0 : 1);
    }
    const int64_t row = t * kTileRows + r;
    return row < p.N ? row : 0;
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (e >= 0) {
    const int64_t rows[2] = {row_of(g), row_of(g + 8)};
    Int4TileDots<T>(p, e, rows, arow, ks, lane, acc, ring);
  }
  if ((lane & 3) == 0) {
    red[warp][g] = acc[0];
    red[warp][g + 8] = acc[2];
  }
  __syncthreads();
  if (!live || ks != 0) return;
  T* out = static_cast<T*>(p.c) + s * p.out_cols;
  auto sum = [&](int r) {
    float v = red[warp][r];
    for (int k = 1; k < p.split; ++k) v += red[warp + k][r];
    return v;
  };
  if (p.gated) {
    const int64_t col = t * 8 + lane;
    if (lane >= 8 || col >= p.out_cols) return;
    if (e < 0) {
      out[col] = FromFloat<T>(0.0f);  // act(0, 0) == 0 for every activation
      return;
    }
    const float gv = Output<T, kWInt4>(p, e, arow, row_of(lane), sum(lane));
    const float uv = Output<T, kWInt4>(p, e, arow, row_of(lane + 8), sum(lane + 8));
    out[col] = FromFloat<T>(moe_math::Gated(p.act, p.ap, gv, uv));
    return;
  }
  const int64_t row = t * kTileRows + lane;
  if (lane >= kTileRows || row >= p.N) return;
  if (e < 0) {
    out[row] = FromFloat<T>(0.0f);
    return;
  }
  const float v = Output<T, kWInt4>(p, e, arow, row, sum(lane));
  out[row] = FromFloat<T>(p.plain ? moe_math::Plain(p.act, v) : v);
}

// --- int8: row dot products.

constexpr int kInt8Elems = 16;  // weights per 16-byte vector

// Two T values (one 32-bit word) as floats.
template <typename T>
__device__ __forceinline__ float2 PairToFloat2(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

// acc += Σ_j w_j · x_j over one weight vector `v` of group `dq`, x the
// activations of its k; signed int8 without zero points is read as q + 128.
template <typename T>
__device__ __forceinline__ void Int8VectorDot(const int4& v,
                                              const detail::quant::IntGroupDequant<T, false>& dq,
                                              bool flip, const float (&x)[kInt8Elems], float& acc) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t pairs[2];
    dq.Pairs(WordOf(v, q) ^ (flip ? 0x80808080u : 0u), pairs);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const float2 w = PairToFloat2<T>(pairs[b]);
      acc = fmaf(w.x, x[4 * q + 2 * b], acc);
      acc = fmaf(w.y, x[4 * q + 2 * b + 1], acc);
    }
  }
}

// out[r] = the dot product of weight row rows[r] of local expert e with
// activation row arow; valid in every lane.
template <typename T, int R>
__device__ __forceinline__ void Int8RowDots(const Params& p, int e, const int64_t (&rows)[R],
                                            int64_t arow, int lane, float (&out)[R]) {
  const int vecs = static_cast<int>(p.K / 16);
  const uint8_t* wb = static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(e) * p.N * p.K;
  const int4* xr = reinterpret_cast<const int4*>(static_cast<const T*>(p.a) + arow * p.K);
  const bool flip = p.w.zero == nullptr;
  // Per row: its vectors, and the offset of its groups' scales (and zero
  // points) from the expert's (32-bit: N x groups of one expert).
  const int64_t e_groups = static_cast<int64_t>(e) * p.N * p.groups;
  const float* sc = p.w.scale + e_groups;
  const uint8_t* zp = p.w.zero != nullptr ? p.w.zero + e_groups : nullptr;
  const int4* w[R];
  int goff[R];
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    w[r] = reinterpret_cast<const int4*>(wb + rows[r] * p.K);
    goff[r] = static_cast<int>(rows[r] * p.groups);
    acc[r] = 0.0f;
  }
  for (int base = lane; base < vecs; base += 32 * kBatch) {
    int4 v[kBatch][R];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (base + 32 * u < vecs) {
#pragma unroll
        for (int r = 0; r < R; ++r) v[u][r] = __ldg(w[r] + base + 32 * u);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + 32 * u;
      if (i >= vecs) break;
      float x[kInt8Elems];
#pragma unroll
      for (int q = 0; q < kInt8Elems / 8; ++q) {
        const int4 xv = __ldg(xr + i * (kInt8Elems / 8) + q);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = PairToFloat2<T>(WordOf(xv, j));
          x[8 * q + 2 * j] = f.x;
          x[8 * q + 2 * j + 1] = f.y;
        }
      }
      const int gk = static_cast<int>(p.gdiv(i * kInt8Elems));  // a vector lies in one group
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const detail::quant::IntGroupDequant<T, false> dq(__ldg(sc + goff[r] + gk),
                                                          BiasedZero(zp, goff[r] + gk, false));
        Int8VectorDot<T>(v[u][r], dq, flip, x, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    out[r] = acc[r];
  }
}

// Gated: one warp per (slot, intermediate column), its gate and up rows.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2) Int8GatedKernel(const __grid_constant__ Params p) {
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= p.numel * p.out_cols) return;
  const int64_t s = item / p.out_cols, n = item % p.out_cols;
  T* out = static_cast<T*>(p.c);
  const int e = LocalExpert(p.ids, p.map, p.num_experts, p.num_local, s);
  if (e < 0) {
    if (lane == 0) out[item] = FromFloat<T>(0.0f);  // act(0, 0) == 0 for every activation
    return;
  }
  const int64_t rows[2] = {moe_math::GatedRow(p.act, n, p.out_cols, 0),
                           moe_math::GatedRow(p.act, n, p.out_cols, 1)};
  const int64_t arow = s / p.a_row_div;
  float d[2];
  Int8RowDots<T, 2>(p, e, rows, arow, lane, d);
  if (lane != 0) return;
  const float g = Output<T, kWInt8>(p, e, arow, rows[0], d[0]);
  const float u = Output<T, kWInt8>(p, e, arow, rows[1], d[1]);
  out[item] = FromFloat<T>(moe_math::Gated(p.act, p.ap, g, u));
}

// Otherwise: one warp per (slot, kRows consecutive rows), with the plain
// activation on each or none.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2) Int8RowsKernel(const __grid_constant__ Params p) {
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= p.numel * p.warps_per_slot) return;
  const int64_t s = item / p.warps_per_slot, n0 = (item % p.warps_per_slot) * kRows;
  T* out = static_cast<T*>(p.c) + s * p.N;
  const int e = LocalExpert(p.ids, p.map, p.num_experts, p.num_local, s);
  if (e < 0) {
    if (lane < kRows && n0 + lane < p.N) out[n0 + lane] = FromFloat<T>(0.0f);
    return;
  }
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = n0 + r < p.N ? n0 + r : 0;  // past N: dropped
  const int64_t arow = s / p.a_row_div;
  float d[kRows];
  Int8RowDots<T, kRows>(p, e, rows, arow, lane, d);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (n0 + r >= p.N) break;
    const float v = Output<T, kWInt8>(p, e, arow, n0 + r, d[r]);
    out[n0 + r] = FromFloat<T>(p.plain ? moe_math::Plain(p.act, v) : v);
  }
}

// The kernel form of a GEMM: one choice for the grid, the launch and the
// combine (MoeQuantMatvecCombines).
enum class Form { kInt8, kFp8Pairs, kInt4Pairs, kInt4Tiles };
Form FormOf(DType kind, int64_t K) {
  if (kind == DType::kInt8) return Form::kInt8;
  if (kind == DType::kFp8E4m3) return Form::kFp8Pairs;
  return MoeQuantMatvecInt4Pairs(K) ? Form::kInt4Pairs : Form::kInt4Tiles;
}

// A pair form's kernel on `grid` CTAs; combine_group > 0: GEMM 2 with the
// combine (PairCombineKernel).
template <typename T, int WK>
cudaError_t Pairs(const Params& p, dim3 grid, const MoeQuantMatvecArgs& args, int combine_group,
                  cudaStream_t stream) {
  if (combine_group > 0) {
    return detail::LaunchPdl(PairCombineKernel<T, WK>, grid, dim3(kThreads), 0, stream, p,
                             args.topk_weights, args.top_k, combine_group);
  }
  return detail::LaunchPdl(PairKernel<T, WK>, grid, dim3(kThreads), 0, stream, p);
}
// The kernel of form f on `grid` CTAs (LaunchMoeQuantMatvec sizes it).
template <typename T>
cudaError_t ByForm(Form f, const Params& p, dim3 grid, const MoeQuantMatvecArgs& args,
                   int combine_group, cudaStream_t stream) {
  switch (f) {
    case Form::kInt8:
      return p.gated ? detail::LaunchPdl(Int8GatedKernel<T>, grid, dim3(kThreads), 0, stream, p)
                     : detail::LaunchPdl(Int8RowsKernel<T>, grid, dim3(kThreads), 0, stream, p);
    case Form::kFp8Pairs:
      return Pairs<T, kWFp8>(p, grid, args, combine_group, stream);
    case Form::kInt4Pairs:
      return Pairs<T, kWInt4>(p, grid, args, combine_group, stream);
    default:
      return detail::LaunchPdl(Int4TileKernel<T>, grid, dim3(kThreads), 0, stream, p);
  }
}

}  // namespace

bool MoeQuantMatvecCombines(const MoeQuantWeights& w, int top_k, int64_t K) {
  const Form f = FormOf(w.kind, K);
  return (f == Form::kFp8Pairs || f == Form::kInt4Pairs) && top_k >= 1 && top_k <= kWarps;
}

bool MoeQuantMatvecSupports(const MoeQuantWeights& w, DType act_type, int64_t N, int64_t K) {
  // The decode kernels' weights and sizes (K < 2^30 among them), with
  // 32-bit vector, chunk and group indices (Int8RowDots, the int4 tiles and
  // the pairs).
  return MoeQuantDecodeSupports(w, act_type, N, K) && N * (K / 16) <= INT32_MAX;
}

absl::Status LaunchMoeQuantMatvec(const MoeQuantMatvecArgs& args, cudaStream_t stream) {
  const MoeQuantDecodeArgs& d = args.gemm;
  if (!MoeQuantMatvecSupports(d.w, d.act_type, d.N, d.K)) {
    return absl::InvalidArgumentError(
        "moe_quant_matvec: weights / activation type / sizes not supported "
        "(MoeQuantMatvecSupports)");
  }
  if (d.numel < 0 || args.num_experts <= 0 || d.num_local_experts <= 0 || d.a_row_div <= 0) {
    return absl::InvalidArgumentError("moe_quant_matvec: bad sizes");
  }
  if (d.numel == 0) return absl::OkStatus();
  if (d.a == nullptr || d.c == nullptr || args.topk_ids == nullptr ||
      (d.w.kind == DType::kFp8E4m3 && d.a_scale == nullptr)) {
    return absl::InvalidArgumentError("moe_quant_matvec: null pointer");
  }
  if (args.combine && (!MoeQuantMatvecCombines(d.w, args.top_k, d.K) || d.apply_act ||
                       d.a_row_div != 1 || d.numel % args.top_k != 0)) {
    return absl::InvalidArgumentError(
        "moe_quant_matvec: a combine it does not take (MoeQuantMatvecCombines), with an "
        "activation, on shared activation rows (a_row_div), or over slots not a multiple of "
        "top_k");
  }
  const bool gated = d.apply_act && d.act < MoeActivation::kSiluNoMul;
  if (gated && d.N % 2 != 0) return absl::InvalidArgumentError("moe_quant_matvec: odd gated N");
  Params p{};
  p.a = d.a;
  p.a_scale = d.a_scale;
  p.a_row_div = d.a_row_div;
  p.w = d.w;
  const bool block = d.w.scale_kind == MoeWeightScale::kBlock;
  p.a_kb = block ? (d.K + d.w.block_k - 1) / d.w.block_k : 1;
  p.nbn = block ? (d.N + d.w.block_n - 1) / d.w.block_n : 0;
  p.groups = d.w.scale_kind == MoeWeightScale::kGroup ? d.K / d.w.group_size : 0;
  p.gdiv = detail::quant::GroupDiv::For(d.w.group_size);
  p.bias = d.bias;
  p.ids = args.topk_ids;
  p.map = args.expert_map;
  p.num_experts = args.num_experts;
  p.num_local = d.num_local_experts;
  p.numel = d.numel;
  p.N = d.N;
  p.K = d.K;
  p.gated = gated;
  p.plain = d.apply_act && !gated;
  p.act = d.act;
  p.ap = EffectiveActParams(d.act_params);
  p.out_cols = gated ? d.N / 2 : d.N;
  p.c = d.c;
  // The CTAs of kWarps warps. The combine's: k * group <= 8 warps for
  // kCombineRows * group columns of a token.
  const int combine_group = args.combine ? std::max(1, kWarps / args.top_k) : 0;
  const Form form = FormOf(d.w.kind, d.K);
  int64_t ctas;
  if (args.combine) {
    const int cols = kCombineRows * combine_group;
    ctas = d.numel / args.top_k * ((d.N + cols - 1) / cols);
  } else if (form == Form::kFp8Pairs || form == Form::kInt4Pairs) {  // a warp per (slot, item)
    const int64_t items = form == Form::kFp8Pairs
                              ? PairItemsPerSlot<kWFp8>(gated, p.out_cols, d.N)
                              : PairItemsPerSlot<kWInt4>(gated, p.out_cols, d.N);
    ctas = (d.numel * items + kWarps - 1) / kWarps;
  } else if (form == Form::kInt4Tiles) {  // kWarps / split tiles a CTA
    p.tiles_per_slot = gated ? (p.out_cols + 7) / 8 : (d.N + kTileRows - 1) / kTileRows;
    p.tiles = d.numel * p.tiles_per_slot;
    p.split = MoeQuantMatvecSplit(p.tiles, d.K / 2);
    ctas = (p.tiles + kWarps / p.split - 1) / (kWarps / p.split);
  } else {  // int8: a warp per (slot, item)
    p.warps_per_slot = (d.N + kRows - 1) / kRows;
    ctas = (d.numel * (gated ? p.out_cols : p.warps_per_slot) + kWarps - 1) / kWarps;
  }
  if (ctas > INT32_MAX) return absl::InvalidArgumentError("moe_quant_matvec: grid too large");
  const dim3 grid(static_cast<unsigned>(ctas));
  KPLAN_CUDA_RETURN_IF_ERROR(d.act_type == DType::kBFloat16
                                 ? ByForm<__nv_bfloat16>(form, p, grid, args, combine_group, stream)
                                 : ByForm<__half>(form, p, grid, args, combine_group, stream));
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
