// The tile schedule of the warp-specialised grouped GEMM (moe_gemm_ws_sm90.cu),
// plain C++ so that the host part is unit-tested on the CPU
// (tests/kernels/moe_ws_schedule_test.cc) and the device walks the same order.
//
// Work: (token tile, weight-row tile) pairs. A token tile is kTileT
// consecutive entries of sorted_token_ids (kWsTileT = 128: a
// moe_align_block_size block of 128 slots, or one half of a 256-slot block;
// kWsTallTileT = 192: a block of 192, the tall tiles' form), so every tile
// belongs to one expert; a weight-row tile is kWsTileN rows of that expert's
// weight matrix.
// The host knows only an upper bound of the token tiles (num_blocks; the
// routing runs on the device), the device clips it to
// ceil(num_tokens_post_padded / kTileT) before walking. The tile's slots
// kTileT are the kernel's (a template argument, so that the tiles of 128 keep
// their shifts); the host's schedule takes them from the block
// (WsTileSlots).
//
// Order: groups of `group` (WsAutoGroup) consecutive units (mostly one
// expert: the blocks of an expert are contiguous); within a group the
// weight-row tile is the slow index and the unit the fast one. A unit is
// `cluster` consecutive token tiles, one per CTA of a thread-block cluster,
// that share a weight-row tile (the kernel multicasts it to the cluster's
// CTAs when their tiles are of one expert); without clusters a unit is one
// token tile. So CTAs running together share a weight-row tile (read from
// HBM once per group, from L2 by the other token tiles of the group) and a
// group's token rows stay in L2 while the expert's weight rows stream. A
// persistent grid of clusters takes linear work items c, c + clusters, ...
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KPLAN_WS_HD __host__ __device__ __forceinline__
#else
#define KPLAN_WS_HD inline
#endif

