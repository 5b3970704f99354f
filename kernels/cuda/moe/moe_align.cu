// moe_align_block_size on the GPU (vllm-kernel-plan.md §6.5), bit-exact with
// kernels/cpu/moe/moe_align.cc (moe::MoeAlignBlockSize). Two forms, the
// same output: every expert's tokens in ascending flat index (stable).
//
// One block (MoeAlignKernel), 512 threads (16 warps); the ids are split into
// 16 contiguous ranges, one per warp:
//  1. sorted_token_ids is filled with the sentinel numel; per-range,
//     per-expert counts in shared memory (cnt[warp][e], shared atomics).
//  2. Per expert: the counts become per-range offsets (an exclusive sum over
//     the ranges), the total is padded to a multiple of block_size, and a
//     block-wide exclusive scan over experts gives each expert's start;
//     cnt[warp][e] becomes the range's write cursor.
//  3. Each warp places its range in order (PlaceBatch): lanes with the same
//     expert find each other with __match_any_sync, take their rank among
//     the lower lanes, write at cursor + rank, and the highest lane of each
//     group advances the cursor.
//  4. expert_ids: block b belongs to the first expert whose padded end
//     exceeds b * block_size (binary search), mapped through expert_map;
//     blocks past num_tokens_post_padded get -1.
// Shared memory: (16 + 1) * E ints (68 KiB at E = 1024). One block walks
// every id: 48 us for 32768 ids (Qwen3-30B-A3B at 4096 tokens; docs/PERF.md,
// session 24).
//
// Spread over chunks of kChunk ids (with a scratch of MoeAlignScratchInts,
// from kSpreadMinIds ids, where SetMoeAlignSpreadMode's switch is on, as it
// is by default), three kernels:
//  - MoeAlignCountKernel, a block per chunk: the sentinel fill (grid-stride)
//    and the chunk's per-expert counts into counts[chunk][e];
//  - MoeAlignScanKernel, one block of 1024 threads, a thread per expert:
//    counts[.][e] become the chunks' exclusive offsets, the padded totals
//    are scanned into starts[e], then num_tokens_post_padded and expert_ids
//    as in step 4;
//  - MoeAlignPlaceKernel, a block per chunk of 8 warps x 128 ids: the
//    per-warp counts, prefix sums and placement of steps 1-3 within the
//    chunk, the cursors starting at starts[e] + counts[chunk][e].
// Chunks in order, warps in order within a chunk, lanes in order within a
// warp: the same stable order as the one-block form.
#include <string>

#include "kernels/cuda/moe/moe_kernel_switch.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = (kMoeAlignMaxExperts + kThreads - 1) / kThreads;  // 2
constexpr int kBatch = 8;  // ids a lane loads at once

// The spread form.
constexpr int kSpreadThreads = 256;
constexpr int kSpreadWarps = kSpreadThreads / 32;
constexpr int kChunk = 1024;                       // ids per block
constexpr int kWarpIds = kChunk / kSpreadWarps;    // 128: 4 a lane
constexpr int kScanThreads = kMoeAlignMaxExperts;  // a thread per expert
static_assert(kScanThreads == 1024, "the scan kernel's warp sums: 32 warps, one a lane");
constexpr int64_t kSpreadMinIds = 4096;

struct AlignArgs {
  const int32_t* ids;
  const int32_t* expert_map;
  int32_t* sorted;
  int32_t* expert_ids;
  int32_t* post;
  int numel, bs, E, max_padded, max_blocks;
  bool ignore_invalid;
};

__device__ __forceinline__ bool Keep(const AlignArgs& a, int e) {
  if (e < 0 || e >= a.E) return false;
  return !(a.ignore_invalid && a.expert_map != nullptr && a.expert_map[e] < 0);
}

// The expert ids of flat indices base + 32 u + lane (u < kB) below end, -1
// for those past end or not kept: every load issued before any is used (one
// at a time, each warp waited a memory round trip per 32 ids; 8192 ids took
// 21.7 us, batched 15-17: docs/PERF.md, session 24).
template <int kB>
__device__ __forceinline__ void LoadIds(const AlignArgs& a, int base, int end, int lane,
                                        int (&e)[kB]) {
#pragma unroll
  for (int u = 0; u < kB; ++u) {
    const int t = base + 32 * u + lane;
    e[u] = t < end ? a.ids[t] : -1;
  }
#pragma unroll
  for (int u = 0; u < kB; ++u) {
    if (!Keep(a, e[u])) e[u] = -1;
  }
}

// Counts the kept experts e[u] (>= 0) into this range's counters my_cnt.
template <int kB>
__device__ __forceinline__ void CountBatch(const int (&e)[kB], int* my_cnt) {
#pragma unroll
  for (int u = 0; u < kB; ++u) {
    if (e[u] >= 0) atomicAdd(&my_cnt[e[u]], 1);
  }
}

