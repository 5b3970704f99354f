// Warp-specialised persistent fp8 e4m3 grouped GEMM for sm_90a
// (moe_gemm_ws_fp8.h). The structure of the bf16 kernel (moe_gemm_ws_sm90.cu):
// the same tile schedule (moe_ws_schedule.h: 128 slots x 256 weight rows per
// tile, one expert per tile, persistent grid), a producer warpgroup feeding
// a 4-stage mbarrier ring and two consumer warpgroups of 64 slots each.
//
// Stage = one 128-wide k-block (128 bytes of every row: one swizzle row):
//   token rows 128 x 128 B (16 KiB, cp.async gather of A[slot / a_row_div]),
//   weight rows 256 x 128 B (32 KiB, one TMA box over [E * N, K] bytes),
//   block scales: the k-block's activation scale of each of the 128 slots
//   and the weight scales of the tile's two 128-row halves (1 KiB).
// Full barrier: 128 cp.async arrivals (noinc) + the TMA thread's expect_tx.
//
// Consumers (setmaxnreg 232): acc[128] fp32 (64 slots x 256 columns) and a
// partial tmp[64] for one 128-column half. Per k-block: 4 wgmma
// m64n128k32 e4m3 into tmp (fresh), wait, acc[half 0] += tmp · (s_a[row] ·
// s_w[half 0]); 4 more into tmp for half 1, wait, release the stage (scales
// already in registers), then promote half 1, while the other consumer
// warpgroup's wgmmas keep the tensor cores busy. Per-tensor and per-channel
// scales take the same path with factor 1 and scale the sum once in the
// epilogue. A consumer warpgroup whose 64 slots are all padding (the tail
// of an expert's last tile) waits and releases the stages without MMAs.
// Epilogue as the bf16 kernel's: round, + round(bias), 16-byte stores after
// a quad transpose; the producer already fills the next tile's stages.
//
// kActQuant (GEMM 1 of a gated block-scaled layer, W = w13 [E, 2I, K]
// unchanged): as the bf16 kernel's fused GEMM 1, tile n_tile covers the
// intermediate's columns [n0 / 2, n0 / 2 + 128), the weight box two boxes of
// 128 rows (gate rows n0 / 2.., up rows I + n0 / 2..: half 0 of the
// accumulator is gate, half 1 up, each half one weight scale block). The
// epilogue rounds gate and up as GEMM 1 stores them (round(round(acc) +
// round(bias))), applies silu(gate) · up as LaunchMoeActivation does
// (rounded once to T), and quantises the 128 columns, one 1 x 128 group of
// GEMM 2's activation, as LaunchMoeFp8Quantize's per-group form does
// (scale max(max|x|, 1e-10) / 448 from a max over the quad, the
// reference's e4m3 rounding): the bytes and scales of GEMM 1 ->
// LaunchMoeActivation -> LaunchMoeFp8Quantize, with neither C1 nor the
// 16-bit intermediate written.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/status.h"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/moe/moe_tma.h"
#include "kernels/cuda/moe/moe_wgmma.cuh"
#include "kernels/cuda/moe/moe_ws_launch.h"
#include "kernels/cuda/moe/moe_ws_pipeline.cuh"
#include "kernels/cuda/moe/moe_ws_schedule.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::CpAsync4;
using detail::Desc;
using detail::FenceProxyAsync;
using detail::FromFloat;
using detail::MbarArrive;
using detail::MbarWait;
using detail::TmaLoad2d;
using detail::ToFloat;
using detail::Wgmma;
using detail::WgmmaCommit;
using detail::WgmmaFence;
using detail::WgmmaWait;
using ws::kWsTileN;
using ws::kWsTileT;

constexpr int kBK = 128;                                 // K per stage: one scale block
constexpr int kHalf = kWsTileN / 2;                      // weight rows per scale block
constexpr int kSOffset = ws::kWsTBytes + ws::kWsWBytes;  // the stage's scales
constexpr int kStageBytes = kSOffset + 1024;             // + 128 + 2 scales, 1024-aligned: 49 KiB
constexpr int kSmemBytes = ws::WsSmemBytes(kStageBytes);
constexpr int kScaleTensor = 0, kScaleChannel = 1, kScaleBlock = 2;

