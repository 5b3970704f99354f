// Decode-sized quantised expert GEMMs in matrix-vector form
// (moe_quant_gemm.h, LaunchMoeQuantMatvec): for slots on distinct experts,
// where a tile of moe_quant_decode.cu would hold one slot. Each slot's
// weight rows are read once, with 16-byte loads; two kernel forms, each the
// faster of those measured for its weights (docs/PERF.md, sessions 11-12;
// int4 with group scales exact in T, as checkpoints store them: with
// arbitrary fp32 scales session 11's int4 rows were faster):
//   fp8 and int4: tiles of 16 rows per warp (gated GEMM 1: the gate and the
//         up rows of 8 intermediate columns) on mma.sync, the weights the
//         16-row operand and the activation row in every one of the 8
//         columns (column 0 is kept). Per 64-byte chunk of a row, lane (g, c)
//         loads vector c of rows g and g + 8, two chunks in flight; the k
//         order inside an mma, which a dot product does not see, follows the
//         loads, and the activation operand is loaded in the same order. K is
//         split over up to 8 warps of a CTA while the grid is small, the
//         partials summed in warp order.
//         fp8: m16n8k32 e4m3 on the stored bytes and the quantised
//         activation row (LaunchMoeFp8Quantize): no conversion, each 64-wide
//         chunk summed on the tensor cores and promoted to an fp32
//         accumulator. Block scales per chunk (block_k % 64 == 0: a chunk
//         lies in one k-block) as acc += Σ·(xs·ws), per-tensor / per-channel
//         scales once at the end: Σ·(xs·ws). (Dequantising fp8 in registers
//         for fp32 FMAs is bound by the conversion pipe.)
//         int4: m16n8k16 in T on w = round_T((q - zp)·s), dequantised in
//         registers (IntGroupDequant: two weights per instruction where that
//         is exact), fp32 accumulation across K.
//   int8: one warp per slot and weight row pair (gated: the gate and up row
//         of one intermediate column) or kRows rows, as the bf16 decode
//         kernels (moe_decode.cu): lane i takes the 16-byte vectors i,
//         i + 32, ... of its rows, kBatch per row in flight, w = round_T((q
//         - zp)·s) as the CPU reference rounds it, times the activations in
//         T with fp32 fmaf. (Tiles were slower here, session 11.)
// Each lane sums in a fixed order, then the warp (and the split warps) in a
// fixed one: results are deterministic and depend on the shape only. The
// epilogue rounds as the grouped GEMMs do (round(acc), bias round(round(acc)
// + round(b))) and, for GEMM 1 with apply_act, applies the activation. Slots
// whose expert is not local (or out of range) get zero rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_decode.cuh"
#include "kernels/cuda/moe/moe_kernel_switch.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
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
constexpr int kBatch = 2;      // chunks (tiles) or vectors (int8 rows) per warp and row in flight
constexpr int kTileRows = 16;  // tiles: weight rows per mma tile (gated: 8 gate + 8 up)
constexpr int kRows = 4;       // int8: rows per warp without gating

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
  int64_t out_cols;  // I (gated) or N
  // fp8 / int4: tiles of a slot, of the call, and the warps splitting a tile's K.
  int64_t tiles_per_slot, tiles;
  int split;
  int64_t warps_per_slot;  // int8, not gated
  void* c;                 // [numel, out_cols]
  // fp8 with the activation quantised in the kernel (MoeQuantMatvecArgs::
  // quantise): qmode a MoeFp8ActQuant, p.a then [a_rows, K] of T; -1: p.a
  // holds e4m3 bytes and p.a_scale their scales.
  int qmode;
  int qgroup;
  float qstatic;
  int64_t a_rows;
};

// GEMM output element (slot, row) as the grouped GEMMs store it, as float;
// fp8 per-tensor / per-channel weights: xs is the activation row's scale.
template <typename T, int WK>
__device__ __forceinline__ float Output(const Params& p, int e, int64_t row, float v,
                                        float xs = 0.0f) {
  if (WK == kWFp8 && p.w.scale_kind != MoeWeightScale::kBlock) {
    const float ws = p.w.scale_kind == MoeWeightScale::kPerTensor
                         ? __ldg(p.w.scale + e)
                         : __ldg(p.w.scale + static_cast<int64_t>(e) * p.N + row);
    v = __fmul_rn(v, __fmul_rn(xs, ws));
  }
  return Rounded<T>(v, p.bias != nullptr ? p.bias + static_cast<int64_t>(e) * p.N + row : nullptr);
}

