// The warp-specialised, persistent fp8 e4m3 grouped GEMM for sm_90a
// (moe_gemm_ws_fp8_sm90.cu): the blocks-of-128 form of LaunchMoeGroupedGemm's fp8
// operands (moe_experts.h, MoeGroupedGemmArgs with fp8 = true), same
// arguments and the same contract:
//   block scales (w_scale [E, ceil(N/128), ceil(K/128)], a_scale
//   [a_rows, ceil(K/128)]):
//     C[s, n] = round(Σ_kb (Σ_{k in kb} qa·qw) · (a_scale[r, kb] · w_scale[e, n/128, kb]))
//   per-tensor / per-channel (a_scale [a_rows]):
//     C[s, n] = round((Σ_k qa·qw) · (a_scale[r] · (w_scale[e] or w_scale[e, n])))
// k-blocks summed in order, each block's partial sum in fp32 (the wgmma
// accumulator, promoted every 128 of K as the CPU reference's
// native_w8a8_block_matmul scales its per-k-tile sums), bias as
// round(round(acc) + round(bias)). Differs from the reference only by the
// summation order inside a k-block.
//
// Selection: a caller (the GPU layer's fp8 route, server/moe/
// gpu_layer_emulation.cc) calls LaunchMoeGroupedGemmWsFp8 when
// MoeGemmWsFp8Enabled() and MoeGemmWsFp8Applies(args), else
// LaunchMoeGroupedGemm. Switch: SetMoeGemmWsFp8Mode(kOn / kOff), or with
// kFromEnv (the default) on unless KPLAN_MOE_FP8_GEMM=old.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"

namespace kplan::kernels::cuda {

void SetMoeGemmWsFp8Mode(MoeGemmWsMode mode);
bool MoeGemmWsFp8Enabled();

// fp8 operands, no split-K, blocks of 128 or 256 slots (however few of them
// are filled), N a multiple of 8, K of 16, 16-byte aligned a / w / c, the
// weights addressable by a TMA tensor map.
bool MoeGemmWsFp8Applies(const MoeGroupedGemmArgs& args);
// Validates what MoeGemmWsFp8Applies does not (INVALID_ARGUMENT); UNAVAILABLE,
// with nothing launched, when the driver gives no TMA tensor map.
absl::Status LaunchMoeGroupedGemmWsFp8(const MoeGroupedGemmArgs& args, cudaStream_t stream);
// Launches that succeeded, process-wide (a test shows the kernel ran).
int64_t MoeGemmWsFp8Launches();

// GEMM 1 of a gated block-scaled layer (W = w13 [E, 2I, K], silu) with the
// activation and GEMM 2's fp8 activation quantisation in its epilogue:
//   q [numel, I] (e4m3 bytes), q_scale [numel, I / 128]
// are bit for bit what LaunchMoeGroupedGemmWsFp8 (C1 [numel, 2I], args.c)
// -> LaunchMoeActivation(silu, params) -> LaunchMoeFp8Quantize(kPerGroup,
// group 128) (moe_quant_gemm.h) give; neither C1 nor the 16-bit
// intermediate is written (args.c is not used). Applies where
// MoeGemmWsFp8Applies does, with block scales, act silu, the activation
// groups of kMoeGemmWsFp8ActQuantGroup and I a multiple of them (one group a
// tile). UNAVAILABLE, with nothing launched, as LaunchMoeGroupedGemmWsFp8.
// The caller takes it where MoeGemmWsFp8ActQuantFor says so. The rule (one H100,
// docs/PERF.md session 40, us per layer, the three steps against the fused
// GEMM 1, same process): from kMoeGemmWsFp8ActQuantMinSlots slots per hit expert
// where GEMM 1's K (the hidden size) is at least kMoeGemmWsFp8ActQuantMinK:
// DeepSeek-V3 (K 7168) 2048 / 3072 / 4096 tokens (64 / 96 / 128 slots)
// 4768 / 5287 / 7712 -> 4696 / 5158 / 7347 (and 7511 -> 7120 in another
// run); it lost at 1024 (32 slots, 4200 -> 4263) and on every Mixtral-8x7B
// (K 4096: 64-4096 tokens 1.4-24% slower) and Qwen3-30B-A3B row it took (K
// 2048: 1024 / 4096 tokens 34% / 13% slower). Its epilogue (the
// activation, a max over the quad, 64 divisions and e4m3 roundings a
// thread) runs in the tile's warps while the weight stream waits; the two
// steps it replaces spread over the whole GPU. What it saves, C1 and the
// 16-bit intermediate written and read again, pays only against long main
// loops. Never while the warp-specialised fp8 kernel is switched off
// (MoeGemmWsFp8Enabled); else SetMoeGemmWsFp8ActQuantMode(kOn) always
// (where it applies), kOff never, kFromEnv (the default) the rule, or
// never with KPLAN_MOE_FP8_ACT_QUANT=0.
inline constexpr int kMoeGemmWsFp8ActQuantGroup = 128;
inline constexpr int64_t kMoeGemmWsFp8ActQuantMinSlots = 64;
inline constexpr int64_t kMoeGemmWsFp8ActQuantMinK = 7168;
void SetMoeGemmWsFp8ActQuantMode(MoeGemmWsMode mode);
// numel slots over num_experts experts (all of the routing's), GEMM 1's K
// (the hidden size).
bool MoeGemmWsFp8ActQuantFor(int64_t numel, int num_experts, int64_t gemm1_k);
bool MoeGemmWsFp8ActQuantApplies(const MoeGroupedGemmArgs& args, MoeActivation act, int group);
absl::Status LaunchMoeGroupedGemmWsFp8ActQuant(const MoeGroupedGemmArgs& args,
                                               const MoeActParams& params, uint8_t* q,
                                               float* q_scale, cudaStream_t stream);
int64_t MoeGemmWsFp8ActQuantLaunches();

}  // namespace kplan::kernels::cuda
