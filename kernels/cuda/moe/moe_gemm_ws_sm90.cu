// Warp-specialised persistent grouped GEMM for sm_90a (moe_gemm_ws.h).
//
// Shape: C[slot, n] = Σ_k A[slot / a_row_div, k] · W[e, n, k]; a tile is
// kWsTileT = 128 slots (one moe_align_block_size block or half of a 256-slot
// block, so one expert) x kWsTileN = 256 weight rows. Not swapped, unlike
// moe_gemm_sm90.cu: the token rows are wgmma's A operand (M = 64 per consumer
// warpgroup), the weight rows its B operand (N = 256), so an accumulator
// pair is two adjacent output columns (4-byte stores) and each wgmma reads
// 2 KiB of A and 8 KiB of B per 64x256x16 step.
//
// CTA: 384 threads, three warpgroups.
//  * WG 0, the producer (setmaxnreg down to 40): per k-tile of 64, thread 0
//    issues the TMA load of the 256 x 64 weight box (tensor map over
//    [E * N, K], 128-byte swizzle; two boxes of 128 rows when fused or
//    clustered) with expect_tx on the stage's full barrier; all 128 threads
//    gather the 128 token rows with 16-byte cp.async into the same swizzled
//    layout and signal the full barrier with cp.async.mbarrier.arrive.noinc
//    (129 arrivals + the TMA bytes per phase).
//  * WG 1, 2, the consumers (setmaxnreg up to 232): slots [64 c, 64 c + 64)
//    of the tile, 4 wgmma m64n256k16 per k-tile into 128 fp32 registers; a
//    k-tile's stage is released (one arrival per consumer warp on the
//    stage's empty barrier, the cluster's CTAs' barriers with clusters) once
//    wgmma.wait_group 1 shows its group done, so every stage is in flight
//    and there is no block-wide barrier at all. Epilogue straight from the
//    registers: round to T, + round(bias), 16-byte stores after a quad
//    transpose; meanwhile the producer already fills the next tile's stages.
// The tall tiles (kTileT = 192, blocks of 192, bf16; moe_gemm_ws.h): a
// fourth warpgroup, 512 threads, a third consumer warpgroup on slots
// [128, 192); the producer gathers 192 token rows a stage (56 KiB stages),
// setmaxnreg 32 / 160, two m64n128k16 halves per k16 step and lighter
// epilogues (at kTallSmemBytes below).
// Persistent: the clusters (of one CTA, or two: kCluster) that fit at once,
// walking work items in the moe_ws_schedule.h order; tiles of experts of
// other ranks (expert id -1) write zero rows as the other kernel does,
// tiles made only of padding are skipped (with clusters: their stages pass
// while the other CTA's tile runs), and so are the MMAs of a consumer
// warpgroup whose 64 slots are all padding (an expert with at most 64 slots
// in the tile).
//
// Fused activation (the Fused instantiation, GEMM 1 of a gated layer, W =
// w13 [E, 2I, K] unchanged): tile n_tile covers output columns [n0, n0 + 128)
// of act = silu(gate) * up, the B tile is two TMA boxes of 128 x 64 (gate
// rows n0.. and up rows I + n0.., stacked: the same 256-row swizzled layout),
// accumulator columns 0..127 are gate, 128..255 up. The epilogue rounds gate
// and up exactly as the unfused path stores them (round(round(acc) +
// round(bias))), applies the activation kernel's formula in fp32 and rounds
// once: bit-identical to GEMM 1 -> LaunchMoeActivation. The tile count is
// that of the unfused GEMM (ceil(2I / 256) == ceil(I / 128)). With
// cooperative tiles of 128 the last kDeferChunks of a tile's four 32-column
// chunks of activation (two: half) run during the first k-tiles of the
// CTA's next tile (or, short of k-tiles, at its next epilogue or the
// kernel's end), their inputs parked in shared memory (kDeferBytes below),
// so that the tensor cores work through them. The other gated activations of
// stacked rows (kAnyAct, cooperative tiles of 128, 16-bit weights) take the
// same path with the activation kernel's moe_math::Gated value by value in
// place of SiluN (MoeGemmWsActApplies names those it takes); SiLU's
// instantiations do not carry that code.
//
// int4 weights (the kInt instantiations, MoeGroupedGemmArgs::int_w: group
// scales, optional zero points): each k-tile's packed bytes (32 of each of
// the 256 weight rows, 8 KiB) come by TMA into a 4-slot staging ring behind
// the stages, 3 k-tiles ahead; the producer warpgroup dequantises them to T
// exactly as LaunchMoeDequantWeights does (IntGroupDequant: round_T((q -
// zp)·s)) into the stage's weight rows in the box's swizzled layout, fenced
// for the async proxy, with one more arrival per thread on the full
// barrier. The consumers are the same code, so C is bit-identical to the
// dequantiser followed by this kernel on its bf16 / fp16 copy. The producer
// keeps 120 registers and the consumers 192 (ptxas spills none). A first
// form loaded the packed bytes into registers one k-tile ahead: bound by
// that load's latency, Mixtral-8x7B 4096 tokens took 11.5 ms against 7.5 ms
// for the dequantised copy (docs/PERF.md, session 16).
#include <cuda.h>  // CUtensorMap and its enums (types only: no -lcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/moe/moe_tma.h"
#include "kernels/cuda/moe/moe_wgmma.cuh"
#include "kernels/cuda/moe/moe_ws_launch.h"
#include "kernels/cuda/moe/moe_ws_pipeline.cuh"
#include "kernels/cuda/moe/moe_ws_schedule.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::Desc;
using detail::FenceProxyAsync;
using detail::FromFloat;
using detail::MbarArrive;
using detail::MbarWait;
using detail::Pack2;
using detail::QuadStore16;
using detail::Round2;
using detail::TmaLoad2d;
using detail::ToFloat;
using detail::Unpack2;
using detail::Wgmma;
using detail::WgmmaCommit;
using detail::WgmmaFence;
using detail::WgmmaWait;
using ws::kWsTileN;
using ws::kWsTileT;

constexpr int kBK = 64;  // K elements per stage (128 bytes)
// A stage: the tile's token rows (128 bytes of K each), then kWsTileN weight rows.
template <int kTileT>
constexpr int TileStageBytes() {
  return kTileT * 128 + ws::kWsWBytes;
}
constexpr int kStageBytes = TileStageBytes<kWsTileT>();  // 48 KiB
constexpr int kSmemBytes = ws::WsSmemBytes(kStageBytes);