// --- Tiles (fp8, int4); the fp8 dots.

// d += A·B, m16n8k32 e4m3, fp32 accumulation.
__device__ __forceinline__ void MmaFp8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The tile of a warp: rows[0] (its lanes' row g) and rows[1] (row g + 8) of
// local expert e against activation row arow, over the chunks ks, ks +
// split, ... of K. On return acc[0] / acc[2] of the lanes with c == 0 hold
// rows g / g + 8 (column 0 of D), before the per-tensor / per-channel scale.
// The e4m3 activation row of a tile and its scales: in global memory
// (quantised by LaunchMoeFp8Quantize), or in the CTA's shared memory
// (quantised in the kernel's prologue, QuantiseToShared).
template <bool kShared>
struct Fp8Row {
  const int4* x;    // the row's 16-byte vectors
  const float* xs;  // block: its k-blocks' scales; else its one scale
  __device__ __forceinline__ int4 X(int i) const { return kShared ? x[i] : __ldg(x + i); }
  __device__ __forceinline__ float S(int i) const { return kShared ? xs[i] : __ldg(xs + i); }
};

template <bool kShared>
__device__ __forceinline__ void Fp8TileDots(const Params& p, int e, const int64_t (&rows)[2],
                                            const Fp8Row<kShared>& xr, int ks, int lane,
                                            float (&acc)[4]) {
  const int c = lane & 3;
  const uint8_t* wb = static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(e) * p.N * p.K;
  const int4* w0 = reinterpret_cast<const int4*>(wb + rows[0] * p.K);
  const int4* w1 = reinterpret_cast<const int4*>(wb + rows[1] * p.K);
  // 32-bit indices: a row's vectors fit (MoeQuantMatvecSupports).
  const int vecs = static_cast<int>(p.K / 16), chunks = (vecs + 3) / 4;
  const bool block = p.w.scale_kind == MoeWeightScale::kBlock;
  const float* ws0 = nullptr;
  const float* ws1 = nullptr;
  if (block) {
    ws0 = p.w.scale + (static_cast<int64_t>(e) * p.nbn + rows[0] / p.w.block_n) * p.a_kb;
    ws1 = p.w.scale + (static_cast<int64_t>(e) * p.nbn + rows[1] / p.w.block_n) * p.a_kb;
  }
  for (int ch0 = ks; ch0 < chunks; ch0 += p.split * kBatch) {
    int4 v0[kBatch], v1[kBatch], xv[kBatch];
    float s0[kBatch], s1[kBatch];  // block scales xs·ws, loaded with the chunk
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int ch = ch0 + u * p.split, i = ch * 4 + c;
      // Past K (or the warp's chunks): zeros, and every lane runs the mma.
      const bool in = ch < chunks && i < vecs;
      v0[u] = in ? __ldg(w0 + i) : make_int4(0, 0, 0, 0);
      v1[u] = in ? __ldg(w1 + i) : make_int4(0, 0, 0, 0);
      xv[u] = in ? xr.X(i) : make_int4(0, 0, 0, 0);
      s0[u] = s1[u] = 0.0f;
      if (block && ch < chunks) {
        const int kb = ch * 64 / p.w.block_k;
        const float xs = xr.S(kb);
        s0[u] = __fmul_rn(xs, __ldg(ws0 + kb));
        s1[u] = __fmul_rn(xs, __ldg(ws1 + kb));
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int ch = ch0 + u * p.split;
      if (ch >= chunks) break;
      // Lane (g, c)'s bytes 0-3 / 4-7 of a row are its k 4c.. / 16 + 4c..
      // of the first mma, bytes 8-15 those of the second. The tensor cores
      // sum e4m3 products with reduced precision: each chunk's sum starts
      // afresh and is promoted to the fp32 acc (every 64 k).
      float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      MmaFp8(t, v0[u].x, v1[u].x, v0[u].y, v1[u].y, xv[u].x, xv[u].y);
      MmaFp8(t, v0[u].z, v1[u].z, v0[u].w, v1[u].w, xv[u].z, xv[u].w);
      if (block) {
        acc[0] = __fadd_rn(acc[0], __fmul_rn(t[0], s0[u]));
        acc[2] = __fadd_rn(acc[2], __fmul_rn(t[2], s1[u]));
      } else {
        acc[0] = __fadd_rn(acc[0], t[0]);
        acc[2] = __fadd_rn(acc[2], t[2]);
      }
    }
  }
}

// --- int4: mma tiles on dequantised pairs.

// Fp8TileDots for int4 weights: per 64-byte chunk of a row (128 k), lane
// (g, c) dequantises vector c of rows g and g + 8 (32 k, one group) to T
// pairs (IntGroupDequant) and loads the same 32 k of the activation row;
// word q of the vector (pairs 4q .. 4q + 3) feeds mma k16 steps 2q and 2q + 1
// (pairs 2j, 2j + 1 each: logical k 2c, 2c + 1 and 2c + 8, 2c + 9). The T
// products are exact and summed in fp32 on the tensor cores across K.
template <typename T>
__device__ __forceinline__ void Int4TileDots(const Params& p, int e, const int64_t (&rows)[2],
                                             int64_t arow, int ks, int lane, float (&acc)[4]) {
  using Dequant = detail::quant::IntGroupDequant<T, true>;
  const int c = lane & 3;
  const int64_t bpr = p.K / 2;  // weight bytes per row
  const uint8_t* wb = static_cast<const uint8_t*>(p.w.data) + static_cast<int64_t>(e) * p.N * bpr;
  const int4* w0 = reinterpret_cast<const int4*>(wb + rows[0] * bpr);
  const int4* w1 = reinterpret_cast<const int4*>(wb + rows[1] * bpr);
  const int4* x = reinterpret_cast<const int4*>(static_cast<const T*>(p.a) + arow * p.K);
  // 32-bit indices: a row's vectors fit (MoeQuantMatvecSupports).
  const int vecs = static_cast<int>(bpr / 16), chunks = (vecs + 3) / 4;
  const int64_t e_groups = static_cast<int64_t>(e) * p.N * p.groups;
  const int64_t g0 = e_groups + rows[0] * p.groups, g1 = e_groups + rows[1] * p.groups;
  for (int ch0 = ks; ch0 < chunks; ch0 += p.split * kBatch) {
    int4 v0[kBatch], v1[kBatch], xv[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int ch = ch0 + u * p.split, i = ch * 4 + c;
      // Past K (or the warp's chunks): zeros, and every lane runs the mma.
      const bool in = ch < chunks && i < vecs;
      v0[u] = in ? __ldg(w0 + i) : make_int4(0, 0, 0, 0);
      v1[u] = in ? __ldg(w1 + i) : make_int4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < 4; ++q) xv[u][q] = in ? __ldg(x + 4 * i + q) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int ch = ch0 + u * p.split, i = ch * 4 + c;
      if (ch >= chunks) break;
      const bool in = i < vecs;
      const int64_t gk = in ? p.gdiv(i * 32) : 0;  // a vector lies in one group
      const Dequant d0(in ? __ldg(p.w.scale + g0 + gk) : 0.0f, BiasedZero(p.w.zero, g0 + gk, true));
      const Dequant d1(in ? __ldg(p.w.scale + g1 + gk) : 0.0f, BiasedZero(p.w.zero, g1 + gk, true));
      // One warp-uniform branch per vector on the packed form, the mma
      // inside seeing every lane (with a branch per word the one-token
      // layers took 1.04-1.17x longer: docs/PERF.md, session 13).
      auto dots = [&](bool packed) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t a0[4], a1[4];
          d0.Pairs(WordOf(v0[u], q), a0, packed);
          d1.Pairs(WordOf(v1[u], q), a1, packed);
          const uint32_t lo[4] = {a0[0], a1[0], a0[1], a1[1]}, hi[4] = {a0[2], a1[2], a0[3], a1[3]};
          detail::quant::Mma16816<T>(acc, lo, WordOf(xv[u][q], 0), WordOf(xv[u][q], 1));
          detail::quant::Mma16816<T>(acc, hi, WordOf(xv[u][q], 2), WordOf(xv[u][q], 3));
        }
      };
      if (__all_sync(0xffffffffu, d0.packed() && d1.packed())) {
        dots(true);
      } else {
        dots(false);
      }
    }
  }
}

