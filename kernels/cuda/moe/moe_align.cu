// moe_align_block_size on the GPU (vllm-kernel-plan.md §6.5), bit-exact with
// kernels/cpu/moe/moe_align.cc (moe::MoeAlignBlockSize).
//
// One block of 512 threads (16 warps). The flat ids are split into 16
// contiguous index ranges, one per warp.
//  1. sorted_token_ids is filled with the sentinel numel; per-range,
//     per-expert counts in shared memory (cnt[warp][e], shared atomics).
//  2. Per expert: the counts become per-range offsets (an exclusive sum over
//     the ranges), the total is padded to a multiple of block_size, and a
//     block-wide exclusive scan over experts gives each expert's start;
//     cnt[warp][e] becomes the range's write cursor.
//  3. Each warp walks its range in order, 32 ids at a time (loaded 32 *
//     kBatch at a time, here and in 1); lanes with the same expert find
//     each other with __match_any_sync, take their rank among the lower
//     lanes, write at cursor + rank, and the highest lane of each group
//     advances the cursor. Ranges are ordered and each range is placed in
//     order, so every expert's tokens are in ascending flat index (stable),
//     as in the reference.
//  4. expert_ids: block b belongs to the first expert whose padded end
//     exceeds b * block_size (binary search), mapped through expert_map;
//     blocks past num_tokens_post_padded get -1.
// Shared memory: (16 + 1) * E ints (68 KiB at E = 1024).
#include <string>

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

// The expert ids of flat indices base + 32 u + lane (u < kBatch) below
// end, -1 for those past end or not kept: every load issued before any is
// used (one at a time, each warp waited a memory round trip per 32 ids;
// 8192 ids took 21.7 us, batched 15-17: docs/PERF.md, session 24).
__device__ __forceinline__ void LoadIds(const AlignArgs& a, int base, int end, int lane,
                                        int (&e)[kBatch]) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int t = base + 32 * u + lane;
    e[u] = t < end ? a.ids[t] : -1;
  }
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    if (!Keep(a, e[u])) e[u] = -1;
  }
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
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (e[u] >= 0) atomicAdd(&my_cnt[e[u]], 1);
    }
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
      int run = 0;
      for (int w = 0; w < kWarps; ++w) {
        const int c = cnt[w * E + e];
        cnt[w * E + e] = run;
        run += c;
      }
      padded[j] = (run + a.bs - 1) / a.bs * a.bs;
      local += padded[j];
    }
  }
  // Block exclusive scan of `local`.
  int incl = local;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += o;
  }
  if (lane == 31) s_warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int v = lane < kWarps ? s_warp_sum[lane] : 0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(kFull, v, off);
      if (lane >= off) v += o;
    }
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

  // expert_ids.
  for (int b = tid; b < a.max_blocks; b += kThreads) {
    const long long pos = static_cast<long long>(b) * a.bs;
    int id = -1;
    if (pos < total) {
      int lo = 0, hi = E - 1;  // first e with s_end[e] > pos
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

  // Stable placement, range by range.
  for (int base = begin; base < end; base += 32 * kBatch) {
    int ev[kBatch];
    LoadIds(a, base, end, lane, ev);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
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
}

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

absl::Status LaunchMoeAlignBlockSize(const int32_t* topk_ids, int64_t numel, int block_size,
                                     int num_experts, const int32_t* expert_map,
                                     bool pad_sorted_ids, bool ignore_invalid_experts,
                                     int32_t* sorted_token_ids, int32_t* expert_ids,
                                     int32_t* num_tokens_post_padded, cudaStream_t stream) {
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
