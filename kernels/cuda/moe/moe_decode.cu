// Decode-sized MoE layers (moe_experts.h): LaunchMoeDecodeExperts, the
// entry point, which runs the one-kernel form (moe_decode_layer.cu) where it
// is switched on and can run, and the two-kernel form here otherwise. At a few token slots the
// grouped path is a chain of align, GEMM 1, activation, GEMM 2 and combine
// kernels, each a few microseconds of launch, ramp and tail around a weight
// stream that is itself short (Qwen3-30B-A3B at one token: 75 MB, 18 us at
// copy speed); here it is (after the routing kernel, when asked to route)
//   up    one warp per (slot, intermediate column): the gate and up rows of
//         the slot's expert against the token's hidden row, the activation,
//         one element of the slot's intermediate row h;
//   down  per CTA 4 * max(1, 8 / k) output columns of one token, each slot's
//         warp four down rows of its expert against h at once; the CTA then
//         sums each output element's k slot values in slot order (without
//         combine, one warp per per-slot element).
// A warp reads a weight row with 16-byte loads (moe_decode.cuh's Dots), lane
// i taking vectors i, i + 32, ..., and sums its fp32 products in a fixed
// order, then over the warp in a fixed butterfly, so results are
// deterministic. The rounding points are the grouped path's: GEMM outputs
// rounded to T (with bias round(round(acc) + round(b))), the activation
// computed from them and rounded once, the combine Σ_j fadd(fmul(y_j, w_j))
// in slot order rounded once; only the fp32 order inside a dot product
// differs. Slots whose expert is not local (expert map -1) or out of range
// contribute zero rows.
#include <algorithm>
#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_decode.cuh"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;
using detail::decode::Dots;
using detail::decode::LocalExpert;
using detail::decode::Rounded;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// The up kernel's loads in flight per lane and row (Dots): 2 measured best
// against 4 and 8 (docs/PERF.md, session 10); with it ptxas -v gives the
// kernel 62 registers: four CTAs of 256 threads fit an SM.
constexpr int kUpBatch = 2;

template <typename T>
struct UpArgs {
  const T* x;  // [M, H]
  const int32_t* ids;
  const int32_t* map;
  int num_experts, num_local, top_k;
  const T* w13;      // [E_local, N13, H]
  const float* b13;  // [E_local, N13] or null
  int64_t numel, H, I, N13;
  MoeActivation act;
  MoeActParams params;
  T* h;  // [numel, I]
};

template <typename T>
__global__ void __launch_bounds__(kThreads) DecodeUpKernel(const __grid_constant__ UpArgs<T> a) {
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= a.numel * a.I) return;
  const int64_t s = item / a.I, n = item % a.I;
  const int e = LocalExpert(a.ids, a.map, a.num_experts, a.num_local, s);
  if (e < 0) {
    if (lane == 0) a.h[item] = FromFloat<T>(0.0f);  // act(0, 0) == 0 for every activation
    return;
  }
  const T* xr = a.x + (s / a.top_k) * a.H;
  const T* we = a.w13 + static_cast<int64_t>(e) * a.N13 * a.H;
  const float* be = a.b13 != nullptr ? a.b13 + static_cast<int64_t>(e) * a.N13 : nullptr;
  const bool gated = a.act < MoeActivation::kSiluNoMul;
  float v;
  if (gated) {
    const int64_t rg = moe_math::GatedRow(a.act, n, a.I, 0),
                  ru = moe_math::GatedRow(a.act, n, a.I, 1);
    const T* const w[2] = {we + rg * a.H, we + ru * a.H};
    float d[2];
    Dots<T, 2, kUpBatch>(w, xr, a.H, lane, d);
    if (lane != 0) return;
    const float g = Rounded<T>(d[0], be != nullptr ? be + rg : nullptr);
    const float u = Rounded<T>(d[1], be != nullptr ? be + ru : nullptr);
    v = moe_math::Gated(a.act, a.params, g, u);
  } else {
    const T* const w[1] = {we + n * a.H};
    float d[1];
    Dots<T, 1, 2 * kUpBatch>(w, xr, a.H, lane, d);
    if (lane != 0) return;
    v = moe_math::Plain(a.act, Rounded<T>(d[0], be != nullptr ? be + n : nullptr));
  }
  a.h[item] = FromFloat<T>(v);
}

template <typename T>
struct DownArgs {
  const T* h;  // [numel, I]
  const int32_t* ids;
  const float* weights;  // [numel]
  const int32_t* map;
  int num_experts, num_local, top_k;
  const T* w2;      // [E_local, H, I]
  const float* b2;  // [E_local, H] or null
  int64_t M, H, I;
  bool combine;
  T* out;  // combine: [M, H]; else [numel, H]
};