// --- fp8: the activation quantised in the prologue (qmode >= 0).

// Vector i (8 elements of T) of `in` as floats, and their largest |x|.
template <typename T>
__device__ __forceinline__ float AbsMax8(const int4& v) {
  float m = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t w = WordOf(v, q);
    T h[2];
    memcpy(h, &w, 4);
    m = fmaxf(m, fmaxf(fabsf(detail::ToFloat(h[0])), fabsf(detail::ToFloat(h[1]))));
  }
  return m;
}

// The 8 e4m3 bytes of vector v at `scale`.
template <typename T>
__device__ __forceinline__ uint2 Quantise8(const int4& v, float scale) {
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t w = WordOf(v, q);
    T h[2];
    memcpy(h, &w, 4);
    const uint32_t b0 = detail::quant::Fp8Quantise(detail::ToFloat(h[0]), scale);
    const uint32_t b1 = detail::quant::Fp8Quantise(detail::ToFloat(h[1]), scale);
    out[q / 2] |= (b0 | (b1 << 8)) << (16 * (q % 2));
  }
  return make_uint2(out[0], out[1]);
}

// 16-byte loads in flight per thread in the prologue: where only maxima are
// taken, and where bytes are written (more spills at the 64-register cap).
constexpr int kMaxBatch = 4, kQuantBatch = 2;

