// Decode-sized quantised expert GEMMs (moe_quant_gemm.h, LaunchMoeQuantDecode)
// and the weight dequantiser of the int prefill route (LaunchMoeDequantWeights).
//
// Decode: over the moe_align_block_size output with a small block (8, 16 or
// 32 slots = NT n8 tiles), a CTA of 4 warps takes one tile (one expert, up to
// 8·NT slots) and 32 weight rows per warp (rows mode) or 32 rows split over
// the 4 warps along K (k-split mode; MoeQuantDecodeKSplit, moe_quant_route.h).
// Every weight row is read once per tile, i.e. once for all the slots of its
// expert, with 16-byte loads; each thread dequantises its 16 bytes in
// registers and feeds mma.sync m16n8k16 (fp32 accumulate) with the weights
// as the 16-row A operand and the tile's slots as the 8-column B operand.
// The k order inside one mma is free (a dot product), so thread (g, c) of a
// warp takes 16 (fp8 / int8) or 32 (int4) consecutive k of its rows and of
// its slot's activation row: both operands use the same k mapping.
//   fp8:  weight and activation e4m3 values are exact in fp16, products exact
//         in fp32; block scales are applied per 64-wide k step (inside one
//         k-block, block_k % 64 == 0) as acc += Σ·(xs·ws), per-tensor /
//         per-channel scales once at the end: Σ·(xs·ws).
//   int:  w = round_T((q - zp)·scale), the reference's rounding
//         (IntGroupDequant: packed T arithmetic where that is exact), times
//         the activations in T (bf16 / fp16).
// The epilogue (after a fixed-order reduction over the k-split warps in
// shared memory) rounds as the grouped GEMMs do (round(acc), bias
// round(round(acc) + round(b))) and, for GEMM 1, applies the activation:
// a warp's two m16 tiles are the gate and the up rows of the same 16
// intermediate columns, so the gated activation is fused.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;
using detail::quant::WordOf;

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 32;  // two m16 tiles

enum WeightKind : int { kWFp8 = 0, kWInt8 = 1, kWInt4 = 2 };
enum Epi : int { kEpiStore = 0, kEpiGated = 1, kEpiPlain = 2 };

struct DecodeParams {
  const void* a;  // fp8 bytes or T, [rows, K]
  const float* a_scale;
  int a_row_div;
  int64_t a_kb;  // fp8 block: k-blocks per activation row
  MoeQuantWeights w;
  const float* bias;
  const int32_t* sorted;
  const int32_t* eids;
  const int32_t* post;
  int64_t numel, N, K;
  int num_local;
  int epi;
  MoeActivation act;
  MoeActParams ap;
  int64_t out_cols;              // I (gated) or N
  int64_t groups;                // row groups
  detail::quant::GroupDiv gdiv;  // int weights: k to its group
  bool ksplit;
  void* c;  // [numel, out_cols]
};

// Two e4m3 bytes (lo first) as an f16x2 register, exact.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// 16 e4m3 bytes as 8 f16x2 pairs (pair p = bytes 2p, 2p + 1).
__device__ __forceinline__ void Fp8ToPairs(const uint4& v, uint32_t (&p)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    p[2 * i] = Fp8x2ToHalf2(w[i]);
    p[2 * i + 1] = Fp8x2ToHalf2(w[i] >> 16);
  }
}

// Zeros in place of a step's activations past K (int weights: the 64 bytes
// of an int4 step, 32 of an int8 one).
__device__ const uint4 kZeroActivations[4] = {};

// Pair `pr` of a thread's 16 fp8 bytes (bytes 2pr, 2pr + 1) as f16x2, exact.
__device__ __forceinline__ uint32_t Fp8Pair(const uint4& v, int pr) {
  return Fp8x2ToHalf2(WordOf(v, pr >> 1) >> (16 * (pr & 1)));
}