// The fused GEMM 1's deferred half (cooperative tiles of 128, 16-bit
// weights: kDefer in the kernel). At a tile's end each consumer thread
// finishes the first 4 - kDeferChunks of its four 32-column chunks; the other
// chunks' rounded gate and up values go to shared memory after the ring,
// kDeferUnits of 16 bytes a thread (unit u: registers 4 j .. 4 j + 3 of j =
// kDeferFirstJ + u, as {gate row r0, up row r0, gate row r0 + 8, up row r0 +
// 8} pairs), and the thread finishes one unit a k-tile during the next tile,
// after the k-tile's wgmmas are issued. Two chunks: 256 consumer threads x 8
// x 16 bytes, 32 KiB beside the 193 KiB ring, within sm_90's 227 KiB.
constexpr int kDeferChunks = 2;
static_assert(kDeferChunks >= 1 && kDeferChunks <= kWsTileN / 64, "of a tile's four chunks");
constexpr int kDeferUnits = 4 * kDeferChunks;
constexpr int kDeferFirstJ = kWsTileN / 16 - kDeferUnits;
constexpr int kDeferStride = 2 * 128 * 16;  // bytes between a thread's units
constexpr int kDeferBytes = kDeferUnits * kDeferStride;
// Whether an instantiation defers (and takes kDeferBytes more shared memory).
template <bool Fused, bool kInt, bool kPingPong, int kTileT>
constexpr bool WsDefers() {
  return Fused && !kInt && !kPingPong && kTileT == kWsTileT;
}
// 128: room for the static shared memory (the ring's 64 bytes of barriers).
static_assert(kSmemBytes + kDeferBytes + 128 <= 227 * 1024, "the deferred chunks fit a CTA");

// The tall tiles (kTileT = ws::kWsTallTileT): 192 token rows a stage (24
// KiB) before the same 32 KiB of weight rows, four stages (225 KiB with the
// alignment room, within sm_90's 227 KiB a CTA); 512 threads, launched with
// 128 registers each. The three consumer warpgroups take 160 (128
// accumulators), the most the producer's 32 leave (setmaxnreg's minimum is 24,
// and counts are multiples of 8). ptxas (CUDA 13) at 32 / 160: the producer
// spills its row indices (196 bytes), the main loops nothing; the epilogues
// are written for the 160 (below). At 56 / 152 the consumers spilled 1128
// bytes in the epilogue.
static_assert(ws::kWsTallTileT == kMoeGemmTallBlockM);
constexpr int kTallSmemBytes = ws::WsSmemBytes(TileStageBytes<ws::kWsTallTileT>());
static_assert(kTallSmemBytes + 128 <= 227 * 1024, "the tall tiles' ring fits a CTA");
constexpr int kTallProducerRegs = 32, kTallConsumerRegs = 160;
static_assert(ws::WsRegsFit(kTallProducerRegs, kTallConsumerRegs, ws::kWsTallTileT),
              "the tall tiles' warpgroups fit the CTA's launch allocation");

struct WsParams {
  ws::WsSchedule sched;                       // the host's upper bound, clipped on the device
  const int32_t *sorted, *expert_ids, *post;  // moe_align_block_size output
  const void* a;
  void* c;
  const float* bias;
  int64_t numel, N, K;
  int a_row_div, num_local_experts, block_m;
  int flags;                // kWsFlag*: measurement variants
  MoeActParams act_params;  // Fused only: clamp_limit already defaulted
  // kInt only: the int4 weights [E, N, K / 2], scales and zero points [E, N, groups].
  MoeQuantWeights iw;
  int64_t groups;
  detail::quant::GroupDiv gdiv;
  // Fused with kAnyAct only: the gated activation (stacked gate / up rows).
  MoeActivation act = MoeActivation::kSilu;
};

// Measurement variants (KPLAN_MOE_WS_DEBUG bits), never set by the layer:
// skip the epilogue (times the tile boundary; output unwritten), store the
// fragment's 4-byte pieces without the quad transpose, leave out the proxy
// fence (not a valid kernel: measures the fence's cost), or skip the
// consumers' MMAs (output wrong: the weight stream alone).
constexpr int kWsFlagNoStore = 1;
constexpr int kWsFlagStore4 = 2;
constexpr int kWsFlagNoFence = 4;      // the consumers' proxy fence left out: timing only
constexpr int kWsFlagNoMulticast = 8;  // clusters: each CTA loads its own weight boxes
constexpr int kWsFlagNoMma = 32;       // the consumers skip their MMAs: timing only

// --- the int4 producer (kInt) ---------------------------------------------------

constexpr int kIntProducerRegs = 120, kIntConsumerRegs = 192;
static_assert(ws::WsRegsFit(kIntProducerRegs, kIntConsumerRegs), "register split");
// The packed k-tiles (32 bytes of each of the 256 weight rows) come by TMA
// into a ring of kIntSlots slots after the stages, kIntAhead k-tiles ahead
// of the dequantising threads.
constexpr int kIntSlots = 4, kIntAhead = kIntSlots - 1;
constexpr int kIntSlotBytes = kWsTileN * kBK / 2;  // 8 KiB
constexpr int kIntSmemBytes = kSmemBytes + kIntSlots * kIntSlotBytes;

// The scales and biased zero points of one k-tile of a producer thread's two
// weight rows, two 32-k vectors each (zb 0: past N or K, stored as +0 like
// the TMA box's fill).
struct IntScales {
  float s[2][2], zb[2][2];
};
// A producer thread's rows of the current tile and the next k-tile's scales.
struct IntTile {
  int64_t wrow;         // the tile's first weight row in [E * N) (fused: the gate box's)
  const float* s[2];    // the rows' group scales; null: past N
  const uint8_t* z[2];  // their zero points, or null
  IntScales next;
};

__device__ __forceinline__ void IntFetchScales(const WsParams& p, IntTile& t, int kt) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int64_t k = static_cast<int64_t>(kt) * kBK + 32 * v;
      const bool ok = t.s[r] != nullptr && k < p.K;
      const int64_t gi = p.gdiv(k);
      t.next.s[r][v] = ok ? __ldg(t.s[r] + gi) : 0.0f;
      t.next.zb[r][v] = ok ? detail::quant::BiasedZero(t.z[r], gi, true) : 0.0f;
    }
  }
}

// The 32 k of packed vector q (scale s, biased zero point zb) dequantised
// weight by weight (the form for scales not exact in T) and stored at chunks
// 4 v .. 4 v + 3 of row `row` at w_s. Out of line: inlined, this rarely
// taken path would sit in the producer's loop, four times over.
template <typename T>
__device__ __noinline__ void IntStoreGeneral(uint4 q, float s, float zb, uint32_t w_s, int row,
                                             int v) {
  const detail::quant::IntGroupDequant<T, true> dq(s, zb);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t o[4];
    dq.Pairs(detail::quant::WordOf(q, j), o, /*packed=*/false);
    detail::StShared16(w_s + detail::Swz(row, 4 * v + j), o);
  }
}

// Dequantises this thread's rows ptid and ptid + 128 of the packed k-tile
// in staging slot `stg` (32 bytes a row) with scales `sc` into the stage's
// weight rows at w_s (LaunchMoeDequantWeights' values), 16 bytes (8 k) at a
// time in the 128-byte swizzled layout.
template <typename T>
__device__ __forceinline__ void IntStore(const IntScales& sc, uint32_t stg, uint32_t w_s,
                                         int ptid) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = ptid + 128 * r;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 q = detail::LdShared16(stg + row * 32 + v * 16);
      const detail::quant::IntGroupDequant<T, true> dq(sc.s[r][v], sc.zb[r][v]);
      if (sc.zb[r][v] != 0.0f && !dq.packed()) {
        IntStoreGeneral<T>(q, sc.s[r][v], sc.zb[r][v], w_s, row, v);
        continue;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t o[4] = {0u, 0u, 0u, 0u};  // zb 0: past N or K, +0
        if (sc.zb[r][v] != 0.0f) dq.Pairs(detail::quant::WordOf(q, j), o, /*packed=*/true);
        detail::StShared16(w_s + detail::Swz(row, 4 * v + j), o);
      }
    }
  }
}