// Expert e's counts in ranges 0 .. kRanges - 1 (cnt[w * E + e]) become the
// ranges' write cursors, from `run` on; returns the cursor past the last.
template <int kRanges>
__device__ __forceinline__ int RangeCursors(int* cnt, int E, int e, int run) {
  for (int w = 0; w < kRanges; ++w) {
    const int c = cnt[w * E + e];
    cnt[w * E + e] = run;
    run += c;
  }
  return run;
}

// Writes the flat indices base + 32 u + lane whose (kept) experts are e[u]
// at their experts' cursors my_cnt[e], in order, advancing the cursors.
template <int kB>
__device__ __forceinline__ void PlaceBatch(const AlignArgs& a, int base, int lane,
                                           const int (&ev)[kB], int* my_cnt) {
#pragma unroll
  for (int u = 0; u < kB; ++u) {
    const int e = ev[u], t = base + 32 * u + lane;
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0) {
      const int pos = my_cnt[e] + __popc(peers & ((1u << lane) - 1u));
      if (pos < a.max_padded) a.sorted[pos] = t;
    }
    __syncwarp();
    if (e >= 0 && lane == 31 - __clz(peers)) my_cnt[e] += __popc(peers);
    __syncwarp();
  }
}

// expert_ids[b] for b = first, first + stride, ...: the expert whose padded
// range [s_end[e - 1], s_end[e]) holds b * bs, through expert_map; -1 past
// total.
__device__ __forceinline__ void WriteExpertIds(const AlignArgs& a, const int* s_end, int total,
                                               int first, int stride) {
  for (int b = first; b < a.max_blocks; b += stride) {
    const long long pos = static_cast<long long>(b) * a.bs;
    int id = -1;
    if (pos < total) {
      int lo = 0, hi = a.E - 1;  // first e with s_end[e] > pos
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (s_end[mid] > pos) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      id = a.expert_map != nullptr ? a.expert_map[lo] : lo;
    }
    a.expert_ids[b] = id;
  }
}

// Inclusive sum of v over the lanes up to this one.
__device__ __forceinline__ int WarpInclusiveSum(int v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int o = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

__global__ void __launch_bounds__(kThreads) MoeAlignKernel(AlignArgs a) {
  extern __shared__ int smem[];
  int* cnt = smem;                   // [kWarps][E]
  int* s_end = smem + kWarps * a.E;  // [E]: padded end offset of each expert
  __shared__ int s_warp_sum[kWarps];
  __shared__ int s_total;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int E = a.E;
  detail::PdlWaitThenRelease();

  for (int i = tid; i < kWarps * E; i += kThreads) cnt[i] = 0;
  for (int i = tid; i < a.max_padded; i += kThreads) a.sorted[i] = a.numel;
  __syncthreads();

  const int len = (a.numel + kWarps - 1) / kWarps;
  const int begin = min(warp * len, a.numel), end = min(begin + len, a.numel);
  int* my_cnt = cnt + warp * E;
  for (int base = begin; base < end; base += 32 * kBatch) {
    int e[kBatch];
    LoadIds(a, base, end, lane, e);
    CountBatch(e, my_cnt);
  }
  __syncthreads();

  // Thread tid owns the contiguous experts [tid * kPerThread, +kPerThread).
  int padded[kPerThread];
  int local = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = tid * kPerThread + j;
    padded[j] = 0;
    if (e < E) {
      const int run = RangeCursors<kWarps>(cnt, E, e, 0);
      padded[j] = (run + a.bs - 1) / a.bs * a.bs;
      local += padded[j];
    }
  }
  // Block exclusive scan of `local`.
  const int incl = WarpInclusiveSum(local, lane);
  if (lane == 31) s_warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int v = WarpInclusiveSum(lane < kWarps ? s_warp_sum[lane] : 0, lane);
    if (lane < kWarps) s_warp_sum[lane] = v;  // inclusive over warps
    if (lane == kWarps - 1) s_total = v;
  }
  __syncthreads();
  int start = incl - local + (warp > 0 ? s_warp_sum[warp - 1] : 0);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = tid * kPerThread + j;
    if (e < E) {
      for (int w = 0; w < kWarps; ++w) cnt[w * E + e] += start;
      start += padded[j];
      s_end[e] = start;
    }
  }
  __syncthreads();
  const int total = s_total;
  if (tid == 0) *a.post = total;
  WriteExpertIds(a, s_end, total, tid, kThreads);

  // Stable placement, range by range.
  for (int base = begin; base < end; base += 32 * kBatch) {
    int ev[kBatch];
    LoadIds(a, base, end, lane, ev);
    PlaceBatch(a, base, lane, ev, my_cnt);
  }
}