struct Fp8Params {
  ws::WsSchedule sched;
  const int32_t *sorted, *expert_ids, *post;
  const uint8_t* a;
  const float* a_scale;  // block: [a_rows, nbk]; else [a_rows]
  const float* w_scale;  // block: [E, nbn, nbk]; channel: [E, N]; tensor: [E]
  void* c;
  const float* bias;
  int64_t numel, N, K;
  int a_row_div, num_local_experts, block_m;
  int scale_kind, nbn, nbk;
  int flags;  // kFlag*: measurement variants
  // kActQuant: GEMM 2's activation, bytes [numel, N / 2] and scales
  // [numel, N / 256], and the activation's parameters (clamp defaulted).
  uint8_t* q;
  float* q_scale;
  MoeActParams act_params;
};

// Measurement variants (KPLAN_MOE_FP8_WS_DEBUG bits), never set by the
// layer: one m64n256 accumulation over the whole K without promotion or
// scales (times the promotion; wrong results), and the epilogue without its
// stores (times the tile boundary; output unwritten).
constexpr int kFlagNoPromote = 1;
constexpr int kFlagNoStore = 2;

template <typename T, bool kActQuant>
__global__ void __launch_bounds__(ws::kWsThreads, 1)
    WsFp8GemmKernel(const __grid_constant__ CUtensorMap wmap, const Fp8Params p) {
  extern __shared__ uint8_t smem_dyn[];
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const ws::WsRing<kStageBytes> ring = ws::WsRingInit<kStageBytes>(&wmap);
  const uint8_t* base_gen =
      smem_dyn + (ring.base - static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn)));
  const ws::WsSchedule sched = ws::WsClip(p.sched, *p.post);
  const int64_t total = ws::WsTotalWork(sched);
  const int64_t N = p.N, K = p.K;
  const int64_t NI = N / 2;  // kActQuant: the intermediate's width
  const int nk = static_cast<int>((K + kBK - 1) / kBK);
  const bool block = p.scale_kind == kScaleBlock;

  if (wg == 0) {
    struct TileScales {
      int srow;  // the slot's activation row, -1: padding
      const float *sa, *sw;
      int wrow;
    };
    const int ptid = threadIdx.x;
    ws::WsProduce<uint8_t>(
        p, ring, sched, total, K, nk,
        // Block scales: this thread copies slot ptid's activation scale (and
        // threads 0, 1 the two weight-row halves' scales) of each k-block.
        [&](ws::WsTileInfo ti) {
          const int32_t sslot = p.sorted[ti.tt * kWsTileT + ptid];
          TileScales st;
          st.srow = sslot >= 0 && sslot < p.numel ? sslot / p.a_row_div : -1;
          st.sa = st.srow >= 0 ? p.a_scale + static_cast<int64_t>(st.srow) * p.nbk : p.a_scale;
          // The weight scale block of half ptid & 1: kActQuant the gate or
          // the up rows' (NI a multiple of 128), else the tile's halves'.
          const int nb = kActQuant ? static_cast<int>((ptid & 1) * (NI / kHalf) + ti.n0 / kWsTileN)
                                   : min(static_cast<int>(ti.n0 / kHalf) + (ptid & 1), p.nbn - 1);
          st.sw = p.w_scale + (static_cast<int64_t>(ti.e) * p.nbn + nb) * p.nbk;
          st.wrow =
              static_cast<int>(static_cast<int64_t>(ti.e) * N + (kActQuant ? ti.n0 / 2 : ti.n0));
          return st;
        },
        [&](const TileScales& st, int kt, uint32_t w_s, uint32_t fb, bool) {
          TmaLoad2d(w_s, &wmap, kt * kBK, st.wrow, fb);
          // kActQuant: the up rows, a second box of 128.
          if (kActQuant) TmaLoad2d(w_s + kHalf * 128, &wmap, kt * kBK, st.wrow + NI, fb);
        },
        [&](const TileScales& st, int kt, uint32_t t_s, uint32_t) {
          const uint32_t s_s = t_s + kSOffset;
          if (block) {
            CpAsync4(s_s + 4 * ptid, st.sa + kt, st.srow >= 0);
            if (ptid < 2) CpAsync4(s_s + 4 * (kWsTileT + ptid), st.sw + kt, true);
          }
        });
    return;
  }

  // -------------------------------------------------------------- consumers
  const ws::WsConsumer cs = ws::WsConsumerEnter();
  const int cw = cs.cw, lane = cs.lane, r0 = cs.r0;
  T* Cg = static_cast<T*>(p.c);
  float acc[kWsTileN /
            2];  // register i: row r0 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2
  float tmp[kHalf / 2];  // the same layout over one 128-column half
  ws::WsCursor c;
  for (int64_t lin = blockIdx.x; lin < total; lin += gridDim.x) {
    const ws::WsTileInfo ti = ws::WsTileOf(p, sched, lin);
    if (ti.empty) continue;
    const int32_t s0 = p.sorted[ti.tt * kWsTileT + r0];
    const int32_t s1 = p.sorted[ti.tt * kWsTileT + r0 + 8];
    const bool ok0 = s0 >= 0 && s0 < p.numel, ok1 = s1 >= 0 && s1 < p.numel;
    // Slots come first in an expert's range: the warpgroup's first row decides.
    const int32_t sfirst = p.sorted[ti.tt * kWsTileT + cw * 64];
    const bool rows = sfirst >= 0 && sfirst < p.numel;
#pragma unroll
    for (int i = 0; i < kWsTileN / 2; ++i) acc[i] = 0.0f;
    if (ti.local) {
      for (int kt = 0; kt < nk; ++kt) {
        MbarWait(ring.Full(c.stage), c.phase);
        const uint32_t t_s = ring.Stage(c.stage), w_s = t_s + ws::kWsTBytes;
        const float* s_s =
            reinterpret_cast<const float*>(base_gen + c.stage * kStageBytes + kSOffset);
        float m00 = 1.0f, m01 = 1.0f, m10 = 1.0f, m11 = 1.0f;  // m[row half][col half]
        if (rows) {
          // cp.async wrote through the generic proxy; wgmma reads through the async one.
          FenceProxyAsync();
        }
        if (rows && (p.flags & kFlagNoPromote)) {
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            Wgmma<kWsTileN, __nv_fp8_e4m3>::Run(acc, Desc(t_s + cw * 64 * 128 + kk * 32),
                                                Desc(w_s + kk * 32), 1);
          }
          WgmmaCommit();
          WgmmaWait<0>();
        } else if (rows) {
          if (block) {
            const float sa0 = s_s[r0], sa1 = s_s[r0 + 8];
            const float sw0 = s_s[kWsTileT], sw1 = s_s[kWsTileT + 1];
            m00 = sa0 * sw0, m01 = sa0 * sw1, m10 = sa1 * sw0, m11 = sa1 * sw1;
          }
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            Wgmma<kHalf, __nv_fp8_e4m3>::Run(tmp, Desc(t_s + cw * 64 * 128 + kk * 32),
                                             Desc(w_s + kk * 32), kk > 0);
          }
          WgmmaCommit();
          WgmmaWait<0>();
#pragma unroll
          for (int i = 0; i < kHalf / 2; ++i) acc[i] += tmp[i] * ((i & 2) ? m10 : m00);
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            Wgmma<kHalf, __nv_fp8_e4m3>::Run(tmp, Desc(t_s + cw * 64 * 128 + kk * 32),
                                             Desc(w_s + kHalf * 128 + kk * 32), kk > 0);
          }
          WgmmaCommit();
          WgmmaWait<0>();
        }
        // The stage is free (operands read, scales in registers): release it
        // before promoting the second half.
        if (lane == 0) MbarArrive(ring.Empty(c.stage));
        if (rows && !(p.flags & kFlagNoPromote)) {
#pragma unroll
          for (int i = 0; i < kHalf / 2; ++i) acc[kHalf / 2 + i] += tmp[i] * ((i & 2) ? m11 : m01);
        }
        c.Next();
      }
    }
    if (p.flags & kFlagNoStore) continue;
    // A warp whose 16 rows are all padding stores nothing: no epilogue (as
    // moe_gemm_ws_sm90.cu).
    if (!__any_sync(0xffffffffu, ok0 || ok1)) continue;
    // Per-tensor / per-channel: the whole sum times a_scale[row] · w_scale.
    if (!kActQuant && ti.local && !block) {
      const float sa0 = ok0 ? p.a_scale[s0 / p.a_row_div] : 0.0f;
      const float sa1 = ok1 ? p.a_scale[s1 / p.a_row_div] : 0.0f;
      const float* wsc = p.scale_kind == kScaleChannel ? p.w_scale + static_cast<int64_t>(ti.e) * N
                                                       : p.w_scale + ti.e;
#pragma unroll
      for (int j = 0; j < kWsTileN / 8; ++j) {
        const int64_t n = ti.n0 + 8 * j + 2 * (lane & 3);
        const bool in = n < N;
        const float w0 = p.scale_kind == kScaleChannel ? (in ? wsc[n] : 0.0f) : wsc[0];
        const float w1 = p.scale_kind == kScaleChannel ? (in ? wsc[n + 1] : 0.0f) : wsc[0];
        acc[4 * j] *= sa0 * w0, acc[4 * j + 1] *= sa0 * w1;
        acc[4 * j + 2] *= sa1 * w0, acc[4 * j + 3] *= sa1 * w1;
      }
    }
    const float* bias =
        ti.local && p.bias != nullptr ? p.bias + static_cast<int64_t>(ti.e) * N : nullptr;
    if constexpr (kActQuant) {
      // Register i of half 0 (i < 64) is gate column c0 + 8 (i / 4) + 2 q +
      // i % 2 of row r0 + 8 ((i / 2) % 2), register 64 + i the up value of
      // the same column. The activation goes back into registers 0..63.
      const int q = lane & 3;
      const int64_t c0 = ti.n0 / 2;
      auto round_t = [](float x) { return ToFloat(FromFloat<T>(x)); };
      float mx0 = 0.0f, mx1 = 0.0f;  // max |act| of rows r0, r0 + 8
#pragma unroll
      for (int m = 0; m < kHalf / 16; ++m) {
        float g[8], u[8];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 2 * m + jj;
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            g[4 * jj + x] = round_t(acc[4 * j + x]);
            u[4 * jj + x] = round_t(acc[kHalf / 2 + 4 * j + x]);
          }
          if (bias != nullptr) {
            const int64_t n = c0 + 8 * j + 2 * q;
            const float b[4] = {round_t(bias[n]), round_t(bias[n + 1]), round_t(bias[NI + n]),
                                round_t(bias[NI + n + 1])};
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              g[4 * jj + x] = round_t(g[4 * jj + x] + b[x % 2]);
              u[4 * jj + x] = round_t(u[4 * jj + x] + b[2 + x % 2]);
            }
          }
        }
        moe_math::GatedSiluN(p.act_params, g, u);
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          const float a = round_t(g[v]);
          acc[8 * m + v] = a;
          if (v % 4 < 2) {
            mx0 = fmaxf(mx0, fabsf(a));
          } else {
            mx1 = fmaxf(mx1, fabsf(a));
          }
        }
      }
      // The group's maximum over the quad's 128 columns (exact in any order).
