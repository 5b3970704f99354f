// The emulation route of the device MoE layer (EnqueueMoeLayer, gpu_layer.h):
// every expert set / activation dtype combination that the fast kplan
// kernels do not take (quantised weights, fp32 weights, activations in
// another dtype than the weights). The same stages as the fast route, with
// kernels/cuda/moe/moe_quant_gemm.h's dequantising GEMM and, for fp8 sets, the
// activation quantiser before each GEMM:
//   routing -> moe_align_block_size -> [scale rows] -> [fp8 quantise A]
//   -> GEMM 1 (dequantise W) -> activation -> [fp8 quantise C2]
//   -> GEMM 2 (dequantise W) -> combine
// At decode sizes (QuantRouteOf == kDecode) both GEMMs are the decode
// kernels of moe_quant_decode.cu instead, GEMM 1 with the activation fused;
// for slots on distinct experts (kMatvec) those of moe_quant_matvec.cu, after
// the routing alone (no align).
// Intermediates are in the activation dtype, rounded where the CPU
// reference rounds. Internal to server/moe: gpu_layer.cc calls it for every
// quantised set and for 16-bit sets with activations the fast kernels do not
// take (!experts.FastPathFor(act_dtype)).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/moe/gpu_layer.h"
#include "server/moe/gpu_runner.h"

namespace kplan {

// The route of a layer of num_tokens x top_k slots over `num_experts` ids on
// quantised experts (moe_quant_route.h): kMatvec and kDecode run inside
// EnqueueEmulationLayer, kDequant in gpu_layer.cc (the fast kernels on a
// dequantised copy of the weights, or int4 GEMMs that dequantise them
// themselves: IntWeightsInGemms). kEmulation for unquantised sets. Batch-invariant calls
// (coalescing, MoeLayerArgs::batch_invariant) get a route that does not
// depend on the slots: kDequant where it applies and the 16-bit copy of the
// set is under 4 GiB, else kEmulation.
kernels::cuda::MoeQuantRoute QuantRouteOf(const GpuExperts& experts, kernels::DType act_dtype,
                                          int64_t num_tokens, int top_k, int num_experts,
                                          bool batch_invariant = false);
// What the layer runs for a call of num_tokens x top_k slots (EnqueueMoeLayer's
// choice), for GpuLayerExpertsKernel (moe_runner.h) to name.
GpuLayerFacts GpuLayerFactsOf(const GpuExperts& experts, kernels::DType act_dtype,
                              int64_t num_tokens, int top_k, int num_experts, bool batch_invariant);
// An int8 / int4 set whose weights the decode kernels or the dequant route
// take with these (bf16 / fp16) activations: kplan's kernels run it at some
// sizes (GpuExperts::FastPathFor).
bool IntKernelsApply(const GpuExperts& experts, kernels::DType act_dtype);
// The stored-form descriptor of a quantised set's w13 or w2.
kernels::cuda::MoeQuantWeights QuantWeightsOf(const GpuExperts& experts, bool w13);
// Multiprocessors of `device` (132 when the query fails).
int DeviceSmCount(int device);

// Workspace bytes for up to max_tokens tokens (scaled rows and a separate
// expert-output buffer included).
int64_t EmulationLayerWorkspaceBytes(const GpuExperts& experts, int64_t max_tokens, int top_k,
                                     int num_experts, kernels::DType act_dtype);

// EnqueueMoeLayer's contract for the emulation route; `a` was checked by
// EnqueueMoeLayer (sizes, null buffers, M > 0).
absl::Status EnqueueEmulationLayer(const GpuExperts& experts, const MoeLayerArgs& a,
                                   kernels::DType act_dtype, void* workspace,
                                   int64_t workspace_bytes, void* stream);

// The first two stages every route shares (gpu_layer.cc): routing from
// logits when `a` has them, then moe_align_block_size with `block_m` (and
// a's expert map) into the given device arrays; block_m 0: the routing only.
// align_scratch: kernels::cuda::MoeAlignScratchInts ints, or null (the
// align then runs as one block).
absl::Status EnqueueRoutingAndAlign(const MoeLayerArgs& a, int block_m, int32_t* sorted,
                                    int32_t* expert_ids, int32_t* num_tokens_post_padded,
                                    int32_t* align_scratch, void* stream);

}  // namespace kplan
