// Which GPU route a quantised expert set's layer takes (server/moe/
// gpu_layer.cc, gpu_layer_emulation.cc), plain C++ so that the choice is
// unit-tested on the CPU (tests/kernels/moe_quant_route_test.cc).
//
//   kMatvec     slots on distinct experts (MoeSlotsOnDistinctExperts: one
//               token, or few slots among many experts):
//               moe_quant_matvec.cu streams each slot's weight rows whole;
//   kDecode     other decode-sized batches: moe_quant_decode.cu reads each
//               hit expert's quantised weights once for all its slots;
//   kDequant    int8 / int4 at larger batches (at every size for
//               batch-invariant calls, gpu_layer_emulation.h): the weights
//               dequantised once per call into the workspace (the
//               reference's rounding), then the bf16 / fp16 grouped GEMMs;
//               int4 with group scales up to 192 slots per hit expert
//               (MoeIntWeightsInGemms): the grouped GEMMs on the int4
//               weights, dequantised inside them to the same values;
//   kEmulation  everything else: the dequantising GEMM of moe_quant_gemm.h
//               (or, for fp8 with 16-bit activations, the fp8 tensor-core
//               grouped GEMMs behind it).
// fp8 sets whose grouped GEMMs run on the fp8 tensor cores (fp8_tc) stay on
// them past the matvec sizes: in session 6's measurements (docs/PERF.md) that
// route was as fast as or faster than the decode tiles at every decode size
// (Mixtral-8x7B fp8 per-tensor 64 tokens 562 us against 1303 us); the decode
// tiles are then opt-in (KPLAN_MOE_QUANT_ROUTE=decode). The matvec kernels
// were faster than both wherever the slots hit distinct experts (session 11:
// DeepSeek-V3 fp8 block one token 126.5 us against 154.9 on the tensor
// cores), so they take those calls on every scheme.
// The decode rule is bytes against slots: the decode kernels stream the
// weights once per tile of 8 / 16 / 32 slots of one expert, so they win while
// the average slots per hit expert fit about one tile (MoeQuantDecodeBlockFor);
// past that the weights would be read once per tile and the grouped GEMMs'
// larger tiles take over. That holds for the
// int4 GEMMs too since session 27 (docs/PERF.md): H200, us per layer, decode
// tiles against the int4 GEMMs at 16 slots per hit expert, Mixtral-8x7B 64
// tokens 572.8 / 841.5, Qwen3-30B-A3B 256 tokens 368.2 / 387.3.
// KPLAN_MOE_QUANT_ROUTE (auto | matvec | decode | dequant | emulation) forces
// a route where it applies, for A/B runs; SetMoeQuantRouteMode does the same
// from code.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace kplan::kernels::cuda {

enum class MoeQuantRoute : int { kEmulation = 0, kDecode = 1, kDequant = 2, kMatvec = 3 };
enum class MoeQuantRouteMode : int {
  kFromEnv = -1,
  kAuto = 0,
  kEmulation,
  kDecode,
  kDequant,
  kMatvec
};

// Every slot of a matrix-vector decode kernel streams its expert's weights,
// so slots that share an expert read them twice: one token (top-k ids are
// distinct), or few slots among many experts (numel^2 <= E: on average at
// most half a shared pair). The bf16 decode kernels' rule too
// (MoeDecodeApplies, moe_experts.h).
inline bool MoeSlotsOnDistinctExperts(int64_t num_tokens, int top_k, int num_experts) {
  const int64_t numel = num_tokens * top_k;
  return numel > 0 && (num_tokens == 1 || numel * numel <= num_experts);
}

// Slots per hit expert if the routing were uniform over min(E, numel)
// experts, rounded up: the estimate every kernel rule by slots uses (these
// routes, MoeGemmBlockMFor, MoeGemmWsPingPongFor).
inline int64_t MoeSlotsPerExpert(int64_t numel, int num_experts) {
  const int64_t hit = std::max<int64_t>(1, std::min<int64_t>(num_experts, numel));
  return (numel + hit - 1) / hit;
}

// Slots per decode tile (the moe_align block size) for `numel` slots over
// `num_experts` experts: 8, 16 or 32; 0 when the batch is past decode size.
// Blocks of 16 up to 16 slots per hit expert on average, though some experts
// then take two tiles: H200, int4, us per layer, blocks of 16 against 32
// (docs/PERF.md, session 27): Mixtral-8x7B 48 tokens (12 per expert) 454.2 /
// 557.0, 64 (16) 573.9 / 572.8, 80 (20) 704.6 / 597.8; Qwen3-30B-A3B 192
// (12) 252.8 / 353.2, 256 (16) 316.8 / 368.0. The same rule serves int8 and
// fp8 decode tiles, not measured in that range.
inline int MoeQuantDecodeBlockFor(int64_t numel, int num_experts) {
  if (numel <= 0 || num_experts <= 0) return 0;
  const int64_t per_expert = MoeSlotsPerExpert(numel, num_experts);
  if (per_expert <= 4) return 8;
  if (per_expert <= 16) return 16;
  if (per_expert <= 20) return 32;
  return 0;
}