// The spread form, kernel 1 of 3: a block per chunk.
__global__ void __launch_bounds__(kSpreadThreads) MoeAlignCountKernel(AlignArgs a, int* counts) {
  extern __shared__ int hist[];  // [E]
  const int tid = threadIdx.x, E = a.E;
  detail::PdlWaitThenRelease();
  for (int i = tid; i < E; i += kSpreadThreads) hist[i] = 0;
  for (long long i = static_cast<long long>(blockIdx.x) * kSpreadThreads + tid; i < a.max_padded;
       i += static_cast<long long>(gridDim.x) * kSpreadThreads) {
    a.sorted[i] = a.numel;
  }
  __syncthreads();
  const int base = blockIdx.x * kChunk;
  constexpr int kPer = kChunk / kSpreadThreads;
  int e[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int t = base + u * kSpreadThreads + tid;  // < numel + kChunk < 2^31
    e[u] = t < a.numel ? a.ids[t] : -1;
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (Keep(a, e[u])) atomicAdd(&hist[e[u]], 1);
  }
  __syncthreads();
  for (int i = tid; i < E; i += kSpreadThreads) counts[blockIdx.x * E + i] = hist[i];
}

// Kernel 2 of 3: one block, thread e for expert e.
__global__ void __launch_bounds__(kScanThreads)
    MoeAlignScanKernel(AlignArgs a, int* counts, int* starts, int chunks) {
  __shared__ int s_end[kMoeAlignMaxExperts];
  __shared__ int s_warp_sum[kScanThreads / 32];
  const int e = threadIdx.x, warp = e >> 5, lane = e & 31, E = a.E;
  detail::PdlWaitThenRelease();
  int run = 0;
  if (e < E) {
    // Sixteen loads in flight, then their stores (the stores may alias the
    // next loads, so each group is one memory round trip: 2 for 32768 ids).
    constexpr int kU = 16;
    int g = 0;
    for (; g + kU <= chunks; g += kU) {
      int c[kU];
#pragma unroll
      for (int j = 0; j < kU; ++j) c[j] = counts[(g + j) * E + e];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        counts[(g + j) * E + e] = run;
        run += c[j];
      }
    }
    for (; g < chunks; ++g) {
      const int c = counts[g * E + e];
      counts[g * E + e] = run;
      run += c;
    }
  }
  const int padded = (run + a.bs - 1) / a.bs * a.bs;
  const int incl = WarpInclusiveSum(padded, lane);
  if (lane == 31) s_warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) s_warp_sum[lane] = WarpInclusiveSum(s_warp_sum[lane], lane);
  __syncthreads();
  const int start = incl - padded + (warp > 0 ? s_warp_sum[warp - 1] : 0);
  if (e < E) {
    starts[e] = start;
    s_end[e] = start + padded;
  }
  const int total = s_warp_sum[kScanThreads / 32 - 1];
  __syncthreads();
  if (e == 0) *a.post = total;
  WriteExpertIds(a, s_end, total, e, kScanThreads);
}

// Kernel 3 of 3: a block per chunk, warp w placing ids [w * 128, +128) of it.
__global__ void __launch_bounds__(kSpreadThreads)
    MoeAlignPlaceKernel(AlignArgs a, const int* counts, const int* starts) {
  extern __shared__ int cnt[];  // [kSpreadWarps][E]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, E = a.E;
  detail::PdlWaitThenRelease();
  for (int i = tid; i < kSpreadWarps * E; i += kSpreadThreads) cnt[i] = 0;
  __syncthreads();
  const int chunk_begin = blockIdx.x * kChunk;
  const int chunk_end = min(chunk_begin + kChunk, a.numel);
  const int begin = min(chunk_begin + warp * kWarpIds, chunk_end);
  const int end = min(begin + kWarpIds, chunk_end);
  int* my_cnt = cnt + warp * E;
  int ev[kWarpIds / 32];
  LoadIds(a, begin, end, lane, ev);
  CountBatch(ev, my_cnt);
  __syncthreads();
  for (int e = tid; e < E; e += kSpreadThreads) {
    RangeCursors<kSpreadWarps>(cnt, E, e, starts[e] + counts[blockIdx.x * E + e]);
  }
  __syncthreads();
  PlaceBatch(a, begin, lane, ev, my_cnt);
}

detail::KernelSwitch g_spread([] {
  return detail::EnvOnOff("KPLAN_MOE_ALIGN_SPREAD", kMoeAlignSpreadDefault);
});

absl::Status Invalid(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(std::string(field) + ": " + what);
}

}  // namespace