// Slot s's GEMM 2 output element n as the grouped GEMM stores it (0 for a
// slot whose expert is not local); valid in lane 0.
template <typename T>
__device__ __forceinline__ float SlotDown(const DownArgs<T>& a, int64_t s, int64_t n, int lane) {
  const int e = LocalExpert(a.ids, a.map, a.num_experts, a.num_local, s);
  if (e < 0) return 0.0f;
  const T* const w[1] = {a.w2 + (static_cast<int64_t>(e) * a.H + n) * a.I};
  float d[1];
  Dots<T, 1>(w, a.h + s * a.I, a.I, lane, d);
  return Rounded<T>(d[0], a.b2 != nullptr ? a.b2 + static_cast<int64_t>(e) * a.H + n : nullptr);
}

// Without combine: one warp per element of a slot's row y.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    DecodeDownKernel(const __grid_constant__ DownArgs<T> a) {
  detail::PdlWaitThenRelease();
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= a.M * a.top_k * a.H) return;
  const float v = SlotDown(a, item / a.H, item % a.H, lane);
  if (lane == 0) a.out[item] = FromFloat<T>(v);
}

// With combine: a CTA computes 4 * G consecutive output columns of one token
// with k * G warps (G = max(1, 8 / k)); warp (g, j) computes slot j's values
// of its kRows columns in one Dots (its loads in flight together); the first
// 4 * G threads then combine each column's k values in slot order.
// Two register budgets, the same sums (Dots' order does not depend on its
// batch): kBatch 4 vectors per lane and row in flight at about 120
// registers (two CTAs per SM), or kBatch 2 at 64 (four). The wide form keeps
// more bytes in flight per warp where the grid is one wave of it (Mixtral-
// 8x7B: 256 CTAs); past that the narrow one runs twice the warps at once
// (Qwen3-30B-A3B one token: 512 CTAs, one wave instead of two).
constexpr int kRows = 4;
constexpr int kWideBatch = 4, kWideCtas = 2, kNarrowBatch = 2, kNarrowCtas = 4;

template <typename T, int kBatch, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    DecodeDownCombineKernel(const __grid_constant__ DownArgs<T> a, int group) {
  detail::PdlWaitThenRelease();
  __shared__ float y[kRows * kWarps];  // [column][slot], k * group <= 8
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, k = a.top_k;
  const int g = warp / k, j = warp % k, cols = kRows * group;
  const int64_t tiles = (a.H + cols - 1) / cols;
  const int64_t m = blockIdx.x / tiles, c0 = (blockIdx.x % tiles) * cols, n0 = c0 + g * kRows;
  const int64_t s = m * k + j;
  const int e = LocalExpert(a.ids, a.map, a.num_experts, a.num_local, s);
  float d[kRows] = {};
  if (e >= 0) {
    const T* w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // Rows past H read a valid row and are dropped.
      w[r] = a.w2 + (static_cast<int64_t>(e) * a.H + (n0 + r < a.H ? n0 + r : 0)) * a.I;
    }
    Dots<T, kRows, kBatch>(w, a.h + s * a.I, a.I, lane, d);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t n = n0 + r;
      if (n >= a.H) continue;
      y[(g * kRows + r) * k + j] =
          e < 0 ? 0.0f
                : Rounded<T>(d[r],
                             a.b2 != nullptr ? a.b2 + static_cast<int64_t>(e) * a.H + n : nullptr);
    }
  }
  __syncthreads();
  const int64_t n = c0 + threadIdx.x;
  if (threadIdx.x < cols && n < a.H) {
    float acc = 0.0f;
    for (int jj = 0; jj < k; ++jj) {
      acc = __fadd_rn(acc, __fmul_rn(y[threadIdx.x * k + jj], a.weights[m * k + jj]));
    }
    a.out[m * a.H + n] = FromFloat<T>(acc);
  }
}

// sms: the device's multiprocessors (the down-combine form's choice).
template <typename T>
absl::Status Launch(const MoeDecodeArgs& d, int sms, cudaStream_t stream) {
  const MoeActParams p = EffectiveActParams(d.act_params);
  const bool gated = d.act < MoeActivation::kSiluNoMul;
  const int64_t numel = d.num_tokens * d.top_k;
  UpArgs<T> up{static_cast<const T*>(d.hidden),
               d.topk_ids,
               d.expert_map,
               d.num_experts,
               d.num_local_experts,
               d.top_k,
               static_cast<const T*>(d.w13),
               d.b13,
               numel,
               d.hidden_size,
               d.intermediate_size,
               gated ? 2 * d.intermediate_size : d.intermediate_size,
               d.act,
               p,
               static_cast<T*>(d.h)};
  const int64_t up_items = numel * d.intermediate_size;
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
      DecodeUpKernel<T>, dim3((up_items + kWarps - 1) / kWarps), dim3(kThreads), 0, stream, up));
  DownArgs<T> down{static_cast<const T*>(d.h),
                   d.topk_ids,
                   d.topk_weights,
                   d.expert_map,
                   d.num_experts,
                   d.num_local_experts,
                   d.top_k,
                   static_cast<const T*>(d.w2),
                   d.b2,
                   d.num_tokens,
                   d.hidden_size,
                   d.intermediate_size,
                   d.combine,
                   static_cast<T*>(d.out)};
  if (!d.combine) {
    const int64_t items = numel * d.hidden_size;
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
        DecodeDownKernel<T>, dim3((items + kWarps - 1) / kWarps), dim3(kThreads), 0, stream, down));
    return absl::OkStatus();
  }
  // k * G <= 8 warps per CTA.
  const int group = std::max(1, kWarps / d.top_k);
  const int64_t tiles = (d.hidden_size + kRows * group - 1) / (kRows * group);
  const int64_t ctas = d.num_tokens * tiles;
  // The wide form's one wave: two CTAs per SM (ptxas gives it ~120 registers).
  const bool narrow = ctas > 2 * static_cast<int64_t>(sms);
  KPLAN_CUDA_RETURN_IF_ERROR(
      narrow ? detail::LaunchPdl(DecodeDownCombineKernel<T, kNarrowBatch, kNarrowCtas>, dim3(ctas),
                                 dim3(32 * d.top_k * group), 0, stream, down, group)
             : detail::LaunchPdl(DecodeDownCombineKernel<T, kWideBatch, kWideCtas>, dim3(ctas),
                                 dim3(32 * d.top_k * group), 0, stream, down, group));
  return absl::OkStatus();
}

}  // namespace