// Whether the decode tiles (moe_quant_decode.cu) split a CTA's 32 weight
// rows over its 4 warps along K rather than giving each warp 32 rows of its
// own. The k-split CTA reads 256 contiguous bytes of each row a round (64 a
// warp) where a rows CTA reads 64 bytes of 128 rows, and the longer pieces
// stream faster (a reading of the measurements below; no ncu compared the
// two forms' memory traffic). It takes blocks of 8 slots whose rows hold at
// least kMoeQuantDecodeKSplitMinRowBytes (each warp then has two or more
// 64-byte steps), and any grid that would leave the chip under 32 warps an
// SM in rows: the weight stream needs that many loads in flight. Blocks of
// 16 and 32 keep rows (Mixtral-8x7B int4 64 tokens, blocks of 16: 612 us in
// rows, 652 in k-split). Measured on one H100 (docs/PERF.md, session 47
// call 5, us per layer, rows against k-split where rows hold >= 1024 bytes):
// int4 Mixtral-8x7B 16 tokens 389.9 / 328.5, DeepSeek-V3 16 / 64 tokens
// 1177 / 958 and 2555 / 2136 (2124 with GEMM 2's 1024-byte rows in rows),
// Qwen3-30B-A3B 16 / 64 135.9 / 126.0 and 191.7 / 183.6. Qwen3's 384-byte
// int4 GEMM 2 rows were slower in k-split (130.6 / 196.6 with them), its
// 768-byte int8 rows faster (int8 16 tokens 248.5 in rows, 219.0 with GEMM
// 1 alone in k-split, 214.1 with both); 512 lies between, not measured
// itself. fp8 decode tiles (opt-in where the fp8 tensor cores apply) follow
// the same rule, not measured.
inline constexpr int64_t kMoeQuantDecodeKSplitMinRowBytes = 512;
// `rows_warps`: the warps of the rows grid for the tiles expected.
inline bool MoeQuantDecodeKSplit(int block_m, int64_t row_bytes, int64_t rows_warps, int num_sms) {
  if (rows_warps < int64_t{32} * std::max(1, num_sms)) return true;
  return block_m == 8 && row_bytes >= kMoeQuantDecodeKSplitMinRowBytes;
}

// The int4 matvec tiles' K split (moe_quant_matvec.cu): a tile's 64-byte
// chunks over 1, 2, 4 or up to kMoeQuantMatvecWarps warps of a CTA, doubled
// until the grid has 8 warps per SM of an H200 (the weight stream needs
// that many loads in flight; with 32 or 16 the one-token layers took up to
// 1.15x longer, docs/PERF.md session 27) while each warp keeps two chunks at
// least. A constant rather than the device's SM count, so that the split,
// and with it the summation order, depends on the shape only.
inline constexpr int kMoeQuantMatvecWarps = 8;
inline int MoeQuantMatvecSplit(int64_t tiles, int64_t row_bytes) {
  const int64_t min_warps = int64_t{132} * 8;
  const int64_t chunks = (row_bytes / 16 + 3) / 4;
  int split = 1;
  while (split < kMoeQuantMatvecWarps && tiles * split < min_warps && chunks >= 4 * split) {
    split *= 2;
  }
  return split;
}

// Which int4 matvec form a GEMM of K columns takes (moe_quant_matvec.cu):
// the row pairs (and, for GEMM 2, the combine) where a weight row is at
// least four 512-byte spans (K >= 4096), else the tiles above. Measured on
// one H100 (docs/PERF.md, session 46, us per one-token layer, tiles against
// pairs on both GEMMs): Mixtral-8x7B (K 4096 / 14336) 102.7 / 90.3,
// DeepSeek-V3 (7168 / 2048) 108.7 / 107.3, Qwen3-30B-A3B (2048 / 768)
// 22.7 / 23.9; a row of one or two spans leaves a pair warp's loads short
// (Qwen3's GEMM 2 rows: 384 bytes).
inline constexpr int64_t kMoeQuantMatvecInt4PairsMinK = 4096;
inline bool MoeQuantMatvecInt4Pairs(int64_t K) { return K >= kMoeQuantMatvecInt4PairsMinK; }

