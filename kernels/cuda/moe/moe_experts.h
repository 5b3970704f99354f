// CUDA launchers of the expert half of a fused MoE layer (vllm-kernel-plan.md
// §6.2, §6.3), vLLM fused_moe's structure with our own kernels:
//
//   routing + moe_align_block_size (moe_ops.h, block size MoeGemmBlockMFor)
//   -> grouped GEMM 1  C1[slot] = A[slot / top_k] · w13[e]ᵀ (+ b13[e])   [numel, N13]
//   -> activation      C2 = act(C1)                                     [numel, I]
//      (in GEMM 1's epilogue, C1 never stored: silu on blocks of 128, 192 and 256,
//      gelu / gelu_tanh / relu2 on blocks of 128 and 256; moe_gemm_ws.h)
//   -> grouped GEMM 2  Y[slot]  = C2[slot] · w2[e]ᵀ (+ b2[e])           [numel, H]
//   -> combine         out[m]   = Σ_j w[m, j] · Y[m*k + j]               [M, H]
//
// Plain functions in the style of moe_ops.h: raw device pointers, sizes, an
// explicit stream, the current device; INVALID_ARGUMENT for bad arguments
// (checked before anything is launched), CUDA errors with file:line.
// Operands are bf16 or fp16 (activations and weights in the same dtype;
// fp32 is served by the CPU path). Results are rounded to the activation
// dtype at the points moe::RunExperts / moe::CombineTopK round (after each
// GEMM, bias and activation; the combine sums in fp32, j ascending, with
// separately rounded multiply and add, bit-exact with moe::CombineTopK for
// the same Y), so the layer differs from the CPU reference only by the fp32
// summation order inside the GEMMs (and the rare bf16/fp16 rounding flips
// that order causes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/types.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_quant_route.h"  // MoeSlotsPerExpert

