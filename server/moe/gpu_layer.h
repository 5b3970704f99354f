// The device half of the GPU MoE layer: one function that enqueues routing
// -> moe_align_block_size -> GEMM 1 -> activation -> GEMM 2 -> combine on a
// stream, over device pointers only. No allocation, no host synchronisation
// and no host-side reads of device data, so it can be captured in a CUDA
// graph and called by every user of the layer: RunMoeOnGpu (gpu_runner.h,
// which adds the uploads and downloads of one request), the expert-parallel
// ranks (which feed it dispatched rows and an expert map) and the benchmark.
//
// The workspace is one caller-owned device buffer sized by
// MoeLayerWorkspaceBytes for an upper bound of tokens; the same buffer serves
// every smaller call, so a server or a graph can keep it.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "server/moe/gpu_runner.h"

namespace kplan {

// The align block of batch-invariant layers (MoeLayerArgs::batch_invariant):
// one block for every M, the 16 MoeGemmBlockMFor picks up to 8 slots per
// expert. Coalesced launches with more slots per expert stream the busier
// experts' weights twice (blocks of 64 ran Mixtral-8x7B at 64 tokens
// 1.1-1.4x faster: docs/PERF.md, session 15); a fixed 64 is not measured.
inline constexpr int kMoeBatchInvariantBlockM = 16;

// A field added here must go into SameLayer (gpu_graphs.cc): the key of the
// CUDA graphs of small calls.
struct MoeLayerArgs {
  int64_t num_tokens = 0;  // M (0 enqueues nothing)
  int top_k = 0;
  // Range of the expert ids: the global E. Without an expert map it must
  // equal the experts' num_experts.
  int num_experts = 0;
  const void* hidden = nullptr;  // [M, H] in act_dtype
  // fp32, fp16 or bf16; empty: the experts' dtype (bf16 / fp16 sets). An
  // unquantised set with experts.FastPathFor(act_dtype) runs the kplan
  // kernels here; quantised sets and other activations go through
  // gpu_layer_emulation.h (its decode, dequant and fp8 tensor-core routes are
  // kplan's kernels too). Output and intermediates are in act_dtype too.
  std::optional<kernels::DType> act_dtype;
  // Routing from logits: router_logits fp32 [M, E] with `routing` (its bias
  // pointer is a device pointer), writing topk_ids / topk_weights. Without
  // logits, topk_ids / topk_weights are inputs.
  const float* router_logits = nullptr;
  kernels::cuda::MoeRoutingParams routing;
  int32_t* topk_ids = nullptr;    // [M, k]
  float* topk_weights = nullptr;  // [M, k]
  // Device [num_experts]: global id -> index into the experts, or -1 where
  // the experts are elsewhere (their slots give zero rows). Null: identity.
  const int32_t* expert_map = nullptr;
  // Every slot's expert is local (an expert-parallel rank's received rows):
  // the kernel rules then estimate the slots per expert over the local
  // experts, not over num_experts (MoeGemmBlockMFor, MoeGemmWsPingPongFor).
  bool slots_local = false;
  bool apply_router_weight_on_input = false;  // top_k must be 1
  // true: output [M, H] = Σ_j w[m, j] · Y[m*k + j] (moe::CombineTopK).
  // false: output [M*k, H] = the unweighted expert rows Y (zero rows for
  // slots whose expert is not local), for a caller that combines elsewhere.
  bool combine = true;
  void* output = nullptr;
  // Up to kernels::cuda::kMoeDecodeMaxSlots slots the decode layer (one
  // kernel, or two; moe_experts.h, LaunchMoeDecodeExperts) replaces routing,
  // align and the grouped GEMMs; false keeps the grouped path (benchmarks
  // compare the two).
  bool allow_decode = true;
  // Pick every kernel without looking at M, so that a row's bits depend only
  // on its own token (coalesced RunMoE calls, server/moe/moe_coalesce.h).
  // What depends on M otherwise, and makes a merged launch sum in another
  // order than its members alone:
  //   - the decode kernels (MoeDecodeApplies: up to kMoeDecodeMaxSlots slots
  //     on distinct experts) instead of align + grouped GEMMs;
  //   - block_m (MoeGemmBlockMFor: 16 / 64 / 128 / 192 / 256 by slots per expert),
  //     i.e. the CTA tile, and at 128 / 192 / 256 the warp-specialised TMA kernel
  //     with the fused activation epilogue (MoeGemmWsActApplies);
  //   - split-K (MoeGemmSplitsFor: by CTAs against one wave, and the partials
  //     budget), which splits each row's fp32 sum into partial sums;
  //   - on the emulation route, block_m of the fp8 tensor-core GEMMs.
  // With batch_invariant: no decode kernels, block_m 16 (the cp.async wgmma
  // kernel, never the ws one), no split-K, on both routes. What still varies
  // with M is the grid and which block and tile row a slot lands in; neither
  // changes a slot's arithmetic: each output element is one CTA's fp32
  // accumulation over the whole K in a fixed order, routing is one warp per
  // token, scale-rows, activation and combine are per element / per token,
  // and no kernel uses atomics. Dynamic per-tensor fp8 activation scales
  // (the maximum over the whole batch) stay batch-dependent: such sets are
  // never coalesced. The cost: a lone decode-sized call loses the decode
  // kernels and split-K.
  bool batch_invariant = false;
};

// Bytes of workspace for calls with up to max_tokens tokens of top_k slots
// over `num_experts` global ids on these experts, activations in act_dtype
// (empty: the experts' dtype), batch-invariant calls (MoeLayerArgs) or not.
int64_t MoeLayerWorkspaceBytes(const GpuExperts& experts, int64_t max_tokens, int top_k,
                               int num_experts,
                               std::optional<kernels::DType> act_dtype = std::nullopt,
                               bool batch_invariant = false);

// Enqueues the layer on `stream` (cudaStream_t) on the current device, which
// must be experts.device(). INVALID_ARGUMENT for inconsistent arguments or a
// workspace smaller than MoeLayerWorkspaceBytes(experts, M, k, E) (checked
// before anything is enqueued); CUDA launch errors with file:line.
absl::Status EnqueueMoeLayer(const GpuExperts& experts, const MoeLayerArgs& args, void* workspace,
                             int64_t workspace_bytes, void* stream);

}  // namespace kplan
