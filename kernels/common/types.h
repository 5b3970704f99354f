// The vocabulary every kernel family shares (kernels/cpu, kernels/cuda,
// kernels/comm) and passes through its launchers: the element type of a
// buffer (DType) with its size, and the MoE layer's activation, routing
// method and scoring function. One enum per fact: a family that supports a
// subset (the wgmma GEMMs: bf16 / fp16; the IR ops: fp32 / fp16 / bf16)
// takes DType and validates, it does not define its own enum. Values are
// fixed: kernels receive them as ints (the routing and activation kernels
// compare against them, the IR ops keep 0..2 for fp32 / fp16 / bf16).
// Header-only, usable from host and device code (DTypeName: host only); no
// CUDA headers.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

#if defined(__CUDACC__)
#define KPLAN_HD __host__ __device__
#else
#define KPLAN_HD
#endif

namespace kplan::kernels {

// Element types of tensors. The names are torch's (DTypeName).
enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFp8E4m3 = 3,     // float8_e4m3fn: bias 7, no infinities, 0x7f/0xff = NaN, max 448
  kInt8 = 4,        // int8 (or uint8 minus a zero point, see moe::MoeQuant)
  kInt4Packed = 5,  // two 4-bit values per byte, low nibble first
  kUint8 = 6,
  kInt32 = 7,
  kInt64 = 8,
};

// Bytes of one stored element; kInt4Packed counts its storage byte (shapes of
// packed int4 tensors count bytes).
KPLAN_HD constexpr int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt64:
      return 8;
    case DType::kFp8E4m3:
    case DType::kInt8:
    case DType::kInt4Packed:
    case DType::kUint8:
      return 1;
  }
  return 1;
}

// torch's name ("float32", "bfloat16", "float8_e4m3fn", ...; "int4" for
// kInt4Packed).
constexpr absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFp8E4m3:
      return "float8_e4m3fn";
    case DType::kInt8:
      return "int8";
    case DType::kInt4Packed:
      return "int4";
    case DType::kUint8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

// fp32, fp16, bf16.
KPLAN_HD constexpr bool IsFloatDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}
// fp16, bf16: what the wgmma GEMMs, the decode kernels and the EP glue take.
KPLAN_HD constexpr bool IsHalfDType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// vLLM's MoE activations (names: moe::MoeActivationName). The gated ones come
// first: every value below kSiluNoMul is gated.
enum class MoeActivation : int {
  kSilu = 0,
  kGelu,
  kGeluTanh,
  kRelu2,
  kSwigluOai,
  kSwigluOaiUninterleave,
  kSwigluStep,
  kSiluNoMul,
  kGeluNoMul,
  kGeluTanhNoMul,
  kRelu2NoMul,
};

enum class ScoringFunc : int { kSoftmax = 0, kSigmoid = 1, kSqrtSoftplus = 2 };

// The routing variants (moe::RoutingSpec says what each computes).
enum class RoutingMethod : int {
  // fused_topk / fused_topk_bias: scores = scoring(g); select top-k on
  // scores (+ e_score_correction_bias when given); weights = unbiased scores
  // at the selected ids; renormalize: w /= Σw; then w *= routed_scaling_factor.
  // Covers vLLM Default, RenormalizeNaive, Sigmoid, SigmoidRenorm, MiniMax2,
  // DeepseekV4 (kSqrtSoftplus) and TopK.
  kTopK = 0,
  // RoutingMethodType.Renormalize: top-k on the raw logits, then softmax over
  // the k selected logits.
  kTopKThenSoftmax = 1,
  // grouped_topk (DeepSeek-V2/V3): E experts in num_expert_group contiguous
  // groups; group score = sum of the top-2 biased scores (with bias) or the max
  // score (without); keep the topk_group best groups; top-k within them on the
  // biased scores; weights = unbiased scores (with bias) or the selected
  // scores; renormalize; * routed_scaling_factor.
  kGroupedTopK = 2,
  // Llama4: top-k (top-1 in Llama 4) on the raw logits; weight = sigmoid(logit).
  kLlama4 = 3,
};

}  // namespace kplan::kernels