// The producer warpgroup's own barrier (named barrier 1; 0 is __syncthreads').
__device__ __forceinline__ void ProducerSync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// The producer of the kInt kernels: WsProduce without a weight box. Per
// k-tile u of this CTA (counted across its tiles) the packed k-tile lies in
// staging slot u % kIntSlots, loaded by thread 0's TMA kIntAhead k-tiles
// earlier (within the tile; a tile's first kIntAhead at its start) with
// expect_tx on the slot's barrier; a producer barrier before each issue
// keeps a slot until every thread has read it.
template <typename T, bool Fused>
__device__ __forceinline__ void IntProduce(const CUtensorMap* imap, const WsParams& p,
                                           const ws::WsRing<kStageBytes>& ring,
                                           const ws::WsSchedule& sched, int64_t total, int nk) {
  __shared__ uint64_t slot_full[kIntSlots];
  const int ptid = threadIdx.x;
  const int64_t N = p.N;
  const uint32_t stg0 = ring.Stage(ws::kWsStages);
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(slot_full));
  if (ptid == 0) {
    for (int i = 0; i < kIntSlots; ++i) detail::MbarInit(full0 + 8 * i, 1);
    FenceProxyAsync();  // the barriers' init visible to the TMA unit
  }
  int64_t u = 0;  // this CTA's k-tiles so far
  // Thread 0: k-tile kt of the tile at wrow into the slot of this CTA's k-tile uk.
  auto issue = [&](int64_t wrow, int kt, int64_t uk) {
    const uint32_t dst = stg0 + static_cast<uint32_t>(uk % kIntSlots) * kIntSlotBytes;
    const uint32_t bar = full0 + 8 * static_cast<uint32_t>(uk % kIntSlots);
    detail::MbarArriveExpectTx(bar, kIntSlotBytes);
    TmaLoad2d(dst, imap, kt * (kBK / 2), static_cast<int>(wrow), bar);
    if constexpr (Fused) {  // the up rows: a second box of 128
      TmaLoad2d(dst + kIntSlotBytes / 2, imap, kt * (kBK / 2), static_cast<int>(wrow + N / 2), bar);
    }
  };
  ws::WsProduce<T, kStageBytes, /*kWBytes=*/0, kIntProducerRegs, /*kCluster=*/1,
                /*kRowAddresses=*/true>(
      p, ring, sched, total, p.K, nk,
      // Rows ptid and ptid + 128 of the tile: unfused weight rows n0 + ptid
      // (+ 128); fused the gate row n0 / 2 + ptid and the up row N / 2 + n0 /
      // 2 + ptid, as the two TMA boxes lay them out.
      [&](ws::WsTileInfo ti) {
        IntTile t;
        t.wrow = static_cast<int64_t>(ti.e) * N + (Fused ? ti.n0 / 2 : ti.n0);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t n = Fused ? r * (N / 2) + ti.n0 / 2 + ptid : ti.n0 + 128 * r + ptid;
          const bool in = Fused ? ti.n0 / 2 + ptid < N / 2 : n < N;
          const int64_t row = static_cast<int64_t>(ti.e) * N + n;
          t.s[r] = in ? p.iw.scale + row * p.groups : nullptr;
          t.z[r] = p.iw.zero != nullptr ? p.iw.zero + row * p.groups : nullptr;
        }
        ProducerSync();  // the slots of the previous tile read
        if (ptid == 0) {
          for (int kt = 0; kt < kIntAhead && kt < nk; ++kt) issue(t.wrow, kt, u + kt);
        }
        IntFetchScales(p, t, 0);
        return t;
      },
      [](const IntTile&, int, uint32_t, uint32_t, bool) {},
      [&](IntTile& t, int kt, uint32_t t_s, uint32_t fb) {
        ProducerSync();  // slot (u + kIntAhead) % kIntSlots, read at u - 1, is free
        if (ptid == 0 && kt + kIntAhead < nk) issue(t.wrow, kt + kIntAhead, u + kIntAhead);
        const IntScales sc = t.next;
        if (kt + 1 < nk) IntFetchScales(p, t, kt + 1);
        detail::MbarWait(full0 + 8 * static_cast<uint32_t>(u % kIntSlots),
                         static_cast<uint32_t>(u / kIntSlots) & 1u);
        IntStore<T>(sc, stg0 + static_cast<uint32_t>(u % kIntSlots) * kIntSlotBytes,
                    t_s + ws::kWsTBytes, ptid);
        // The stores visible to the consumers' wgmma (async proxy), then the arrival.
        FenceProxyAsync();
        MbarArrive(fb);
        ++u;
      });
}

// kCluster: CTAs per cluster (1, or 2 without kInt: the weight box
// multicast, moe_ws_pipeline.cuh); the tensor map's box is then 128 rows,
// two boxes a k-tile (the fused kernel's gate and up boxes). kPingPong: the
// consumer warpgroups take half-items in turn (moe_ws_pipeline.cuh; one
// CTA a tile, 16-bit weights). kTileT: slots a tile, kWsTileT or the tall
// tiles' kWsTallTileT (a third consumer warpgroup; 16-bit weights,
// cooperative consumers, one CTA a tile: in clusters of two they lost where
// an expert has two tall tiles, the only place a pair shares its weights).
template <typename T, bool Fused, bool kInt, int kCluster, bool kPingPong = false,
          int kTileT = kWsTileT, bool kAnyAct = false>
