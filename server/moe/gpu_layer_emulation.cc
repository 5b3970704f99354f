#include "server/moe/gpu_layer_emulation.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cuda/runtime/buffers.h"
#include "base/status.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;

// The align block of this route: the dequantising GEMM takes any size; 64
// rows is its CTA tile.
constexpr int kBlockM = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What the experts' spec asks of the route.
struct Scheme {
  bool fp8 = false, block = false, per_token = false;
  bool fp8_tc = false;  // GEMMs on the fp8 tensor cores (LaunchMoeGroupedGemm)
  int block_k = 128;
  float a1_static = 0.0f, a2_static = 0.0f;  // 0: dynamic per-tensor
  kc::MoeQuantWeights w13, w2;
};

Scheme SchemeOf(const GpuExperts& experts) {
  const ExpertsSpec& spec = experts.spec();
  const ExpertsQuantSpec& q = spec.quant;
  Scheme s;
  kc::MoeQuantWeights w;
  w.block_n = q.block_n;
  w.block_k = q.block_k;
  w.group_size = q.group_size;
  if (q.scheme.empty()) {
    w.kind = spec.dtype == kernels::DType::kFloat32   ? kernels::DType::kFloat32
             : spec.dtype == kernels::DType::kFloat16 ? kernels::DType::kFloat16
                                                      : kernels::DType::kBFloat16;
    w.scale_kind = kc::MoeWeightScale::kNone;
  } else if (q.scheme.rfind("fp8", 0) == 0) {
    s.fp8 = true;
    s.fp8_tc = experts.Fp8OnTensorCores();
    s.block = q.scheme == "fp8_block";
    s.per_token = !s.block && q.activation_scale == "per_token";
    s.block_k = q.block_k;
    if (!s.block && !s.per_token) {
      s.a1_static = q.a1_scale.value_or(0.0f);
      s.a2_static = q.a2_scale.value_or(0.0f);
    }
    w.kind = kernels::DType::kFp8E4m3;
    w.scale_kind = s.block                         ? kc::MoeWeightScale::kBlock
                   : q.scheme == "fp8_per_channel" ? kc::MoeWeightScale::kPerChannel
                                                   : kc::MoeWeightScale::kPerTensor;
  } else {
    w.kind = q.scheme == "int4_group" ? kernels::DType::kInt4Packed : kernels::DType::kInt8;
    w.scale_kind = kc::MoeWeightScale::kGroup;
  }
  s.w13 = s.w2 = w;
  s.w13.data = experts.w13();
  s.w13.scale = experts.w13_scale();
  s.w13.zero = experts.w13_zero();
  s.w2.data = experts.w2();
  s.w2.scale = experts.w2_scale();
  s.w2.zero = experts.w2_zero();
  return s;
}

struct Layout {
  int block_m = kBlockM;
  int64_t max_padded = 0, max_blocks = 0;
  int64_t sorted = 0, eids = 0, post = 0, scaled = -1, c1 = 0, c2 = 0, y = -1;
  int64_t q1 = -1, s1 = -1, q2 = -1, s2 = -1, scratch = -1;
  int64_t bytes = 0;
};