// The weight stream goes through a per-thread shared-memory ring of kStages
// steps filled by cp.async (loads in flight without registers). int weights:
// the step's other operands (group scales, zero points, the slots'
// activations) are loaded one step ahead into registers, so that no step
// waits for a round trip, and the step's dequantisation runs as
// straight-line code under one warp-uniform branch on the packed form
// (docs/PERF.md, session 27: the loads at use and a branch per word were half
// the instructions and the largest stalls).
// CTAs per SM the register budget aims for. int weights: as many as fit
// with at most a few bytes of spills (ptxas, CUDA 13: 8 bytes for int4 with
// zero points at 16-slot tiles, none elsewhere); the dequantisation is
// instruction bound and more warps hide its dependent chains. fp8 at 32-slot
// tiles: 3 (one more than ptxas gave it without a bound; not measured).
template <int WK, int NT>
constexpr int MinCtas() {
  if constexpr (WK == kWFp8) return NT == 4 ? 3 : 1;
  if constexpr (NT == 1) return WK == kWInt4 ? 4 : 3;
  return NT == 2 ? 3 : 2;
}

// kZp: int weights with zero points (p.w.zero set); without, the kernel
// issues no zero-point work (a predicated load, its address and conversion a
// row and a step: about 20 of a step's 525 instructions, docs/PERF.md session
// 48).
template <typename T, int WK, int NT, bool kZp>
__global__ void __launch_bounds__(kWarps * 32, (MinCtas<WK, NT>()))
    QuantDecodeKernel(const __grid_constant__ DecodeParams p) {
  constexpr int kBS = 8 * NT;
  constexpr int kCW = WK == kWInt4 ? 32 : 16;  // k per thread per step
  constexpr int kPairs = kCW / 2;              // T / f16 pairs per thread per step
  constexpr int kSteps = kPairs / 2;           // mma k16 steps per 4-thread step
  constexpr int kSpan = 4 * kCW;               // k per warp step
  constexpr int kRowStep = 64;                 // weight bytes of a row per step (all kinds)
  static_assert(
      kRowStep == (WK == kWInt4 ? kSpan / 2 : kSpan) && (WK == kWInt4 ? kCW / 2 : kCW) == 16,
      "a thread's 16 weight bytes a row and a step");
  using MT = std::conditional_t<WK == kWFp8, __half, T>;
  constexpr int kStages = NT == 4 ? 3 : 4;
  __shared__ float red[kWarps][kRowsPerWarp][kBS + 1];
  __shared__ uint4 ring[kStages][4][kWarps * 32];
  __shared__ int32_t s_sid[kBS];

  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.y;
  if (tile * kBS >= *p.post) return;
  const int e = p.eids[tile];
  const bool local = e >= 0 && e < p.num_local;
  const int64_t rg = p.ksplit ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const bool gated = p.epi == kEpiGated;
  if (threadIdx.x < kBS) s_sid[threadIdx.x] = p.sorted[tile * kBS + threadIdx.x];
  __syncthreads();

  // Weight rows of this thread: m-tile mt, half h (row g or g + 8).
  int64_t row[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = g + 8 * h;
      int64_t r;
      bool ok;
      if (gated) {
        const int64_t j = rg * 16 + i;
        ok = j < p.out_cols;
        r = moe_math::GatedRow(p.act, j, p.out_cols, mt);
      } else {
        r = rg * kRowsPerWarp + mt * 16 + i;
        ok = r < p.N;
      }
      row[mt][h] = ok && rg < p.groups ? r : 0;
    }
  }
  // Activation rows of this thread's B columns (slot g of each n8 tile).
  int64_t arow[NT];
  bool aok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int32_t sid = p.sorted[tile * kBS + nt * 8 + g];
    aok[nt] = sid >= 0 && sid < p.numel;
    arow[nt] = aok[nt] ? sid / p.a_row_div : 0;
  }

  float acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;

  const int64_t bpr = WK == kWInt4 ? p.K / 2 : p.K;  // weight bytes per row
  const uint8_t* wbase =
      static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(local ? e : 0) * p.N * bpr;
  // k in 32 bits (MoeQuantDecodeSupports: K < 2^30), so the per-step index
  // and offset arithmetic is 32-bit.
  const int K32 = static_cast<int>(p.K);
  const int steps = (K32 + kSpan - 1) / kSpan;
  const int first = p.ksplit ? warp : 0, stride = p.ksplit ? kWarps : 1;
  // The start of each weight row of this thread.
  const uint8_t* wrow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) wrow[mt][h] = wbase + row[mt][h] * bpr;

  // This thread's chunk of ring stage 0 (the chunk of row (mt, h) lies
  // (mt * 2 + h) * kChunkRow bytes above it, stage s s * kStageBytes).
  constexpr uint32_t kChunkRow = kWarps * 32 * sizeof(uint4);
  constexpr uint32_t kStageBytes = 4 * kChunkRow;
  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[0][0][threadIdx.x]));
  // cp.async of step st's 16-byte chunks into ring stage `stage` (zero-filled
  // past K; nothing past the last step), one commit group per call.
  auto issue = [&](int st, int stage) {
    if (st < steps) {
      const bool kin = st * kSpan + c * kCW < K32;
      const int off = kin ? st * kRowStep + c * 16 : 0;  // past K: the row start, unread
      const uint32_t dst = ring0 + static_cast<uint32_t>(stage) * kStageBytes;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          detail::CpAsync16(dst + (mt * 2 + h) * kChunkRow, wrow[mt][h] + off, kin);
        }
    }
    detail::CpAsyncCommit();
  };
  // The ring stages the loop reads (rd) and fills (wr) this step: wr is the
  // stage read the step before, so each take moves both on by one.
  int rd = 0, wr = kStages - 1;
  // The weights of ring stage rd, once its group landed; then the next step's
  // stages.
  auto take = [&](uint4(&wcur)[2][2]) {
    detail::CpAsyncWait<kStages - 1>();
    const int stage = rd;
    wr = rd;
    rd = rd == kStages - 1 ? 0 : rd + 1;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) wcur[mt][h] = ring[stage][mt * 2 + h][threadIdx.x];
  };

  if (local && rg < p.groups && first < steps) {
#pragma unroll
    for (int sg = 0; sg < kStages - 1; ++sg) issue(first + sg * stride, sg);
    if constexpr (WK == kWFp8) {
      const bool block = p.w.scale_kind == MoeWeightScale::kBlock;
      const int64_t nbk = block ? (p.K + p.w.block_k - 1) / p.w.block_k : 0;
      const int64_t nbn = block ? (p.N + p.w.block_n - 1) / p.w.block_n : 0;
#pragma unroll 1
      for (int st = first; st < steps; st += stride) {
        issue(st + (kStages - 1) * stride, wr);
        uint4 wcur[2][2];
        take(wcur);
        const int64_t kc = st * kSpan + c * kCW;
        const bool kin = kc < p.K;
        // Activations of this thread's slot column in each n8 tile: bp[nt][pair].
        uint32_t bp[NT][kPairs];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (kin && aok[nt]) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.a) +
                                                                 arow[nt] * p.K + kc));
            Fp8ToPairs(v, bp[nt]);
          } else {
#pragma unroll
            for (int i = 0; i < kPairs; ++i) bp[nt][i] = 0u;
          }
        }
        float tmp[2][NT][4];
        if (block) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int q = 0; q < 4; ++q) tmp[mt][nt][q] = 0.0f;
        }
        // mma k16 step j takes pairs 2j (logical k 2c, 2c + 1) and 2j + 1
        // (logical 2c + 8, 2c + 9) of rows g, g + 8 and of the slot's row.