__global__ void __launch_bounds__(ws::WsThreadsFor(kTileT), 1)
    WsGroupedGemmKernel(const __grid_constant__ CUtensorMap wmap, const WsParams p) {
  static_assert(kCluster == 1 || (kCluster == 2 && !kInt), "clusters of two, bf16 / fp16 weights");
  static_assert(!kPingPong || (kCluster == 1 && !kInt), "ping-pong: one CTA a tile, 16-bit");
  static_assert(
      kTileT == kWsTileT || (kTileT == ws::kWsTallTileT && !kInt && !kPingPong && kCluster == 1),
      "tall tiles: 16-bit weights, cooperative consumers, one CTA a tile");
  static_assert(!kAnyAct || (Fused && !kInt && !kPingPong && kTileT == kWsTileT),
                "another gated activation: the fused cooperative tiles of 128, 16-bit");
  constexpr bool kTall = kTileT != kWsTileT;
  constexpr bool kDefer = WsDefers<Fused, kInt, kPingPong, kTileT>();
  constexpr int kStage = TileStageBytes<kTileT>();
  constexpr int kProducerRegs = kTall ? kTallProducerRegs : ws::kWsProducerRegs;
  constexpr int kConsumerRegs = kTall  ? kTallConsumerRegs
                                : kInt ? kIntConsumerRegs
                                       : ws::kWsConsumerRegs;
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const ws::WsRing<kStage> ring = ws::WsRingInit < kStage, kInt ? 128 : 0, kCluster,
                           kPingPong ? ws::kWsConsumerWarps / 2
                                     : ws::WsConsumerWarpsFor(kTileT) > (&wmap);
  const ws::WsSchedule sched = ws::WsClip<kTileT>(p.sched, *p.post);
  const int64_t total = ws::WsTotalWork(sched);
  const int64_t N = p.N, K = p.K;
  const int nk = static_cast<int>((K + kBK - 1) / kBK);

  if constexpr (kInt) {
    if (wg == 0) {
      IntProduce<T, Fused>(&wmap, p, ring, sched, total, nk);
      return;
    }
  }
  if (wg == 0 && !kInt) {
    // The tile's first weight row. Fused: gate rows n0 / 2 .., up rows
    // N / 2 + n0 / 2 .. (two 128-row boxes).
    auto wrow_of = [&](ws::WsTileInfo ti) {
      return static_cast<int64_t>(ti.e) * N + (Fused ? ti.n0 / 2 : ti.n0);
    };
    ws::WsProduce<T, kStage, ws::kWsWBytes, kProducerRegs, kCluster,
                  /*kRowAddresses=*/false, kPingPong, kTileT>(
        p, ring, sched, total, K, nk, wrow_of,
        [&](int64_t wrow, int kt, uint32_t w_s, uint32_t fb, bool multicast) {
          if constexpr (!Fused && kCluster == 1) {
            TmaLoad2d(w_s, &wmap, kt * kBK, static_cast<int>(wrow), fb);
            return;
          }
          // Two boxes of 128 rows: the gate and up rows, or the tile's halves.
          const int64_t rows[2] = {wrow, Fused ? wrow + N / 2 : wrow + kWsTileN / 2};
          if constexpr (kCluster > 1) {
            if (multicast && !(p.flags & kWsFlagNoMulticast)) {  // this CTA's box, into both
              const uint32_t r = detail::ClusterCtaRank();
              detail::TmaLoad2dMulticast(w_s + r * (ws::kWsWBytes / 2), &wmap, kt * kBK,
                                         static_cast<int>(rows[r]), fb, 0x3);
              return;
            }
          }
          TmaLoad2d(w_s, &wmap, kt * kBK, static_cast<int>(rows[0]), fb);
          TmaLoad2d(w_s + ws::kWsWBytes / 2, &wmap, kt * kBK, static_cast<int>(rows[1]), fb);
        },
        [](int64_t, int, uint32_t, uint32_t) {});
    return;
  }

  const ws::WsConsumer cs = ws::WsConsumerEnter<kConsumerRegs>();
  const int cw = cs.cw, lane = cs.lane, r0 = cs.r0;
  T* Cg = static_cast<T*>(p.c);
  float acc[kWsTileN / 2];
  ws::WsCursor c;
  const int q = lane & 3;
  const int64_t NI = N / 2;  // Fused: the intermediate's width
  // Fused: gate and up registers 4 j .. 4 j + 3 of tile ti (j < 16: output
  // columns n and n + 1, n = ti.n0 / 2 + 8 j + 2 q; rows r0, r0, r0 + 8,
  // r0 + 8) as the unfused path stores them: round(acc), or with a bias
  // round(round(acc) + round(bias)); 0 for another rank's expert. Gate
  // column n is accumulator column n - n0 / 2, up column N / 2 + n
  // accumulator column 128 + n - n0 / 2 (register + 64).
  auto gate_up = [&](const ws::WsTileInfo& ti, const float* bias, int j, float* gj, float* uj) {
    const int64_t n = ti.n0 / 2 + 8 * j + 2 * q;
    if constexpr (kDefer) {
      // Two values a conversion, and one rounding where there is no bias
      // (a second one changes nothing): the deferred form's epilogue in
      // fewer instructions (docs/PERF.md, session 37).
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        gj[x] = ti.local ? acc[4 * j + x] : 0.0f;
        uj[x] = ti.local ? acc[4 * (j + kWsTileN / 16) + x] : 0.0f;
      }
#pragma unroll
      for (int x = 0; x < 4; x += 2) Round2<T>(gj[x], gj[x + 1]), Round2<T>(uj[x], uj[x + 1]);
      if (bias != nullptr && n < NI) {
        float b[4] = {bias[n], bias[n + 1], bias[NI + n], bias[NI + n + 1]};
        Round2<T>(b[0], b[1]), Round2<T>(b[2], b[3]);
        gj[0] += b[0], gj[1] += b[1], gj[2] += b[0], gj[3] += b[1];
        uj[0] += b[2], uj[1] += b[3], uj[2] += b[2], uj[3] += b[3];
#pragma unroll
        for (int x = 0; x < 4; x += 2) Round2<T>(gj[x], gj[x + 1]), Round2<T>(uj[x], uj[x + 1]);
      }
    } else {
      // The other forms: the same values, one rounding at a time and twice
      // whatever the bias. In that form ptxas (CUDA 13) allocates their
      // epilogues with fewer spills (ping-pong 48 bytes against 60, tall 252
      // against 276), and the ping-pong form measured 0.3-0.5% faster.
#pragma unroll
      for (int x = 0; x < 4; ++x) gj[x] = uj[x] = 0.0f;
      if (ti.local) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          gj[x] = ToFloat(FromFloat<T>(acc[4 * j + x]));
          uj[x] = ToFloat(FromFloat<T>(acc[4 * (j + kWsTileN / 16) + x]));
        }
        if (bias != nullptr && n < NI) {
          const float g0 = ToFloat(FromFloat<T>(bias[n])), g1 = ToFloat(FromFloat<T>(bias[n + 1]));
          const float u0 = ToFloat(FromFloat<T>(bias[NI + n]));
          const float u1 = ToFloat(FromFloat<T>(bias[NI + n + 1]));
          gj[0] += g0, gj[1] += g1, gj[2] += g0, gj[3] += g1;
          uj[0] += u0, uj[1] += u1, uj[2] += u0, uj[3] += u1;
        }
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        gj[x] = ToFloat(FromFloat<T>(gj[x]));
        uj[x] = ToFloat(FromFloat<T>(uj[x]));
      }
    }
  };
  // kDefer: this thread's pending units (dcnt .. kDeferUnits - 1) at dbuf,
  // of output rows ds0 / ds1 (-1: not stored) from column dcol.
  const uint32_t dbuf =
      ring.Stage(ws::kWsStages) + (static_cast<uint32_t>(threadIdx.x) - 128u) * 16u;
  int dcnt = kDeferUnits, ds0 = -1, ds1 = -1;
  int64_t dcol = 0;
  // The next pending unit: the activation of its 2 x 2 values, 4-byte stores.
  auto defer_unit = [&]() {
    const uint4 w = detail::LdShared16(dbuf + dcnt * kDeferStride);
    float g[4], u[4];
    Unpack2<T>(w.x, g[0], g[1]), Unpack2<T>(w.y, u[0], u[1]);
    Unpack2<T>(w.z, g[2], g[3]), Unpack2<T>(w.w, u[2], u[3]);
    if constexpr (kAnyAct) {
#pragma unroll
      for (int x = 0; x < 4; ++x) g[x] = moe_math::Gated(p.act, p.act_params, g[x], u[x]);
    } else {
      moe_math::GatedSiluN(p.act_params, g, u);
    }
    const int64_t n = dcol + 8 * (kDeferFirstJ + dcnt) + 2 * q;
    if (n < NI) {
      if (ds0 >= 0) *reinterpret_cast<uint32_t*>(Cg + ds0 * NI + n) = Pack2<T>(g[0], g[1]);
      if (ds1 >= 0) *reinterpret_cast<uint32_t*>(Cg + ds1 * NI + n) = Pack2<T>(g[2], g[3]);
    }
    ++dcnt;
  };
  auto defer_flush = [&]() {
#pragma unroll 1
    while (dcnt < kDeferUnits) defer_unit();
  };
  // The k-tiles of one tile: with `mine` this warpgroup's MMAs on the 64
  // token rows at a_off of each stage; each stage released after its wgmma
  // group is done (the last one at the end).
  auto main_loop = [&](bool mine, uint32_t a_off, int rank) {
    int prev = -1;
    for (int kt = 0; kt < nk; ++kt) {
      MbarWait(ring.Full(c.stage), c.phase);
      if (mine) {
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        if (!(p.flags & kWsFlagNoFence)) FenceProxyAsync();
        const uint32_t t_s = ring.Stage(c.stage), w_s = t_s + kTileT * 128;
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if constexpr (kTall) {
            // Two n128 halves: ptxas compiles no n256 wgmma (128 accumulators
            // in one instruction) under the 128-register launch bound of 512
            // threads, whatever setmaxnreg gives the consumers. Register i of
            // a half is register i (+ 64) of the n256 fragment.
            using Half = float[kWsTileN / 4];
            Wgmma<kWsTileN / 2, T>::Run(*reinterpret_cast<Half*>(acc), Desc(t_s + a_off + kk * 32),
                                        Desc(w_s + kk * 32), kt > 0 || kk > 0);
            Wgmma<kWsTileN / 2, T>::Run(*reinterpret_cast<Half*>(acc + kWsTileN / 4),
                                        Desc(t_s + a_off + kk * 32),
                                        Desc(w_s + ws::kWsWBytes / 2 + kk * 32), kt > 0 || kk > 0);
          } else {
            Wgmma<kWsTileN, T>::Run(acc, Desc(t_s + a_off + kk * 32), Desc(w_s + kk * 32),
                                    kt > 0 || kk > 0);
          }
        }
        WgmmaCommit();
        // A pending unit while the tensor cores run this k-tile.
        if constexpr (kDefer) {
          if (dcnt < kDeferUnits) defer_unit();
        }
        WgmmaWait<1>();
      } else if constexpr (kDefer) {
        if (dcnt < kDeferUnits) defer_unit();
      }
      if (prev >= 0) ws::WsRelease<kCluster>(ring, prev, lane, rank);
      prev = c.stage;
      c.Next();
    }
    WgmmaWait<0>();
    ws::WsRelease<kCluster>(ring, prev, lane, rank);
  };
  // The epilogue of tile ti for this thread's accumulator rows, slots s0
  // and s1 (padding or -1: not stored).
  auto epilogue = [&](const ws::WsTileInfo& ti, int32_t s0, int32_t s1) {
    const bool ok0 = s0 >= 0 && s0 < p.numel, ok1 = s1 >= 0 && s1 < p.numel;
    // A warp whose 16 rows are all padding stores nothing: it skips the
    // epilogue's arithmetic too (the fused activation's above all). The
    // warpgroup's next wgmma waits for its slowest warp, and the producer, 4
    // stages ahead, for the warpgroup: ncu on Mixtral-8x7B's fused GEMM 1 at
    // 64 tokens (16 slots a tile), 527.6 us with the MMAs left out, 455.8
    // with the epilogue left out too; this skip: the layer 770 -> 758 us
    // (docs/PERF.md, session 23).
    if (!__any_sync(0xffffffffu, ok0 || ok1)) return;
    // Epilogue. Register i holds row r0 + 8 ((i / 2) % 2), column 8 (i / 4) +
    // 2 (lane % 4) + i % 2: a quad holds 8 adjacent columns of a row in four
    // 4-byte pieces. Per 32 columns (j = 4m .. 4m + 3) a 4 x 4 transpose in
    // the quad gives lane q the 8 columns of j = 4m + q: one 16-byte store.
    const float* bias =
        ti.local && p.bias != nullptr ? p.bias + static_cast<int64_t>(ti.e) * N : nullptr;
    if constexpr (Fused) {
      // Output [numel, N / 2]: per chunk m of 32 columns the rounded gate
      // and up values (gate_up), the activation kernel's formula, 16-byte
      // stores. kDefer: the last kDeferChunks go to the deferred units instead.
      if constexpr (kDefer)
        defer_flush();  // the previous tile's units, before the buffer is reused
#pragma unroll
      for (int m = 0; m < kWsTileN / 64 - (kDefer ? kDeferChunks : 0); ++m) {
        float g[16], u[16];
        uint32_t pa[4], pb[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          float* gj = g + 4 * jj;
          float* uj = u + 4 * jj;
          gate_up(ti, bias, 4 * m + jj, gj, uj);
          if constexpr (kInt || kTall) {
            // The int4 consumers keep 192 registers, the tall tiles' 160:
            // 16 values at once spilled 268-448 bytes there (4 at once 988 in
            // the tall tiles, one at a time 284), so they take one at a time.
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              gj[x] = moe_math::Gated(MoeActivation::kSilu, p.act_params, gj[x], uj[x]);
            }
            pa[jj] = Pack2<T>(gj[0], gj[1]);
            pb[jj] = Pack2<T>(gj[2], gj[3]);
          }
        }
        if constexpr (!kInt && !kTall) {
          if constexpr (kAnyAct) {  // the activation kernel's formula value by value
#pragma unroll
            for (int i = 0; i < 16; ++i) g[i] = moe_math::Gated(p.act, p.act_params, g[i], u[i]);
          } else {
            moe_math::GatedSiluN(p.act_params, g, u);
          }
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            pa[jj] = Pack2<T>(g[4 * jj], g[4 * jj + 1]);
            pb[jj] = Pack2<T>(g[4 * jj + 2], g[4 * jj + 3]);
          }
        }
        const int64_t n = ti.n0 / 2 + 8 * (4 * m + q);
        QuadStore16(pa, pb, lane, ok0 && n < NI ? Cg + static_cast<int64_t>(s0) * NI + n : nullptr,
                    ok1 && n < NI ? Cg + static_cast<int64_t>(s1) * NI + n : nullptr);
      }
      if constexpr (kDefer) {
#pragma unroll
        for (int v = 0; v < kDeferUnits; ++v) {
          float gj[4], uj[4];
          gate_up(ti, bias, kDeferFirstJ + v, gj, uj);
          const uint32_t w[4] = {Pack2<T>(gj[0], gj[1]), Pack2<T>(uj[0], uj[1]),
                                 Pack2<T>(gj[2], gj[3]), Pack2<T>(uj[2], uj[3])};
          detail::StShared16(dbuf + v * kDeferStride, w);
        }
        ds0 = ok0 ? s0 : -1, ds1 = ok1 ? s1 : -1;
        dcol = ti.n0 / 2;
        dcnt = 0;
      }
      return;
    }
    // 4-byte pieces straight from the fragment: a measurement variant, and
    // the tall tiles' form (the quad transpose's registers spilled 372 bytes
    // at their 160 registers; the 4-byte stores none).
    if (kTall || (p.flags & kWsFlagStore4)) {
#pragma unroll
      for (int j = 0; j < kWsTileN / 8; ++j) {
        const int64_t n = ti.n0 + 8 * j + 2 * q;
        if (n >= N) continue;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (ti.local) {
#pragma unroll
          for (int x = 0; x < 4; ++x) v[x] = ToFloat(FromFloat<T>(acc[4 * j + x]));
          if (bias != nullptr) {
            const float b0 = ToFloat(FromFloat<T>(bias[n])),
                        b1 = ToFloat(FromFloat<T>(bias[n + 1]));
            v[0] += b0, v[1] += b1, v[2] += b0, v[3] += b1;
          }
        }
        if (ok0)
          *reinterpret_cast<uint32_t*>(Cg + static_cast<int64_t>(s0) * N + n) =
              Pack2<T>(v[0], v[1]);
        if (ok1)
          *reinterpret_cast<uint32_t*>(Cg + static_cast<int64_t>(s1) * N + n) =
              Pack2<T>(v[2], v[3]);
      }
      return;
    }
    detail::WsStoreRows<T, kWsTileN>(
        [&](int j, int64_t, float(&v)[4]) {
#pragma unroll
          for (int x = 0; x < 4; ++x) v[x] = ti.local ? acc[4 * j + x] : 0.0f;
        },
        bias, ti.n0, N, lane, ok0 ? Cg + static_cast<int64_t>(s0) * N : nullptr,
        ok1 ? Cg + static_cast<int64_t>(s1) * N : nullptr);
  };
  if constexpr (kPingPong) {
    const int row = r0 - 64 * cw;  // this thread's accumulator row in the half
    int j = 0;                     // this CTA's half-items so far
    ws::WsForEachWork<1>(p, sched, total, [&](const ws::WsWork& w) {
      const ws::WsTileInfo& ti = w.ti;
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        const int64_t base = ti.tt * kWsTileT + kWsTileT / 2 * h;
        const int32_t s0 = ti.empty ? -1 : p.sorted[base + row];
        const int32_t s1 = ti.empty ? -1 : p.sorted[base + row + 8];
        if (!w.active) {  // a tile of another rank's expert: zero rows, warpgroup h
          if (!ti.empty && cw == h && !(p.flags & kWsFlagNoStore)) epilogue(ti, s0, s1);
          continue;
        }
        if (!ws::WsHalfHasWork(p, w, h)) continue;
        if ((j & 1) != cw) {  // the other warpgroup's: its stages pass
          for (int kt = 0; kt < nk; ++kt) c.Next();
          ++j;
          continue;
        }
        if (j > 0) ws::WsOrderWait(cw);  // the other's main loop of half-item j - 1 done
        main_loop(!(p.flags & kWsFlagNoMma), 0, 0);
        ws::WsOrderSignal(cw ^ 1);
        ++j;
        if (!(p.flags & kWsFlagNoStore)) epilogue(ti, s0, s1);
      }
    });
    // The last half-item's signal has no taker: the warpgroup that would
    // have taken half-item j takes it.
    if (j > 0 && (j & 1) == cw) ws::WsOrderWait(cw);
    return;
  }
  ws::WsForEachWork<kCluster, kTileT>(p, sched, total, [&](const ws::WsWork& w) {
    const ws::WsTileInfo& ti = w.ti;
    if (!w.run && ti.empty) return;
    const int32_t s0 = ti.empty ? -1 : p.sorted[ti.tt * kTileT + r0];
    const int32_t s1 = ti.empty ? -1 : p.sorted[ti.tt * kTileT + r0 + 8];
    // This warpgroup's 64 slots: padding only (an expert's slots come first,
    // so the first decides) where the expert has at most 64 in the tile.
    const int32_t first = ti.empty ? -1 : p.sorted[ti.tt * kTileT + 64 * cw];
    const bool mine = w.active && first >= 0 && first < p.numel && !(p.flags & kWsFlagNoMma);
    // This tile's MMAs when it has work; else the stages only pass.
    if (w.run) main_loop(mine, cw * 64 * 128, w.rank);
    if (ti.empty || (p.flags & kWsFlagNoStore)) return;
    epilogue(ti, s0, s1);
  });
  if constexpr (kDefer) defer_flush();
}