#pragma unroll
      for (int d = 1; d < 4; d *= 2) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
      }
      const float sc0 = detail::quant::Fp8GroupScale(mx0), sc1 = detail::quant::Fp8GroupScale(mx1);
      // Per 64 columns (chunks m, m + 1 of 32): the rows' bytes, 8-byte stores.
#pragma unroll
      for (int m = 0; m < kHalf / 32; m += 2) {
        uint32_t w[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const float* a = acc + 4 * (4 * (m + h) + jj);
            w[h][jj] = static_cast<uint32_t>(detail::quant::Fp8Quantise(a[0], sc0)) |
                       static_cast<uint32_t>(detail::quant::Fp8Quantise(a[1], sc0)) << 8 |
                       static_cast<uint32_t>(detail::quant::Fp8Quantise(a[2], sc1)) << 16 |
                       static_cast<uint32_t>(detail::quant::Fp8Quantise(a[3], sc1)) << 24;
          }
        }
        const int64_t n = c0 + 32 * m;
        detail::QuadStore8x2(w[0], w[1], lane,
                             ok0 ? p.q + static_cast<int64_t>(s0) * NI + n : nullptr,
                             ok1 ? p.q + static_cast<int64_t>(s1) * NI + n : nullptr);
      }
      if (q == 0) {
        const int64_t groups = NI / kHalf, gi = ti.n0 / kWsTileN;
        if (ok0) p.q_scale[static_cast<int64_t>(s0) * groups + gi] = sc0;
        if (ok1) p.q_scale[static_cast<int64_t>(s1) * groups + gi] = sc1;
      }
      continue;
    }
    detail::WsStoreRows<T, kWsTileN>(
        [&](int j, int64_t, float(&v)[4]) {
#pragma unroll
          for (int x = 0; x < 4; ++x) v[x] = acc[4 * j + x];
        },
        bias, ti.n0, N, lane, ok0 ? Cg + static_cast<int64_t>(s0) * N : nullptr,
        ok1 ? Cg + static_cast<int64_t>(s1) * N : nullptr);
  }
}