#pragma unroll
        for (int j = 0; j < kSteps; ++j) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const uint32_t a[4] = {Fp8Pair(wcur[mt][0], 2 * j), Fp8Pair(wcur[mt][1], 2 * j),
                                   Fp8Pair(wcur[mt][0], 2 * j + 1),
                                   Fp8Pair(wcur[mt][1], 2 * j + 1)};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              if (block) {
                detail::quant::Mma16816<MT>(tmp[mt][nt], a, bp[nt][2 * j], bp[nt][2 * j + 1]);
              } else {
                detail::quant::Mma16816<MT>(acc[mt][nt], a, bp[nt][2 * j], bp[nt][2 * j + 1]);
              }
            }
          }
        }
        if (block) {
          // acc += Σ_step · (xs[slot, kb] · ws[row block, kb]); the step lies in one k-block.
          const int64_t kb = (static_cast<int64_t>(st) * kSpan) / p.w.block_k;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float ws[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              ws[h] = __ldg(p.w.scale +
                            (static_cast<int64_t>(e) * nbn + row[mt][h] / p.w.block_n) * nbk + kb);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const int32_t sid = s_sid[nt * 8 + 2 * c + (q & 1)];
                const float xs = sid >= 0 && sid < p.numel
                                     ? __ldg(p.a_scale + (sid / p.a_row_div) * p.a_kb + kb)
                                     : 0.0f;
                acc[mt][nt][q] =
                    __fadd_rn(acc[mt][nt][q], __fmul_rn(tmp[mt][nt][q], __fmul_rn(xs, ws[q >> 1])));
              }
            }
          }
        }
      }
    } else {
      // Pair p of a 32-bit word: int4 nibbles 2p, 2p + 1 (4 pairs), int8
      // bytes 2p, 2p + 1 (2 pairs); signed int8 without zero points read as
      // q + 128 with zp 128.
      constexpr int kPerWord = WK == kWInt4 ? 4 : 2;
      static_assert(kPairs / 4 <= sizeof(kZeroActivations) / sizeof(uint4),
                    "a step's activations fit the zero row");
      using Dequant = detail::quant::IntGroupDequant<T, WK == kWInt4>;
      const uint32_t flip = WK == kWInt8 && !kZp ? 0x80808080u : 0u;
      // Group scale (and zero point) rows of this thread's weight rows.
      const int64_t groups_per_row = p.K / p.w.group_size;
      const float* srow[2][2];
      const uint8_t* zrow[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t grow = (static_cast<int64_t>(e) * p.N + row[mt][h]) * groups_per_row;
          srow[mt][h] = p.w.scale + grow;
          zrow[mt][h] = kZp ? p.w.zero + grow : nullptr;
        }
      // Activation rows of the slot columns; a padding slot's (aok false)
      // is row 0, read and never stored (the epilogue skips the slot).
      const T* xrow[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xrow[nt] = static_cast<const T*>(p.a) + arow[nt] * p.K;
      // A step's operands besides the weights. Past K (or past the last
      // step): scale 0 and the activations of kZeroActivations, so the step
      // adds exact zeros; the loads themselves are unconditional (no zero
      // defaults in registers).
      struct Ops {
        float sc[2][2], zb[2][2];
        uint32_t bp[NT][kPairs];  // activations of slot g of each n8 tile
      };
      auto load_ops = [&](int st, Ops& o) {
        const int kc = st * kSpan + c * kCW;
        const bool kin = kc < K32;  // false for every step past the last
        const int gi = p.gdiv(kin ? kc : 0);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            o.sc[mt][h] = kin ? __ldg(srow[mt][h] + gi) : 0.0f;
            o.zb[mt][h] =
                detail::quant::BiasedZero(kZp && kin ? zrow[mt][h] : nullptr, gi, WK == kWInt4);
          }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4* src = kin ? reinterpret_cast<const uint4*>(xrow[nt] + kc) : kZeroActivations;
#pragma unroll
          for (int v = 0; v < kPairs / 4; ++v) {
            const uint4 x = __ldg(src + v);
            o.bp[nt][4 * v] = x.x;
            o.bp[nt][4 * v + 1] = x.y;
            o.bp[nt][4 * v + 2] = x.z;
            o.bp[nt][4 * v + 3] = x.w;
          }
        }
      };
      Ops cur;
      load_ops(first, cur);
