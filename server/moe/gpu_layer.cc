#include "server/moe/gpu_layer.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_info.h"
#include "base/status.h"
#include "server/moe/gpu_layer_emulation.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;

// Where each intermediate lives in the workspace, for M tokens. Sizing and
// enqueueing both use it, so they cannot disagree. With `bound` the sizes
// are the largest over every block size and split choice of calls with up to
// M tokens (the choice depends on M, not monotonically).
struct Layout {
  int block_m = 0;
  bool ping_pong = false;        // MoeGroupedGemmArgs::ping_pong of both GEMMs
  int splits1 = 1, splits2 = 1;  // split-K of GEMM 1 / GEMM 2
  int64_t max_padded = 0, max_blocks = 0;
  int64_t sorted = 0, eids = 0, post = 0, align = -1, scaled = -1, c1 = 0, c2 = 0, y = -1,
          partials = -1;
  int64_t bytes = 0;
};

// Bytes of split-K partials a layer may use; beyond it GEMMs do not split.
constexpr int64_t kMaxPartialsBytes = int64_t{32} << 20;

// The experts a call's slots spread over, for the kernel rules: the local
// ones where every slot is local (MoeLayerArgs::slots_local), else all E.
int RuleExperts(const GpuExperts& experts, const MoeLayerArgs& a) {
  return a.slots_local ? experts.spec().num_experts : a.num_experts;
}

// rule_experts: the experts the kernel rules spread the slots over
// (RuleExperts). With `bound` the local experts, the fewest any call spreads
// its slots over: the largest block a call of M tokens may pick.
Layout LayoutFor(const GpuExperts& experts, int64_t M, int k, int E, bool scale_rows,
                 bool separate_y, bool bound, bool batch_invariant, int rule_experts) {
  Layout l;
  const int64_t H = experts.spec().hidden, I = experts.spec().intermediate;
  const int64_t N13 = experts.n13(), numel = M * k;
  // int sets' GEMMs (the int4 GEMMs, or the 16-bit ones on the dequantised
  // copy): ws_k 0, the rule measured for int4.
  const int64_t ws_k = experts.spec().quant.scheme.empty() ? std::min(H, I) : 0;
  l.ping_pong = !batch_invariant && ws_k > 0 &&
                kc::MoeGemmWsPingPongFor(experts.spec().dtype, numel, rule_experts);
  const bool tall = !batch_invariant && ws_k > 0 &&
                    kc::MoeGemmWsTallTilesFor(experts.spec().dtype, numel, rule_experts, ws_k);
  l.block_m = batch_invariant ? kMoeBatchInvariantBlockM
                              : kc::MoeGemmBlockMFor(numel, rule_experts, ws_k, l.ping_pong, tall);
  l.max_padded = kc::MoeAlignMaxPadded(numel, E, l.block_m, false);
  l.max_blocks = kc::MoeAlignMaxBlocks(numel, E, l.block_m, false);
  int64_t partials = 0;
  if (bound) {
    for (int bm : {16, 64, 128, kc::kMoeGemmTallBlockM, 256}) {
      l.max_padded = std::max(l.max_padded, kc::MoeAlignMaxPadded(numel, E, bm, false));
      l.max_blocks = std::max(l.max_blocks, kc::MoeAlignMaxBlocks(numel, E, bm, false));
    }
    partials = std::min(kMaxPartialsBytes, kc::MoeGemmPartialsBytes(8, numel, std::max(N13, H)));
  } else if (!batch_invariant) {  // batch-invariant: no split-K
    const int sms = DeviceSmCount(experts.device());
    auto splits = [&](int64_t N, int64_t K) {
      if (l.block_m == kc::kMoeGemmTallBlockM) return 1;  // the tall tiles split no K
      int s = kc::MoeGemmSplitsFor(numel, l.max_blocks, N, K, sms, l.block_m);
      while (s > 1 && kc::MoeGemmPartialsBytes(s, numel, N) > kMaxPartialsBytes) --s;
      return s;
    };
    l.splits1 = splits(N13, H);
    l.splits2 = splits(H, I);
    partials = std::max(kc::MoeGemmPartialsBytes(l.splits1, numel, N13),
                        kc::MoeGemmPartialsBytes(l.splits2, numel, H));
  }
  auto reserve = [&l](int64_t bytes) { return kc::ReserveAligned(&l.bytes, bytes); };
  l.sorted = reserve(l.max_padded * 4);
  l.eids = reserve(l.max_blocks * 4);
  l.post = reserve(4);
  // The align's scratch (spread over blocks from a few thousand ids).
  if (const int64_t ints = kc::MoeAlignScratchInts(numel, E); ints > 0) l.align = reserve(ints * 4);
  if (scale_rows) l.scaled = reserve(M * H * 2);
  l.c1 = reserve(numel * N13 * 2);
  l.c2 = reserve(numel * I * 2);
  if (separate_y) l.y = reserve(numel * H * 2);
  if (partials > 0) l.partials = reserve(partials);
  return l;
}