detail::KernelSwitch g_ws([] { return ws::WsEnvNotOld("KPLAN_MOE_FP8_GEMM"); });
// On: the rule of MoeGemmWsFp8ActQuantFor applies; forced (kOn): always
// (with g_ws on).
detail::KernelSwitch g_act_quant([] { return detail::EnvOnOff("KPLAN_MOE_FP8_ACT_QUANT", true); });
std::atomic<int64_t> g_launches{0}, g_act_quant_launches{0};

// Measurement knobs of moe_fp8_gemm_bench: KPLAN_MOE_FP8_WS_DEBUG (kFlag*
// bits) and KPLAN_MOE_FP8_WS_GROUP (units per group; default
// ws::WsAutoGroup).
const ws::WsKnobs& Knobs() {
  static const ws::WsKnobs knobs =
      ws::WsKnobsFromEnv("KPLAN_MOE_FP8_WS_DEBUG", "KPLAN_MOE_FP8_WS_GROUP");
  return knobs;
}
// kActQuant: q / q_scale / act_params (Fp8Params) of the fused GEMM 1.
template <typename T, bool kActQuant>
absl::Status LaunchFp8(const MoeGroupedGemmArgs& g, uint8_t* q, float* q_scale,
                       const MoeActParams& act_params, cudaStream_t stream) {
  int sms = 0;
  constexpr auto kKernel = WsFp8GemmKernel<T, kActQuant>;
  KPLAN_RETURN_IF_ERROR(ws::WsLaunchSetup<kKernel>(kSmemBytes, &sms));
  CUtensorMap map;
  if (absl::Status st = detail::EncodeTma2d(
          &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, g.w, static_cast<uint64_t>(g.K),
          static_cast<uint64_t>(g.num_local_experts) * static_cast<uint64_t>(g.N),
          static_cast<uint64_t>(g.K), kBK, kActQuant ? kHalf : kWsTileN, "moe_grouped_gemm_ws_fp8");
      !st.ok()) {
    return st;
  }
  Fp8Params p{};
  p.sched = ws::MakeWsSchedule(g.num_blocks, g.block_m, g.N, sms, Knobs().group);
  p.sorted = g.sorted_token_ids;
  p.expert_ids = g.expert_ids;
  p.post = g.num_tokens_post_padded;
  p.a = static_cast<const uint8_t*>(g.a);
  p.a_scale = g.a_scale;
  p.w_scale = g.w_scale;
  p.c = g.c;
  p.bias = g.bias;
  p.numel = g.numel;
  p.N = g.N;
  p.K = g.K;
  p.a_row_div = g.a_row_div;
  p.num_local_experts = g.num_local_experts;
  p.block_m = g.block_m;
  p.scale_kind = g.w_scale_kind == MoeFp8WeightScale::kBlock        ? kScaleBlock
                 : g.w_scale_kind == MoeFp8WeightScale::kPerChannel ? kScaleChannel
                                                                    : kScaleTensor;
  p.nbn = static_cast<int>((g.N + kHalf - 1) / kHalf);
  p.nbk = static_cast<int>((g.K + kBK - 1) / kBK);
  p.flags = Knobs().debug_flags;
  p.q = q;
  p.q_scale = q_scale;
  p.act_params = EffectiveActParams(act_params);
  if (p.sched.grid <= 0) return absl::OkStatus();
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(kKernel, dim3(p.sched.grid), dim3(ws::kWsThreads),
                                               kSmemBytes, stream, map, p));
  (kActQuant ? g_act_quant_launches : g_launches).fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// The checks both launchers make before anything is launched.
