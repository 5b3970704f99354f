// The decode-sized MoE layer as one kernel (detail::LaunchMoeDecodeLayer,
// moe_decode.cuh; behind LaunchMoeDecodeExperts, moe_experts.h): routing,
// gate/up rows with the activation, down rows and combine, for up to
// kMoeDecodeMaxSlots slots on distinct experts.
// At one token a layer streams little (Qwen3-30B-A3B: 75 MB, 18 us at copy
// speed); as a chain of kernels the routing kernel, each kernel's ramp and
// tail and the gaps between them cost as much again. Here one persistent
// grid of one CTA per multiprocessor, launched cooperatively (every CTA
// resident, so a grid-wide barrier is safe), with eight consumer warps and
// one producer warp per CTA:
//   0. the hidden rows into shared memory (one bulk copy); every CTA routes
//      the tokens itself (moe_routing.cuh, a warp per token; CTA 0 stores
//      the picks), so no routing kernel sits on the critical path;
//   1. the producer streams this CTA's share of the (slot, intermediate
//      column) items' gate and up rows (consecutive columns of a slot are
//      consecutive rows: one or two bulk copies per chunk) through a ring
//      of shared-memory stages filling all the shared memory the rest
//      leaves (about 200 KB in flight per multiprocessor, whatever the
//      registers); the chunks of ring stage st are consumer warp st % 8's
//      (one warp per stage, so a warp waits for a stage's uses in order and
//      an mbarrier's phase parity never aliases): per item the dot
//      products against the token's row, the activation, one element of the
//      intermediate h (global memory);
//   2. one grid-wide barrier (cooperative groups): h is complete. The down
//      rows do not depend on h, so the producer has already filled the ring
//      with this CTA's first step-3 chunks before it joins the barrier;
//   3. h into shared memory; this CTA's output columns (a contiguous range
//      of [tokens x H], or of [slots x H] without combine): their down rows
//      (k per column) arrive through the ring, consumers compute them against
//      h into y, then the combine in slot order.
// Every value is computed as the two-kernel form (moe_decode.cu) computes
// it: the same dot product (moe_decode.cuh), the same rounding points, the
// same routing code, so the two are bit-identical.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_decode.cuh"
#include "kernels/cuda/moe/moe_decode_layer_plan.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_kernel_switch.h"
#include "kernels/cuda/moe/moe_routing.cuh"
#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

namespace cg = cooperative_groups;
using detail::FromFloat;
using detail::ToFloat;
using detail::decode::Dots;
using detail::decode::GenericLoad;
using detail::decode::Rounded;

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // and one producer warp
constexpr int kMaxStages = detail::kDecodeLayerMaxStages;
constexpr int kMaxSlots = static_cast<int>(kMoeDecodeMaxSlots);
// A CTA's output columns span at most this many owners (tokens, or slots
// without combine; DecodeSegments).
constexpr int kMaxSegments = kMaxSlots;

// Measurement knobs (moe_bench sets them through the environment): the ring's
// stage size in KiB (0: the default) and its most stages, and whether the
// launch may overlap its predecessor (programmatic dependent launch).
struct Knobs {
  int stage_kib, max_stages, pdl, trace;
};
const Knobs& KnobsFromEnv() {
  static const Knobs k{detail::EnvInt("KPLAN_MOE_DECODE_STAGE_KIB", 0),
                       detail::EnvInt("KPLAN_MOE_DECODE_STAGES", kMaxStages),
                       detail::EnvInt("KPLAN_MOE_DECODE_PDL", 0),
                       detail::EnvInt("KPLAN_MOE_DECODE_TRACE", 0)};
  return k;
}