#pragma unroll 1
      for (int st = first; st < steps; st += stride) {
        issue(st + (kStages - 1) * stride, wr);
        Ops nxt;
        load_ops(st + stride, nxt);
        uint4 wcur[2][2];
        take(wcur);
        const Dequant dq[2][2] = {
            {Dequant(cur.sc[0][0], cur.zb[0][0]), Dequant(cur.sc[0][1], cur.zb[0][1])},
            {Dequant(cur.sc[1][0], cur.zb[1][0]), Dequant(cur.sc[1][1], cur.zb[1][1])}};
        // mma k16 step j takes pairs 2j (logical k 2c, 2c + 1) and 2j + 1
        // (logical 2c + 8, 2c + 9) of rows g, g + 8 and of the slot's row;
        // the weight pairs are decoded a word (kPerWord pairs) at a time,
        // once per m-tile for all n8 tiles.
        auto dots = [&](bool packed) {
          uint32_t wp[2][2][kPerWord];
#pragma unroll
          for (int j = 0; j < kSteps; ++j) {
            const int pr = (2 * j) % kPerWord;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              if (pr == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  dq[mt][h].Pairs(WordOf(wcur[mt][h], 2 * j / kPerWord) ^ flip, wp[mt][h], packed);
                }
              }
              const uint32_t a[4] = {wp[mt][0][pr], wp[mt][1][pr], wp[mt][0][pr + 1],
                                     wp[mt][1][pr + 1]};
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                detail::quant::Mma16816<MT>(acc[mt][nt], a, cur.bp[nt][2 * j],
                                            cur.bp[nt][2 * j + 1]);
              }
            }
          }
        };
        const bool packed =
            dq[0][0].packed() && dq[0][1].packed() && dq[1][0].packed() && dq[1][1].packed();
        if (__all_sync(0xffffffffu, packed)) {
          dots(true);
        } else {
          dots(false);
        }
        cur = nxt;
      }
    }
    detail::CpAsyncWait<0>();
  }

  // Partial sums to shared memory: red[warp][m-tile row][slot].
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        red[warp][mt * 16 + g + 8 * (q >> 1)][nt * 8 + 2 * c + (q & 1)] = acc[mt][nt][q];
      }
  __syncthreads();

  // Epilogue: per row group, outputs (slot, column) with the column fastest.
  const int groups_here = p.ksplit ? 1 : kWarps;
  const int cols = gated ? 16 : kRowsPerWarp;
  const int total = groups_here * kBS * cols;
  T* out = static_cast<T*>(p.c);
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int grp = idx / (kBS * cols), o = idx % (kBS * cols);
    const int s = o / cols, i = o % cols;
    const int64_t g_rg = p.ksplit ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * kWarps + grp;
    const int32_t sid = s_sid[s];
    if (sid < 0 || sid >= p.numel) continue;
    const int64_t col = g_rg * cols + i;
    if (col >= p.out_cols) continue;
    auto sum = [&](int r) {
      float v = 0.0f;
      if (p.ksplit) {
#pragma unroll
        for (int w2 = 0; w2 < kWarps; ++w2) v += red[w2][r][s];
      } else {
        v = red[grp][r][s];
      }
      return v;
    };
    // GEMM row of output column `col` (m-tile mt for the gated pair) and its value.
    auto value = [&](int mt, int r_local) -> float {
      int64_t r;
      if (gated) {
        r = moe_math::GatedRow(p.act, col, p.out_cols, mt);
      } else {
        r = col;
      }
      float v = sum(r_local);
      if (WK == kWFp8 && p.w.scale_kind != MoeWeightScale::kBlock) {
        const float xs = __ldg(p.a_scale + sid / p.a_row_div);
        const float ws = p.w.scale_kind == MoeWeightScale::kPerTensor
                             ? __ldg(p.w.scale + e)
                             : __ldg(p.w.scale + static_cast<int64_t>(e) * p.N + r);
        v = __fmul_rn(v, __fmul_rn(xs, ws));
      }
      float o2 = ToFloat(FromFloat<T>(v));
      if (p.bias != nullptr) {
        o2 = ToFloat(FromFloat<T>(o2 + ToFloat(FromFloat<T>(p.bias[e * p.N + r]))));
      }
      return o2;
    };
    float v;
    if (!local) {
      v = 0.0f;  // act(0, 0) == 0 for every activation
    } else if (gated) {
      v = moe_math::Gated(p.act, p.ap, value(0, i), value(1, 16 + i));
    } else if (p.epi == kEpiPlain) {
      v = moe_math::Plain(p.act, value(0, i));
    } else {
      v = value(0, i);
    }
    out[static_cast<int64_t>(sid) * p.out_cols + col] = FromFloat<T>(v);
  }
}

}  // namespace
}  // namespace kplan::kernels::cuda