absl::Status CheckFp8Launch(const MoeGroupedGemmArgs& g) {
  if (absl::Status s = CheckHalfDType(g.dtype, "moe_grouped_gemm_ws_fp8"); !s.ok()) return s;
  if (!MoeGemmWsFp8Applies(g)) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_fp8: arguments not supported");
  }
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (g.a == nullptr || g.w == nullptr || g.a_scale == nullptr || g.w_scale == nullptr ||
      g.sorted_token_ids == nullptr || g.expert_ids == nullptr ||
      g.num_tokens_post_padded == nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_fp8: null pointer");
  }
  return absl::OkStatus();
}

}  // namespace

void SetMoeGemmWsFp8Mode(MoeGemmWsMode mode) { g_ws.Set(mode); }

bool MoeGemmWsFp8Enabled() { return g_ws.On(); }

bool MoeGemmWsFp8Applies(const MoeGroupedGemmArgs& g) {
  if (!g.fp8 || g.splits != 1 || g.reduce_in_consumer) return false;
  if (g.N <= 0 || g.N % 8 != 0 || g.K <= 0 || g.K % 16 != 0 || g.a_row_div <= 0) return false;
  if (g.num_local_experts <= 0 || g.numel < 0 || g.numel > INT32_MAX || g.num_blocks < 0) {
    return false;
  }
  if (!Aligned16(g.a) || !Aligned16(g.w) || !Aligned16(g.c)) return false;
  return ws::WsTilesApply(g) && g.K < (int64_t{1} << 31);
}