template <typename T>
T* At(void* base, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// The int prefill route's buffers after the fast layout: hit flags, then
// the dequantised w13 and w2 of every local expert (only hit ones written).
struct DequantLayout {
  int64_t hit = 0, w13 = 0, w2 = 0, bytes = 0;
};

DequantLayout DequantLayoutAfter(const GpuExperts& experts, int64_t base) {
  const ExpertsSpec& spec = experts.spec();
  DequantLayout d;
  d.bytes = base;
  d.hit = kc::ReserveAligned(&d.bytes, spec.num_experts);
  d.w13 = kc::ReserveAligned(&d.bytes, int64_t{spec.num_experts} * experts.n13() * spec.hidden * 2);
  d.w2 =
      kc::ReserveAligned(&d.bytes, int64_t{spec.num_experts} * spec.hidden * spec.intermediate * 2);
  return d;
}

// The fast route's weights: the experts' own (bf16 / fp16 sets), the int
// route's dequantised copies, or (int13 / int2 set, w13 / w2 null) its int4
// weights for the GEMMs to dequantise themselves.
struct FastWeights {
  const void* w13;
  const void* w2;
  kernels::DType dtype;
  const kc::MoeQuantWeights* int13 = nullptr;
  const kc::MoeQuantWeights* int2 = nullptr;
};

// Whether both GEMMs of a call with layout `l` over `num_experts` ids run on
// the int4 weights, dequantised inside the GEMMs (bit-identical to the
// dequantised copy; no copy, no dequantiser pass): where it pays
// (MoeIntWeightsInGemms) and the int4 GEMMs take them (MoeGemmIntApplies).
bool IntWeightsInGemms(const GpuExperts& experts, const Layout& l, int64_t numel, int num_experts,
                       kernels::DType dtype, const kc::MoeQuantWeights& q13,
                       const kc::MoeQuantWeights& q2) {
  if (!kc::MoeGemmIntEnabled() || !kc::MoeIntWeightsInGemms(numel, num_experts)) return false;
  kc::MoeGroupedGemmArgs g;
  g.dtype = dtype;
  g.numel = numel;
  g.num_blocks = l.max_blocks;
  g.block_m = l.block_m;
  g.num_local_experts = experts.spec().num_experts;
  g.N = experts.n13();
  g.K = experts.spec().hidden;
  g.splits = l.splits1;
  g.int_w = &q13;
  if (!kc::MoeGemmIntApplies(g)) return false;
  g.N = experts.spec().hidden;
  g.K = experts.spec().intermediate;
  g.splits = l.splits2;
  g.int_w = &q2;
  return kc::MoeGemmIntApplies(g);
}

absl::Status EnqueueFastLayer(const GpuExperts& experts, const FastWeights& fw,
                              const MoeLayerArgs& a, void* workspace, int64_t workspace_bytes,
                              cudaStream_t stream);

}  // namespace

int DeviceSmCount(int device) { return kc::MultiprocessorCount(device).value_or(132); }