// fn(j, v, valid) for j in [0, n): vector j of `in` loaded in batches of
// kB per thread (invalid: past n, zeros); the loop is uniform over the CTA,
// so fn may shuffle across the warp.
template <int kB, typename F>
__device__ __forceinline__ void ForVectors(const int4* in, int64_t n, F&& fn) {
  for (int64_t base = 0; base < n; base += static_cast<int64_t>(kThreads) * kB) {
    int4 v[kB];
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int64_t j = base + u * kThreads + threadIdx.x;
      v[u] = j < n ? __ldg(in + j) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int64_t j = base + u * kThreads + threadIdx.x;
      fn(j, v[u], j < n);
    }
  }
}

// max over the CTA (every thread gets it); red: 32 floats of shared memory.
__device__ __forceinline__ float CtaMax(float v, float* red) {
  v = detail::WarpMax(v);
  __syncthreads();  // red's previous use is over
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kWarps ? red[threadIdx.x & 31] : 0.0f;
  return detail::WarpMax(v);
}

// Rows r_lo .. r_lo + nrows - 1 of the activation (T) quantised as
// LaunchMoeFp8Quantize(qmode) quantises them, row j's bytes to q + j K and
// its scales to sc + j stride (stride: K / group, or 1). Maxima are exact
// in any order, and each element's byte is the quantiser kernels' formula,
// so the bytes and scales are theirs.
template <typename T>
__device__ void QuantiseToShared(const Params& p, int64_t r_lo, int nrows, uint8_t* q, float* sc,
                                 float* red) {
  const int4* all = static_cast<const int4*>(p.a);  // 8 elements a vector
  const int64_t rvec = p.K / 8;                     // vectors per row
  const int4* mine = all + r_lo * rvec;
  const int64_t n = nrows * rvec;
  const auto mode = static_cast<MoeFp8ActQuant>(p.qmode);
  if (mode == MoeFp8ActQuant::kPerGroup) {
    // A group is tpg consecutive vectors (8, 16 or 32 threads of a warp,
    // aligned): its maximum by shuffles, its bytes where they were read.
    const int tpg = p.qgroup / 8;
    ForVectors<kQuantBatch>(mine, n, [&](int64_t j, const int4& v, bool valid) {
      float m = AbsMax8<T>(v);
      for (int o = tpg / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (!valid) return;
      const float s = detail::quant::Fp8GroupScale(m);
      reinterpret_cast<uint2*>(q)[j] = Quantise8<T>(v, s);
      if (threadIdx.x % tpg == 0) sc[j / tpg] = s;
    });
    return;
  }
  float s0 = 0.0f, s1 = 0.0f;  // the rows' scales
  if (mode == MoeFp8ActQuant::kPerTensor) {
    float m = 0.0f;
    if (!(p.qstatic > 0.0f)) {
      ForVectors<kMaxBatch>(all, p.a_rows * rvec,
                            [&](int64_t, const int4& v, bool) { m = fmaxf(m, AbsMax8<T>(v)); });
      m = CtaMax(m, red);
    }
    s0 = s1 = detail::quant::Fp8TensorScale(p.qstatic, m);
  } else {  // per token
    float m0 = 0.0f, m1 = 0.0f;
    ForVectors<kMaxBatch>(mine, n, [&](int64_t j, const int4& v, bool) {
      const float a = AbsMax8<T>(v);
      if (j < rvec) {
        m0 = fmaxf(m0, a);
      } else {
        m1 = fmaxf(m1, a);
      }
    });
    s0 = detail::quant::Fp8TokenScale(CtaMax(m0, red));
    if (nrows > 1) s1 = detail::quant::Fp8TokenScale(CtaMax(m1, red));
  }
  ForVectors<kQuantBatch>(mine, n, [&](int64_t j, const int4& v, bool valid) {
    if (valid) reinterpret_cast<uint2*>(q)[j] = Quantise8<T>(v, j < rvec ? s0 : s1);
  });
  if (threadIdx.x == 0) sc[0] = s0;
  if (threadIdx.x == 1 && nrows > 1) sc[1] = s1;
}

// Dynamic shared memory of the prologue: two rows of K bytes, then their
// scales (per group K / group each, else one).
__host__ __device__ inline int64_t QuantSmemScalesAt(int64_t K) { return (2 * K + 15) / 16 * 16; }
__host__ __device__ inline int64_t QuantSmemBytes(int64_t K, int64_t stride) {
  return QuantSmemScalesAt(K) + 2 * stride * 4;
}

// A CTA of kWarps warps takes kWarps / split tiles of one slot, each tile's
// K split over `split` warps; the tile's first warp sums the partials in
// warp order and writes the outputs. Gated, tile t of a slot is the gate
// rows (row g) and the up rows (g + 8) of intermediate columns 8t .. 8t + 7;
// else rows 16t .. 16t + 15.
// fp8: a guard that keeps 4 CTAs per multiprocessor (64 registers; ptxas
// has given it 66 without, i.e. 3 CTAs). int4 takes the registers it needs
// (~110, 2 CTAs): a cap of 3 CTAs spills and measured slower (docs/PERF.md,
// session 13).
// kQuantise (fp8 only): p.a is the activation in T, quantised in the
// prologue (p.qmode).
template <typename T, int WK, bool kQuantise = false>
__global__ void __launch_bounds__(kThreads, WK == kWFp8 ? 4 : 1)
    TileKernel(const __grid_constant__ Params p) {
  __shared__ float red[kWarps][kTileRows];
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int ks = warp % p.split;
  const int64_t per_cta = kWarps / p.split;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * per_cta + warp / p.split;
  const bool live = tile < p.tiles;
  const int64_t s = live ? tile / p.tiles_per_slot : 0, t = tile % p.tiles_per_slot;
  const int e = live ? LocalExpert(p.ids, p.map, p.num_experts, p.num_local, s) : -1;
  const int64_t arow = s / p.a_row_div;
  // fp8: the activation row of the tile, and its scale for the epilogue.
  Fp8Row<kQuantise> xr{};
  float row_scale = 0.0f;
  if constexpr (WK == kWFp8) {
    const bool block = p.w.scale_kind == MoeWeightScale::kBlock;
    if constexpr (kQuantise) {
      // The rows of the CTA's first and last tiles (the host allows two).
      extern __shared__ __align__(16) uint8_t qsm[];
      const int64_t first = static_cast<int64_t>(blockIdx.x) * per_cta;
      const int64_t last = min(first + per_cta, p.tiles) - 1;
      const int64_t r_lo = first / p.tiles_per_slot / p.a_row_div;
      const int nrows = static_cast<int>(last / p.tiles_per_slot / p.a_row_div - r_lo) + 1;
      const int64_t stride = block ? p.a_kb : 1;
      float* sc = reinterpret_cast<float*>(qsm + QuantSmemScalesAt(p.K));
      QuantiseToShared<T>(p, r_lo, nrows, qsm, sc, &red[0][0]);
      __syncthreads();
      xr = {reinterpret_cast<const int4*>(qsm + (arow - r_lo) * p.K), sc + (arow - r_lo) * stride};
    } else {
      xr = {reinterpret_cast<const int4*>(static_cast<const uint8_t*>(p.a) + arow * p.K),
            p.a_scale + arow * (block ? p.a_kb : 1)};
    }
    if (e >= 0 && !block) row_scale = xr.S(0);
  }
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
    if constexpr (WK == kWFp8) {
      Fp8TileDots(p, e, rows, xr, ks, lane, acc);
    } else {
      Int4TileDots<T>(p, e, rows, arow, ks, lane, acc);
    }
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
    const float gv = Output<T, WK>(p, e, row_of(lane), sum(lane), row_scale);
    const float uv = Output<T, WK>(p, e, row_of(lane + 8), sum(lane + 8), row_scale);
    out[col] = FromFloat<T>(moe_math::Gated(p.act, p.ap, gv, uv));
    return;
  }
  const int64_t row = t * kTileRows + lane;
  if (lane >= kTileRows || row >= p.N) return;
  if (e < 0) {
    out[row] = FromFloat<T>(0.0f);
    return;
  }
  const float v = Output<T, WK>(p, e, row, sum(lane), row_scale);
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
  const float g = Output<T, kWInt8>(p, e, rows[0], d[0]);
  const float u = Output<T, kWInt8>(p, e, rows[1], d[1]);
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
    const float v = Output<T, kWInt8>(p, e, n0 + r, d[r]);
    out[n0 + r] = FromFloat<T>(p.plain ? moe_math::Plain(p.act, v) : v);
  }
}