// --- host ---------------------------------------------------------------------

detail::KernelSwitch g_ws([] { return ws::WsEnvNotOld("KPLAN_MOE_GEMM"); });

// Measurement knobs of moe_bench: KPLAN_MOE_WS_DEBUG (kWsFlag* bits) and
// KPLAN_MOE_WS_GROUP (units per group, moe_ws_schedule.h; default:
// ws::WsAutoGroup), KPLAN_MOE_WS_GROUP_ACT (the same for the fused GEMM 1
// only, over KPLAN_MOE_WS_GROUP).
const ws::WsKnobs& Knobs() {
  static const ws::WsKnobs knobs =
      ws::WsKnobsFromEnv("KPLAN_MOE_WS_DEBUG", "KPLAN_MOE_WS_GROUP", "KPLAN_MOE_WS_GROUP_ACT");
  return knobs;
}

template <typename T, bool Fused, bool kInt, int kCluster, bool kPingPong = false,
          int kTileT = kWsTileT, bool kAnyAct = false>
absl::Status LaunchWsKernel(const MoeGroupedGemmArgs& g, const MoeActParams& act_params,
                            cudaStream_t stream, MoeActivation act = MoeActivation::kSilu) {
  constexpr bool kDefer = WsDefers<Fused, kInt, kPingPong, kTileT>();
  constexpr int kSmem = kTileT != kWsTileT ? kTallSmemBytes
                        : kInt             ? kIntSmemBytes
                        : kDefer           ? kSmemBytes + kDeferBytes
                                           : kSmemBytes;
  constexpr int kThreads = ws::WsThreadsFor(kTileT);
  constexpr auto kKernel =
      WsGroupedGemmKernel<T, Fused, kInt, kCluster, kPingPong, kTileT, kAnyAct>;
  if (ws::WsTileSlots(g.block_m) != kTileT) {
    return absl::InternalError("moe_grouped_gemm_ws: block_m does not match the kernel's tiles");
  }
  int resident = 0;
  if (absl::Status st = ws::WsLaunchSetup<kKernel>(kSmem, &resident, kCluster, kThreads);
      !st.ok()) {
    return st;
  }
  // Fused or clustered: two boxes of kWsTileN / 2 rows (the gate and up
  // halves, or the tile's halves). kInt: the packed bytes, 32 (64 k) of each
  // row a box, not swizzled.
  const uint64_t rows = static_cast<uint64_t>(g.num_local_experts) * static_cast<uint64_t>(g.N);
  const uint32_t box_rows = Fused || kCluster > 1 ? kWsTileN / 2 : kWsTileN;
  CUtensorMap map;
  if (absl::Status st =
          kInt ? detail::EncodeTma2d(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, g.int_w->data,
                                     static_cast<uint64_t>(g.K / 2), rows,
                                     static_cast<uint64_t>(g.K / 2), kBK / 2, box_rows,
                                     "moe_grouped_gemm_ws_int4", CU_TENSOR_MAP_SWIZZLE_NONE)
               : detail::EncodeTma2d(&map,
                                     std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                     g.w, static_cast<uint64_t>(g.K), rows,
                                     static_cast<uint64_t>(g.K) * sizeof(T), kBK, box_rows,
                                     "moe_grouped_gemm_ws");
      !st.ok()) {
    return st;
  }
  const int group = Fused ? Knobs().act_group : Knobs().group;
  WsParams p{ws::MakeWsSchedule(g.num_blocks, g.block_m, g.N, resident, group, kCluster),
             g.sorted_token_ids,
             g.expert_ids,
             g.num_tokens_post_padded,
             g.a,
             g.c,
             g.bias,
             g.numel,
             g.N,
             g.K,
             g.a_row_div,
             g.num_local_experts,
             g.block_m,
             Knobs().debug_flags & ~(Fused ? kWsFlagStore4 : 0),
             act_params,
             {},
             0,
             {}};
  p.act = act;
  if constexpr (kInt) {
    p.iw = *g.int_w;
    p.groups = g.K / g.int_w->group_size;
    p.gdiv = detail::quant::GroupDiv::For(g.int_w->group_size);
  }
  if (p.sched.grid <= 0) return absl::OkStatus();
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdlCluster(kKernel, dim3(p.sched.grid), dim3(kThreads),
                                                      kSmem, stream, kCluster, map, p));
  return absl::OkStatus();
}