namespace kplan::kernels::cuda {
namespace {

template <typename T, int WK, int NT, bool kZp>
cudaError_t LaunchKernel(const DecodeParams& p, dim3 grid, cudaStream_t stream) {
  return detail::LaunchPdl(QuantDecodeKernel<T, WK, NT, kZp>, grid, dim3(kWarps * 32), 0, stream,
                           p);
}

template <typename T, int WK, bool kZp>
cudaError_t ByBlock(const DecodeParams& p, int block_m, dim3 grid, cudaStream_t stream) {
  switch (block_m) {
    case 8:
      return LaunchKernel<T, WK, 1, kZp>(p, grid, stream);
    case 16:
      return LaunchKernel<T, WK, 2, kZp>(p, grid, stream);
    default:
      return LaunchKernel<T, WK, 4, kZp>(p, grid, stream);
  }
}

// Int weights: the instance with or without zero-point work (kZp).
template <typename T, int WK>
cudaError_t ByZeroPoints(const DecodeParams& p, int block_m, dim3 grid, cudaStream_t stream) {
  return p.w.zero != nullptr ? ByBlock<T, WK, true>(p, block_m, grid, stream)
                             : ByBlock<T, WK, false>(p, block_m, grid, stream);
}

template <typename T>
cudaError_t ByKind(const DecodeParams& p, int block_m, dim3 grid, cudaStream_t stream) {
  switch (p.w.kind) {
    case DType::kFp8E4m3:
      return ByBlock<T, kWFp8, false>(p, block_m, grid, stream);
    case DType::kInt8:
      return ByZeroPoints<T, kWInt8>(p, block_m, grid, stream);
    default:
      return ByZeroPoints<T, kWInt4>(p, block_m, grid, stream);
  }
}

// Elements a thread decodes from its 16 bytes.
int64_t ChunkOf(DType kind) { return kind == DType::kInt4Packed ? 32 : 16; }

}  // namespace

bool MoeQuantDecodeSupports(const MoeQuantWeights& w, DType act_type, int64_t N, int64_t K) {
  if (act_type != DType::kBFloat16 && act_type != DType::kFloat16) return false;
  if (N <= 0 || K <= 0 || w.data == nullptr || w.scale == nullptr) return false;
  if (K >= (int64_t{1} << 30)) return false;  // the kernel's k arithmetic is 32-bit
  switch (w.kind) {
    case DType::kFp8E4m3:
      if (K % 16 != 0) return false;
      if (w.scale_kind == MoeWeightScale::kBlock) {
        return w.block_n > 0 && w.block_k > 0 && w.block_k % 64 == 0;
      }
      return w.scale_kind == MoeWeightScale::kPerTensor ||
             w.scale_kind == MoeWeightScale::kPerChannel;
    case DType::kInt8:
    case DType::kInt4Packed:
      return w.scale_kind == MoeWeightScale::kGroup && w.group_size > 0 &&
             K % ChunkOf(w.kind) == 0 && w.group_size % ChunkOf(w.kind) == 0 &&
             K % w.group_size == 0;
    default:
      return false;
  }
}

absl::Status LaunchMoeQuantDecode(const MoeQuantDecodeArgs& d, cudaStream_t stream) {
  if (!MoeQuantDecodeSupports(d.w, d.act_type, d.N, d.K)) {
    return absl::InvalidArgumentError(
        "moe_quant_decode: weights / activation type / sizes not supported "
        "(MoeQuantDecodeSupports)");
  }
  if (d.block_m != 8 && d.block_m != 16 && d.block_m != 32) {
    return absl::InvalidArgumentError("moe_quant_decode: block_m must be 8, 16 or 32");
  }
  if (d.numel <= 0) return absl::OkStatus();
  if (d.a == nullptr || d.c == nullptr || d.sorted_token_ids == nullptr ||
      d.expert_ids == nullptr || d.num_tokens_post_padded == nullptr ||
      (d.w.kind == DType::kFp8E4m3 && d.a_scale == nullptr) || d.a_row_div <= 0) {
    return absl::InvalidArgumentError("moe_quant_decode: null pointer or bad a_row_div");
  }
  const bool gated = d.apply_act && d.act < MoeActivation::kSiluNoMul;
  if (gated && d.N % 2 != 0) return absl::InvalidArgumentError("moe_quant_decode: odd gated N");
  DecodeParams p{};
  p.a = d.a;
  p.a_scale = d.a_scale;
  p.a_row_div = d.a_row_div;
  p.w = d.w;
  p.a_kb = d.w.scale_kind == MoeWeightScale::kBlock ? (d.K + d.w.block_k - 1) / d.w.block_k : 1;
  p.bias = d.bias;
  p.sorted = d.sorted_token_ids;
  p.eids = d.expert_ids;
  p.post = d.num_tokens_post_padded;
  p.numel = d.numel;
  p.N = d.N;
  p.K = d.K;
  p.num_local = d.num_local_experts;
  p.epi = !d.apply_act ? kEpiStore : gated ? kEpiGated : kEpiPlain;
  p.act = d.act;
  p.ap = EffectiveActParams(d.act_params);
  p.out_cols = gated ? d.N / 2 : d.N;
  p.groups = gated ? (p.out_cols + 15) / 16 : (d.N + kRowsPerWarp - 1) / kRowsPerWarp;
  p.c = d.c;
  p.gdiv = detail::quant::GroupDiv::For(d.w.group_size);
  // Non-empty tiles: at most one per slot and the blocks moe_align wrote.
  const int64_t tiles = std::max<int64_t>(1, std::min<int64_t>(d.num_blocks, d.numel));
  // Rows (4 row groups per CTA) or k-split CTAs (MoeQuantDecodeKSplit), the
  // rows grid counted over the tiles expected (one per hit expert at least).
  // KPLAN_MOE_QUANT_DECODE_SPLIT = rows | k forces one mode (A/B runs, and
  // the GPU suites in each mode).
  const int64_t expected = std::min<int64_t>(tiles, d.num_local_experts);
  const int64_t rows_ctas = (p.groups + kWarps - 1) / kWarps * expected;
  const int64_t row_bytes = d.K / ChunkOf(d.w.kind) * 16;  // K % ChunkOf == 0: supported
  p.ksplit = MoeQuantDecodeKSplit(d.block_m, row_bytes, rows_ctas * kWarps, d.num_sms);
  if (const char* f = std::getenv("KPLAN_MOE_QUANT_DECODE_SPLIT"); f != nullptr) {
    if (std::strcmp(f, "rows") == 0) p.ksplit = false;
    if (std::strcmp(f, "k") == 0) p.ksplit = true;
  }
  const int64_t gx = p.ksplit ? p.groups : (p.groups + kWarps - 1) / kWarps;
  if (gx > INT32_MAX || tiles > 65535) {
    return absl::InvalidArgumentError("moe_quant_decode: grid too large");
  }
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(tiles));
  KPLAN_CUDA_RETURN_IF_ERROR(d.act_type == DType::kBFloat16
                                 ? ByKind<__nv_bfloat16>(p, d.block_m, grid, stream)
                                 : ByKind<__half>(p, d.block_m, grid, stream));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The int prefill route's helpers.

namespace {

__global__ void ExpertsHitKernel(const int32_t* ids, int64_t numel, int num_experts,
                                 const int32_t* map, int num_local, uint8_t* hit) {
  detail::PdlWaitThenRelease();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int id = ids[i];
    if (id < 0 || id >= num_experts) continue;
    const int l = map != nullptr ? map[id] : id;
    if (l >= 0 && l < num_local) hit[l] = 1;
  }
}

// One warp per weight row of a hit expert, grid-stride over the rows of all
// local experts: lane l takes the row's 32-bit words l, l + 32, ... (8 int4 /
// 4 int8 weights, inside one group), kWords of them in flight, and writes
// each word's weights w = round_T((q - zp)·s) as one 16-byte (int4) / 8-byte
// (int8) piece. So every load instruction reads 128 contiguous bytes and
// every store writes 512 / 256 contiguous ones, whole sectors. (The first
// form, a thread per 16 stored bytes with 64-bit index divisions and 16-byte
// stores 64 bytes apart, ran at about half the copy roofline: docs/PERF.md,
// session 21.)
template <typename T, bool kInt4>
__global__ void __launch_bounds__(256)
    DequantKernel(const __grid_constant__ MoeQuantWeights w, int N, int K, int rows,
                  detail::quant::GroupDiv gdiv, const uint8_t* hit, T* out) {
  detail::PdlWaitThenRelease();
  constexpr int kPer = kInt4 ? 8 : 4;  // weights per 32-bit word
  constexpr int kWords = 4;            // words per lane in flight
  using Piece = std::conditional_t<kInt4, uint4, uint2>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int words = K / kPer, groups = K / w.group_size;
  const uint32_t flip = !kInt4 && w.zero == nullptr ? 0x80808080u : 0u;
  const int warps = static_cast<int>(gridDim.x * (blockDim.x / 32));
  for (int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32); row < rows;
       row += warps) {
    if (!hit[row / N]) continue;
    const uint32_t* src =
        reinterpret_cast<const uint32_t*>(w.data) + static_cast<int64_t>(row) * words;
    const float* sc = w.scale + static_cast<int64_t>(row) * groups;
    const uint8_t* zp = w.zero != nullptr ? w.zero + static_cast<int64_t>(row) * groups : nullptr;
    Piece* dst = reinterpret_cast<Piece*>(out + static_cast<int64_t>(row) * K);
    for (int base = lane; base < words; base += 32 * kWords) {
      uint32_t v[kWords];
#pragma unroll
      for (int u = 0; u < kWords; ++u) {
        const int i = base + 32 * u;
        v[u] = i < words ? __ldg(src + i) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kWords; ++u) {
        const int i = base + 32 * u;
        if (i >= words) break;
        const int gi = static_cast<int>(gdiv(i * kPer));
        const detail::quant::IntGroupDequant<T, kInt4> dq(__ldg(sc + gi),
                                                          detail::quant::BiasedZero(zp, gi, kInt4));
        uint32_t o[kPer / 2];
        dq.Pairs(v[u] ^ flip, o);
        if constexpr (kInt4) {
          dst[i] = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
          dst[i] = make_uint2(o[0], o[1]);
        }
      }
    }
  }
}

}  // namespace