template <typename T>
cudaError_t LaunchInt8(const Params& p, cudaStream_t stream) {
  const int64_t warps = p.numel * (p.gated ? p.out_cols : p.warps_per_slot);
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps));
  return p.gated ? detail::LaunchPdl(Int8GatedKernel<T>, grid, dim3(kThreads), 0, stream, p)
                 : detail::LaunchPdl(Int8RowsKernel<T>, grid, dim3(kThreads), 0, stream, p);
}

template <typename T>
cudaError_t ByKind(const Params& p, cudaStream_t stream) {
  if (p.w.kind == DType::kInt8) return LaunchInt8<T>(p, stream);
  const int64_t per_cta = kWarps / p.split;
  const dim3 grid(static_cast<unsigned>((p.tiles + per_cta - 1) / per_cta));
  if (p.w.kind != DType::kFp8E4m3) {
    return detail::LaunchPdl(TileKernel<T, kWInt4>, grid, dim3(kThreads), 0, stream, p);
  }
  if (p.qmode < 0)
    return detail::LaunchPdl(TileKernel<T, kWFp8>, grid, dim3(kThreads), 0, stream, p);
  const int64_t stride = p.w.scale_kind == MoeWeightScale::kBlock ? p.a_kb : 1;
  return detail::LaunchPdl(TileKernel<T, kWFp8, true>, grid, dim3(kThreads),
                           static_cast<size_t>(QuantSmemBytes(p.K, stride)), stream, p);
}