std::atomic<int> cluster_mode{static_cast<int>(MoeGemmWsMode::kFromEnv)};
std::atomic<int64_t> ws_launches{0}, cluster_launches{0}, ping_pong_launches{0}, tall_launches{0};

// On: the rule of MoeGemmWsPingPongFor applies; forced (kOn): always.
detail::KernelSwitch g_ping_pong([] { return detail::EnvOnOff("KPLAN_MOE_WS_PINGPONG", true); });
// On: the rule of MoeGemmWsTallTilesFor applies; forced (kOn): always.
detail::KernelSwitch g_tall([] {
  return detail::EnvOnOff("KPLAN_MOE_WS_TALL", kMoeWsTallTilesDefault);
});

// Clusters of two for g: as SetMoeGemmWsClusterMode says, else
// KPLAN_MOE_WS_CLUSTER when set (a number of 2 or more: on, anything else:
// off), else the rule (ws::WsClusterPays).
bool UseClusters(const MoeGroupedGemmArgs& g) {
  switch (static_cast<MoeGemmWsMode>(cluster_mode.load(std::memory_order_relaxed))) {
    case MoeGemmWsMode::kOn:
      return true;
    case MoeGemmWsMode::kOff:
      return false;
    default:
      break;
  }
  static const int env = [] {
    const char* v = std::getenv("KPLAN_MOE_WS_CLUSTER");
    return v == nullptr || *v == '\0' ? -1 : std::atoi(v) >= 2 ? 1 : 0;
  }();
  if (env >= 0) return env == 1;
  return kMoeWsClusterDefault && ws::WsClusterPays(g.K);
}