// decode_block: the decode kernels' align block (8 / 16 / 32), 0 for the
// grouped GEMMs.
Layout LayoutFor(const GpuExperts& experts, const Scheme& s, int64_t M, int k, int E,
                 int64_t act_bytes, bool scale_rows, bool separate_y, int decode_block,
                 bool batch_invariant = false) {
  Layout l;
  const int64_t H = experts.spec().hidden, I = experts.spec().intermediate;
  const int64_t N13 = experts.n13(), numel = M * k;
  // fp8 on tensor cores aligns with the wgmma GEMM's block (16 / 64 / 128
  // by batch); sized for the largest of them (and of the decode blocks), as
  // the choice depends on M. Batch-invariant (MoeLayerArgs): no decode
  // kernels and one block for every M.
  l.block_m =
      decode_block > 0 ? decode_block
      : !s.fp8_tc      ? kBlockM
      : batch_invariant
          ? kMoeBatchInvariantBlockM
          : std::min(kc::MoeGemmBlockMFor(numel, E, std::min(H, I), /*ping_pong=*/false), 128);
  for (int bm : {8, 16, 32, 64, 128}) {
    if (!s.fp8_tc && bm != kBlockM && bm > 32) continue;
    l.max_padded = std::max(l.max_padded, kc::MoeAlignMaxPadded(numel, E, bm, false));
    l.max_blocks = std::max(l.max_blocks, kc::MoeAlignMaxBlocks(numel, E, bm, false));
  }
  auto reserve = [&l](int64_t bytes) { return kc::ReserveAligned(&l.bytes, bytes); };
  l.sorted = reserve(l.max_padded * 4);
  l.eids = reserve(l.max_blocks * 4);
  l.post = reserve(4);
  if (scale_rows) l.scaled = reserve(M * H * act_bytes);
  if (s.fp8) {
    l.q1 = reserve(M * H);
    l.s1 = reserve(M * (s.block ? CeilDiv(H, s.block_k) : 1) * 4);
    l.q2 = reserve(numel * I);
    l.s2 = reserve(numel * (s.block ? CeilDiv(I, s.block_k) : 1) * 4);
    l.scratch = reserve(int64_t{4} * kc::kMoeFp8QuantScratchFloats);
  }
  l.c1 = reserve(numel * N13 * act_bytes);
  l.c2 = reserve(numel * I * act_bytes);
  if (separate_y) l.y = reserve(numel * H * act_bytes);
  return l;
}

template <typename T>
T* At(void* base, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// The fp8 tensor-core form (moe_experts.h) of an fp8 GEMM of this route.
kc::MoeGroupedGemmArgs Fp8TensorCoreGemm(const kc::MoeQuantGemmArgs& q, kernels::DType out) {
  kc::MoeGroupedGemmArgs g;
  g.dtype = out;
  g.fp8 = true;
  g.a = q.a;
  g.a_row_div = q.a_row_div;
  g.a_scale = q.a_scale;
  g.w = q.w.data;
  g.w_scale = q.w.scale;
  g.w_scale_kind = q.w.scale_kind == kc::MoeWeightScale::kBlock ? kc::MoeFp8WeightScale::kBlock
                   : q.w.scale_kind == kc::MoeWeightScale::kPerChannel
                       ? kc::MoeFp8WeightScale::kPerChannel
                       : kc::MoeFp8WeightScale::kPerTensor;
  g.bias = q.bias;
  g.c = q.c;
  g.sorted_token_ids = q.sorted_token_ids;
  g.expert_ids = q.expert_ids;
  g.num_tokens_post_padded = q.num_tokens_post_padded;
  g.numel = q.numel;
  g.num_blocks = q.num_blocks;
  g.N = q.N;
  g.K = q.K;
  g.num_local_experts = q.num_local_experts;
  g.block_m = q.block_m;
  return g;
}

// An fp8 GEMM on the tensor cores: the warp-specialised TMA kernel on blocks of 128
// (moe_gemm_ws_fp8.h; KPLAN_MOE_FP8_GEMM=old forces the other), else
// LaunchMoeGroupedGemm's cp.async one. Same contract, same result up to the
// summation order inside a k-block.
absl::Status LaunchFp8TensorCoreGemm(const kc::MoeGroupedGemmArgs& g, cudaStream_t stream) {
  if (kc::MoeGemmWsFp8Enabled() && kc::MoeGemmWsFp8Applies(g)) {
    const absl::Status st = kc::LaunchMoeGroupedGemmWsFp8(g, stream);
    if (!absl::IsUnavailable(st)) return st;  // else no tensor map: the other kernel
  }
  return kc::LaunchMoeGroupedGemm(g, stream);
}

kernels::DType FloatTypeOf(kernels::DType d) {
  return d == kernels::DType::kFloat32   ? kernels::DType::kFloat32
         : d == kernels::DType::kFloat16 ? kernels::DType::kFloat16
                                         : kernels::DType::kBFloat16;
}

// The route's grouped GEMMs multiply on the fp8 tensor cores: fp8 weights
// that can (Scheme::fp8_tc) with 16-bit activations; fp32 activations take
// the dequantising GEMM. The one rule for the layer, its route choice and
// the name of the kernel that ran.
bool OnFp8TensorCores(const Scheme& s, kernels::DType act_dtype) {
  return s.fp8_tc && act_dtype != kernels::DType::kFloat32;
}

// Which of kplan's quantised kernels take a set's weights with activations
// of `ft` (both GEMMs), and whether its GEMMs run on the fp8 tensor cores.
kc::MoeQuantKernels QuantKernelsFor(const GpuExperts& experts, const Scheme& s, kernels::DType ft) {
  const ExpertsSpec& spec = experts.spec();
  const int64_t H = spec.hidden, I = spec.intermediate, N13 = experts.n13();
  kc::MoeQuantKernels q;
  q.matvec =
      kc::MoeQuantMatvecSupports(s.w13, ft, N13, H) && kc::MoeQuantMatvecSupports(s.w2, ft, H, I);
  q.decode =
      kc::MoeQuantDecodeSupports(s.w13, ft, N13, H) && kc::MoeQuantDecodeSupports(s.w2, ft, H, I);
  q.dequant = !s.fp8 && kc::MoeDequantWeightsSupports(s.w13, ft, N13, H) &&
              kc::MoeDequantWeightsSupports(s.w2, ft, H, I);
  q.fp8_tc = OnFp8TensorCores(s, ft);
  return q;
}

}  // namespace

