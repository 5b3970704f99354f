// The warp-specialised, persistent grouped GEMM of the fused MoE layer for
// sm_90a (moe_gemm_ws_sm90.cu): the path of blocks of 128, 192 (the tall
// tiles, below) and 256 of LaunchMoeGroupedGemm
// (moe_experts.h), same arguments and results (bf16 / fp16 output with the
// same rounding points; bit-identical to moe_gemm_sm90.cu's output in every
// GEMM measured), the default since session 5 (docs/PERF.md).
//
// Selection: LaunchMoeGroupedGemm calls LaunchMoeGroupedGemmWs when
// MoeGemmWsEnabled() and MoeGemmWsApplies(args): bf16 / fp16 operands (no
// fp8), no split-K, blocks of 128 or 256 slots (MoeGemmBlockMFor picks these
// where this kernel pays) or of 192 (bf16), and the weights addressable by a
// TMA tensor map.
// The switch: SetMoeGemmWsMode(kOn / kOff), or with kFromEnv (the default)
// on unless the environment variable KPLAN_MOE_GEMM=old selects the cp.async
// kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace kplan::kernels::cuda {

using MoeGemmWsMode = MoeKernelMode;
void SetMoeGemmWsMode(MoeGemmWsMode mode);
bool MoeGemmWsEnabled();

// Clusters of two CTAs that step through their stages together and share
// the weight box by TMA multicast (bf16 / fp16 weights; int4 weights
// never): SetMoeGemmWsClusterMode(kOn / kOff), or with kFromEnv (the
// default) KPLAN_MOE_WS_CLUSTER=2 (on) / 1 (off), unset: with
// kMoeWsClusterDefault on for the GEMMs whose K is long enough to gain
// (moe_ws_schedule.h's WsClusterPays), else off. Same output bits either
// way. Blocks of 192 (the tall tiles, below) run one CTA a tile whatever
// the switch says. The bf16 / fp16 launches of this kernel that succeeded, and those of
// them in clusters, process-wide: a test's proof of which form ran.
inline constexpr bool kMoeWsClusterDefault = true;  // the rule applies (session 19, call 5)
void SetMoeGemmWsClusterMode(MoeGemmWsMode mode);
int64_t MoeGemmWsLaunches();
int64_t MoeGemmWsClusterLaunches();
// The ping-pong form (moe_ws_pipeline.cuh: the consumer warpgroups take
// 64-slot halves of tiles in turn, one's epilogue under the other's MMAs),
// for bf16 weights (not int4), in place of clusters, where the caller sets
// MoeGroupedGemmArgs::ping_pong by MoeGemmWsPingPongFor's rule:
// SetMoeGemmWsPingPongMode(kOn) always (whatever the args say), kOff never;
// with kFromEnv (the default) never for KPLAN_MOE_WS_PINGPONG=0, else below
// kMoeWsPingPongMaxSlots slots per expert (MoeSlotsPerExpert).
// Measured per layer, one H200 (docs/PERF.md, session 26), against the
// cooperative consumers in clusters: Mixtral-8x7B 64-192 tokens (16-48
// slots) 726-745 -> 694-709 us; DeepSeek-V3 512 / 1024 tokens (16 / 32)
// 5436 / 5581 -> 5291 / 5422; Qwen3-30B-A3B (blocks of 128 from 16 slots
// then, MoeGemmBlockMFor) 256-768 tokens 358-403 -> 353-389. At 64 slots
// and more it lost: Mixtral-8x7B 256 / 1024 / 4096 tokens 784 / 1641 / 5417
// -> 1048 / 2620 / 9001 us, Qwen3-30B-A3B 1024 423 -> 542. Session 39 (one
// H100, us per layer, the form the rule gives without ping-pong against
// it): even at 48 slots (Mixtral 192 tokens 955.9 against 960.1, Qwen3 768
// 506.9 against 503.8; the H200 gain above was 3-5% there), but at 60
// Mixtral 240 tokens 966.0 against 1227.3 (with 60 +- 8 slots a quarter of
// the experts get more than 64, and their tiles' second halves stream the
// weights again) and Qwen3 960 (blocks of 64 on the cp.async kernel) 552.0
// against 618.3. 49-59 slots and DeepSeek-V3 from 48 are not measured; by
// the binomial spread 2.5-4.5% of the experts pass 64 slots at 52, 10-13%
// at 56. So ping-pong below 52 slots (the bound is exclusive).
inline constexpr int64_t kMoeWsPingPongMaxSlots = 52;
void SetMoeGemmWsPingPongMode(MoeGemmWsMode mode);
// The rule for MoeGroupedGemmArgs::ping_pong of a GEMM of `dtype` over
// numel slots routed to num_experts experts (all of the routing's).
bool MoeGemmWsPingPongFor(DType dtype, int64_t numel, int num_experts);
int64_t MoeGemmWsPingPongLaunches();
// The tall tiles (blocks of 192 slots, bf16 weights): a fourth warpgroup, so
// a tile of 192 slots x 256 weight rows streams an expert's weights once
// where it gets about 128 +- 11 slots (uniform routing), which tiles of 128
// cover with 1.47 tiles an expert on average, each streaming the weights
// (docs/notes/moe_gemm_next.md). One CTA a tile (never in clusters). Same
// output bits as the tiles of 128.
// The rule (measured on an H100, docs/PERF.md sessions 32 and 39): from
// kMoeWsTallTilesMinSlots to below kMoeWsTallTilesMaxSlots slots per expert
// (one tall tile an expert) where both GEMMs' K (the hidden and the
// intermediate size) are at least kMoeWsTallTilesMinK: Mixtral-8x7B (K 4096
// / 14336) 512 tokens 1.04-1.06x, DeepSeek-V3 (7168 / 2048) 4096 tokens
// 1.13x; Qwen3-30B-A3B (2048 / 768) at 2048 tokens 0.96x (the tall
// epilogue weighs more on short K), 64 or 256+ slots an expert 0.76-0.94x.
// The lower edge (session 39; tall against tiles of 128, us per layer):
// Mixtral-8x7B at 96 / 104 / 112 slots (384 / 416 / 448 tokens) 1110 /
// 1122 / 1130 against 1016 / 1095 / 1092, DeepSeek-V3 at 96 / 112 (3072 /
// 3584 tokens) 9537 / 9863 against 8864 / 9460: an expert's slots then fit
// one tile of 128 (+- 10), which the tall tile's fourth warpgroup and its
// epilogue (not deferred, unlike the fused tiles of 128's) only slow; even
// at 120 (Mixtral 480 tokens: 1161 / 1170), the tall tiles 2.5-4.5% faster
// at 124 and 128. 113-119 slots and DeepSeek-V3 past 112 are not measured; the
// upper edge and the K bound are the model's (a shape with one short K
// between 768 and 2048 is untested).
// SetMoeGemmWsTallTilesMode(kOn) always (where blocks of 128 or more would
// run the cooperative consumers), kOff never; kFromEnv: the rule, or never
// with KPLAN_MOE_WS_TALL=0. The caller picks blocks of 192 with
// MoeGemmBlockMFor(..., tall_tiles) by MoeGemmWsTallTilesFor's answer.
inline constexpr bool kMoeWsTallTilesDefault = true;
inline constexpr int64_t kMoeWsTallTilesMinSlots = 120;
inline constexpr int64_t kMoeWsTallTilesMaxSlots = 192;
inline constexpr int64_t kMoeWsTallTilesMinK = 2048;
void SetMoeGemmWsTallTilesMode(MoeGemmWsMode mode);
// min_k: the shorter K of the layer's two GEMMs (min(hidden, intermediate);
// 0 for int weights, which take no tall tiles).
bool MoeGemmWsTallTilesFor(DType dtype, int64_t numel, int num_experts, int64_t min_k);
int64_t MoeGemmWsTallTilesLaunches();