absl::Status EnqueueRoutingAndAlign(const MoeLayerArgs& a, int block_m, int32_t* sorted,
                                    int32_t* expert_ids, int32_t* num_tokens_post_padded,
                                    int32_t* align_scratch, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.router_logits != nullptr) {
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeRouting(a.routing, a.router_logits, a.num_tokens,
                                               a.topk_weights, a.topk_ids, stream));
  }
  if (block_m == 0) return absl::OkStatus();
  return kc::LaunchMoeAlignBlockSize(a.topk_ids, a.num_tokens * a.top_k, block_m, a.num_experts,
                                     a.expert_map, /*pad_sorted_ids=*/false,
                                     /*ignore_invalid_experts=*/false, sorted, expert_ids,
                                     num_tokens_post_padded, align_scratch, stream);
}

int64_t MoeLayerWorkspaceBytes(const GpuExperts& experts, int64_t max_tokens, int top_k,
                               int num_experts, std::optional<kernels::DType> act_dtype,
                               bool batch_invariant) {
  const kernels::DType act = act_dtype.value_or(experts.spec().dtype);
  if (!experts.spec().quant.scheme.empty() &&
      QuantRouteOf(experts, act, max_tokens, top_k, num_experts, batch_invariant) ==
          kc::MoeQuantRoute::kDequant) {
    // Smaller calls may take the matvec, decode or emulation route (one
    // layout): room for both.
    const int64_t fast = LayoutFor(experts, max_tokens, top_k, num_experts, /*scale_rows=*/true,
                                   /*separate_y=*/true, /*bound=*/true, /*batch_invariant=*/false,
                                   experts.spec().num_experts)
                             .bytes;
    return std::max(DequantLayoutAfter(experts, fast).bytes,
                    EmulationLayerWorkspaceBytes(experts, max_tokens, top_k, num_experts, act));
  }
  if (!experts.FastPathFor(act) || !experts.spec().quant.scheme.empty()) {
    return EmulationLayerWorkspaceBytes(experts, max_tokens, top_k, num_experts, act);
  }
  return LayoutFor(experts, max_tokens, top_k, num_experts, /*scale_rows=*/true,
                   /*separate_y=*/true, /*bound=*/true, /*batch_invariant=*/false,
                   experts.spec().num_experts)
      .bytes;
}