bool IntKernelsApply(const GpuExperts& experts, kernels::DType act_dtype) {
  const Scheme s = SchemeOf(experts);
  if (experts.spec().quant.scheme.empty() || s.fp8) return false;
  if (act_dtype != kernels::DType::kBFloat16 && act_dtype != kernels::DType::kFloat16) {
    return false;
  }
  const kc::MoeQuantKernels q = QuantKernelsFor(experts, s, act_dtype);
  return q.decode || q.dequant;  // matvec takes what decode takes
}

GpuLayerFacts GpuLayerFactsOf(const GpuExperts& experts, kernels::DType act_dtype,
                              int64_t num_tokens, int top_k, int num_experts,
                              bool batch_invariant) {
  GpuLayerFacts f;
  f.quantised = !experts.spec().quant.scheme.empty();
  if (!f.quantised) {
    f.fast_path = experts.FastPathFor(act_dtype);
    return f;
  }
  f.quant_route = QuantRouteOf(experts, act_dtype, num_tokens, top_k, num_experts, batch_invariant);
  // EnqueueEmulationLayer's `tc`.
  f.fp8_tensor_cores = OnFp8TensorCores(SchemeOf(experts), act_dtype);
  return f;
}

kc::MoeQuantRoute QuantRouteOf(const GpuExperts& experts, kernels::DType act_dtype,
                               int64_t num_tokens, int top_k, int num_experts,
                               bool batch_invariant) {
  const ExpertsSpec& spec = experts.spec();
  if (spec.quant.scheme.empty()) return kc::MoeQuantRoute::kEmulation;
  const Scheme s = SchemeOf(experts);
  const kernels::DType ft = FloatTypeOf(act_dtype);
  const int64_t H = spec.hidden, I = spec.intermediate, N13 = experts.n13();
  const kc::MoeQuantKernels ok = QuantKernelsFor(experts, s, ft);
  if (batch_invariant) {
    // The dequant route keeps a 16-bit copy of every expert in the workspace
    // (DequantLayoutAfter), which a decode-sized call would not otherwise
    // need: only while that copy stays under 4 GiB; past it the emulation
    // GEMM (one block size at every M) keeps the route independent of M too.
    constexpr int64_t kMaxCopyBytes = int64_t{4} << 30;
    const int64_t copy = int64_t{spec.num_experts} * (N13 * H + H * I) * 2;
    return ok.dequant && copy <= kMaxCopyBytes ? kc::MoeQuantRoute::kDequant
                                               : kc::MoeQuantRoute::kEmulation;
  }
  return kc::MoeQuantRouteFor(ok, num_tokens, top_k, num_experts, kc::MoeQuantRouteModeNow());
}