// Whether g takes the ping-pong form (LaunchWs below).
bool TakesPingPong(const MoeGroupedGemmArgs& g) {
  return g.dtype == DType::kBFloat16 && g_ping_pong.On() && (g.ping_pong || g_ping_pong.Forced());
}

// Whether g runs on the cooperative tiles of 128 (one CTA a tile or
// clusters of two), 16-bit weights: the forms with a fused epilogue for
// every stacked gated activation (kAnyAct), where the others fuse SiLU only.
bool WsCooperativeTiles(const MoeGroupedGemmArgs& g) {
  return g.block_m != ws::kWsTallTileT && g.int_w == nullptr && !TakesPingPong(g);
}

// The cooperative tiles of 128, 16-bit weights: in clusters of two where
// UseClusters says so (UNAVAILABLE there: one CTA a tile), else one CTA a
// tile.
template <bool Fused, bool kAnyAct>
absl::Status LaunchWsCooperative(const MoeGroupedGemmArgs& g, const MoeActParams& act_params,
                                 cudaStream_t stream, MoeActivation act) {
  const bool bf16 = g.dtype == DType::kBFloat16;
  if (UseClusters(g)) {
    absl::Status st =
        bf16 ? LaunchWsKernel<__nv_bfloat16, Fused, false, 2, false, kWsTileT, kAnyAct>(
                   g, act_params, stream, act)
             : LaunchWsKernel<__half, Fused, false, 2, false, kWsTileT, kAnyAct>(g, act_params,
                                                                                 stream, act);
    if (st.ok()) {
      cluster_launches.fetch_add(1, std::memory_order_relaxed);
      ws_launches.fetch_add(1, std::memory_order_relaxed);
    }
    // UNAVAILABLE (no cluster fits, or no tensor map): one CTA a tile, which
    // answers UNAVAILABLE itself when the tensor map is what failed.
    if (!absl::IsUnavailable(st)) return st;
  }
  absl::Status st = bf16 ? LaunchWsKernel<__nv_bfloat16, Fused, false, 1, false, kWsTileT, kAnyAct>(
                               g, act_params, stream, act)
                         : LaunchWsKernel<__half, Fused, false, 1, false, kWsTileT, kAnyAct>(
                               g, act_params, stream, act);
  if (st.ok()) ws_launches.fetch_add(1, std::memory_order_relaxed);
  return st;
}

// The instantiation for g's dtype and weights (bf16 / fp16; int4 with
// int_w): the tall tiles for blocks of 192 (bf16, WsTilesApply; one CTA a
// tile whatever the clusters' switch says); else the
// ping-pong form where the caller chose it (g.ping_pong) or its switch
// forces it, unless the switch is off; else the cooperative tiles. Fused
// with an activation other than SiLU: the kAnyAct instantiations of the
// cooperative tiles (MoeGemmWsActApplies checks the form).
template <bool Fused>
absl::Status LaunchWs(const MoeGroupedGemmArgs& g, const MoeActParams& act_params,
                      cudaStream_t stream, MoeActivation act = MoeActivation::kSilu) {
  const bool bf16 = g.dtype == DType::kBFloat16;
  if constexpr (Fused) {
    if (act != MoeActivation::kSilu) {
      if (!WsCooperativeTiles(g)) {  // a switch flipped since MoeGemmWsActApplies: unfused
        return absl::UnavailableError("moe_grouped_gemm_ws_act: not the cooperative tiles");
      }
      return LaunchWsCooperative<true, true>(g, act_params, stream, act);
    }
  }
  if (g.block_m == ws::kWsTallTileT) {  // bf16 (WsTilesApply)
    absl::Status st = LaunchWsKernel<__nv_bfloat16, Fused, false, 1, false, ws::kWsTallTileT>(
        g, act_params, stream);
    if (st.ok()) {
      tall_launches.fetch_add(1, std::memory_order_relaxed);
      ws_launches.fetch_add(1, std::memory_order_relaxed);
    }
    return st;
  }
  if (g.int_w != nullptr) {
    absl::Status st = bf16 ? LaunchWsKernel<__nv_bfloat16, Fused, true, 1>(g, act_params, stream)
                           : LaunchWsKernel<__half, Fused, true, 1>(g, act_params, stream);
    if (st.ok()) detail::NoteMoeGemmIntLaunch();
    return st;
  }
  // The ping-pong form before clusters (it has none).
  if (TakesPingPong(g)) {
    absl::Status st = LaunchWsKernel<__nv_bfloat16, Fused, false, 1, true>(g, act_params, stream);
    if (st.ok()) {
      ping_pong_launches.fetch_add(1, std::memory_order_relaxed);
      ws_launches.fetch_add(1, std::memory_order_relaxed);
    }
    return st;
  }
  return LaunchWsCooperative<Fused, false>(g, act_params, stream, act);
}

}  // namespace

