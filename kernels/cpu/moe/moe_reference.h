// CPU reference for fused Mixture-of-Experts layers: the oracle every GPU
// result is checked against, and the path the server runs when it has no GPU.
// It mirrors vLLM's golden-model math (docs: vllm-kernel-plan.md §6): router
// scoring and top-k selection (§6.1), moe_align_block_size (§6.5), the gated
// and non-gated activations (§6.3), the expert MLP
// y_e(x) = w2[e] · act(w13[e] · x + b13[e]) + b2[e] and the weighted combine
// Σ_k w·y (§6.2), for float weights and for fp8 / int8 / int4 quantised ones
// (§6.6). Everything is a plain function over raw row-major pointers with
// fp32 accumulation; intermediate results are rounded to the activation dtype
// at the same points as vLLM's torch_experts (after each GEMM, bias and
// activation), so bf16/fp16 references match the PyTorch golden model and
// not an idealised fp32 one. Results are deterministic: every output row is
// computed by one thread in a fixed summation order, so the thread count never
// changes a bit of the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "base/float16.h"
#include "kernels/common/types.h"

namespace kplan::moe {

// ---------------------------------------------------------------------------
// Dtypes (kernels/common/types.h) and exact conversions.

using ::kplan::kernels::IsFloatDType;

// Round-to-nearest-even conversions as PyTorch's .to(); NaN stays NaN,
// overflow of fp16 gives ±inf. One copy for every layer: base/float16.h.
using ::kplan::Bf16ToFloat;
using ::kplan::FloatToBf16;
using ::kplan::FloatToHalf;
using ::kplan::HalfToFloat;

inline constexpr float kFp8E4m3Max = 448.0f;
float Fp8E4m3ToFloat(uint8_t bits);
// saturate=true clamps to ±448 first (what vLLM's quantisers do before the
// cast, and what every quantisation here uses). saturate=false is torch's raw
// cast: |x| >= 480 (or rounding past 448) becomes NaN (0x7f, sign kept).
// Rounding is to nearest even, subnormals (step 2^-9) included.
uint8_t FloatToFp8E4m3(float f, bool saturate = true);

// Rounds an fp32 value to the nearest value representable in `dtype`
// (identity for fp32). Only for float dtypes. RoundToDTypeInPlace does it to
// x[0, n), the dtype dispatched once.
float RoundToDType(float f, kernels::DType dtype);
void RoundToDTypeInPlace(float* x, int64_t n, kernels::DType dtype);

// Reads / writes element i of a float-dtype buffer (fp32, fp16 or bf16).
// LoadFloats reads elements [begin, begin + n) into dst, the dtype
// dispatched once (the reference's weight and input decoding).
float LoadFloat(const void* data, kernels::DType dtype, int64_t i);
void LoadFloats(const void* data, kernels::DType dtype, int64_t begin, int64_t n, float* dst);
void StoreFloat(void* data, kernels::DType dtype, int64_t i, float value);

// int4 packing: element i lives in byte i/2, low nibble for even i.
inline uint8_t Int4At(const uint8_t* packed, int64_t i) {
  return (i & 1) ? (packed[i >> 1] >> 4) : (packed[i >> 1] & 0x0f);
}
// Packs n nibbles (each value & 0xf) into (n+1)/2 bytes.
std::vector<uint8_t> PackInt4(const std::vector<uint8_t>& nibbles);

// ---------------------------------------------------------------------------
// Routing (§6.1, §2.4). Output: topk_weights fp32 [M, k], topk_ids int32 [M, k].
//
// Ties: selection is a stable sort by descending score, so among equal scores
// the lowest expert index wins and is listed first (what torch.topk on CPU
// returns for equal values). NaN compares greater than any number.
// RoutingMethod and ScoringFunc: kernels/common/types.h.

using ::kplan::kernels::RoutingMethod;
using ::kplan::kernels::ScoringFunc;

struct RoutingSpec {
  int num_experts = 0;  // E, the global expert count (row width of the logits)
  int top_k = 0;
  RoutingMethod method = RoutingMethod::kTopK;
  ScoringFunc scoring = ScoringFunc::kSoftmax;  // kTopK and kGroupedTopK
  bool renormalize = false;
  const float* e_score_correction_bias = nullptr;  // [E] or null
  float routed_scaling_factor = 1.0f;
  int num_expert_group = 0;  // kGroupedTopK
  int topk_group = 0;        // kGroupedTopK
};

// INVALID_ARGUMENT naming the offending field ("routing.top_k", ...).
absl::Status ValidateRoutingSpec(const RoutingSpec& spec);

// logits: fp32 [num_tokens, E].
absl::Status RouteTokens(const RoutingSpec& spec, const float* logits, int64_t num_tokens,
                         float* topk_weights, int32_t* topk_ids);

// Stable top-k of one row: indices of the k largest values, descending, ties
// to the lowest index, NaN largest.
void TopKIndices(const float* values, int n, int k, int32_t* out_ids);

// ---------------------------------------------------------------------------
// moe_align_block_size (§6.5).

struct MoeAlignResult {
  std::vector<int32_t> sorted_token_ids;  // [max_padded], tail = numel (sentinel)
  std::vector<int32_t> expert_ids;        // [ceil(max_padded / block_size)], tail = -1
  int32_t num_tokens_post_padded = 0;
};

// topk_ids: the flat [numel] ids (token-major). expert_map: [num_experts]
// global -> local id or -1, or null. Ids outside [0, num_experts) are skipped
// (as the CUDA kernel does). Without ignore_invalid_experts, blocks of
// non-local experts stay and their expert_ids entry becomes -1; with it,
// tokens of non-local experts are dropped before counting.
absl::StatusOr<MoeAlignResult> MoeAlignBlockSize(const int32_t* topk_ids, int64_t numel,
                                                 int block_size, int num_experts,
                                                 const int32_t* expert_map = nullptr,
                                                 bool pad_sorted_ids = false,
                                                 bool ignore_invalid_experts = false);

// ---------------------------------------------------------------------------
// Activations (§6.3, §2.3); MoeActivation: kernels/common/types.h.

using ::kplan::kernels::MoeActivation;

// vLLM's string ("silu", "swigluoai_uninterleave", ...).
absl::string_view MoeActivationName(MoeActivation act);
// Accepts the alias gelu_pytorch_tanh; unknown names give vLLM's text
// "Unknown MoE activation: '<s>'. Valid activations: [...]".
absl::StatusOr<MoeActivation> ParseMoeActivation(absl::string_view name);
// vLLM's is_gated: every activation without the _no_mul suffix (relu2 too).
bool IsGated(MoeActivation act);

struct ActivationParams {
  // silu: optional clamp (silu(min(x1, L)) · clamp(x2, -L, L));
  // swigluoai / swiglustep: the limit, 7.0 when absent;
  // swigluoai_uninterleave: required. Ignored by the other activations.
  absl::optional<float> clamp_limit;
  float alpha = 1.702f;  // swigluoai, swigluoai_uninterleave
  float beta = 1.0f;     // swigluoai_uninterleave: out = g·σ(α·g)·(u + β)
};

// in: [rows, in_width] fp32, out: [rows, out_width] fp32. Gated activations
// need in_width == 2 * out_width, the _no_mul ones in_width == out_width.
// Values are computed in fp32 and not rounded (callers round).
//   relu2 (gated): relu(x1)² · x2 (the and_mul form of relu2_no_mul).
//   swigluoai: interleaved, gate = x[0::2], up = x[1::2].
absl::Status ApplyActivation(MoeActivation act, const ActivationParams& params, const float* in,
                             int64_t rows, int64_t in_width, float* out, int64_t out_width);

// ---------------------------------------------------------------------------
// Experts.

enum class MoeQuantScheme {
  kNone,            // weights in fp32 / fp16 / bf16
  kFp8W8A8,         // fp8 e4m3 weights and dynamically / statically quantised activations
  kInt8WeightOnly,  // int8 weights, group scales, activations unquantised (w8a16)
  kInt4WeightOnly,  // int4 packed weights, group scales (w4a16)
};

enum class Fp8WeightScale {
  kPerTensor,   // w13_scale [E_local], w2_scale [E_local]
  kPerChannel,  // w13_scale [E_local, N13], w2_scale [E_local, H]
  kBlock,       // w13_scale [E_local, ceil(N13/bn), ceil(H/bk)], w2_scale [E_local, ceil(H/bn),
                // ceil(I/bk)]
};

enum class Fp8ActScale {
  kPerTensor,  // one scale for all rows: static (a1_scale / a2_scale) or dynamic max|x|/448
  kPerToken,   // dynamic, one scale per row: max(max|x|/448, 1/(448·512))
  // With Fp8WeightScale::kBlock activations are always quantised per 1 x block_k
  // group: scale = max(max|x|, 1e-10)/448 (per_token_group_quant_fp8), and the
  // GEMM is native_w8a8_block_matmul (per k-tile partial sums scaled, summed).
};

struct MoeQuant {
  MoeQuantScheme scheme = MoeQuantScheme::kNone;
  // kFp8W8A8
  Fp8WeightScale weight_scale = Fp8WeightScale::kPerTensor;
  Fp8ActScale act_scale = Fp8ActScale::kPerTensor;
  int block_n = 128, block_k = 128;
  absl::optional<float> a1_scale, a2_scale;  // static per-tensor scales; absent = dynamic
  // Weight scales (fp32): fp8 as above; int8/int4 group scales
  // w13_scale [E_local, N13, H/group_size], w2_scale [E_local, H, I/group_size].
  const float* w13_scale = nullptr;
  const float* w2_scale = nullptr;
  // kInt8WeightOnly / kInt4WeightOnly: groups along the reduction dim (H for
  // w13, I for w2). Dequantised w = (q - zp) · scale, rounded to the
  // activation dtype (as the Triton wna16 kernels do before the dot).
  // Without zero points: int8 is signed two's complement (zp 0), int4 is an
  // unsigned nibble with implied zp 8 (uint4b8, vLLM's symmetric layout).
  // With zero points (one unpacked uint8 per group, same shape as the
  // scales): int8 weights are read as uint8 and int4 nibbles as 0..15.
  int group_size = 128;
  const uint8_t* w13_zero = nullptr;
  const uint8_t* w2_zero = nullptr;
};

struct MoeWeights {
  kernels::DType dtype = kernels::DType::kFloat32;  // storage dtype of w13 / w2
  int num_local_experts = 0;                        // first dim of w13 / w2 (E_local)
  // w13: [E_local, 2I, H] (gated: rows [0,I) gate, [I,2I) up; swigluoai
  // interleaves them) or [E_local, I, H] for _no_mul. w2: [E_local, H, I].
  // int4: packed along the last dim ([.., H/2] and [.., I/2] bytes).
  const void* w13 = nullptr;
  const void* w2 = nullptr;
  const float* b13 = nullptr;  // [E_local, N13] or null
  const float* b2 = nullptr;   // [E_local, H] or null
  MoeQuant quant;
};

struct MoeProblem {
  int64_t num_tokens = 0;    // M
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (per partition; N13 = 2I gated, I otherwise)
  int num_experts = 0;       // E, global
  int top_k = 0;
  kernels::DType act_dtype = kernels::DType::kBFloat16;  // fp32 / fp16 / bf16: input and output
  const void* hidden_states = nullptr;                   // [M, H] in act_dtype