// With args.int_w also MoeIntWeightsApply (moe_experts.h).
bool MoeGemmWsApplies(const MoeGroupedGemmArgs& args);
// Counts a successful launch with int_w (MoeGemmIntLaunches); called by
// both int kernels' launchers.
namespace detail {
void NoteMoeGemmIntLaunch();
}  // namespace detail
// Args already validated by LaunchMoeGroupedGemm, MoeGemmWsApplies true.
// UNAVAILABLE, with nothing launched, when the driver gives no TMA tensor map
// for the weights (LaunchMoeGroupedGemm then takes the cp.async kernel,
// except for blocks of 192, which it has not).
absl::Status LaunchMoeGroupedGemmWs(const MoeGroupedGemmArgs& args, cudaStream_t stream);

// GEMM 1 with the gated activation in its epilogue: act_out [numel, N / 2] =
// act(C1) where C1 = GEMM 1 of `args` (W = w13 [E, N, K], gate rows first,
// up rows from N / 2), bit-identical to LaunchMoeGroupedGemm(args) followed
// by LaunchMoeActivation(act, params, ...) (same rounding points: gate and
// up rounded to the dtype as the intermediate stores them, the activation in
// fp32, rounded once); args.c is not used and C1 is never stored.
// MoeGemmWsActApplies: silu in every form; gelu, gelu_tanh and relu2
// (stacked gate / up rows) where the tiles are the cooperative ones of 128
// with 16-bit weights (not the tall or ping-pong forms, not int4), their
// instantiations of the fused kernel (the layer's bits equal the unfused
// layer's on an H100 for bf16 gelu, fp16 gelu_tanh and bf16 relu2 in
// clusters, docs/PERF.md session 50); swigluoai (interleaved rows) and the
// activations without a gate take the unfused path, and so, until a GPU run
// checks them, do swiglustep and swigluoai_uninterleave (the kernel computes
// them alike; the layer never passes the latter's clamp_limit). N a multiple of 16, and
// MoeGemmWsApplies. Switch: SetMoeFusedActMode, or with kFromEnv KPLAN_MOE_FUSED_ACT=0 / 1 (unset:
// kMoeFusedActDefault, on since session 5 call 5, docs/PERF.md; =0 gives the unfused path). The
// layer checks MoeGemmWsEnabled() too. UNAVAILABLE as LaunchMoeGroupedGemmWs.
inline constexpr bool kMoeFusedActDefault = true;  // since session 5, call 5
void SetMoeFusedActMode(MoeGemmWsMode mode);
bool MoeFusedActEnabled();
bool MoeGemmWsActApplies(const MoeGroupedGemmArgs& args, MoeActivation act,
                         const MoeActParams& params);
// Fused GEMM 1 launches that succeeded, process-wide: lets a test show the
// fused kernel really ran (a fallback would leave it unchanged).
int64_t MoeFusedActLaunches();
absl::Status LaunchMoeGroupedGemmWsAct(const MoeGroupedGemmArgs& args, MoeActivation act,
                                       const MoeActParams& params, void* act_out,
                                       cudaStream_t stream);

}  // namespace kplan::kernels::cuda