void SetMoeGemmWsMode(MoeGemmWsMode mode) { g_ws.Set(mode); }

void SetMoeGemmWsClusterMode(MoeGemmWsMode mode) {
  cluster_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
}

int64_t MoeGemmWsLaunches() { return ws_launches.load(std::memory_order_relaxed); }

int64_t MoeGemmWsClusterLaunches() { return cluster_launches.load(std::memory_order_relaxed); }

void SetMoeGemmWsPingPongMode(MoeGemmWsMode mode) { g_ping_pong.Set(mode); }

bool MoeGemmWsPingPongFor(DType dtype, int64_t numel, int num_experts) {
  if (dtype != DType::kBFloat16 || !g_ping_pong.On()) return false;
  return g_ping_pong.Forced() || MoeSlotsPerExpert(numel, num_experts) < kMoeWsPingPongMaxSlots;
}

int64_t MoeGemmWsPingPongLaunches() { return ping_pong_launches.load(std::memory_order_relaxed); }

void SetMoeGemmWsTallTilesMode(MoeGemmWsMode mode) { g_tall.Set(mode); }

bool MoeGemmWsTallTilesFor(DType dtype, int64_t numel, int num_experts, int64_t min_k) {
  if (dtype != DType::kBFloat16 || !g_tall.On() || !g_ws.On()) return false;
  if (g_tall.Forced()) return true;
  const int64_t per = MoeSlotsPerExpert(numel, num_experts);
  return per >= kMoeWsTallTilesMinSlots && per < kMoeWsTallTilesMaxSlots &&
         min_k >= kMoeWsTallTilesMinK;
}

int64_t MoeGemmWsTallTilesLaunches() { return tall_launches.load(std::memory_order_relaxed); }

bool MoeGemmWsEnabled() { return g_ws.On(); }

bool MoeGemmWsApplies(const MoeGroupedGemmArgs& g) {
  if (g.fp8 || g.splits != 1) return false;
  if (g.int_w != nullptr) {
    if (!MoeIntWeightsApply(*g.int_w, g.K)) return false;
  } else if ((reinterpret_cast<uintptr_t>(g.w) & 15) != 0 || (g.K * 2) % 16 != 0) {
    return false;  // TMA: 16-byte aligned base and row stride
  }
  return ws::WsTilesApply(g);
}

absl::Status LaunchMoeGroupedGemmWs(const MoeGroupedGemmArgs& g, cudaStream_t stream) {
  return LaunchWs<false>(g, {}, stream);
}

// --- fused activation -----------------------------------------------------------

namespace {
detail::KernelSwitch g_fused([] {
  return detail::EnvOnOff("KPLAN_MOE_FUSED_ACT", kMoeFusedActDefault);
});
}  // namespace

void SetMoeFusedActMode(MoeGemmWsMode mode) { g_fused.Set(mode); }

bool MoeFusedActEnabled() { return g_fused.On(); }

bool MoeGemmWsActApplies(const MoeGroupedGemmArgs& g, MoeActivation act, const MoeActParams&) {
  switch (act) {
    case MoeActivation::kSilu:  // every form
      break;
    case MoeActivation::kGelu:
    case MoeActivation::kGeluTanh:
    case MoeActivation::kRelu2:  // stacked gate / up rows: the cooperative tiles
      if (!WsCooperativeTiles(g)) return false;
      break;
    default:  // GEMM 1 + LaunchMoeActivation (moe_gemm_ws.h says which and why)
      return false;
  }
  // Output rows of I = N / 2 elements stored 16 bytes at a time.
  if (g.N <= 0 || g.N % 16 != 0 || g.K <= 0 || g.K % 8 != 0) return false;
  if (g.a_row_div <= 0 || g.num_local_experts <= 0 || g.reduce_in_consumer) return false;
  if (g.numel < 0 || g.numel > INT32_MAX || g.num_blocks < 0) return false;
  return MoeGemmWsApplies(g);
}

namespace {
std::atomic<int64_t> fused_act_launches{0};
}  // namespace

absl::Status LaunchMoeGroupedGemmWsAct(const MoeGroupedGemmArgs& g, MoeActivation act,
                                       const MoeActParams& params, void* act_out,
                                       cudaStream_t stream) {
  if (!MoeGemmWsActApplies(g, act, params)) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_act: arguments not supported");
  }
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (g.a == nullptr || (g.w == nullptr && g.int_w == nullptr) || act_out == nullptr ||
      g.sorted_token_ids == nullptr || g.expert_ids == nullptr ||
      g.num_tokens_post_padded == nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_act: null pointer");
  }
  if ((reinterpret_cast<uintptr_t>(g.a) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(act_out) & 15) != 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_act: buffers must be 16-byte aligned");
  }
  const MoeActParams p = EffectiveActParams(params);
  MoeGroupedGemmArgs f = g;
  f.c = act_out;
  const absl::Status launched = LaunchWs<true>(f, p, stream, act);
  if (launched.ok()) fused_act_launches.fetch_add(1, std::memory_order_relaxed);
  return launched;
}

int64_t MoeFusedActLaunches() { return fused_act_launches.load(std::memory_order_relaxed); }

// --- TMA tensor maps (moe_tma.h) ------------------------------------------------

namespace detail {
namespace {
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

absl::Status GetEncodeTiled(EncodeTiledFn* out) {
  static std::once_flag once;
  static EncodeTiledFn fn = nullptr;
  static cudaError_t err = cudaSuccess;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                           &q);
    if (err == cudaSuccess && q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiledFn>(f);
  });
  if (fn == nullptr) {
    cudaGetLastError();
    return absl::UnavailableError(std::string("moe_grouped_gemm_ws: no cuTensorMapEncodeTiled: ") +
                                  cudaGetErrorString(err));
  }
  *out = fn;
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeTma2d(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                         uint64_t inner, uint64_t rows, uint64_t row_bytes, uint32_t box_inner,
                         uint32_t box_rows, const char* what, CUtensorMapSwizzle swizzle) {
  EncodeTiledFn encode = nullptr;
  if (absl::Status st = GetEncodeTiled(&encode); !st.ok()) return st;
  std::memset(map, 0, sizeof(*map));
  const cuuint64_t dims[2] = {inner, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, estr,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::UnavailableError(std::string(what) + ": cuTensorMapEncodeTiled failed (" +
                                  std::to_string(static_cast<int>(r)) + ")");
  }
  return absl::OkStatus();
}

}  // namespace detail

}  // namespace kplan::kernels::cuda