// The tiles of a fp8 / int4 launch and the warps splitting each tile's K.
struct TilePlan {
  int64_t tiles_per_slot = 0, tiles = 0;
  int split = 1;
};
TilePlan PlanTiles(const MoeQuantDecodeArgs& d, bool gated) {
  TilePlan t;
  const int64_t out_cols = gated ? d.N / 2 : d.N;
  t.tiles_per_slot = gated ? (out_cols + 7) / 8 : (d.N + kTileRows - 1) / kTileRows;
  t.tiles = d.numel * t.tiles_per_slot;
  // K split over up to kWarps warps until the grid has kMinWarps warps
  // (the weight stream needs that many loads in flight: an H200's 132 SMs
  // x 32 warps, a constant rather than the device's count so that the
  // split, and with it the summation order, depends on the shape only),
  // keeping two chunks per warp at least.
  constexpr int64_t kMinWarps = 132 * 32;
  const int64_t bpr = d.w.kind == DType::kInt4Packed ? d.K / 2 : d.K;  // bytes per row
  const int64_t chunks = (bpr / 16 + 3) / 4;
  while (t.split < kWarps && t.tiles * t.split < kMinWarps && chunks >= 4 * t.split) t.split *= 2;
  return t;
}

bool Gated(const MoeQuantDecodeArgs& d) { return d.apply_act && d.act < MoeActivation::kSiluNoMul; }

// The largest K whose activation the fp8 tiles quantise themselves: the
// shared-memory bound, or KPLAN_MOE_FP8_MATVEC_QUANTISE (a measurement knob;
// 0: never) where smaller.
constexpr int64_t kMaxQuantiseK = 16384;
int64_t MaxQuantiseK() {
  static const int64_t k = std::min<int64_t>(
      kMaxQuantiseK, detail::EnvInt("KPLAN_MOE_FP8_MATVEC_QUANTISE", kMaxQuantiseK));
  return k;
}
detail::KernelSwitch g_quantise_in_matvec([] { return MaxQuantiseK() > 0; });

}  // namespace