absl::Status LaunchMoeExpertsHit(const int32_t* topk_ids, int64_t numel, int num_experts,
                                 const int32_t* expert_map, int num_local, uint8_t* hit,
                                 cudaStream_t stream) {
  if (num_local <= 0 || hit == nullptr) return absl::InvalidArgumentError("experts_hit: bad args");
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(hit, 0, static_cast<size_t>(num_local), stream));
  if (numel <= 0) return absl::OkStatus();
  const int64_t blocks = std::min<int64_t>((numel + 255) / 256, 1024);
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(ExpertsHitKernel, dim3(blocks), dim3(256), 0, stream,
                                               topk_ids, numel, num_experts, expert_map, num_local,
                                               hit));
  return absl::OkStatus();
}

bool MoeDequantWeightsSupports(const MoeQuantWeights& w, DType out_type, int64_t N, int64_t K) {
  return (out_type == DType::kBFloat16 || out_type == DType::kFloat16) &&
         (w.kind == DType::kInt8 || w.kind == DType::kInt4Packed) &&
         w.scale_kind == MoeWeightScale::kGroup && N > 0 && K > 0 && w.group_size > 0 &&
         K % ChunkOf(w.kind) == 0 && w.group_size % ChunkOf(w.kind) == 0 && K % w.group_size == 0;
}