int64_t MoeAlignMaxPadded(int64_t numel, int num_experts, int block_size, bool pad_sorted_ids) {
  const int64_t bs = block_size;
  int64_t max_padded = numel + static_cast<int64_t>(num_experts) * (bs - 1);
  if (pad_sorted_ids) max_padded = (max_padded + bs - 1) / bs * bs;
  if (numel < num_experts && numel * bs < max_padded) max_padded = numel * bs;
  return max_padded;
}

int64_t MoeAlignMaxBlocks(int64_t numel, int num_experts, int block_size, bool pad_sorted_ids) {
  const int64_t bs = block_size;
  return (MoeAlignMaxPadded(numel, num_experts, block_size, pad_sorted_ids) + bs - 1) / bs;
}

void SetMoeAlignSpreadMode(MoeKernelMode mode) { g_spread.Set(mode); }

int64_t MoeAlignScratchInts(int64_t numel, int num_experts) {
  if (numel < kSpreadMinIds || num_experts <= 0 || num_experts > kMoeAlignMaxExperts) return 0;
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
  const int64_t ints = (chunks + 1) * num_experts;
  // Indices stay in int32 on the device.
  if (numel > 0x7fffffff - kChunk || ints > 0x7fffffff) return 0;
  return ints;
}

absl::Status LaunchMoeAlignBlockSize(const int32_t* topk_ids, int64_t numel, int block_size,
                                     int num_experts, const int32_t* expert_map,
                                     bool pad_sorted_ids, bool ignore_invalid_experts,
                                     int32_t* sorted_token_ids, int32_t* expert_ids,
                                     int32_t* num_tokens_post_padded, int32_t* scratch,
                                     cudaStream_t stream) {
  if (block_size <= 0) {
    return Invalid("block_size", "block_size must be positive, got " + std::to_string(block_size));
  }
  if (num_experts <= 0 || num_experts > kMoeAlignMaxExperts) {
    return Invalid("num_experts", "num_experts must be in [1, " +
                                      std::to_string(kMoeAlignMaxExperts) +
                                      "] for the GPU kernel, got " + std::to_string(num_experts));
  }
  if (numel < 0 || (numel > 0 && topk_ids == nullptr)) {
    return Invalid("topk_ids", "topk_ids must hold numel >= 0 ids");
  }
  const int64_t max_padded = MoeAlignMaxPadded(numel, num_experts, block_size, pad_sorted_ids);
  const int64_t max_blocks = MoeAlignMaxBlocks(numel, num_experts, block_size, pad_sorted_ids);
  if (max_padded > 0x7fffffff) {
    return Invalid("topk_ids", "numel + num_experts * (block_size - 1) must fit in int32");
  }
  if ((max_padded > 0 && sorted_token_ids == nullptr) ||
      (max_blocks > 0 && expert_ids == nullptr) || num_tokens_post_padded == nullptr) {
    return Invalid("sorted_token_ids", "output buffers must not be null");
  }
  AlignArgs a;
  a.ids = topk_ids;
  a.expert_map = expert_map;
  a.sorted = sorted_token_ids;
  a.expert_ids = expert_ids;
  a.post = num_tokens_post_padded;
  a.numel = static_cast<int>(numel);
  a.bs = block_size;
  a.E = num_experts;
  a.max_padded = static_cast<int>(max_padded);
  a.max_blocks = static_cast<int>(max_blocks);
  a.ignore_invalid = ignore_invalid_experts;
  if (scratch != nullptr && MoeAlignScratchInts(numel, num_experts) > 0 && g_spread.On()) {
    const int chunks = static_cast<int>((numel + kChunk - 1) / kChunk);
    int* counts = scratch;                                               // [chunks][E]
    int* starts = scratch + static_cast<int64_t>(chunks) * num_experts;  // [E]
    const size_t count_smem = static_cast<size_t>(num_experts) * sizeof(int);
    const size_t place_smem = static_cast<size_t>(kSpreadWarps) * num_experts * sizeof(int);
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
        MoeAlignCountKernel, dim3(chunks), dim3(kSpreadThreads), count_smem, stream, a, counts));
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(MoeAlignScanKernel, dim3(1), dim3(kScanThreads), 0,
                                                 stream, a, counts, starts, chunks));
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
        MoeAlignPlaceKernel, dim3(chunks), dim3(kSpreadThreads), place_smem, stream, a,
        static_cast<const int*>(counts), static_cast<const int*>(starts)));
    return absl::OkStatus();
  }
  const size_t smem = static_cast<size_t>(kWarps + 1) * num_experts * sizeof(int);
  if (smem > 48 * 1024) {
    KPLAN_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        MoeAlignKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  KPLAN_CUDA_RETURN_IF_ERROR(
      detail::LaunchPdl(MoeAlignKernel, dim3(1), dim3(kThreads), smem, stream, a));
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