kc::MoeQuantWeights QuantWeightsOf(const GpuExperts& experts, bool w13) {
  const Scheme s = SchemeOf(experts);
  return w13 ? s.w13 : s.w2;
}

int64_t EmulationLayerWorkspaceBytes(const GpuExperts& experts, int64_t max_tokens, int top_k,
                                     int num_experts, kernels::DType act_dtype) {
  const int64_t act_bytes = kernels::DTypeSize(act_dtype);
  return LayoutFor(experts, SchemeOf(experts), max_tokens, top_k, num_experts, act_bytes,
                   /*scale_rows=*/true, /*separate_y=*/true, /*decode_block=*/0)
      .bytes;
}

absl::Status EnqueueEmulationLayer(const GpuExperts& experts, const MoeLayerArgs& a,
                                   kernels::DType act_dtype, void* workspace,
                                   int64_t workspace_bytes, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (!moe::IsFloatDType(act_dtype)) {
    return InvalidField("act_dtype", absl::StrCat("activations must be float32, float16 or "
                                                  "bfloat16, got ",
                                                  kernels::DTypeName(act_dtype)));
  }
  const ExpertsSpec& spec = experts.spec();
  const Scheme s = SchemeOf(experts);
  const int64_t M = a.num_tokens;
  const int k = a.top_k, E = a.num_experts;
  const int64_t H = spec.hidden, I = spec.intermediate, N13 = experts.n13();
  const int64_t numel = M * k;
  const bool f32 = act_dtype == kernels::DType::kFloat32;
  const int64_t act_bytes = f32 ? 4 : 2;
  const kc::MoeQuantRoute route = QuantRouteOf(experts, act_dtype, M, k, E, a.batch_invariant);
  const bool matvec = route == kc::MoeQuantRoute::kMatvec;
  const bool decode = route == kc::MoeQuantRoute::kDecode;
  int decode_block = 0;
  if (decode) {
    decode_block = kc::MoeQuantDecodeBlockFor(numel, E);
    if (decode_block == 0) decode_block = 32;  // forced past decode size
  }
  const Layout l = LayoutFor(experts, s, M, k, E, act_bytes, a.apply_router_weight_on_input,
                             a.combine, decode_block, a.batch_invariant);
  if (workspace == nullptr || workspace_bytes < l.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueMoeLayer: workspace of ", workspace_bytes, " bytes, need ", l.bytes));
  }
  const kernels::DType ft = FloatTypeOf(act_dtype);
  // The bf16 / fp16 elementwise launchers of moe_experts.h; fp32 has its own.
  const kernels::DType et =
      ft == kernels::DType::kFloat16 ? kernels::DType::kFloat16 : kernels::DType::kBFloat16;

  int32_t* sorted = At<int32_t>(workspace, l.sorted);
  int32_t* eids = At<int32_t>(workspace, l.eids);
  int32_t* post = At<int32_t>(workspace, l.post);
  // fp8: quantise the GEMM's A operand as the reference's QuantizeRows does.
  const kc::MoeFp8ActQuant qmode = s.block       ? kc::MoeFp8ActQuant::kPerGroup
                                   : s.per_token ? kc::MoeFp8ActQuant::kPerToken
                                                 : kc::MoeFp8ActQuant::kPerTensor;
  // Decode sizes: routing and GEMM 1's A quantised by one launcher, one
  // kernel where the quantiser fits extra blocks of the routing kernel (per
  // group: LaunchMoeRoutingAndFp8Quantize; the hidden rows as given), one
  // kernel fewer on the layer's critical path.
  float* scratch = s.fp8 ? At<float>(workspace, l.scratch) : nullptr;
  const bool quantise_a1_with_routing =
      s.fp8 && (matvec || decode) && a.router_logits != nullptr && !a.apply_router_weight_on_input;
  MoeLayerArgs to_align = a;
  if (quantise_a1_with_routing) {
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeRoutingAndFp8Quantize(
        a.routing, a.router_logits, M, a.topk_weights, a.topk_ids, qmode, ft, a.hidden, M, H,
        s.block_k, s.a1_static, scratch, At<uint8_t>(workspace, l.q1), At<float>(workspace, l.s1),
        stream));
    to_align.router_logits = nullptr;  // routed above: the align (if any) only
  }
  KPLAN_RETURN_IF_ERROR(EnqueueRoutingAndAlign(to_align, matvec ? 0 : l.block_m, sorted, eids, post,
                                               nullptr, stream));
  const void* a1 = a.hidden;
  if (a.apply_router_weight_on_input) {
    void* scaled = At<void>(workspace, l.scaled);
    KPLAN_RETURN_IF_ERROR(
        f32 ? kc::LaunchMoeScaleRowsF32(static_cast<const float*>(a.hidden), a.topk_weights, M, H,
                                        static_cast<float*>(scaled), stream)
            : kc::LaunchMoeScaleRows(et, a.hidden, a.topk_weights, M, H, scaled, stream));
    a1 = scaled;
  }

  // Makes `g`'s A operand the fp8 quantisation of `in` ([rows, K]) into the
  // workspace's q / scale buffers at the given offsets.
  // `quantised`: already there (quantise_a1_with_routing).
  auto quantise_a = [&](kc::MoeQuantGemmArgs& g, const void* in, int64_t rows, int64_t K,
                        float static_scale, int64_t q_at, int64_t s_at,
                        bool quantised = false) -> absl::Status {
    if (!quantised) {
      KPLAN_RETURN_IF_ERROR(kc::LaunchMoeFp8Quantize(
          qmode, ft, in, rows, K, s.block_k, static_scale, scratch, At<uint8_t>(workspace, q_at),
          At<float>(workspace, s_at), stream));
    }
    g.a_fp8 = true;
    g.a = At<void>(workspace, q_at);
    g.a_scale = At<float>(workspace, s_at);
    g.a_group = s.block ? s.block_k : 0;
    return absl::OkStatus();
  };

  kc::MoeQuantGemmArgs g1;
  g1.a_type = ft;
  g1.a = a1;
  g1.a_row_div = k;
  if (s.fp8) {
    KPLAN_RETURN_IF_ERROR(
        quantise_a(g1, a1, M, H, s.a1_static, l.q1, l.s1, quantise_a1_with_routing));
  }
  g1.w = s.w13;
  g1.bias = experts.b13();
  g1.c_type = ft;
  g1.c = At<void>(workspace, l.c1);
  g1.sorted_token_ids = sorted;
  g1.expert_ids = eids;
  g1.num_tokens_post_padded = post;
  g1.block_m = l.block_m;
  g1.numel = numel;
  g1.num_blocks = l.max_blocks;
  g1.N = N13;
  g1.K = H;
  g1.num_local_experts = spec.num_experts;
  const bool tc = OnFp8TensorCores(s, act_dtype);
  kc::MoeActParams ap;  // the ExpertSet's activation with default ActivationParams
  const auto act = experts.activation();
  void* c2 = At<void>(workspace, l.c2);
  // A GEMM of this route on the decode kernels (tiles over the align output)
  // or the matvec ones (on the slots as routed).
  // combine (matvec, GEMM 2): c is the layer's output (MoeQuantMatvecArgs).
  auto decode_gemm = [&](const kc::MoeQuantGemmArgs& g, bool apply_act, void* c,
                         bool combine = false) {
    kc::MoeQuantDecodeArgs d;
    d.act_type = et;
    d.a = g.a;
    d.a_scale = g.a_scale;
    d.a_row_div = g.a_row_div;
    d.w = g.w;
    d.bias = g.bias;
    d.sorted_token_ids = sorted;
    d.expert_ids = eids;
    d.num_tokens_post_padded = post;
    d.block_m = l.block_m;
    d.numel = numel;
    d.num_blocks = l.max_blocks;
    d.N = g.N;
    d.K = g.K;
    d.num_local_experts = spec.num_experts;
    d.apply_act = apply_act;
    d.act = act;
    d.act_params = ap;
    d.c = c;
    d.num_sms = DeviceSmCount(experts.device());
    const float* w = a.apply_router_weight_on_input ? nullptr : a.topk_weights;
    return matvec ? kc::LaunchMoeQuantMatvec(
                        {d, a.topk_ids, a.expert_map, E, combine, k, combine ? w : nullptr}, stream)
                  : kc::LaunchMoeQuantDecode(d, stream);
  };
  // fp8 block scales with 1 x 128 groups on the warp-specialised kernel:
  // GEMM 1's epilogue applies the activation and quantises GEMM 2's A itself
  // (moe_gemm_ws_fp8.h: the bytes and scales of the three steps below).
  bool a2_quantised = false;
  if (!matvec && !decode && tc && qmode == kc::MoeFp8ActQuant::kPerGroup &&
      kc::MoeGemmWsFp8ActQuantFor(numel, E, H)) {
    const kc::MoeGroupedGemmArgs f = Fp8TensorCoreGemm(g1, et);
    if (kc::MoeGemmWsFp8ActQuantApplies(f, act, s.block_k)) {
      const absl::Status st = kc::LaunchMoeGroupedGemmWsFp8ActQuant(
          f, ap, At<uint8_t>(workspace, l.q2), At<float>(workspace, l.s2), stream);
      if (!st.ok() && !absl::IsUnavailable(st)) return st;  // unavailable: the steps below
      a2_quantised = st.ok();
    }
  }
  // GEMM 1 and the activation into c2 (not written where GEMM 1 quantised
  // GEMM 2's A above).
  if (!a2_quantised) {
    if (matvec || decode) {
      // GEMM 1 with the activation, straight into c2.
      KPLAN_RETURN_IF_ERROR(decode_gemm(g1, /*apply_act=*/true, c2));
    } else {
      KPLAN_RETURN_IF_ERROR(tc ? LaunchFp8TensorCoreGemm(Fp8TensorCoreGemm(g1, et), stream)
                               : kc::LaunchMoeQuantGemm(g1, stream));
      KPLAN_RETURN_IF_ERROR(f32 ? kc::LaunchMoeActivationF32(act, ap, At<float>(workspace, l.c1),
                                                             numel, N13, static_cast<float*>(c2), I,
                                                             stream)
                                : kc::LaunchMoeActivation(act, ap, et, At<void>(workspace, l.c1),
                                                          numel, N13, c2, I, stream));
    }
  }

  void* y = a.combine ? At<void>(workspace, l.y) : a.output;
  kc::MoeQuantGemmArgs g2 = g1;
  g2.a = c2;
  g2.a_fp8 = false;
  g2.a_scale = nullptr;
  g2.a_group = 0;
  g2.a_row_div = 1;
  if (a2_quantised) {
    g2.a_fp8 = true;
    g2.a = At<void>(workspace, l.q2);
    g2.a_scale = At<float>(workspace, l.s2);
    g2.a_group = s.block_k;
  } else if (s.fp8) {
    // A dynamic per-tensor scale spans every row: slots of experts that are
    // not local hold zeros, which do not move the maximum (the reference
    // takes it over the local rows).
    KPLAN_RETURN_IF_ERROR(quantise_a(g2, c2, numel, I, s.a2_static, l.q2, l.s2));
  }
  g2.w = s.w2;
  g2.bias = experts.b2();
  g2.c = y;
  g2.N = H;
  g2.K = I;
  // GEMM 2 with the combine on the matvec's row pairs: straight into the output.
  if (matvec && a.combine && kc::MoeQuantMatvecCombines(g2.w, k, g2.K)) {
    return decode_gemm(g2, /*apply_act=*/false, a.output, /*combine=*/true);
  }
  KPLAN_RETURN_IF_ERROR(matvec || decode ? decode_gemm(g2, /*apply_act=*/false, y)
                        : tc ? LaunchFp8TensorCoreGemm(Fp8TensorCoreGemm(g2, et), stream)
                             : kc::LaunchMoeQuantGemm(g2, stream));
  if (!a.combine) return absl::OkStatus();
  const float* w = a.apply_router_weight_on_input ? nullptr : a.topk_weights;
  return f32 ? kc::LaunchMoeCombineF32(static_cast<const float*>(y), w, M, k, H,
                                       static_cast<float*>(a.output), stream)
             : kc::LaunchMoeCombine(et, y, w, M, k, H, a.output, stream);
}

}  // namespace kplan