absl::Status LaunchMoeDequantWeights(const MoeQuantWeights& w, int num_local, int64_t N, int64_t K,
                                     const uint8_t* hit, DType out_type, void* out,
                                     cudaStream_t stream) {
  if (!MoeDequantWeightsSupports(w, out_type, N, K) || num_local <= 0 || hit == nullptr ||
      out == nullptr || w.data == nullptr || w.scale == nullptr) {
    return absl::InvalidArgumentError("moe_dequant_weights: unsupported weights or null pointer");
  }
  const int64_t rows = N * num_local;
  if (rows > INT32_MAX / 2 || K > INT32_MAX) {  // 32-bit rows, with room for the grid stride
    return absl::InvalidArgumentError("moe_dequant_weights: 2^30 rows or 2^31 columns or more");
  }
  const bool int4 = w.kind == DType::kInt4Packed;
  // 8 warps a CTA, grid-stride over rows; 8 CTAs for each of an H200's 132
  // multiprocessors, of which 5 are resident at its 48 registers (1.6 waves).
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, 132 * 8)));
  const detail::quant::GroupDiv gdiv = detail::quant::GroupDiv::For(w.group_size);
  const int n = static_cast<int>(N), k = static_cast<int>(K), r = static_cast<int>(rows);
  cudaError_t err;
  if (out_type == DType::kBFloat16) {
    err = int4 ? detail::LaunchPdl(DequantKernel<__nv_bfloat16, true>, grid, dim3(256), 0, stream,
                                   w, n, k, r, gdiv, hit, static_cast<__nv_bfloat16*>(out))
               : detail::LaunchPdl(DequantKernel<__nv_bfloat16, false>, grid, dim3(256), 0, stream,
                                   w, n, k, r, gdiv, hit, static_cast<__nv_bfloat16*>(out));
  } else {
    err = int4 ? detail::LaunchPdl(DequantKernel<__half, true>, grid, dim3(256), 0, stream, w, n, k,
                                   r, gdiv, hit, static_cast<__half*>(out))
               : detail::LaunchPdl(DequantKernel<__half, false>, grid, dim3(256), 0, stream, w, n,
                                   k, r, gdiv, hit, static_cast<__half*>(out));
  }
  KPLAN_CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