absl::Status LaunchMoeGroupedGemmWsFp8(const MoeGroupedGemmArgs& g, cudaStream_t stream) {
  KPLAN_RETURN_IF_ERROR(CheckFp8Launch(g));
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (g.c == nullptr) return absl::InvalidArgumentError("moe_grouped_gemm_ws_fp8: null pointer");
  if (g.dtype == DType::kBFloat16)
    return LaunchFp8<__nv_bfloat16, false>(g, nullptr, nullptr, {}, stream);
  return LaunchFp8<__half, false>(g, nullptr, nullptr, {}, stream);
}

int64_t MoeGemmWsFp8Launches() { return g_launches.load(std::memory_order_relaxed); }

void SetMoeGemmWsFp8ActQuantMode(MoeGemmWsMode mode) { g_act_quant.Set(mode); }

bool MoeGemmWsFp8ActQuantFor(int64_t numel, int num_experts, int64_t gemm1_k) {
  if (!g_act_quant.On() || !g_ws.On()) return false;
  if (g_act_quant.Forced()) return true;
  return MoeSlotsPerExpert(numel, num_experts) >= kMoeGemmWsFp8ActQuantMinSlots &&
         gemm1_k >= kMoeGemmWsFp8ActQuantMinK;
}

bool MoeGemmWsFp8ActQuantApplies(const MoeGroupedGemmArgs& g, MoeActivation act, int group) {
  return act == MoeActivation::kSilu && group == kMoeGemmWsFp8ActQuantGroup &&
         g.w_scale_kind == MoeFp8WeightScale::kBlock &&
         g.N % (2 * kMoeGemmWsFp8ActQuantGroup) == 0 && MoeGemmWsFp8Applies(g);
}

absl::Status LaunchMoeGroupedGemmWsFp8ActQuant(const MoeGroupedGemmArgs& g,
                                               const MoeActParams& params, uint8_t* q,
                                               float* q_scale, cudaStream_t stream) {
  if (!MoeGemmWsFp8ActQuantApplies(g, MoeActivation::kSilu, kMoeGemmWsFp8ActQuantGroup)) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_fp8_act_quant: arguments not supported");
  }
  KPLAN_RETURN_IF_ERROR(CheckFp8Launch(g));
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (q == nullptr || q_scale == nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_fp8_act_quant: null pointer");
  }
  if (reinterpret_cast<uintptr_t>(q) % 8 != 0 || reinterpret_cast<uintptr_t>(q_scale) % 4 != 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm_ws_fp8_act_quant: misaligned output");
  }
  if (g.dtype == DType::kBFloat16) {
    return LaunchFp8<__nv_bfloat16, true>(g, q, q_scale, params, stream);
  }
  return LaunchFp8<__half, true>(g, q, q_scale, params, stream);
}

int64_t MoeGemmWsFp8ActQuantLaunches() {
  return g_act_quant_launches.load(std::memory_order_relaxed);
}

}  // namespace kplan::kernels::cuda
