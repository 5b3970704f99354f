// The skeleton both warp-specialised grouped GEMMs share (moe_gemm_ws_sm90.cu:
// bf16 / fp16, moe_gemm_ws_fp8_sm90.cu: fp8 e4m3): a CTA of kWsThreads
// threads (warpgroup 0 the producer, 1 and 2 the consumers; the tall tiles:
// WsThreadsFor(192), a third consumer), the kWsStages-stage shared-memory
// ring with its full / empty mbarriers, the walk over this CTA's work items
// of the persistent grid (moe_ws_schedule.h) and the producer's loop: per
// k-tile a TMA box of weight rows and the tile's 128 (192) token rows
// gathered with cp.async.
//
// With kCluster = 2 (the bf16 / fp16 kernel) two CTAs of a thread-block
// cluster take the two token tiles of a unit (moe_ws_schedule.h) on the
// same weight-row tile; when both tiles are of the same local expert each
// CTA's producer loads half of the weight box and multicasts it to both.
// Each CTA's consumers release a stage to both producers (a stage's empty
// barrier counts the cluster's consumer warps), both CTAs step through the
// same stages for every work item either of them has work in, and a
// producer waits for its stages' last releases before its CTA exits.
//
// What differs between the kernels (the weight boxes, fp8's block scales,
// the consumers' MMAs and epilogues) stays with each, passed in as lambdas.
// Everything here is force-inlined and keeps the kernels' order of
// evaluation; their SASS stayed the same when these lines moved here (CUDA
// 13, sm_90a: byte-identical but for the register numbers of the unfused
// bf16 / fp16 consumers' stage and phase). Small rearrangements (the tile
// loop inlined into WsProduce, the consumers' loops as lambdas) do change
// the code: after an edit compare the kernels' .text sections (nvcc -cubin
// -arch=sm_90a, readelf -x) with the old ones, or time them against the old
// build in one run (session 19 moved the bf16 / fp16 consumers' loop into
// WsForEachWork without a disassembler at hand: Mixtral-8x7B 4096 tokens
// one CTA a tile 5985.2 against 5991.8 us for 42d1fc8, docs/perf/session19/
// call2/summary.txt). Internal to kernels/cuda/moe.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: no -lcuda)

#include <cstdint>

#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/moe/moe_ws_schedule.h"
#include "kernels/cuda/moe/pdl.cuh"

