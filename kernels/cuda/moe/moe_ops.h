// CUDA launchers of the MoE routing and moe_align_block_size steps
// (vllm-kernel-plan.md §6.1, §6.5, §2.4). Plain functions in the DeepEP
// style: raw device pointers, sizes, an explicit stream, the current device;
// errors come back as absl::Status (INVALID_ARGUMENT for bad arguments,
// checked before anything is launched; CUDA errors with file:line and
// cudaGetErrorString). Results equal kernels/cpu/moe/moe_reference.h
// (moe::RouteTokens, moe::MoeAlignBlockSize):
//  * routing: ids identical except where two selection scores are within
//    fp32 rounding of exp/sigmoid/log1p (about 1e-6 relative) of each other;
//    weights within 1e-5 relative (sums are reduced in a different order).
//    Exact ties go to the lowest expert index, NaN ranks above every number,
//    as in the CPU reference.
//  * align: bit-exact, including the unused tails (sorted_token_ids = numel,
//    expert_ids = -1) that the reference defines; within an expert, tokens
//    are in ascending flat index order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/types.h"
#include "kernels/cpu/moe/moe_reference.h"

namespace kplan::kernels::cuda {

// A process-wide switch of one kernel choice, for A/B runs: kFromEnv (the
// default) reads the kernel's environment variable once; kOn / kOff force.
enum class MoeKernelMode : int { kFromEnv = 0, kOff = 1, kOn = 2 };

// A POD mirror of moe::RoutingSpec; e_score_correction_bias is a DEVICE
// pointer ([num_experts] fp32) or null.
struct MoeRoutingParams {
  int num_experts = 0;  // E, 1..kMoeRoutingMaxExperts
  int top_k = 0;        // 1..min(E, kMoeRoutingMaxTopK)
  RoutingMethod method = RoutingMethod::kTopK;
  ScoringFunc scoring = ScoringFunc::kSoftmax;  // kTopK and kGroupedTopK
  bool renormalize = false;
  const float* e_score_correction_bias = nullptr;
  float routed_scaling_factor = 1.0f;
  int num_expert_group = 0;  // kGroupedTopK: 1..32, divides E
  int topk_group = 0;        // kGroupedTopK: 1..num_expert_group
};

inline constexpr int kMoeRoutingMaxExperts = 512;
inline constexpr int kMoeRoutingMaxTopK = 32;
inline constexpr int kMoeRoutingMaxGroups = 32;
inline constexpr int kMoeAlignMaxExperts = 1024;

// The routing kernel's parameters for a host moe::RoutingSpec; the
// correction bias pointer is left null (it must point to device memory: the
// caller sets it once the bias is uploaded).
MoeRoutingParams MoeRoutingParamsOf(const moe::RoutingSpec& routing);

// INVALID_ARGUMENT naming the field ("routing.top_k", ...), the checks of
// moe::ValidateRoutingSpec plus this kernel's limits.
absl::Status ValidateMoeRoutingParams(const MoeRoutingParams& p);

// logits: fp32 [num_tokens, E] (device); topk_weights fp32 [num_tokens, k],
// topk_ids int32 [num_tokens, k] (device). One warp per token.
absl::Status LaunchMoeRouting(const MoeRoutingParams& p, const float* logits, int64_t num_tokens,
                              float* topk_weights, int32_t* topk_ids, cudaStream_t stream);

// Size of sorted_token_ids: numel + E * (block_size - 1), rounded up to
// block_size with pad_sorted_ids, then min(numel * block_size, .) when
// numel < E (exactly moe::MoeAlignBlockSize's max_padded).
int64_t MoeAlignMaxPadded(int64_t numel, int num_experts, int block_size, bool pad_sorted_ids);
// Size of expert_ids: ceil(max_padded / block_size).
int64_t MoeAlignMaxBlocks(int64_t numel, int num_experts, int block_size, bool pad_sorted_ids);

// topk_ids: int32 [numel] (device, token-major flat ids). expert_map: device
// [num_experts] global -> local id or -1, or null. Outputs (device):
// sorted_token_ids [MoeAlignMaxPadded], expert_ids [MoeAlignMaxBlocks],
// num_tokens_post_padded [1]. Every element of both arrays is written
// (padding and the tail of sorted_token_ids = numel, unused expert_ids = -1).
// Ids outside [0, num_experts) are skipped. Without ignore_invalid_experts,
// blocks of non-local experts stay with expert_ids -1; with it, their tokens
// are dropped before counting. Each expert's tokens are in ascending flat
// index (stable), so the output is deterministic. With `scratch` (device,
// MoeAlignScratchInts ints; may be null) and the spread switch on, the work
// is spread over blocks of 1024 ids in three kernels; else one block of 512
// threads walks every id. Both give the same output.
absl::Status LaunchMoeAlignBlockSize(const int32_t* topk_ids, int64_t numel, int block_size,
                                     int num_experts, const int32_t* expert_map,
                                     bool pad_sorted_ids, bool ignore_invalid_experts,
                                     int32_t* sorted_token_ids, int32_t* expert_ids,
                                     int32_t* num_tokens_post_padded, int32_t* scratch,
                                     cudaStream_t stream);
// Ints of scratch LaunchMoeAlignBlockSize spreads over blocks with (0: it
// runs as one block at this size). Non-decreasing in numel below the
// kernels' int32 limits.
int64_t MoeAlignScratchInts(int64_t numel, int num_experts);
// The spread form's switch: kOn / kOff as set, or with kFromEnv (the
// default) KPLAN_MOE_ALIGN_SPREAD=0 / 1, unset: kMoeAlignSpreadDefault. On
// since session 26 (docs/PERF.md): bit-identical, and Qwen3-30B-A3B's layer
// at 1024 / 4096 tokens (8192 / 32768 ids) 423.0 / 896.0 -> 414.8 / 884.3 us
// (again 419.4 / 894.0 -> 413.8 / 887.1); Mixtral-8x7B at 4096 tokens (8192
// ids) within the noise (5417 / 5500 -> 5464 / 5503 us).
inline constexpr bool kMoeAlignSpreadDefault = true;
void SetMoeAlignSpreadMode(MoeKernelMode mode);

// Copies `bytes` from `src` to `dst` by the SMs (a CTA per 1024 words,
// at most 132, every load of a round in flight before its stores), either side pinned host memory
// seen through its device mapping (unified addressing): a call's small upload or download without a
// copy engine. Launched with programmatic dependent launch, so it waits for the kernel before it
// (and lets the one after it be scheduled). 16-byte words when both pointers are 16-byte aligned
// (the bytes past the last word by the first CTA), single bytes otherwise.
absl::Status LaunchMoeStageCopy(void* dst, const void* src, int64_t bytes, cudaStream_t stream);

}  // namespace kplan::kernels::cuda