template <typename T>
struct Params {
  const T* x;  // [M, H]
  const float* logits;
  detail::routing::RouteParams route;
  int32_t* ids;    // [numel]: written with logits (by CTA 0), else read
  float* weights;  // [numel]
  const int32_t* map;
  int num_experts, num_local, top_k;
  const T* w13;
  const float* b13;
  const T* w2;
  const float* b2;
  int64_t M, H, I, N13;
  MoeActivation act;
  MoeActParams act_params;
  T* h;  // [numel, I]
  bool combine;
  T* out;
  // Dynamic shared memory (hidden rows | h, the routing scratch before it |
  // y | the ring), the ring's stages and chunks (moe_decode_layer_plan.h).
  detail::DecodeLayerPlan plan;
  bool trace;  // KPLAN_MOE_DECODE_TRACE: print the phases' cycle stamps
};

struct SmallSmem {
  uint64_t bar_x;
  uint64_t full[kMaxStages], empty[kMaxStages];
  int32_t ids[kMaxSlots];
  float weights[kMaxSlots];
  int local[kMaxSlots];  // local expert of each slot, or -1
  detail::DecodeSegment seg[kMaxSegments];
  int nseg;
};

// The parity of chunk c's use of its ring stage (c % stages).
__device__ __forceinline__ uint32_t UseParity(int64_t c, int stages) {
  return static_cast<uint32_t>((c / stages) & 1);
}