namespace kplan::kernels::cuda::ws {

inline constexpr int kWsStages = 4;  // stages of the ring
// A CTA's arrivals that empty a stage (tiles of 128; WsConsumerWarpsFor).
inline constexpr int kWsConsumerWarps = WsConsumerWarpsFor(kWsTileT);
// setmaxnreg: the producer gives registers back, the consumers take them.
// A CTA of kWsThreads threads is launched with 168 registers a thread (the
// most a multiple of 8 that 65536 / 384 allows), and setmaxnreg.inc waits
// until the CTA has the registers free: past that pool the consumers wait
// forever (48 / 232 hung on the H200, docs/PERF.md session 8). At 40 the
// producer spills a few registers per k-tile, which cost nothing measurable;
// at 56 / 224 the fp8 consumers spill and ran 4% slower, at 24 / 240 the
// producer and everything 6-32% slower (session 20). A producer that
// dequantises weights (the int4 kernel) keeps more (WsRegsFit: what a split
// must satisfy).
inline constexpr int kWsProducerRegs = 40;
inline constexpr int kWsConsumerRegs = 232;
// The registers a thread of a CTA over tiles of tile_t slots is launched
// with (168 for 384 threads, 128 for the tall tiles' 512), and whether a
// split fits them.
constexpr int WsLaunchRegs(int tile_t = kWsTileT) { return 65536 / WsThreadsFor(tile_t) / 8 * 8; }
constexpr bool WsRegsFit(int producer, int consumer, int tile_t = kWsTileT) {
  return producer + (tile_t / 64) * consumer <=
             (WsThreadsFor(tile_t) / 128) * WsLaunchRegs(tile_t) &&
         producer % 8 == 0 && consumer % 8 == 0;  // setmaxnreg takes multiples of 8
}
static_assert(WsRegsFit(kWsProducerRegs, kWsConsumerRegs),
              "the warpgroups' registers must fit the CTA's launch allocation");
// Every stage holds 128 bytes of K of every row: one 128-byte swizzle row.
inline constexpr int kWsTBytes = kWsTileT * 128;  // 16 KiB of token rows, at the stage's start
inline constexpr int kWsWBytes = kWsTileN * 128;  // 32 KiB of weight rows, after them
// Dynamic shared memory of a ring of stages of `stage_bytes` (+ room to align to 1024).
constexpr int WsSmemBytes(int stage_bytes) { return kWsStages * stage_bytes + 1024; }

// The ring: stage s at base + s * kStageBytes (base 1024-aligned, as the
// 128-byte swizzle wants), its full barrier at full0 + 8 s (the producer's
// 128 cp.async arrivals + thread 0's expect_tx of the weight bytes, + 128
// arrivals where the producer stores weights itself), its empty barrier at
// empty0 + 8 s (one arrival per consumer warp of the cluster).
template <int kStageBytes>
struct WsRing {
  uint32_t base, full0, empty0;
  __device__ __forceinline__ uint32_t Stage(int s) const { return base + s * kStageBytes; }
  __device__ __forceinline__ uint32_t Full(int s) const { return full0 + 8 * s; }
  __device__ __forceinline__ uint32_t Empty(int s) const { return empty0 + 8 * s; }
};

// Called by every thread of the CTA first: the ring over the dynamic shared
// memory, its barriers (static shared memory) initialised by thread 0, which
// also prefetches the weights' tensor map, a CTA (cluster) barrier, then
// the programmatic-dependent-launch wait (pdl.cuh): nothing a previous kernel
// wrote is read before it. kStoreArrivals: the producer threads that store
// into a stage themselves and arrive on its full barrier; kConsumerWarps:
// the warps of a CTA that release each stage (every consumer warpgroup's:
// WsConsumerWarpsFor, or one's in the ping-pong form).
template <int kStageBytes, int kStoreArrivals = 0, int kCluster = 1,
          int kConsumerWarps = kWsConsumerWarps>
__device__ __forceinline__ WsRing<kStageBytes> WsRingInit(const CUtensorMap* wmap) {
  extern __shared__ uint8_t smem_dyn[];
  __shared__ uint64_t full_bar[kWsStages];
  __shared__ uint64_t empty_bar[kWsStages];
  WsRing<kStageBytes> r;
  r.base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn)) + 1023u) & ~1023u;
  r.full0 = static_cast<uint32_t>(__cvta_generic_to_shared(full_bar));
  r.empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(empty_bar));
  if (threadIdx.x == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      // 128 cp.async arrivals + the TMA thread's expect_tx (+ the storing threads').
      detail::MbarInit(r.Full(s), 128 + 1 + kStoreArrivals);
      detail::MbarInit(r.Empty(s), kConsumerWarps * kCluster);
    }
    detail::FenceProxyAsync();  // the barriers' init visible to the TMA unit
    if constexpr (kCluster > 1) detail::FenceMbarInitCluster();  // and to the other CTAs
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(wmap)) : "memory");
  }
  if constexpr (kCluster > 1) {
    detail::ClusterSync();  // no remote arrival or multicast before the barriers exist
  } else {
    __syncthreads();
  }
  detail::PdlWaitThenRelease();
  return r;
}

