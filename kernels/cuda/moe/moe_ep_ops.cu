#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_ep_ops.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;

constexpr int kVec = 8;  // elements per 16-byte vector of bf16 / fp16

int GridFor(int64_t n, int threads) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 132 * 16)));
}

// One thread per 8 consecutive elements of one output row.
template <typename T>
__global__ void CombineFp32Kernel(const T* __restrict__ y, const int32_t* __restrict__ ids,
                                  const float* __restrict__ w, const int32_t* __restrict__ map,
                                  int num_experts, int64_t M, int k, int64_t H,
                                  float* __restrict__ out) {
  const int64_t vecs_per_row = H / kVec, total = M * vecs_per_row;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = v / vecs_per_row, h = (v % vecs_per_row) * kVec;
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t slot = m * k + j;
      const int32_t id = ids[slot];
      if (id < 0 || id >= num_experts || (map != nullptr && map[id] < 0)) continue;
      const uint4 raw = *reinterpret_cast<const uint4*>(y + slot * H + h);
      const T* vals = reinterpret_cast<const T*>(&raw);
      const float wj = w != nullptr ? w[slot] : 1.0f;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float x = ToFloat(vals[e]);
        acc[e] = __fadd_rn(acc[e], w != nullptr ? __fmul_rn(x, wj) : x);
      }
    }
    float4* dst = reinterpret_cast<float4*>(out + m * H + h);
    dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

template <typename T>
__global__ void CastKernel(const float* __restrict__ in, int64_t n, T* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(in[i]);
  }
}

__device__ __forceinline__ int OwnerOf(int expert, int num_experts, int num_ranks) {
  const int base = num_experts / num_ranks, rem = num_experts % num_ranks;
  const int big = rem * (base + 1);
  if (expert < big) return expert / (base + 1);
  return rem + (expert - big) / base;
}

constexpr int kPartitionThreads = 1024;

// Pass 1 counts slots per rank; pass 2 walks the slots in chunks of the block
// size and, per rank, places that rank's slots of the chunk by a block scan
// of the flags (stable: slot order).
__global__ void __launch_bounds__(kPartitionThreads)
    PartitionKernel(const int32_t* __restrict__ ids, int64_t numel, int num_experts, int num_ranks,
                    int32_t* __restrict__ order, int64_t* __restrict__ counts) {
  using Scan = cub::BlockScan<int, kPartitionThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int count[kMoeEpMaxRanks];
  __shared__ int64_t next[kMoeEpMaxRanks];
  const int tid = threadIdx.x;
  if (tid < num_ranks) count[tid] = 0;
  __syncthreads();
  for (int64_t t = tid; t < numel; t += kPartitionThreads) {
    const int32_t e = ids[t];
    if (e >= 0 && e < num_experts) atomicAdd(&count[OwnerOf(e, num_experts, num_ranks)], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int64_t at = 0;
    for (int r = 0; r < num_ranks; ++r) {
      next[r] = at;
      at += count[r];
      counts[r] = count[r];
    }
  }
  __syncthreads();
  for (int64_t base = 0; base < numel; base += kPartitionThreads) {
    const int64_t t = base + tid;
    int dest = -1;
    if (t < numel) {
      const int32_t e = ids[t];
      if (e >= 0 && e < num_experts) dest = OwnerOf(e, num_experts, num_ranks);
    }
    for (int r = 0; r < num_ranks; ++r) {
      const int flag = dest == r ? 1 : 0;
      int pos = 0, total = 0;
      Scan(scan_storage).ExclusiveSum(flag, pos, total);
      if (flag) order[next[r] + pos] = static_cast<int32_t>(t);
      __syncthreads();  // scan_storage reuse; next[] read above before the update
      if (tid == 0) next[r] += total;
      __syncthreads();
    }
  }
}

template <typename T>
__global__ void GatherRowsKernel(const T* __restrict__ x, const int32_t* __restrict__ order,
                                 int64_t rows, int k, int64_t H, const int32_t* __restrict__ ids,
                                 const float* __restrict__ w, T* __restrict__ x_out,
                                 int32_t* __restrict__ meta) {
  const int64_t vecs = H / kVec;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t slot = order[i], m = slot / k;
    const uint4* src = reinterpret_cast<const uint4*>(x + m * H);
    uint4* dst = reinterpret_cast<uint4*>(x_out + i * H);
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) dst[v] = src[v];
    if (threadIdx.x == 0) {
      meta[2 * i] = ids[slot];
      meta[2 * i + 1] = __float_as_int(w[slot]);
    }
  }
}