  // Routing: router_logits (fp32 [M, E]) with `routing`, or given topk_ids
  // (int32 [M, k]) and topk_weights (fp32 [M, k]). routing.num_experts and
  // routing.top_k default to num_experts and top_k when 0.
  const float* router_logits = nullptr;
  RoutingSpec routing;
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;

  MoeActivation activation = MoeActivation::kSilu;
  ActivationParams act_params;
  MoeWeights weights;
  const int32_t* expert_map = nullptr;  // [E]: global -> local id, -1 = not local (EP)
  bool apply_router_weight_on_input = false;
  int num_threads = 0;  // 0: automatic (1 for small problems); results never depend on it
  // The experts stop between row blocks once it has passed (RunExperts and
  // MoeReference return DEADLINE_EXCEEDED), so one request cannot hold the
  // thread that runs it past its deadline.
  absl::Time deadline = absl::InfiniteFuture();
};

// Checks sizes, pointers and option combinations; INVALID_ARGUMENT naming
// the field ("weights.quant.w13_scale", "top_k", ...).
absl::Status ValidateMoeProblem(const MoeProblem& p, bool needs_routing);

// Expert outputs per (token, slot) before weighting: per_slot_out fp32
// [M*k, H], row t = token*k + j, values rounded to act_dtype, zeros for slots
// whose expert is not local. With apply_router_weight_on_input the input rows
// are scaled by their weight first (k must be 1).
absl::Status RunExperts(const MoeProblem& p, const int32_t* topk_ids, const float* topk_weights,
                        float* per_slot_out);

// out[m, :] = Σ_j weight[m, j] · per_slot_out[m*k + j, :] in fp32 (j ascending),
// stored in out_dtype; with weights_applied_on_input the weights are skipped.
absl::Status CombineTopK(const float* per_slot_out, const float* topk_weights, int64_t num_tokens,
                         int top_k, int64_t hidden, bool weights_applied_on_input,
                         kernels::DType out_dtype, void* out);

// The whole layer: routing (unless ids/weights are given) -> experts ->
// combine. output: [M, H] in act_dtype. The routing result is written to
// topk_weights_out / topk_ids_out when not null.
absl::Status MoeReference(const MoeProblem& p, void* output, float* topk_weights_out = nullptr,
                          int32_t* topk_ids_out = nullptr);

}  // namespace kplan::moe
