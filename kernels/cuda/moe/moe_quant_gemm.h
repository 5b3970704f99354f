// The `emulation` half of the GPU MoE layer: a grouped GEMM that reads the
// expert weights in their stored form (fp32 / fp16 / bf16, fp8 e4m3 with
// per-tensor, per-channel or block scales, int8 / int4 with group scales and
// optional zero points), dequantises each weight tile on its way into shared
// memory and multiplies with fp32 accumulation; plus the fp8 activation
// quantisers and the fp32 elementwise steps (activation, combine, input
// scaling) that the bf16 / fp16 launchers of moe_experts.h do not cover.
//
// Why a second GEMM: the fast kernels (moe_experts.h) take operands that
// tensor cores consume as stored. Quantised sets stay resident in their
// compact form (no bf16 copy of the whole set), so every tile is decoded in
// the kernel, at the points and with the roundings of the CPU reference
// (kernels/cpu/moe/moe_experts.cc), which keeps the GPU within summation-order
// error of it:
//   * int8 / int4: w = (q - zp) · scale, rounded to the activation dtype;
//   * fp8: activations quantised beforehand (LaunchMoeFp8Quantize, the
//     reference's QuantizeRows); the GEMM multiplies the fp8 values and
//     applies activation x weight scales (per k-block for block scales);
//   * float weights in another dtype than the activations: plain values.
// Two compute modes, chosen by the launcher: tensor cores (mma.sync
// m16n8k16, bf16 or fp16 inputs, fp32 accumulate) where every decoded operand
// is exactly representable in the 16-bit input type (fp8 values always are in
// fp16; int8/int4 weights rounded to bf16/fp16 activations are), else an
// exact fp32 SIMT path (fp32 activations with int / float weights; fp8 block
// scales whose block_k is not a multiple of the k step). Never TF32.
//
// Same tile contract as MoeGroupedGemmArgs (moe_experts.h) over the
// moe_align_block_size output, for any align block size: tile t covers
// sorted_token_ids[t*block_m, (t+1)*block_m) of expert expert_ids[t];
// sentinel slots are skipped, expert -1 writes zero rows, tiles at or past
// *num_tokens_post_padded do nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_ops.h"