absl::Status EnqueueMoeLayer(const GpuExperts& experts, const MoeLayerArgs& a, void* workspace,
                             int64_t workspace_bytes, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const ExpertsSpec& spec = experts.spec();
  const int64_t M = a.num_tokens;
  const int k = a.top_k, E = a.num_experts;
  if (M < 0) return InvalidField("num_tokens", "must be >= 0");
  if (k <= 0) return InvalidField("top_k", "must be positive");
  if (E <= 0) return InvalidField("num_experts", "must be positive");
  if (a.expert_map == nullptr && E != spec.num_experts) {
    return InvalidField("num_experts", absl::StrCat("without an expert map it must equal the "
                                                    "experts' count ",
                                                    spec.num_experts, ", got ", E));
  }
  if (a.apply_router_weight_on_input && k != 1) {
    return InvalidField("apply_router_weight_on_input", "needs top_k == 1");
  }
  if (M == 0) return absl::OkStatus();
  if (a.hidden == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr ||
      a.output == nullptr) {
    return absl::InvalidArgumentError("EnqueueMoeLayer: a device buffer is null");
  }
  const kernels::DType act = a.act_dtype.value_or(spec.dtype);
  // Quantised sets take the route with the activation quantisers (whose
  // GEMMs are the fp8 tensor-core ones where Fp8OnTensorCores()).
  if (!spec.quant.scheme.empty() &&
      QuantRouteOf(experts, act, M, k, E, a.batch_invariant) == kc::MoeQuantRoute::kDequant) {
    // int8 / int4 at prefill sizes: the fast route on the int4 weights where
    // its GEMMs take them; else routing, the hit experts' weights dequantised
    // into the workspace, then the fast route on them.
    const Layout lf = LayoutFor(experts, M, k, E, a.apply_router_weight_on_input, a.combine,
                                /*bound=*/false, a.batch_invariant, RuleExperts(experts, a));
    const int64_t fast = lf.bytes;
    const kc::MoeQuantWeights q13 = QuantWeightsOf(experts, true);
    const kc::MoeQuantWeights q2 = QuantWeightsOf(experts, false);
    if (!a.batch_invariant && IntWeightsInGemms(experts, lf, M * k, E, act, q13, q2)) {
      return EnqueueFastLayer(experts, {nullptr, nullptr, act, &q13, &q2}, a, workspace,
                              workspace_bytes, stream);
    }
    const DequantLayout d = DequantLayoutAfter(experts, fast);
    if (workspace == nullptr || workspace_bytes < d.bytes) {
      return absl::InvalidArgumentError(absl::StrCat("EnqueueMoeLayer: workspace of ",
                                                     workspace_bytes, " bytes, need ", d.bytes));
    }
    MoeLayerArgs routed = a;
    if (a.router_logits != nullptr) {
      KPLAN_RETURN_IF_ERROR(
          kc::LaunchMoeRouting(a.routing, a.router_logits, M, a.topk_weights, a.topk_ids, stream));
      routed.router_logits = nullptr;
    }
    uint8_t* hit = At<uint8_t>(workspace, d.hit);
    KPLAN_RETURN_IF_ERROR(
        kc::LaunchMoeExpertsHit(a.topk_ids, M * k, E, a.expert_map, spec.num_experts, hit, stream));
    const kernels::DType dt = act;
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeDequantWeights(q13, spec.num_experts, experts.n13(),
                                                      spec.hidden, hit, dt,
                                                      At<void>(workspace, d.w13), stream));
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeDequantWeights(q2, spec.num_experts, spec.hidden,
                                                      spec.intermediate, hit, dt,
                                                      At<void>(workspace, d.w2), stream));
    return EnqueueFastLayer(experts, {At<void>(workspace, d.w13), At<void>(workspace, d.w2), dt},
                            routed, workspace, fast, stream);
  }
  if (!experts.FastPathFor(act) || !spec.quant.scheme.empty()) {
    return EnqueueEmulationLayer(experts, a, act, workspace, workspace_bytes, stream);
  }
  const kernels::DType dtype = spec.dtype == kernels::DType::kBFloat16 ? kernels::DType::kBFloat16
                                                                       : kernels::DType::kFloat16;
  return EnqueueFastLayer(experts, {experts.w13(), experts.w2(), dtype}, a, workspace,
                          workspace_bytes, stream);
}