namespace {

// What the kernels can run (16-byte rows, the combine CTA's k <= 8 warps).
bool Supported(int64_t numel, int top_k, int64_t hidden, int64_t intermediate) {
  return numel <= kMoeDecodeMaxSlots && top_k <= 8 && hidden % 8 == 0 && intermediate % 8 == 0;
}

// LaunchMoeDecodeExperts's checks (moe_experts.h).
absl::Status ValidateMoeDecodeArgs(const MoeDecodeArgs& d) {
  if (absl::Status s = CheckHalfDType(d.dtype, "moe_decode"); !s.ok()) return s;
  const int64_t numel = d.num_tokens * d.top_k;
  if (d.num_tokens < 0 || d.top_k <= 0 || d.num_experts <= 0 || d.num_local_experts <= 0) {
    return absl::InvalidArgumentError("moe_decode: bad sizes");
  }
  if (numel == 0) return absl::OkStatus();  // nothing to launch
  if (!Supported(numel, d.top_k, d.hidden_size, d.intermediate_size)) {
    return absl::InvalidArgumentError(
        "moe_decode: needs at most kMoeDecodeMaxSlots slots, top_k <= 8 and hidden / "
        "intermediate sizes that are multiples of 8");
  }
  if (d.hidden == nullptr || d.topk_ids == nullptr || d.topk_weights == nullptr ||
      d.w13 == nullptr || d.w2 == nullptr || d.h == nullptr || d.out == nullptr) {
    return absl::InvalidArgumentError("moe_decode: null pointer");
  }
  const int a = static_cast<int>(d.act);
  if (a < 0 || a > static_cast<int>(MoeActivation::kRelu2NoMul)) {
    return absl::InvalidArgumentError("moe_decode: unknown activation");
  }
  if (d.act == MoeActivation::kSwigluOaiUninterleave && !d.act_params.has_clamp_limit) {
    return absl::InvalidArgumentError("SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  }
  if (d.router_logits != nullptr) {
    KPLAN_RETURN_IF_ERROR(ValidateMoeRoutingParams(d.routing));
    if (d.routing.num_experts != d.num_experts || d.routing.top_k != d.top_k) {
      return absl::InvalidArgumentError(
          "moe_decode: routing.num_experts / top_k differ from the layer's");
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool MoeDecodeApplies(int64_t num_tokens, int top_k, int num_experts, int64_t hidden,
                      int64_t intermediate) {
  return MoeSlotsOnDistinctExperts(num_tokens, top_k, num_experts) &&
         Supported(num_tokens * top_k, top_k, hidden, intermediate);
}

absl::Status LaunchMoeDecodeExperts(const MoeDecodeArgs& d, cudaStream_t stream) {
  KPLAN_RETURN_IF_ERROR(ValidateMoeDecodeArgs(d));
  if (d.num_tokens == 0) return absl::OkStatus();
  if (MoeDecodeLayerEnabled()) {
    const absl::Status st = detail::LaunchMoeDecodeLayer(d, stream);
    if (!absl::IsUnavailable(st)) return st;  // launched, or a real error
  }
  // Queried before the first launch: a failure leaves nothing half-enqueued.
  int device = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KPLAN_ASSIGN_OR_RETURN(const int sms, MultiprocessorCount(device));
  if (d.router_logits != nullptr) {
    KPLAN_RETURN_IF_ERROR(LaunchMoeRouting(d.routing, d.router_logits, d.num_tokens, d.topk_weights,
                                           d.topk_ids, stream));
  }
  return d.dtype == DType::kBFloat16 ? Launch<__nv_bfloat16>(d, sms, stream)
                                     : Launch<__half>(d, sms, stream);
}

}  // namespace kplan::kernels::cuda