__global__ void UnpackMetaKernel(const int32_t* __restrict__ meta, int64_t rows,
                                 int32_t* __restrict__ ids, float* __restrict__ w) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ids[i] = meta[2 * i];
    w[i] = __int_as_float(meta[2 * i + 1]);
  }
}

__global__ void ScatterRowsKernel(const uint4* __restrict__ in, const int32_t* __restrict__ order,
                                  int64_t rows, int64_t vecs, uint4* __restrict__ y) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const uint4* src = in + i * vecs;
    uint4* dst = y + static_cast<int64_t>(order[i]) * vecs;
    for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) dst[v] = src[v];
  }
}

}  // namespace

absl::Status LaunchMoeEpCombineFp32(DType dtype, const void* y, const int32_t* topk_ids,
                                    const float* topk_weights, const int32_t* expert_map,
                                    int num_experts, int64_t num_tokens, int top_k, int64_t hidden,
                                    float* out, cudaStream_t stream) {
  if (absl::Status s = CheckHalfDType(dtype, "moe_ep_combine_fp32"); !s.ok()) return s;
  if (num_tokens < 0 || top_k <= 0 || hidden < 0 || hidden % kVec != 0 || num_experts <= 0) {
    return absl::InvalidArgumentError(
        "moe_ep_combine_fp32: bad sizes (hidden must be a multiple of 8)");
  }
  const int64_t vecs = num_tokens * (hidden / kVec);
  if (vecs == 0) return absl::OkStatus();
  if (y == nullptr || topk_ids == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("moe_ep_combine_fp32: null pointer");
  }
  if (!Aligned16(y) || !Aligned16(out)) {
    return absl::InvalidArgumentError("moe_ep_combine_fp32: buffers must be 16-byte aligned");
  }
  const int threads = 256, blocks = GridFor(vecs, threads);
  if (dtype == DType::kBFloat16) {
    CombineFp32Kernel<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(y),
                                                      topk_ids, topk_weights, expert_map,
                                                      num_experts, num_tokens, top_k, hidden, out);
  } else {
    CombineFp32Kernel<<<blocks, threads, 0, stream>>>(static_cast<const __half*>(y), topk_ids,
                                                      topk_weights, expert_map, num_experts,
                                                      num_tokens, top_k, hidden, out);
  }
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("CombineFp32Kernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeEpCastFromFp32(DType dtype, const float* in, int64_t n, void* out,
                                     cudaStream_t stream) {
  if (absl::Status s = CheckHalfDType(dtype, "moe_ep_cast"); !s.ok()) return s;
  if (n < 0) return absl::InvalidArgumentError("moe_ep_cast: negative size");
  if (n == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr) return absl::InvalidArgumentError("moe_ep_cast: null");
  const int threads = 256, blocks = GridFor(n, threads);
  if (dtype == DType::kBFloat16) {
    CastKernel<<<blocks, threads, 0, stream>>>(in, n, static_cast<__nv_bfloat16*>(out));
  } else {
    CastKernel<<<blocks, threads, 0, stream>>>(in, n, static_cast<__half*>(out));
  }
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("CastKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeEpPartitionByRank(const int32_t* topk_ids, int64_t numel, int num_experts,
                                        int num_ranks, int32_t* send_order, int64_t* send_counts,
                                        cudaStream_t stream) {
  if (numel < 0 || numel > INT32_MAX || num_experts <= 0 || num_ranks <= 0 ||
      num_ranks > kMoeEpMaxRanks) {
    return absl::InvalidArgumentError(
        "moe_ep_partition: bad sizes (numel < 2^31, 1 <= num_ranks <= 64)");
  }
  if (send_counts == nullptr || (numel > 0 && (topk_ids == nullptr || send_order == nullptr))) {
    return absl::InvalidArgumentError("moe_ep_partition: null pointer");
  }
  PartitionKernel<<<1, kPartitionThreads, 0, stream>>>(topk_ids, numel, num_experts, num_ranks,
                                                       send_order, send_counts);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("PartitionKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeEpGatherRows(DType dtype, const void* hidden, const int32_t* send_order,
                                   int64_t rows, int top_k, int64_t hidden_size,
                                   const int32_t* topk_ids, const float* topk_weights, void* x_out,
                                   int32_t* meta_out, cudaStream_t stream) {
  if (absl::Status s = CheckHalfDType(dtype, "moe_ep_gather_rows"); !s.ok()) return s;
  if (rows < 0 || top_k <= 0 || hidden_size <= 0 || hidden_size % kVec != 0) {
    return absl::InvalidArgumentError(
        "moe_ep_gather_rows: bad sizes (hidden must be a multiple of 8)");
  }
  if (rows == 0) return absl::OkStatus();
  if (hidden == nullptr || send_order == nullptr || topk_ids == nullptr ||
      topk_weights == nullptr || x_out == nullptr || meta_out == nullptr) {
    return absl::InvalidArgumentError("moe_ep_gather_rows: null pointer");
  }
  if (!Aligned16(hidden) || !Aligned16(x_out)) {
    return absl::InvalidArgumentError("moe_ep_gather_rows: rows must be 16-byte aligned");
  }
  const int threads = 128;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 132 * 16));
  if (dtype == DType::kBFloat16) {
    GatherRowsKernel<<<blocks, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(hidden), send_order, rows, top_k, hidden_size, topk_ids,
        topk_weights, static_cast<__nv_bfloat16*>(x_out), meta_out);
  } else {
    GatherRowsKernel<<<blocks, threads, 0, stream>>>(
        static_cast<const __half*>(hidden), send_order, rows, top_k, hidden_size, topk_ids,
        topk_weights, static_cast<__half*>(x_out), meta_out);
  }
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("GatherRowsKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeEpUnpackMeta(const int32_t* meta, int64_t rows, int32_t* ids, float* weights,
                                   cudaStream_t stream) {
  if (rows < 0) return absl::InvalidArgumentError("moe_ep_unpack_meta: negative size");
  if (rows == 0) return absl::OkStatus();
  if (meta == nullptr || ids == nullptr || weights == nullptr) {
    return absl::InvalidArgumentError("moe_ep_unpack_meta: null pointer");
  }
  const int threads = 256, blocks = GridFor(rows, threads);
  UnpackMetaKernel<<<blocks, threads, 0, stream>>>(meta, rows, ids, weights);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("UnpackMetaKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeEpScatterRows(const void* rows_in, const int32_t* send_order, int64_t rows,
                                    int64_t hidden_size, void* y, cudaStream_t stream) {
  if (rows < 0 || hidden_size <= 0 || hidden_size % kVec != 0) {
    return absl::InvalidArgumentError(
        "moe_ep_scatter_rows: bad sizes (hidden must be a multiple of 8)");
  }
  if (rows == 0) return absl::OkStatus();
  if (rows_in == nullptr || send_order == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("moe_ep_scatter_rows: null pointer");
  }
  if (!Aligned16(rows_in) || !Aligned16(y)) {
    return absl::InvalidArgumentError("moe_ep_scatter_rows: rows must be 16-byte aligned");
  }
  const int threads = 128;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 132 * 16));
  ScatterRowsKernel<<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(rows_in), send_order,
                                                    rows, hidden_size / kVec,
                                                    static_cast<uint4*>(y));
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("ScatterRowsKernel");
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