// A thread's position in the ring: the stage it uses next and the parity
// of that stage's barriers in this use. Producer and consumers step alike.
struct WsCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Next() {
    if (++stage == kWsStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The tile of cluster rank `rank` in work item `lin` of `sched` (tiles of
// kTileT slots), decoded against p's routing (p.sorted, p.expert_ids,
// p.block_m, p.numel, p.num_local_experts).
template <int kTileT = kWsTileT, typename P>
__device__ __forceinline__ WsTileInfo WsTileOf(const P& p, const WsSchedule& sched, int64_t lin,
                                               int rank = 0) {
  return WsDecode<kTileT>(sched, lin, rank, p.sorted, p.expert_ids, p.block_m, p.numel,
                          p.num_local_experts);
}

// A work item as one CTA of its cluster sees it: its tile, whether the
// CTA's ring steps through the item's k-tiles (its tile or, with clusters,
// the other CTA's has work: a local expert and a slot) and whether the two
// tiles share the weight rows (same local expert: the box is multicast).
struct WsWork {
  WsTileInfo ti;
  int rank = 0;         // this CTA's rank in its cluster
  bool active = false;  // this CTA's tile has work
  bool run = false;
  bool multicast = false;
};
__device__ __forceinline__ bool WsHasWork(const WsTileInfo& t) { return t.local && !t.empty; }

// fn(work) for the work items of this CTA's cluster: items blockIdx.x /
// kCluster, + gridDim.x / kCluster, ... below `total` (WsTotalWork(sched));
// tiles of kTileT slots.
template <int kCluster = 1, int kTileT = kWsTileT, typename P, typename F>
__device__ __forceinline__ void WsForEachWork(const P& p, const WsSchedule& sched, int64_t total,
                                              F&& fn) {
  static_assert(kCluster == 1 || kCluster == 2, "clusters of one or two CTAs");
  const int rank = kCluster > 1 ? static_cast<int>(detail::ClusterCtaRank()) : 0;
  for (int64_t lin = blockIdx.x / kCluster; lin < total; lin += gridDim.x / kCluster) {
    WsWork w;
    w.rank = rank;
    w.ti = WsTileOf<kTileT>(p, sched, lin, rank);
    w.active = WsHasWork(w.ti);
    w.run = w.active;
    if constexpr (kCluster > 1) {
      const WsTileInfo other = WsTileOf<kTileT>(p, sched, lin, rank ^ 1);
      w.run = w.active || WsHasWork(other);
      w.multicast = w.active && WsHasWork(other) && other.e == w.ti.e;
    }
    fn(w);
  }
}

// A consumer warp's release of ring stage `stage` (lane 0 arrives for the
// warp): on its own CTA's empty barrier, with clusters on the other CTA's
// too (rank: this CTA's).
template <int kCluster, int kStageBytes>
__device__ __forceinline__ void WsRelease(const WsRing<kStageBytes>& ring, int stage, int lane,
                                          int rank) {
  if (lane != 0) return;
  detail::MbarArrive(ring.Empty(stage));
  if constexpr (kCluster > 1) detail::MbarArriveRemote(ring.Empty(stage), rank ^ 1);
}

// --- the ping-pong form (one CTA a tile, 16-bit weights) ---------------------
//
// A work item's tile splits into its two halves of 64 slots; a half with a
// slot (the first half of a tile with work, the second where its first
// entry is a slot) is a half-item. The CTA's half-items, counted j = 0, 1,
// ... in the walk's order, go to consumer warpgroup j % 2 alone, which
// runs the weight box's k-tiles against its 64 token rows (at the stage's
// start) and releases each stage (4 warps: WsRingInit's kConsumerWarps);
// the other warpgroup steps its cursor past those stages without waiting.
// So one warpgroup's epilogue runs while the other's MMAs consume the next
// half-item's stages, and the weight stream does not stop at the tile
// boundary. A tile with more than 64 slots streams its weight box twice
// (the second time mostly from L2).
//
// A warpgroup starts the main loop of half-item j only after the other has
// finished that of j - 1 (WsOrderWait / WsOrderSignal, named barriers 2 and
// 3): every earlier use of the stages it waits on has then completed, so
// its parity waits on the full barriers cannot pass a phase early (a
// cursor stepped ahead of the ring's fill would see an incomplete phase of
// the other parity as done).

// Whether half h of work item w is a half-item (above).
template <typename P>
__device__ __forceinline__ bool WsHalfHasWork(const P& p, const WsWork& w, int h) {
  if (!w.active) return false;
  if (h == 0) return true;
  const int32_t s = p.sorted[w.ti.tt * kWsTileT + kWsTileT / 2];
  return s >= 0 && s < p.numel;
}

// Warpgroup cw (0 or 1) waits until the other one signals it; the other
// signals with WsOrderSignal(cw). 256 threads: both warpgroups. Constant
// barrier ids (an id in a register reserves all 16 barriers).
__device__ __forceinline__ void WsOrderWait(int cw) {
  if (cw == 0) {
    asm volatile("bar.sync 2, 256;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
  }
}
__device__ __forceinline__ void WsOrderSignal(int cw) {
  if (cw == 0) {
    asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  } else {
    asm volatile("bar.arrive 3, 256;\n" ::: "memory");
  }
}

// The producer warpgroup (threads 0..127; setmaxnreg down to kRegs). For each
// of this CTA's work items (WsForEachWork) that run: the rows of its tile's
// kTileT slots in p.a (slot / p.a_row_div, rows of K elements of E; padding
// zero-filled), st = on_tile(tile), then for each k-tile kt of nk (128
// bytes of K, 128 / sizeof(E) elements): wait until the stage is empty;
// thread 0 arms the stage's full barrier with kWBytes of weight-box
// transactions (0, or a tile without work: a plain arrival) and, for a
// tile with work, issues the weight box(es), load_w(st, kt, w_s, full
// barrier, multicast) with w_s the stage's weight rows; for a tile with
// work every thread copies its 16-byte chunk of 8 token rows into the
// 128-byte swizzled layout (zero past K); extra(st, kt, stage address, full
// barrier) adds the kernel's own copies (st may carry state from one k-tile
// to the next; with clusters on_tile and extra also run for a tile without
// work, whose expert may be -1: the kernels that take clusters have none);
// the thread's arrival on the full barrier follows its cp.asyncs. Returns
// once all of them have landed and, with clusters, every stage's last use
// was released by both CTAs' consumers (their arrivals reach this CTA's
// shared memory, which must outlive them). kRowAddresses picks how a thread
// keeps its 8 rows between k-tiles (below). kPingPong: per half-item
// instead of per tile, its 64 token rows (4 a thread) into the stage's
// first 64 (one CTA a tile, row indices). kTileT: the tile's slots
// (the schedule's, WsClip<kTileT>), kTileT token rows at the stage's start,
// the weight rows after them (w_s).
template <typename E, int kStageBytes, int kWBytes = kWsWBytes, int kRegs = kWsProducerRegs,
          int kCluster = 1, bool kRowAddresses = false, bool kPingPong = false,
          int kTileT = kWsTileT, typename P, typename OnTile, typename LoadW, typename Extra>
__device__ __forceinline__ void WsProduce(const P& p, const WsRing<kStageBytes>& ring,
                                          const WsSchedule& sched, int64_t total, int64_t K, int nk,
                                          OnTile&& on_tile, LoadW&& load_w, Extra&& extra) {
  static_assert(!kPingPong || (kCluster == 1 && !kRowAddresses), "ping-pong: one CTA, indices");
  static_assert(!kPingPong || kTileT == kWsTileT, "ping-pong: tiles of 128");
  static_assert(kTileT % 16 == 0 && kTileT * 128 + kWBytes <= kStageBytes, "the stage's rows");
  constexpr int kBK = 128 / static_cast<int>(sizeof(E));  // K elements per stage
  constexpr int kRows = kPingPong ? kTileT / 2 : kTileT;  // token rows a stage holds
  detail::SetMaxNRegDec<kRegs>();
  const E* A = static_cast<const E*>(p.a);
  const int ptid = threadIdx.x;
  const int chunk = ptid & 7;
  // Row r = ptid / 8 + 16 i of the tile; its swizzled chunk is the same for all i.
  const uint32_t dst0 = (ptid >> 3) * 128 + ((chunk ^ ((ptid >> 3) & 7)) << 4);
  WsCursor c;
  WsForEachWork<kCluster, kTileT>(p, sched, total, [&](const WsWork& w) {
    if (!w.run) return;
    const WsTileInfo& ti = w.ti;
    for (int h = 0; h < (kPingPong ? 2 : 1); ++h) {
      if (kPingPong && !WsHalfHasWork(p, w, h)) continue;
      // This thread's 8 rows (4 in a half-item). kRowAddresses: the address of its chunk in
      // each at k-tile 0 (A for padding) and bit i of row_mask set for a slot,
      // so that a k-tile only adds its offset. Else each row's index in A, -1
      // for padding. Measured in the same H200 calls (docs/PERF.md, session
      // 20), the address form ran Qwen3-30B-A3B int4 at 4096 tokens in 1492
      // us against 1565 (the int4 kernels take it), Mixtral-8x7B bf16 0.1-2.7%
      // slower and the fp8 GEMMs the same (these keep the indices).
      const E* src[kRows / 16];
      int32_t arow[kRows / 16];
      uint32_t row_mask = 0;
#pragma unroll
      for (int i = 0; i < kRows / 16; ++i) {
        const int32_t slot =
            w.active ? p.sorted[ti.tt * kTileT + kRows * h + (ptid >> 3) + 16 * i] : -1;
        if constexpr (kRowAddresses) {
          const bool ok = slot >= 0 && slot < p.numel;
          src[i] = A + (ok ? static_cast<int64_t>(slot / p.a_row_div) * K + chunk * (kBK / 8) : 0);
          row_mask |= static_cast<uint32_t>(ok) << i;
        } else {
          arow[i] = slot >= 0 && slot < p.numel ? slot / p.a_row_div : -1;
        }
      }
      auto st = on_tile(ti);
      for (int kt = 0; kt < nk; ++kt) {
        detail::MbarWait(ring.Empty(c.stage), c.phase ^ 1);
        const uint32_t t_s = ring.Stage(c.stage), w_s = t_s + kTileT * 128;
        const uint32_t fb = ring.Full(c.stage);
        if (ptid == 0) {
          if (kWBytes > 0 && w.active) {
            detail::MbarArriveExpectTx(fb, kWBytes);
          } else {
            detail::MbarArrive(fb);
          }
          if (w.active) load_w(st, kt, w_s, fb, w.multicast);
        }
        // Without work nobody reads the stage: no copy.
        if constexpr (kRowAddresses) {
          // A chunk past K copies nothing (zero-filled) from its row's start.
          const bool kok = static_cast<int64_t>(kt) * kBK + chunk * (kBK / 8) < K;
          const int64_t k = kok ? static_cast<int64_t>(kt) * kBK : 0;
          const uint32_t live_mask = kok ? row_mask : 0;
          if (w.active) {
#pragma unroll
            for (int i = 0; i < kRows / 16; ++i) {
              detail::CpAsync16(t_s + dst0 + i * 16 * 128, src[i] + k, (live_mask >> i) & 1);
            }
          }
        } else {
          const int64_t k = static_cast<int64_t>(kt) * kBK + chunk * (kBK / 8);
          const bool kok = k < K;
          if (w.active) {
#pragma unroll
            for (int i = 0; i < kRows / 16; ++i) {
              const bool ok = kok && arow[i] >= 0;
              detail::CpAsync16(t_s + dst0 + i * 16 * 128,
                                ok ? A + static_cast<int64_t>(arow[i]) * K + k : A, ok);
            }
          }
        }
        extra(st, kt, t_s, fb);
        detail::CpAsyncArriveNoinc(fb);
        c.Next();
      }
    }
  });
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  if constexpr (kCluster > 1) {
    for (int s = 0; s < kWsStages; ++s) {
      detail::MbarWait(ring.Empty(c.stage), c.phase ^ 1);
      c.Next();
    }
  }
}

// A consumer thread (warpgroups 1, 2, and 3 in tall tiles; setmaxnreg up to
// kRegs): its warpgroup cw covers slots [64 cw, 64 cw + 64) of a tile (in the ping-pong
// form the 64 slots of its half-item instead), its accumulator fragment rows
// r0 and r0 + 8 (r0 - 64 cw within a half-item).
struct WsConsumer {
  int cw, lane, r0;
};
template <int kRegs = kWsConsumerRegs>
__device__ __forceinline__ WsConsumer WsConsumerEnter() {
  detail::SetMaxNRegInc<kRegs>();
  const int tid = threadIdx.x;
  WsConsumer c;
  c.cw = tid / 128 - 1;
  const int warp = (tid >> 5) & 3;
  c.lane = tid & 31;
  c.r0 = c.cw * 64 + warp * 16 + (c.lane >> 2);
  return c;
}

}  // namespace kplan::kernels::cuda::ws