// Whether the int route (kDequant) runs its GEMMs on the int4 weights
// themselves (the int4 GEMMs of moe_experts.h, MoeGemmIntApplies) rather
// than on a dequantised 16-bit copy of the hit experts: while the slots per
// hit expert stay at most kMoeIntWeightsMaxSlots. The warp-specialised int
// kernels (blocks of 128: 64 slots per expert and up) run the GEMMs at about half the
// 16-bit kernels' TFLOP/s but save the copy, a pass over the hit experts'
// weights whose cost against the GEMMs' falls as the slots per expert grow.
// Measured on one H200 (docs/PERF.md, session 21, int kernels against the
// copy, us): 128 slots per hit expert: Mixtral-8x7B 512 tokens 1864 / 2070,
// Qwen3-30B-A3B 2048 913 / 1044, DeepSeek-V3 4096 12756 / 15839; 256:
// Mixtral 1024 2916 / 2631, Qwen3 4096 1478 / 1385; 192: Qwen3 3072 1230 /
// 1284 (int4 GEMMs 4% ahead), Mixtral 768 2291 / 2247 (2% behind).
inline constexpr int64_t kMoeIntWeightsMaxSlots = 192;
inline bool MoeIntWeightsInGemms(int64_t numel, int num_experts) {
  return numel > 0 && num_experts > 0 &&
         MoeSlotsPerExpert(numel, num_experts) <= kMoeIntWeightsMaxSlots;
}

// The code's override (SetMoeQuantRouteMode, read and written from any
// thread) and KPLAN_MOE_QUANT_ROUTE, read once.
inline std::atomic<MoeQuantRouteMode>& MoeQuantRouteOverride() {
  static std::atomic<MoeQuantRouteMode> mode{MoeQuantRouteMode::kFromEnv};
  return mode;
}
inline void SetMoeQuantRouteMode(MoeQuantRouteMode m) { MoeQuantRouteOverride().store(m); }

inline MoeQuantRouteMode MoeQuantRouteFromEnv() {
  static const MoeQuantRouteMode mode = [] {
    const char* v = std::getenv("KPLAN_MOE_QUANT_ROUTE");
    if (v == nullptr || std::strcmp(v, "auto") == 0) return MoeQuantRouteMode::kAuto;
    if (std::strcmp(v, "emulation") == 0) return MoeQuantRouteMode::kEmulation;
    if (std::strcmp(v, "decode") == 0) return MoeQuantRouteMode::kDecode;
    if (std::strcmp(v, "dequant") == 0) return MoeQuantRouteMode::kDequant;
    if (std::strcmp(v, "matvec") == 0) return MoeQuantRouteMode::kMatvec;
    return MoeQuantRouteMode::kAuto;
  }();
  return mode;
}

inline MoeQuantRouteMode MoeQuantRouteModeNow() {
  const MoeQuantRouteMode m = MoeQuantRouteOverride().load();
  return m != MoeQuantRouteMode::kFromEnv ? m : MoeQuantRouteFromEnv();
}

// Which kernels run these weights, activations and sizes (both GEMMs):
// matvec (MoeQuantMatvecSupports), decode (MoeQuantDecodeSupports), dequant
// (MoeDequantWeightsSupports); fp8_tc: the emulation route's GEMMs are the
// fp8 tensor-core ones.
struct MoeQuantKernels {
  bool matvec = false, decode = false, dequant = false, fp8_tc = false;
};

// The route of a layer of num_tokens x top_k slots over num_experts ids. A
// forced route that does not apply falls back to the automatic choice.
inline MoeQuantRoute MoeQuantRouteFor(const MoeQuantKernels& ok, int64_t num_tokens, int top_k,
                                      int num_experts, MoeQuantRouteMode mode) {
  const int64_t numel = num_tokens * top_k;
  const bool decode_sized = MoeQuantDecodeBlockFor(numel, num_experts) > 0;
  switch (mode) {
    case MoeQuantRouteMode::kEmulation:
      return MoeQuantRoute::kEmulation;
    case MoeQuantRouteMode::kMatvec:
      if (ok.matvec && numel > 0) return MoeQuantRoute::kMatvec;
      break;
    case MoeQuantRouteMode::kDecode:
      if (ok.decode && numel > 0) return MoeQuantRoute::kDecode;
      break;
    case MoeQuantRouteMode::kDequant:
      if (ok.dequant) return MoeQuantRoute::kDequant;
      break;
    default:
      break;
  }
  if (ok.matvec && MoeSlotsOnDistinctExperts(num_tokens, top_k, num_experts)) {
    return MoeQuantRoute::kMatvec;
  }
  if (ok.decode && decode_sized && !ok.fp8_tc) {
    return MoeQuantRoute::kDecode;
  }
  if (ok.dequant) return MoeQuantRoute::kDequant;
  return MoeQuantRoute::kEmulation;
}

}  // namespace kplan::kernels::cuda