namespace {

absl::Status EnqueueFastLayer(const GpuExperts& experts, const FastWeights& fw,
                              const MoeLayerArgs& a, void* workspace, int64_t workspace_bytes,
                              cudaStream_t stream) {
  const ExpertsSpec& spec = experts.spec();
  const int64_t M = a.num_tokens;
  const int k = a.top_k, E = a.num_experts;
  Layout l = LayoutFor(experts, M, k, E, a.apply_router_weight_on_input, a.combine,
                       /*bound=*/false, a.batch_invariant, RuleExperts(experts, a));
  if (workspace == nullptr || workspace_bytes < l.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueMoeLayer: workspace of ", workspace_bytes, " bytes, need ", l.bytes));
  }
  const kernels::DType dtype = fw.dtype;
  const int64_t H = spec.hidden, I = spec.intermediate, N13 = experts.n13();
  const int64_t numel = M * k;

  if (a.allow_decode && !a.batch_invariant && !a.apply_router_weight_on_input &&
      fw.int13 == nullptr && kc::MoeDecodeApplies(M, k, E, H, I)) {
    // A few slots: the decode layer (routing included), one kernel or two.
    kc::MoeDecodeArgs d;
    d.dtype = dtype;
    d.hidden = a.hidden;
    d.router_logits = a.router_logits;
    d.routing = a.routing;
    d.topk_ids = a.topk_ids;
    d.topk_weights = a.topk_weights;
    d.expert_map = a.expert_map;
    d.num_experts = E;
    d.num_local_experts = spec.num_experts;
    d.num_tokens = M;
    d.top_k = k;
    d.hidden_size = H;
    d.intermediate_size = I;
    d.w13 = fw.w13;
    d.b13 = experts.b13();
    d.w2 = fw.w2;
    d.b2 = experts.b2();
    d.act = experts.activation();
    d.h = At<void>(workspace, l.c2);
    d.combine = a.combine;
    d.out = a.output;
    return kc::LaunchMoeDecodeExperts(d, stream);
  }

  int32_t* sorted = At<int32_t>(workspace, l.sorted);
  int32_t* eids = At<int32_t>(workspace, l.eids);
  int32_t* post = At<int32_t>(workspace, l.post);
  int32_t* align = l.align >= 0 ? At<int32_t>(workspace, l.align) : nullptr;
  KPLAN_RETURN_IF_ERROR(EnqueueRoutingAndAlign(a, l.block_m, sorted, eids, post, align, stream));
  const void* a1 = a.hidden;
  if (a.apply_router_weight_on_input) {
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeScaleRows(dtype, a.hidden, a.topk_weights, M, H,
                                                 At<void>(workspace, l.scaled), stream));
    a1 = At<void>(workspace, l.scaled);
  }
  kc::MoeGroupedGemmArgs g1;
  g1.dtype = dtype;
  g1.a = a1;
  g1.a_row_div = k;
  g1.w = fw.w13;
  g1.int_w = fw.int13;
  g1.bias = experts.b13();
  g1.c = At<void>(workspace, l.c1);
  g1.sorted_token_ids = sorted;
  g1.expert_ids = eids;
  g1.num_tokens_post_padded = post;
  g1.numel = numel;
  g1.num_blocks = l.max_blocks;
  g1.N = N13;
  g1.K = H;
  g1.num_local_experts = spec.num_experts;
  g1.block_m = l.block_m;
  g1.ping_pong = l.ping_pong;
  g1.splits = l.splits1;
  g1.partials = l.partials >= 0 ? At<float>(workspace, l.partials) : nullptr;
  // Split-K partials without a bias are summed by the next step itself.
  g1.reduce_in_consumer = g1.splits > 1 && g1.bias == nullptr;
  kc::MoeActParams ap;  // the ExpertSet's activation with default ActivationParams
  const kernels::MoeActivation act_kind = experts.activation();
  // GEMM 1 with the activation in its epilogue (moe_gemm_ws.h), straight into
  // c2, where it applies; else GEMM 1 into c1, then the activation kernel.
  bool fused = false;
  if (N13 == 2 * I && kc::MoeFusedActEnabled() && kc::MoeGemmWsEnabled() &&
      kc::MoeGemmWsActApplies(g1, act_kind, ap)) {
    const absl::Status st =
        kc::LaunchMoeGroupedGemmWsAct(g1, act_kind, ap, At<void>(workspace, l.c2), stream);
    if (!absl::IsUnavailable(st)) KPLAN_RETURN_IF_ERROR(st);
    fused = st.ok();
  }
  if (!fused) {
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeGroupedGemm(g1, stream));
    kc::MoeSplitInput split1;
    if (g1.reduce_in_consumer) split1 = {g1.partials, g1.splits};
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeActivation(act_kind, ap, dtype, At<void>(workspace, l.c1),
                                                  numel, N13, At<void>(workspace, l.c2), I, stream,
                                                  split1));
  }
  void* y = a.combine ? At<void>(workspace, l.y) : a.output;
  kc::MoeGroupedGemmArgs g2 = g1;
  g2.a = At<void>(workspace, l.c2);
  g2.a_row_div = 1;
  g2.w = fw.w2;
  g2.int_w = fw.int2;
  g2.bias = experts.b2();
  g2.c = y;
  g2.N = H;
  g2.K = I;
  g2.splits = l.splits2;
  // Only the combine can sum GEMM 2's partials; without it Y must be stored.
  g2.reduce_in_consumer = a.combine && g2.splits > 1 && g2.bias == nullptr;
  KPLAN_RETURN_IF_ERROR(kc::LaunchMoeGroupedGemm(g2, stream));
  if (!a.combine) return absl::OkStatus();
  kc::MoeSplitInput split2;
  if (g2.reduce_in_consumer) split2 = {g2.partials, g2.splits};
  return kc::LaunchMoeCombine(dtype, y, a.apply_router_weight_on_input ? nullptr : a.topk_weights,
                              M, k, H, a.output, stream, split2);
}

}  // namespace
}  // namespace kplan
