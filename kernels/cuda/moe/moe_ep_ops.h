// CUDA launchers of the expert-parallel glue around the fused MoE layer
// (server/moe/ep/gpu_ep.h): what the dispatch strategies do to rows between
// the NCCL collectives and EnqueueMoeLayer. Plain functions in the style of
// moe_ops.h / moe_experts.h: raw device pointers, sizes, an explicit stream,
// the current device; INVALID_ARGUMENT for bad arguments (checked before
// anything is launched), CUDA errors with file:line.
//
//  allgather_reducescatter: every rank runs its local experts on all tokens
//    (combine=false), LaunchMoeEpCombineFp32 sums this rank's slots per token
//    in fp32 (the reduce-scatter then adds the ranks' partials in fp32) and
//    LaunchMoeEpCastFromFp32 rounds the sum once to the activation dtype,
//    which is where moe::CombineTopK rounds.
//  kplan_all2allv: LaunchMoeEpPartitionByRank orders the (token, slot) rows
//    by destination rank, LaunchMoeEpGatherRows packs them (and their expert
//    id / weight) for the all-to-all-v, LaunchMoeEpUnpackMeta splits what
//    arrived, and LaunchMoeEpScatterRows puts the returned expert rows back
//    in slot order so that LaunchMoeCombine (moe_experts.h) combines them
//    exactly as the single-GPU layer does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace kplan::kernels::cuda {

// Largest expert-parallel group the partition kernel handles.
inline constexpr int kMoeEpMaxRanks = 64;

// out[m, h] = Σ_j w[m, j] · y[m*k + j, h] over the slots j whose expert is
// local (topk_ids in [0, num_experts) and expert_map[id] >= 0), in fp32, j
// ascending, multiply and add rounded separately (as LaunchMoeCombine before
// its final rounding). Other slots (non-local experts, padding rows with id
// -1) are not read, so their y rows may hold anything; a token without local
// slots gets +0. topk_weights == nullptr: plain sum (weights applied on the
// input). y: [num_tokens * top_k, hidden] in dtype; out fp32 [num_tokens,
// hidden]. expert_map: device [num_experts] or null (all ids local).
absl::Status LaunchMoeEpCombineFp32(DType dtype, const void* y, const int32_t* topk_ids,
                                    const float* topk_weights, const int32_t* expert_map,
                                    int num_experts, int64_t num_tokens, int top_k, int64_t hidden,
                                    float* out, cudaStream_t stream);

// out[i] = round(in[i]) to dtype (round to nearest even), i < n.
absl::Status LaunchMoeEpCastFromFp32(DType dtype, const float* in, int64_t n, void* out,
                                     cudaStream_t stream);

// Orders the numel slots (flat token * k + j) by the rank owning their expert
// under the linear placement of num_experts over num_ranks
// (ep::ExpertPlacement::Linear), stable: slot order within one rank.
// send_order [numel]: slot index per position; send_counts int64
// [num_ranks]: slots per destination. Ids outside [0, num_experts) belong to
// no rank (skipped; the caller validates ids before). One block of 1024
// threads: a count pass, then one block scan per rank and 1024 slots.
absl::Status LaunchMoeEpPartitionByRank(const int32_t* topk_ids, int64_t numel, int num_experts,
                                        int num_ranks, int32_t* send_order, int64_t* send_counts,
                                        cudaStream_t stream);

// For i < rows: x_out[i] = hidden[send_order[i] / top_k] (one row of `hidden`
// elements of dtype; hidden a multiple of 8), meta_out[2i] =
// topk_ids[send_order[i]], meta_out[2i + 1] = the bits of
// topk_weights[send_order[i]] (one int32 stream for the all-to-all-v).
absl::Status LaunchMoeEpGatherRows(DType dtype, const void* hidden, const int32_t* send_order,
                                   int64_t rows, int top_k, int64_t hidden_size,
                                   const int32_t* topk_ids, const float* topk_weights, void* x_out,
                                   int32_t* meta_out, cudaStream_t stream);

// ids[i] = meta[2i], weights[i] = bits meta[2i + 1], i < rows.
absl::Status LaunchMoeEpUnpackMeta(const int32_t* meta, int64_t rows, int32_t* ids, float* weights,
                                   cudaStream_t stream);

// y[send_order[i]] = rows_in[i] (rows of hidden 2-byte elements, bf16 or
// fp16; hidden a multiple of 8), i < rows.
absl::Status LaunchMoeEpScatterRows(const void* rows_in, const int32_t* send_order, int64_t rows,
                                    int64_t hidden_size, void* y, cudaStream_t stream);

}  // namespace kplan::kernels::cuda