namespace kplan::kernels::cuda {

enum class MoeWeightScale : int {
  kNone,        // float weights
  kPerTensor,   // fp8: scale[E_local]
  kPerChannel,  // fp8: scale[E_local, N]
  kBlock,       // fp8: scale[E_local, ceil(N/block_n), ceil(K/block_k)]
  kGroup,       // int8 / int4: scale[E_local, N, K/group_size], zero the same shape or null
};

struct MoeQuantWeights {
  DType kind = DType::kBFloat16;
  MoeWeightScale scale_kind = MoeWeightScale::kNone;
  const void* data = nullptr;    // device
  const float* scale = nullptr;  // device, or null for kNone
  // kGroup only: uint8 zero points (int8 weights are then read as uint8 and
  // int4 nibbles as 0..15). Null: int8 signed, int4 with implied zp 8.
  const uint8_t* zero = nullptr;
  int block_n = 128, block_k = 128;  // kBlock
  int group_size = 128;              // kGroup
};

// One grouped GEMM: for each slot s of a tile (s < numel) and column n < N
//   C[s, n] = round_c(Σ_k A[s / a_row_div, k] · W[e, n, k]  (with scales))
// and with bias round_c(round_c(acc) + round_c(bias[e, n])).
// A is either float (a_type) or fp8 e4m3 bytes with fp32 scales a_scale:
// [a_rows] per row (a_group == 0) or [a_rows, ceil(K / a_group)] per 1 x a_group
// group (fp8 block weights need a_group == block_k). fp8 weights need fp8 A
// and the other weights float A.
struct MoeQuantGemmArgs {
  DType a_type = DType::kBFloat16;  // when !a_fp8
  bool a_fp8 = false;
  const void* a = nullptr;
  const float* a_scale = nullptr;
  int a_group = 0;
  int a_row_div = 1;
  MoeQuantWeights w;
  const float* bias = nullptr;  // [E_local, N] fp32 or null
  DType c_type = DType::kBFloat16;
  void* c = nullptr;  // [numel, N]
  const int32_t* sorted_token_ids = nullptr;
  const int32_t* expert_ids = nullptr;
  const int32_t* num_tokens_post_padded = nullptr;
  int block_m = 64;  // the moe_align_block_size block size (any positive value)
  int64_t numel = 0;
  int64_t num_blocks = 0;  // entries of expert_ids
  int64_t N = 0;
  int64_t K = 0;  // a multiple of 8
  int num_local_experts = 0;
};

absl::Status LaunchMoeQuantGemm(const MoeQuantGemmArgs& args, cudaStream_t stream);

// fp8 activation quantisation, as the CPU reference's QuantizeRows /
// TensorScale (moe_kernel_quantize_input), bit for bit:
//   kPerToken:  s[r] = max(max|x_r| / 448, 1 / (448·512))
//   kPerTensor: s = static_scale when > 0, else max|x| / 448 over all rows
//               (1 when every element is 0); written to every s[r]
//   kPerGroup:  s[r, g] = max(max|x_{r,g}|, 1e-10) / 448 over 1 x group
// q = fp8_e4m3(x / s) saturated to ±448, round to nearest even.
// in: [rows, K] of in_type; q: uint8 [rows, K]; scale: [rows] or
// [rows, ceil(K/group)]. kPerTensor without a static scale needs `scratch`
// (kMoeFp8QuantScratchFloats device floats: per-block maxima, written before
// they are read, so no zeroing; the next launch on the same stream may reuse
// them, since every kernel of the chain waits for its predecessor).
enum class MoeFp8ActQuant : int { kPerToken, kPerTensor, kPerGroup };
inline constexpr int kMoeFp8QuantScratchFloats = 132 * 16;  // 16 CTAs per SM of an H200
absl::Status LaunchMoeFp8Quantize(MoeFp8ActQuant mode, DType in_type, const void* in, int64_t rows,
                                  int64_t K, int group, float static_scale, float* scratch,
                                  uint8_t* q, float* scale, cudaStream_t stream);

// LaunchMoeRouting (moe_ops.h) of the logits, then LaunchMoeFp8Quantize of
// `in`, the same results; as one kernel where the quantiser is per group on
// 2-byte rows with group <= 128 (K and group multiples of 4, `in` 8-byte and
// q 4-byte aligned): its blocks beside the routing ones, neither reading
// what the other writes, so that a decode layer's chain of kernels has one
// link less. Bad arguments of the quantiser are reported before the
// routing's.
absl::Status LaunchMoeRoutingAndFp8Quantize(const MoeRoutingParams& routing, const float* logits,
                                            int64_t num_tokens, float* topk_weights,
                                            int32_t* topk_ids, MoeFp8ActQuant mode, DType in_type,
                                            const void* in, int64_t rows, int64_t K, int group,
                                            float static_scale, float* scratch, uint8_t* q,
                                            float* scale, cudaStream_t stream);

// fp32 versions of the moe_experts.h elementwise steps (same formulas and
// rounding points; fp32 rounding is the identity).
absl::Status LaunchMoeActivationF32(MoeActivation act, const MoeActParams& params, const float* in,
                                    int64_t rows, int64_t in_width, float* out, int64_t out_width,
                                    cudaStream_t stream);
absl::Status LaunchMoeCombineF32(const float* y, const float* topk_weights, int64_t num_tokens,
                                 int top_k, int64_t hidden, float* out, cudaStream_t stream);
absl::Status LaunchMoeScaleRowsF32(const float* a, const float* row_weights, int64_t rows,
                                   int64_t width, float* out, cudaStream_t stream);

// Decode-sized quantised expert GEMMs (moe_quant_decode.cu): over the
// moe_align_block_size output with block_m 8, 16 or 32 (MoeQuantDecodeBlockFor,
// moe_quant_route.h), one CTA per (tile, 128 weight rows), or per (tile, 32
// rows) with K split over its warps (MoeQuantDecodeKSplit), reads each weight
// row once for all the tile's slots (16-byte loads), dequantises it in
// registers and multiplies on mma.sync m16n8k16 (weights the 16-row operand,
// slots the 8-column one), fp32 accumulation. Arithmetic as
// LaunchMoeQuantGemm's (the reference's): fp8 weights need A quantised by
// LaunchMoeFp8Quantize (e4m3 bytes; a_scale per row, or per 1 x block_k
// group for block scales), block scales applied per k-block; int8 / int4
// weights w = round_T((q - zp)·scale) against A of act_type. Output
// C[s, n] of act_type rounded as the grouped GEMMs round (bias too); with
// apply_act the activation is fused (gated: C is [numel, N/2], the
// activation of the gate and up rows, as LaunchMoeActivation computes it).
// Slots of a non-local expert (expert -1) get zero rows.
struct MoeQuantDecodeArgs {
  DType act_type = DType::kBFloat16;  // bf16 / fp16
  const void* a = nullptr;
  const float* a_scale = nullptr;  // fp8 weights only
  int a_row_div = 1;
  MoeQuantWeights w;
  const float* bias = nullptr;  // [E_local, N] fp32 or null
  const int32_t* sorted_token_ids = nullptr;
  const int32_t* expert_ids = nullptr;
  const int32_t* num_tokens_post_padded = nullptr;
  int block_m = 8;
  int64_t numel = 0, num_blocks = 0, N = 0, K = 0;
  int num_local_experts = 0;
  bool apply_act = false;
  MoeActivation act = MoeActivation::kSilu;
  MoeActParams act_params;
  void* c = nullptr;
  int num_sms = 132;  // picks rows or k-split CTAs
};
// What the decode kernels run: bf16 / fp16 activations; fp8 per-tensor,
// per-channel or block scales with block_k % 64 == 0, K % 16 == 0; int8 /
// int4 with group sizes that are multiples of 16 / 32 and divide K; K below
// 2^30 (the tiles' k arithmetic is 32-bit).
bool MoeQuantDecodeSupports(const MoeQuantWeights& w, DType act_type, int64_t N, int64_t K);
absl::Status LaunchMoeQuantDecode(const MoeQuantDecodeArgs& args, cudaStream_t stream);

// The same GEMMs in matrix-vector form (moe_quant_matvec.cu) for slots on
// distinct experts (MoeSlotsOnDistinctExperts, moe_quant_route.h), where a
// decode tile would hold one slot: each slot's weight rows streamed once with
// 16-byte loads (fp8: a warp per row pair, or two with the combine, on
// mma.sync e4m3, 512 bytes of a row a load; int4 from K 4096
// (MoeQuantMatvecInt4Pairs): the same row pairs, two a warp, on mma.sync
// in T, the weights dequantised in registers; shorter int4 rows: tiles of
// 16 rows on mma.sync, K split over the warps of a CTA while the grid is
// small; int8: one warp per row pair or 4 rows, dequantised in registers),
// fp32 accumulation. Arithmetic, output and rounding as
// LaunchMoeQuantDecode's; the slots come from topk_ids (through expert_map,
// as the align kernel maps them; -1 or out of range: zero rows) instead of
// the align output, so no align kernel runs before it.
struct MoeQuantMatvecArgs {
  // The GEMM; its align fields (sorted_token_ids, expert_ids,
  // num_tokens_post_padded, block_m, num_blocks) and num_sms are not read.
  MoeQuantDecodeArgs gemm;
  const int32_t* topk_ids = nullptr;    // [gemm.numel]
  const int32_t* expert_map = nullptr;  // [num_experts] or null
  int num_experts = 0;
  // GEMM 2 with the combine (where MoeQuantMatvecCombines; no activation,
  // a_row_div 1): gemm.c is the layer's output [gemm.numel / top_k, N] =
  // Σ_j w_j · y_j in slot order, y_j rounded as GEMM 2 stores it
  // (topk_weights null: a plain sum), as LaunchMoeCombine computes it from
  // the GEMM's output. Launched with PDL, this kernel reads topk_ids,
  // expert_map and the expert weights before its wait for the kernel before it
  // (pdl.cuh): those must be complete when that kernel starts, i.e.
  // written by a kernel two or more launches back (the routing, in the
  // layer), never by the launch right before it.
  bool combine = false;
  int top_k = 0;
  const float* topk_weights = nullptr;  // [gemm.numel]
};
// What the matvec kernels run: what MoeQuantDecodeSupports takes, with
// N x K / 16 up to 2^31 - 1.
bool MoeQuantMatvecSupports(const MoeQuantWeights& w, DType act_type, int64_t N, int64_t K);
absl::Status LaunchMoeQuantMatvec(const MoeQuantMatvecArgs& args, cudaStream_t stream);
// Whether LaunchMoeQuantMatvec takes the combine into a GEMM 2 (no
// activation) of weights w, K columns and top_k slots a token: fp8, and int4
// where it takes the row pairs (MoeQuantMatvecInt4Pairs), top_k 1-8.
bool MoeQuantMatvecCombines(const MoeQuantWeights& w, int top_k, int64_t K);

// The int prefill route: hit[l] = 1 for every local expert some slot routes
// to (zeroed first), then the hit experts' int8 / int4 weights dequantised
// to out_type (bf16 / fp16) with the reference's rounding into `out`
// ([num_local, N, K]; experts not hit are left unwritten), for the bf16 /
// fp16 grouped GEMMs of moe_experts.h.
absl::Status LaunchMoeExpertsHit(const int32_t* topk_ids, int64_t numel, int num_experts,
                                 const int32_t* expert_map, int num_local, uint8_t* hit,
                                 cudaStream_t stream);
bool MoeDequantWeightsSupports(const MoeQuantWeights& w, DType out_type, int64_t N, int64_t K);
absl::Status LaunchMoeDequantWeights(const MoeQuantWeights& w, int num_local, int64_t N, int64_t K,
                                     const uint8_t* hit, DType out_type, void* out,
                                     cudaStream_t stream);

}  // namespace kplan::kernels::cuda