__device__ int g_trace_prints = 0;  // KPLAN_MOE_DECODE_TRACE: lines printed

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    DecodeLayerKernel(const __grid_constant__ Params<T> a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ SmallSmem sm;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k = a.top_k, S = a.plan.stages;
  const int64_t M = a.M, H = a.H, I = a.I, numel = M * k;
  const int R = a.combine ? k : 1;  // down rows per output column
  const int64_t owners = a.combine ? M : numel;
  const bool gated = a.act < MoeActivation::kSiluNoMul;
  const bool interleaved = a.act == MoeActivation::kSwigluOai;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar_x = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.bar_x));
  auto full = [&](int st) { return static_cast<uint32_t>(__cvta_generic_to_shared(&sm.full[st])); };
  auto empty = [&](int st) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(&sm.empty[st]));
  };
  const T* xs = reinterpret_cast<const T*>(smem);
  T* hs = reinterpret_cast<T*>(smem + a.plan.off_h);
  float* ys = reinterpret_cast<float*>(smem + a.plan.off_y);
  auto stage_rows = [&](int st) {
    return reinterpret_cast<const T*>(smem + a.plan.off_ring +
                                      static_cast<uint32_t>(st) * a.plan.stage_bytes);
  };

  // Inputs a previous kernel wrote are read only after this (pdl.cuh).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  long long stamp[8] = {clock64(), 0, 0, 0, 0, 0, 0, 0};  // KPLAN_MOE_DECODE_TRACE
  if (tid == 0) {
    detail::MbarInit(bar_x, 1);
    for (int st = 0; st < S; ++st) {
      detail::MbarInit(full(st), 1);   // the producer's expect_tx arrival
      detail::MbarInit(empty(st), 1);  // the consuming warp's arrival
    }
    detail::FenceProxyAsync();
    const uint32_t x_bytes = static_cast<uint32_t>(M * H * sizeof(T));
    detail::MbarArriveExpectTx(bar_x, x_bytes);
    detail::BulkLoad(smem_base, a.x, x_bytes, bar_x);
  }

  // 0. Routing: every CTA computes the same picks.
  if (a.logits != nullptr) {
    float* scratch = reinterpret_cast<float*>(smem + a.plan.off_h) + warp * a.route.E;
    for (int64_t m = warp; m < M; m += kThreads / 32) {
      float w;
      int id;
      // kN 16 for every E: one instantiation per dtype of this opt-in kernel,
      // where the routing kernel has four (moe_routing.cu).
      detail::routing::RouteTokenWarp<detail::routing::kPerLane>(a.route, a.logits + m * a.route.E,
                                                                 scratch, lane, w, id);
      if (lane < k) {
        sm.ids[m * k + lane] = id;
        sm.weights[m * k + lane] = w;
        if (blockIdx.x == 0) {
          a.ids[m * k + lane] = id;
          a.weights[m * k + lane] = w;
        }
      }
    }
  } else if (tid < numel) {
    sm.ids[tid] = a.ids[tid];
    sm.weights[tid] = a.weights[tid];
  }
  __syncthreads();
  if (tid < numel) {
    sm.local[tid] = detail::decode::LocalExpert(sm.ids, a.map, a.num_experts, a.num_local, tid);
  }
  int64_t c0, c1;  // this CTA's output columns
  detail::DecodeShare(owners * H, blockIdx.x, gridDim.x, c0, c1);
  const int64_t rows = R * (c1 - c0);
  if (tid == 0) sm.nseg = detail::DecodeSegments(c0, c1, H, R, sm.seg);
  __syncthreads();
  stamp[1] = clock64();
  int64_t i0, i1;  // this CTA's step-1 items
  detail::DecodeShare(numel * I, blockIdx.x, gridDim.x, i0, i1);
  const int64_t N13 = a.N13;

  if (warp == kConsumerWarps) {
    // The producer warp: every chunk of step 1, then of step 3, into the
    // ring in order (lane 0 issues; the warp stays converged for the grid
    // barrier). Step 3's chunks need no h: the first S of them are copied
    // before the barrier, while the consumers finish step 1.
    int64_t c = 0;
    auto acquire = [&](int64_t chunk) {
      const int st = static_cast<int>(chunk % S);
      if (chunk >= S) detail::MbarWait(empty(st), UseParity(chunk - S, S));
      return st;
    };
    for (int64_t item = i0; item < i1; ++c) {
      const detail::DecodeUpChunk ch = detail::DecodeUpChunkAt(item, i1, I, a.plan.chunk_items);
      item += ch.count;
      const int st = acquire(c);
      if (lane == 0) {
        const int e = sm.local[ch.slot];
        const uint32_t row_bytes = static_cast<uint32_t>(H * sizeof(T));
        const uint32_t part = ch.count * row_bytes;  // one run of rows
        const uint32_t dst = smem_base + a.plan.off_ring + st * a.plan.stage_bytes;
        const T* we = a.w13 + static_cast<int64_t>(e) * N13 * H;
        if (e < 0) {
          detail::MbarArriveExpectTx(full(st), 0);
        } else if (!gated) {
          detail::MbarArriveExpectTx(full(st), part);
          detail::BulkLoad(dst, we + ch.n0 * H, part, full(st));
        } else if (interleaved) {  // gate 2n, up 2n + 1
          detail::MbarArriveExpectTx(full(st), 2 * part);
          detail::BulkLoad(dst, we + 2 * static_cast<int64_t>(ch.n0) * H, 2 * part, full(st));
        } else {  // gate rows, then up rows
          detail::MbarArriveExpectTx(full(st), 2 * part);
          detail::BulkLoad(dst, we + ch.n0 * H, part, full(st));
          detail::BulkLoad(dst + part, we + (I + ch.n0) * H, part, full(st));
        }
      }
      __syncwarp();
    }
    const int64_t p1 = c;
    bool synced = false;
    for (int64_t r = 0; r < rows; ++c) {
      const detail::DecodeDownChunk ch =
          detail::DecodeDownChunkAt(sm.seg, sm.nseg, r, a.plan.chunk_rows);
      r += ch.count;
      if (!synced && c >= p1 + S) {  // the stage's last use is step 3's
        cg::this_grid().sync();
        synced = true;
      }
      const int st = acquire(c);
      if (lane == 0) {
        const detail::DecodeSegment& g = sm.seg[ch.seg];
        const int e = sm.local[a.combine ? g.owner * k + ch.j : g.owner];
        const uint32_t bytes = e < 0 ? 0u : static_cast<uint32_t>(ch.count * I * sizeof(T));
        detail::MbarArriveExpectTx(full(st), bytes);
        if (e >= 0) {
          detail::BulkLoad(smem_base + a.plan.off_ring + st * a.plan.stage_bytes,
                           a.w2 + (static_cast<int64_t>(e) * H + ch.n) * I, bytes, full(st));
        }
      }
      __syncwarp();
    }
    if (!synced) cg::this_grid().sync();
    return;
  }

  // The consumer warps. Chunk c is warp (c % S) % kConsumerWarps's: every
  // use of a stage by one warp, in order (a warp that waited for a later use
  // of a stage while an earlier one's phase was complete would pass on the
  // wrong data: the phase parity repeats every two uses).
  // 1. Step 1's chunks:
  // per item the gate and up rows (or the one row) against the token's
  // hidden row, the activation, h[item].
  detail::MbarWait(bar_x, 0);
  stamp[2] = clock64();
  int64_t c = 0;
  for (int64_t item = i0; item < i1; ++c) {
    const detail::DecodeUpChunk ch = detail::DecodeUpChunkAt(item, i1, I, a.plan.chunk_items);
    const int64_t first = item;
    item += ch.count;
    if ((c % S) % kConsumerWarps != warp) continue;
    const int st = static_cast<int>(c % S);
    detail::MbarWait(full(st), UseParity(c, S));
    const int e = sm.local[ch.slot];
    const T* xr = xs + (ch.slot / k) * H;
    const T* rows0 = stage_rows(st);
    const float* be = a.b13 != nullptr && e >= 0 ? a.b13 + static_cast<int64_t>(e) * N13 : nullptr;
    for (int p = 0; p < ch.count; ++p) {
      const int64_t n = ch.n0 + p;
      float v = 0.0f;  // act(0, 0) == 0 for every activation: remote slots
      if (e >= 0 && gated) {
        const T* const w[2] = {rows0 + moe_math::GatedRow(a.act, p, ch.count, 0) * H,
                               rows0 + moe_math::GatedRow(a.act, p, ch.count, 1) * H};
        float d[2];
        Dots<T, 2, 1>(w, xr, H, lane, d, GenericLoad{}, GenericLoad{});
        const int64_t rg = moe_math::GatedRow(a.act, n, I, 0),
                      ru = moe_math::GatedRow(a.act, n, I, 1);
        const float g = Rounded<T>(d[0], be != nullptr ? be + rg : nullptr);
        const float u = Rounded<T>(d[1], be != nullptr ? be + ru : nullptr);
        v = moe_math::Gated(a.act, a.act_params, g, u);
      } else if (e >= 0) {
        const T* const w[1] = {rows0 + p * H};
        float d[1];
        Dots<T, 1, 1>(w, xr, H, lane, d, GenericLoad{}, GenericLoad{});
        v = moe_math::Plain(a.act, Rounded<T>(d[0], be != nullptr ? be + n : nullptr));
      }
      if (lane == 0) a.h[first + p] = FromFloat<T>(v);
    }
    __syncwarp();
    if (lane == 0) detail::MbarArrive(empty(st));
  }

  // 2. h is complete once every CTA has passed here.
  stamp[3] = clock64();
  cg::this_grid().sync();
  stamp[4] = clock64();
  // Every CTA is resident and past its inputs: the next kernel may start.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // 3. h into shared memory (written by other CTAs in this launch: L2 loads),
  // then step 3's chunks (numbered on from step 1's): their down
  // rows against h, four at a time, into y[column][slot].
  {
    const int4* src = reinterpret_cast<const int4*>(a.h);
    int4* dst = reinterpret_cast<int4*>(hs);
    const int64_t vecs = numel * I * static_cast<int64_t>(sizeof(T)) / 16;
#pragma unroll 4
    for (int64_t i = tid; i < vecs; i += kConsumers) dst[i] = __ldcg(src + i);
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");  // consumers only
  stamp[5] = clock64();
  for (int64_t r = 0; r < rows; ++c) {
    const detail::DecodeDownChunk ch =
        detail::DecodeDownChunkAt(sm.seg, sm.nseg, r, a.plan.chunk_rows);
    r += ch.count;
    if ((c % S) % kConsumerWarps != warp) continue;
    const int st = static_cast<int>(c % S);
    detail::MbarWait(full(st), UseParity(c, S));
    const detail::DecodeSegment& g = sm.seg[ch.seg];
    const int slot = a.combine ? g.owner * k + ch.j : g.owner;
    const int e = sm.local[slot];
    const T* hr = hs + static_cast<int64_t>(slot) * I;
    const T* rows0 = stage_rows(st);
    const int ycol0 = static_cast<int>(static_cast<int64_t>(g.owner) * H + ch.n - c0);
    for (int q = 0; q < ch.count; q += 4) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (e >= 0) {
        const T* w[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          w[t] = rows0 + (q + t < ch.count ? q + t : q) * I;  // past the chunk: dropped
        }
        Dots<T, 4, 1>(w, hr, I, lane, d, GenericLoad{}, GenericLoad{});
      }
      if (lane == 0) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          if (q + t >= ch.count) continue;
          const int64_t n = ch.n + q + t;
          ys[(ycol0 + q + t) * R + ch.j] =
              e < 0 ? 0.0f
                    : Rounded<T>(
                          d[t], a.b2 != nullptr ? a.b2 + static_cast<int64_t>(e) * H + n : nullptr);
        }
      }
    }
    __syncwarp();
    if (lane == 0) detail::MbarArrive(empty(st));
  }
  stamp[6] = clock64();
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
  for (int64_t cc = tid; cc < c1 - c0; cc += kConsumers) {
    const int64_t col = c0 + cc, o = col / H;
    if (a.combine) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        acc = __fadd_rn(acc, __fmul_rn(ys[cc * k + j], sm.weights[o * k + j]));
      }
      a.out[col] = FromFloat<T>(acc);
    } else {
      a.out[col] = FromFloat<T>(ys[cc]);
    }
  }
  if (a.trace && tid == 0 && (blockIdx.x == 0 || blockIdx.x == gridDim.x - 1)) {
    stamp[7] = clock64();
    const int printed = atomicAdd(&g_trace_prints, 1);
    if (printed >= 16 && printed < 22) {  // past the first, cold launches
      printf(
          "decode trace cta %d (cycles from start): routed %lld, x %lld, step1 %lld, barrier %lld, "
          "h %lld, step3 %lld, end %lld\n",
          blockIdx.x, stamp[1] - stamp[0], stamp[2] - stamp[0], stamp[3] - stamp[0],
          stamp[4] - stamp[0], stamp[5] - stamp[0], stamp[6] - stamp[0], stamp[7] - stamp[0]);
    }
  }
}