void SetMoeFp8QuantiseInMatvecMode(MoeKernelMode mode) { g_quantise_in_matvec.Set(mode); }

bool MoeQuantMatvecQuantises(const MoeQuantMatvecArgs& args) {
  const MoeQuantDecodeArgs& d = args.gemm;
  if (!args.quantise || !g_quantise_in_matvec.On()) return false;
  if (d.w.kind != DType::kFp8E4m3 || !MoeQuantMatvecSupports(d.w, d.act_type, d.N, d.K)) {
    return false;
  }
  const MoeFp8Quantise& q = *args.quantise;
  if (d.K > MaxQuantiseK() || d.K % 8 != 0 || (reinterpret_cast<uintptr_t>(d.a) & 15) != 0) {
    return false;
  }
  if (d.numel <= 0 || d.a_row_div <= 0 || q.rows <= 0 || (d.numel - 1) / d.a_row_div >= q.rows) {
    return false;
  }
  switch (q.mode) {
    case MoeFp8ActQuant::kPerGroup:
      if (d.w.scale_kind != MoeWeightScale::kBlock || q.group != d.w.block_k) return false;
      if ((q.group != 64 && q.group != 128 && q.group != 256) || d.K % q.group != 0) return false;
      break;
    case MoeFp8ActQuant::kPerTensor:
      // Every CTA reads the whole tensor for its maximum: a few loads per thread.
      if (!(q.static_scale > 0.0f) && q.rows * d.K > 16384) return false;
      [[fallthrough]];
    case MoeFp8ActQuant::kPerToken:
      if (d.w.scale_kind == MoeWeightScale::kBlock) return false;
      break;
    default:
      return false;
  }
  // A CTA's tiles span at most two slots, so two rows (a_row_div >= 1).
  const TilePlan t = PlanTiles(d, Gated(d));
  return kWarps / t.split <= t.tiles_per_slot;
}

bool MoeQuantMatvecSupports(const MoeQuantWeights& w, DType act_type, int64_t N, int64_t K) {
  // The decode kernels' weights and sizes, with 32-bit vector, chunk and
  // group indices (Int8RowDots and the tiles).
  return MoeQuantDecodeSupports(w, act_type, N, K) && K <= (int64_t{1} << 30) &&
         N * (K / 16) <= INT32_MAX;
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
      (d.w.kind == DType::kFp8E4m3 && d.a_scale == nullptr && !args.quantise)) {
    return absl::InvalidArgumentError("moe_quant_matvec: null pointer");
  }
  const bool gated = Gated(d);
  if (gated && d.N % 2 != 0) return absl::InvalidArgumentError("moe_quant_matvec: odd gated N");
  const bool quantise = args.quantise.has_value();
  if (quantise && !MoeQuantMatvecQuantises(args)) {
    return absl::InvalidArgumentError(
        "moe_quant_matvec: quantise set where MoeQuantMatvecQuantises says no");
  }
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
  p.qmode = quantise ? static_cast<int>(args.quantise->mode) : -1;
  p.qgroup = quantise ? args.quantise->group : 0;
  p.qstatic = quantise ? args.quantise->static_scale : 0.0f;
  p.a_rows = quantise ? args.quantise->rows : 0;
  int64_t warps;
  if (d.w.kind != DType::kInt8) {
    const TilePlan t = PlanTiles(d, gated);
    p.tiles_per_slot = t.tiles_per_slot;
    p.tiles = t.tiles;
    p.split = t.split;
    warps = (p.tiles + kWarps / p.split - 1) / (kWarps / p.split) * kWarps;
  } else {
    p.warps_per_slot = (d.N + kRows - 1) / kRows;
    warps = d.numel * (gated ? p.out_cols : p.warps_per_slot);
  }
  if ((warps + kWarps - 1) / kWarps > INT32_MAX) {
    return absl::InvalidArgumentError("moe_quant_matvec: grid too large");
  }
  KPLAN_CUDA_RETURN_IF_ERROR(d.act_type == DType::kBFloat16 ? ByKind<__nv_bfloat16>(p, stream)
                                                            : ByKind<__half>(p, stream));
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