namespace kplan::kernels::cuda::ws {

inline constexpr int kWsThreads = 384;  // a CTA: three warpgroups, a producer and two consumers
inline constexpr int kWsTileT = 128;    // token slots per tile (two consumer warpgroups x 64)
// The tall tiles (blocks of 192: three consumer warpgroups x 64, a CTA of
// four warpgroups), which hold a whole expert where it gets about 128 slots.
inline constexpr int kWsTallTileT = 192;
// Token slots per tile for moe_align blocks of block_m (128, 192 or 256).
constexpr int WsTileSlots(int block_m) { return block_m == kWsTallTileT ? kWsTallTileT : kWsTileT; }
// The consumer warps, and the threads, of a CTA whose consumer warpgroups
// cover tile_t slots, 64 each (and a producer warpgroup).
constexpr int WsConsumerWarpsFor(int tile_t) { return 4 * (tile_t / 64); }
constexpr int WsThreadsFor(int tile_t) { return 128 + 32 * WsConsumerWarpsFor(tile_t); }
static_assert(WsThreadsFor(kWsTileT) == kWsThreads);
inline constexpr int kWsTileN = 256;  // weight rows per tile (wgmma N)
inline constexpr int kWsGroup = 4;    // units per group when the weight rows are many
inline constexpr int kWsAutoGroup = 0;

struct WsSchedule {
  int64_t token_tiles = 0;  // upper bound (host) / actual (device, after clipping)
  int64_t n_tiles = 0;      // ceil(N / kWsTileN)
  int64_t group = 1;        // units per group, >= 1
  int grid = 0;             // CTAs of the persistent grid, a multiple of cluster
  int cluster = 1;          // CTAs per cluster = token tiles per unit (1 or 2)
};

struct WsTile {
  int64_t token_tile = 0;
  int64_t n_tile = 0;
};

KPLAN_WS_HD int64_t WsUnits(const WsSchedule& s) {
  return (s.token_tiles + s.cluster - 1) / s.cluster;
}
// Work items of the walk: (unit, weight-row tile) pairs, one per cluster.
KPLAN_WS_HD int64_t WsTotalWork(const WsSchedule& s) { return WsUnits(s) * s.n_tiles; }

// The tile of CTA `rank` of its cluster in work item `linear` in [0,
// WsTotalWork(s)) of the order above (a bijection onto the tiles, with
// rank in [0, s.cluster)). Its token tile may be past s.token_tiles (the
// last unit of an odd count): no tile.
KPLAN_WS_HD WsTile WsTileAt(const WsSchedule& s, int64_t linear, int rank = 0) {
  const int64_t units = WsUnits(s);
  const int64_t per_group = s.group * s.n_tiles;
  const int64_t g = linear / per_group, r = linear - g * per_group;
  const int64_t first = g * s.group;
  const int64_t left = units - first;
  const int64_t size = left < s.group ? left : s.group;  // the last group may be short
  WsTile t;
  t.token_tile = (first + r % size) * s.cluster + rank;
  t.n_tile = r / size;
  return t;
}

// The tile of rank `rank` in work item `linear`, with what the kernels need
// of it: its first slot index tt * kTileT, its first weight row n0, its
// expert e (local: in [0, E_local)) and whether it holds no slot at all (within an expert's range
// the slots come first, then the padding, so the first entry decides; a token tile past
// s.token_tiles holds none and reads nothing).
struct WsTileInfo {
  int64_t tt = 0, n0 = 0;
  int e = -1;
  bool local = false, empty = true;
};
template <int kTileT = kWsTileT>
KPLAN_WS_HD WsTileInfo WsDecode(const WsSchedule& s, int64_t linear, int rank,
                                const int32_t* sorted, const int32_t* expert_ids, int block_m,
                                int64_t numel, int num_local_experts) {
  const WsTile t = WsTileAt(s, linear, rank);
  WsTileInfo info;
  info.tt = t.token_tile;
  info.n0 = t.n_tile * kWsTileN;
  if (t.token_tile >= s.token_tiles) return info;
  info.e = expert_ids[(t.token_tile * kTileT) / block_m];
  info.local = info.e >= 0 && info.e < num_local_experts;
  const int32_t first = sorted[t.token_tile * kTileT];
  info.empty = first < 0 || first >= numel;
  return info;
}

// The same schedule with the token tiles clipped to the blocks actually used.
template <int kTileT = kWsTileT>
KPLAN_WS_HD WsSchedule WsClip(WsSchedule s, int64_t num_tokens_post_padded) {
  const int64_t used = (num_tokens_post_padded + kTileT - 1) / kTileT;
  if (used < s.token_tiles) s.token_tiles = used < 0 ? 0 : used;
  return s;
}

// Group size with kWsAutoGroup, measured on one H200 (docs/PERF.md, session
// 5): when one wave of CTAs covers all weight-row tiles of at least 8 token
// tiles even with the weight-row tile fast (Mixtral GEMM 2: 16 row tiles),
// group 1 (the weight-row tile fast) was best, 650 against 582 TFLOP/s at
// group 8; with many weight-row tiles (GEMM 1: 112) group 4 (492, group 1:
// 461, whose wave re-reads every weight-row tile per token tile).
// In units: with clusters of two, 4 units (8 token tiles) a group ran
// Mixtral-8x7B 4096 tokens in 5527 us against 5625 at 2 units and 5683 at
// 1 (session 19, call 4; the fused GEMM 1, 112 row tiles).
inline int64_t WsAutoGroup(int64_t n_tiles, int num_sms) {
  return n_tiles * 8 <= num_sms ? 1 : kWsGroup;
}

// Whether clusters of two pay for a GEMM of reduction length K (the
// default rule; moe_gemm_ws.h's switch can force them either way). Measured
// per layer, one H200 (session 19, call 4), clusters against one CTA a
// tile: Mixtral-8x7B (K 4096 / 14336) 1024 / 2048 / 4096 tokens 1795 /
// 3047 / 5625 us against 1835 / 3266 / 6046; DeepSeek-V3 (K 7168 / 2048)
// 4096 tokens 8815 against 9236; Qwen3-30B-A3B (K 2048 / 768) 2048 / 4096
// tokens 655 / 1024 against 628 / 1000. The CTAs of a cluster step through
// their stages together, so the weight stream of a row tile is read from
// HBM once for both; that pays on long main loops and costs on short ones.
inline constexpr int64_t kWsClusterMinK = 4096;
inline bool WsClusterPays(int64_t K) { return K >= kWsClusterMinK; }

// Host side: the upper-bound schedule of a launch. block_m is the
// moe_align_block_size block (128, 192 or 256: tiles of WsTileSlots(block_m)
// slots), num_blocks the size of
// expert_ids; group kWsAutoGroup picks it with WsAutoGroup; resident_ctas the
// CTAs that run at once (the SMs, or the clusters that fit times cluster).
inline WsSchedule MakeWsSchedule(int64_t num_blocks, int block_m, int64_t N, int resident_ctas,
                                 int group = kWsAutoGroup, int cluster = 1) {
  WsSchedule s;
  s.cluster = cluster < 1 ? 1 : cluster;
  s.token_tiles = num_blocks * (block_m / WsTileSlots(block_m));
  s.n_tiles = (N + kWsTileN - 1) / kWsTileN;
  s.group = group == kWsAutoGroup ? WsAutoGroup(s.n_tiles, resident_ctas) : group < 1 ? 1 : group;
  const int64_t total = WsTotalWork(s);
  const int64_t clusters = resident_ctas < s.cluster ? 1 : resident_ctas / s.cluster;
  s.grid = static_cast<int>(total < clusters ? total : clusters) * s.cluster;
  return s;
}

}  // namespace kplan::kernels::cuda::ws