detail::KernelSwitch g_switch([] {
  return detail::EnvOnOff("KPLAN_MOE_DECODE_LAYER", kMoeDecodeLayerDefault);
});
std::atomic<int64_t> g_launches{0};

// What a launch needs to know of the device and the kernel, found once per
// (device, kernel) with the kernel's shared-memory opt-in set: cooperative
// launch support, the dynamic shared memory a CTA may have (the device's
// opt-in limit less the kernel's static part).
struct LaunchFacts {
  bool cooperative = false;
  int dynamic_smem = 0;
};

template <typename T>
absl::StatusOr<LaunchFacts> FactsFor(int device) {
  static std::mutex mu;
  static LaunchFacts facts[64];
  static bool known[64] = {};
  if (device < 0 || device >= 64) return absl::UnavailableError("device ordinal past 63");
  std::lock_guard<std::mutex> lock(mu);
  if (known[device]) return facts[device];
  int coop = 0, optin = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes fa;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&fa, DecodeLayerKernel<T>));
  const int dynamic = optin - static_cast<int>(fa.sharedSizeBytes);
  KPLAN_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      DecodeLayerKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
  facts[device] = LaunchFacts{coop != 0, dynamic};
  known[device] = true;
  return facts[device];
}

template <typename T>
absl::Status Launch(const MoeDecodeArgs& d, cudaStream_t stream) {
  int device = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KPLAN_ASSIGN_OR_RETURN(const int sms, MultiprocessorCount(device));
  const Knobs& knobs = KnobsFromEnv();
  KPLAN_ASSIGN_OR_RETURN(const LaunchFacts facts, FactsFor<T>(device));
  if (!facts.cooperative) return absl::UnavailableError("moe_decode_layer: no cooperative launch");

  detail::DecodeLayerShape shape;
  shape.tokens = d.num_tokens;
  shape.top_k = d.top_k;
  shape.num_experts = d.num_experts;
  shape.hidden = d.hidden_size;
  shape.intermediate = d.intermediate_size;
  shape.elem_bytes = sizeof(T);
  shape.gated = d.act < MoeActivation::kSiluNoMul;
  shape.combine = d.combine;
  shape.grouped_routing =
      d.router_logits != nullptr && d.routing.method == RoutingMethod::kGroupedTopK;
  const std::optional<detail::DecodeLayerPlan> plan = detail::PlanDecodeLayer(
      shape, sms, facts.dynamic_smem, kThreads / 32, knobs.stage_kib, knobs.max_stages);
  if (!plan.has_value()) {
    return absl::UnavailableError(
        "moe_decode_layer: shared memory holds no ring of two stages beside the hidden and "
        "intermediate rows");
  }

  Params<T> p;
  p.x = static_cast<const T*>(d.hidden);
  p.logits = d.router_logits;
  p.route = detail::routing::RouteParamsOf(d.routing);
  p.ids = d.topk_ids;
  p.weights = d.topk_weights;
  p.map = d.expert_map;
  p.num_experts = d.num_experts;
  p.num_local = d.num_local_experts;
  p.top_k = d.top_k;
  p.w13 = static_cast<const T*>(d.w13);
  p.b13 = d.b13;
  p.w2 = static_cast<const T*>(d.w2);
  p.b2 = d.b2;
  p.M = d.num_tokens;
  p.H = d.hidden_size;
  p.I = d.intermediate_size;
  p.N13 = shape.gated ? 2 * p.I : p.I;
  p.act = d.act;
  p.act_params = EffectiveActParams(d.act_params);
  p.h = static_cast<T*>(d.h);
  p.combine = d.combine;
  p.out = static_cast<T*>(d.out);
  p.plan = *plan;
  p.trace = knobs.trace != 0;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(plan->grid));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(plan->smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = knobs.pdl != 0 ? 2 : 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, DecodeLayerKernel<T>, p);
  if (err != cudaSuccess) cudaGetLastError();  // reported here, not by the next launcher
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    // Fewer multiprocessors than the device has are this context's (MPS, green
    // contexts): nothing was launched, the two kernels run instead.
    return absl::UnavailableError("moe_decode_layer: the grid does not fit this context");
  }
  KPLAN_CUDA_RETURN_IF_ERROR(err);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace

void SetMoeDecodeLayerMode(MoeKernelMode mode) { g_switch.Set(mode); }

bool MoeDecodeLayerEnabled() { return g_switch.On(); }

int64_t MoeDecodeLayerLaunches() { return g_launches.load(std::memory_order_relaxed); }

namespace detail {

absl::Status LaunchMoeDecodeLayer(const MoeDecodeArgs& d, cudaStream_t stream) {
  if (!Aligned16(d.hidden) || !Aligned16(d.w13) || !Aligned16(d.w2) || !Aligned16(d.h)) {
    return absl::UnavailableError("moe_decode_layer: bulk copies need 16-byte aligned rows");
  }
  const bool bf16 = d.dtype == DType::kBFloat16;
  return bf16 ? Launch<__nv_bfloat16>(d, stream) : Launch<__half>(d, stream);
}

}  // namespace detail

}  // namespace kplan::kernels::cuda