namespace kplan::kernels::cuda {

// Mirrors moe::ActivationParams.
struct MoeActParams {
  bool has_clamp_limit = false;  // silu: clamp; swigluoai_uninterleave: required
  float clamp_limit = 7.0f;      // swigluoai / swiglustep use 7.0 when absent
  float alpha = 1.702f;
  float beta = 1.0f;
};

// What the kernels apply: `p` with clamp_limit 7.0 where has_clamp_limit is
// false (the swigluoai / swiglustep default).
inline MoeActParams EffectiveActParams(MoeActParams p) {
  if (!p.has_clamp_limit) p.clamp_limit = 7.0f;
  return p;
}

// The grouped GEMM (moe_gemm_sm90.cu, wgmma on sm_90a): a CTA computes 128
// weight rows x block_m slots of one moe_align_block_size block (one expert),
// K stepped by 64 through a cp.async pipeline; block_m is 16, 64 or 128 and
// must be the block size moe_align_block_size ran with. Blocks of 128 and
// 256 run the warp-specialised TMA kernel instead where it takes them, same
// results (moe_gemm_ws.h); blocks of kMoeGemmTallBlockM (bf16) run only
// there (no tensor map: UNAVAILABLE, no fallback). MoeGemmBlockMFor picks the block
// from the average slots per hit expert (MoeSlotsPerExpert): 16 up to 8 (where nearly every hit
// expert of a uniform routing fits one block), 64 below 64, then 128 and from 512 256; and 128 from
// 16 when both GEMMs' reductions are long: ws_k, the shorter of them (min(H, I)) for 16-bit and fp8
// weights, is at least kMoeGemmWsLongK, or when the GEMMs take the ping-pong form (ping_pong:
// MoeGemmWsPingPongFor, moe_gemm_ws.h; callers pass false for int4 weights). ws_k 0: int4 weights
// (their GEMMs on blocks of 128 below 64 slots per expert were slower). tall_tiles
// (MoeGemmWsTallTilesFor, bf16 weights with ws_k > 0): 192 in place of 128 or 256 where the
// ping-pong form is not taken.
inline constexpr int64_t kMoeGemmWsLongK = 2048;
inline constexpr int kMoeGemmTallBlockM = 192;  // the tall tiles' block (moe_gemm_ws.h)
int MoeGemmBlockMFor(int64_t numel, int num_experts, int64_t ws_k, bool ping_pong,
                     bool tall_tiles = false);
// Split-K factor that fills one wave of resident CTAs with weight streams
// when the blocks alone fill less than half of it (1 = no split);
// MoeGemmPartialsBytes is the fp32 workspace it needs.
int MoeGemmSplitsFor(int64_t numel, int64_t num_blocks, int64_t N, int64_t K, int num_sms,
                     int block_m, int elem_bytes = 2);
int64_t MoeGemmPartialsBytes(int splits, int64_t numel, int64_t N);

// Weight scales of fp8 e4m3 operands: per expert [E], per expert row [E, N],
// or per 128 x 128 block [E, ceil(N/128), ceil(K/128)].
enum class MoeFp8WeightScale : int { kPerTensor, kPerChannel, kBlock };

// The element types these launchers take (DType, kernels/common/types.h):
// CheckHalfDType accepts bf16 / fp16 (the wgmma GEMMs, the decode kernels,
// the elementwise steps, the EP glue), CheckFloatDType fp32 / fp16 / bf16
// (the emulation route). INVALID_ARGUMENT naming `what` otherwise.
absl::Status CheckHalfDType(DType dtype, const char* what);
absl::Status CheckFloatDType(DType dtype, const char* what);

struct MoeQuantWeights;  // moe_quant_gemm.h

// One grouped GEMM over the moe_align_block_size output. Block t covers
// sorted_token_ids[t*block_m, (t+1)*block_m) and uses expert expert_ids[t].
// For every slot s in it with s < numel (sentinels are skipped):
//   C[s, n] = round(Σ_k A[s / a_row_div, k] · W[e, n, k])        (+ bias: see below)
// where with bias v = round(round(acc) + round(bias[e, n])). Blocks whose
// expert is -1 (not local under EP) write zeros to their slots; blocks at or
// past *num_tokens_post_padded do nothing. Slots that no block lists are not
// written. With splits > 1 the K range is split over that many CTAs whose
// fp32 partials (`partials`, MoeGemmPartialsBytes) are summed in split order
// before the same rounding.
struct MoeGroupedGemmArgs {
  DType dtype = DType::kBFloat16;
  const void* a = nullptr;      // [a_rows, K]; GEMM 1: hidden states [M, K]; GEMM 2: [numel, K]
  int a_row_div = 1;            // GEMM 1: top_k (token = slot / top_k); GEMM 2: 1
  const void* w = nullptr;      // [num_local_experts, N, K]
  const float* bias = nullptr;  // [num_local_experts, N] fp32, or null
  void* c = nullptr;            // [numel, N]
  const int32_t* sorted_token_ids = nullptr;        // [num_blocks * block_m]
  const int32_t* expert_ids = nullptr;              // [num_blocks]
  const int32_t* num_tokens_post_padded = nullptr;  // [1]
  int64_t numel = 0;                                // M * top_k, the sentinel value
  int64_t num_blocks = 0;                           // MoeAlignMaxBlocks(numel, E, block_m, false)
  int64_t N = 0;                                    // a multiple of 8
  int64_t K = 0;                                    // a multiple of 8 (16-byte rows for cp.async)
  int num_local_experts = 0;
  int block_m = 64;
  // Blocks of 128 or 256 on bf16 weights: the warp-specialised GEMM's
  // ping-pong consumers (MoeGemmWsPingPongFor, moe_gemm_ws.h), decided by the
  // caller together with block_m so that both use one estimate of the slots
  // per expert (the layer's counts every expert of the routing, not only the
  // local ones). SetMoeGemmWsPingPongMode(kOn) forces the form either way.
  bool ping_pong = false;
  int splits = 1;
  float* partials = nullptr;  // with splits > 1
  // splits > 1 only: leave the partials unreduced for the next step to sum
  // (LaunchMoeActivation / LaunchMoeCombine with MoeSplitInput), one kernel
  // less per GEMM at decode sizes. Needs bias == nullptr; C is not written,
  // non-local blocks write zero partials.
  bool reduce_in_consumer = false;
  // fp8 e4m3 operands (wgmma e4m3): a and w hold e4m3 bytes, c is `dtype`;
  // block_m 16, 64 or 128 and K a multiple of 16. The fp32 sum is scaled by
  // w_scale and a_scale (per A row; with block weight scales per A row and
  // 128-wide k-block, [a_rows, ceil(K/128)], applied k-block by k-block as
  // the CPU reference does):
  //   C[s, n] = round(Σ_kb (Σ_{k in kb} qa·qw) · a_scale[r, kb] · w_scale[e, n/128, kb])
  //   C[s, n] = round((Σ_k qa·qw) · (a_scale[r] · w_scale[e] or w_scale[e, n]))
  bool fp8 = false;
  MoeFp8WeightScale w_scale_kind = MoeFp8WeightScale::kPerTensor;
  const float* w_scale = nullptr;
  const float* a_scale = nullptr;
  // int4 weights with group scales (moe_quant_gemm.h: kInt4Packed, kGroup;
  // optional zero points) in place of w, for the int route of the layer
  // (MoeGemmIntApplies): the warp-specialised kernel dequantises them in its
  // producer (splits 1, MoeGemmWsApplies), the cp.async one in its consumer
  // threads, into wgmma's A registers (block_m 16, 64 or 128). Either gives
  // the values LaunchMoeDequantWeights stores, so C is bit-identical to that
  // dequantiser followed by this GEMM on its 16-bit copy. w is not read.
  const MoeQuantWeights* int_w = nullptr;
};

// Whether the int4 GEMMs take weights `w` of a GEMM of depth K: int4 packed
// with group scales (zero points optional), 16-byte aligned data, K and the
// group size multiples of 32, K a multiple of the group size.
bool MoeIntWeightsApply(const MoeQuantWeights& w, int64_t K);
// Whether LaunchMoeGroupedGemm takes `args` with its int_w (above). At
// block_m 256 only the warp-specialised kernel does, which returns
// UNAVAILABLE when the driver gives no TMA tensor map for the weights.
bool MoeGemmIntApplies(const MoeGroupedGemmArgs& args);
// Whether the layer's int route runs its GEMMs on the int4 weights (on by
// default): SetMoeGemmIntMode, or with kFromEnv KPLAN_MOE_INT_GEMM=0 for the
// dequantised copy and the 16-bit kernels (the A/B of moe_bench).
void SetMoeGemmIntMode(MoeKernelMode mode);
bool MoeGemmIntEnabled();
// The cp.async kernel's wide k-tiles (256 bytes of each row a stage) for
// 16-bit blocks of 16 at K >= 4096, not split (on by default, measured on
// Mixtral-8x7B at 16 tokens only): SetMoeGemmWideMode, or with kFromEnv
// KPLAN_MOE_CP_WIDE=0 for 128-byte stages (the A/B of moe_bench).
void SetMoeGemmWideMode(MoeKernelMode mode);
// Launches with int_w that succeeded, process-wide (a test's proof that the
// int4 kernels ran).
int64_t MoeGemmIntLaunches();

// GEMM output given as unreduced split-K partials ([splits][numel][N] fp32):
// a consumer reads element i as round(Σ_z partials[z][i]), z ascending,
// exactly what the GEMM's own reduction stores (without bias).
struct MoeSplitInput {
  const float* partials = nullptr;  // null: read the stored GEMM output
  int splits = 1;
};

absl::Status LaunchMoeGroupedGemm(const MoeGroupedGemmArgs& args, cudaStream_t stream);

// in: [rows, in_width], out: [rows, out_width], both in dtype. Gated
// activations need in_width == 2 * out_width (x1 = first half, x2 = second;
// swigluoai interleaved), _no_mul ones in_width == out_width. Computed in
// fp32 from the stored values and rounded once, as moe::ApplyActivation
// followed by the reference's rounding.
absl::Status LaunchMoeActivation(MoeActivation act, const MoeActParams& params, DType dtype,
                                 const void* in, int64_t rows, int64_t in_width, void* out,
                                 int64_t out_width, cudaStream_t stream,
                                 const MoeSplitInput& split = {});

// out[m, h] = round(Σ_j w[m, j] · y[m*k + j, h]) with fp32 accumulation, j
// ascending (topk_weights == nullptr: plain sum, for weights applied on the
// input). y: [num_tokens * top_k, hidden], out: [num_tokens, hidden].
absl::Status LaunchMoeCombine(DType dtype, const void* y, const float* topk_weights,
                              int64_t num_tokens, int top_k, int64_t hidden, void* out,
                              cudaStream_t stream, const MoeSplitInput& split = {});

// Decode-sized layers: routing (optional) and the whole expert half (GEMM 1,
// activation, GEMM 2 and combine) over the routed top-k ids, without
// moe_align_block_size, for up to kMoeDecodeMaxSlots token slots, as
//   one kernel   (moe_decode_layer.cu, where MoeDecodeLayerEnabled()):
//                every CTA routes the tokens itself; a producer warp streams
//                the CTA's share of the gate/up rows, then of the down rows,
//                through a ring of shared-memory stages (bulk copies) to
//                eight consumer warps; one grid-wide barrier between the two
//                halves; a cooperative launch (all CTAs resident), which a
//                CUDA graph can hold;
//   two kernels  (moe_decode.cu, the default; after the routing kernel when
//                routing is asked for): matrix-vector kernels for the gate/up
//                rows with the activation, then the down rows with the
//                combine.
// Both compute every value with the same instructions in the same order, so
// their outputs are bit-identical. Same rounding points as the grouped path
// (GEMM outputs, activation, combine), only the fp32 order inside each dot
// product differs. Slots whose expert is out of range or not local (expert
// map -1) contribute zero rows. top_k <= 8; no apply_router_weight_on_input.
inline constexpr int64_t kMoeDecodeMaxSlots = 16;
struct MoeDecodeArgs {
  DType dtype = DType::kBFloat16;
  const void* hidden = nullptr;  // [num_tokens, hidden_size]
  // With router_logits (fp32 [num_tokens, num_experts], device) the layer
  // routes with `routing` (routing.num_experts == num_experts) and writes
  // topk_ids / topk_weights; without, they are its inputs.
  const float* router_logits = nullptr;
  MoeRoutingParams routing;
  int32_t* topk_ids = nullptr;          // [num_tokens, top_k], global ids
  float* topk_weights = nullptr;        // [num_tokens, top_k]
  const int32_t* expert_map = nullptr;  // [num_experts] global -> local or -1; null: identity
  int num_experts = 0;                  // range of the ids
  int num_local_experts = 0;            // experts in w13 / w2
  int64_t num_tokens = 0;
  int top_k = 0;
  int64_t hidden_size = 0, intermediate_size = 0;  // multiples of 8
  const void* w13 = nullptr;   // [E_local, N13, H], N13 = 2I for gated activations, else I
  const float* b13 = nullptr;  // [E_local, N13] or null
  const void* w2 = nullptr;    // [E_local, H, I]
  const float* b2 = nullptr;   // [E_local, H] or null
  MoeActivation act = MoeActivation::kSilu;
  MoeActParams act_params;
  void* h = nullptr;  // workspace [num_tokens * top_k, I]
  // true: out [num_tokens, H] = Σ_j w · y_j; false: out [num_tokens * top_k, H] = y.
  bool combine = true;
  void* out = nullptr;
};
// Whether a layer of these sizes runs faster on the decode kernels: at most
// kMoeDecodeMaxSlots slots that (nearly always) hit distinct experts, since
// each slot streams its expert's weights.
bool MoeDecodeApplies(int64_t num_tokens, int top_k, int num_experts, int64_t hidden,
                      int64_t intermediate);
// INVALID_ARGUMENT, with nothing launched, for what neither form can run: a
// dtype other than bf16 / fp16, bad sizes, more than kMoeDecodeMaxSlots
// slots, top_k > 8, hidden or intermediate sizes not multiples of 8, a null
// buffer, an unknown activation, routing parameters the router refuses.
absl::Status LaunchMoeDecodeExperts(const MoeDecodeArgs& args, cudaStream_t stream);

// The one-kernel form's switch: kOn / kOff as set (SetMoeDecodeLayerMode),
// or with kFromEnv KPLAN_MOE_DECODE_LAYER=0 / 1 (unset:
// kMoeDecodeLayerDefault). Off by default: on one H200 it is bit-identical
// to the two kernels and on par with them on DeepSeek-V3 at one token
// (180-185 us against 186-188), but slower on Qwen3-30B-A3B (52.7 against
// 41.0 us) and Mixtral-8x7B (245 against 180 us); docs/PERF.md, session 9.
// Where it is on but cannot run (no cooperative launch, a grid too large for
// this context under MPS or green contexts, too little shared memory for
// the hidden and intermediate rows, output partials and two ring stages,
// rows not 16-byte aligned for the bulk copies) the two kernels run instead.
inline constexpr bool kMoeDecodeLayerDefault = false;
void SetMoeDecodeLayerMode(MoeKernelMode mode);
bool MoeDecodeLayerEnabled();
// Successful one-kernel launches, process-wide: lets a test show that it ran.
int64_t MoeDecodeLayerLaunches();

// apply_router_weight_on_input (top_k == 1): out[m, h] = round(a[m, h] ·
// round(w[m])), as moe::RunExperts scales the input rows.
absl::Status LaunchMoeScaleRows(DType dtype, const void* a, const float* row_weights, int64_t rows,
                                int64_t width, void* out, cudaStream_t stream);

}  // namespace kplan::kernels::cuda
