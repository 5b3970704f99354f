// The dequantising grouped GEMM of moe_quant_gemm.h.
//
// One CTA per (BM-row slice of an align block, BN column tile), 256 threads.
// Operands are decoded from their stored form in registers and written to a
// double-buffered shared-memory stage in the compute type; the next k step's
// raw global loads are issued before the current stage is multiplied, so the
// loads overlap the math (one barrier per k step).
//   * MMA modes (fp16 / bf16 inputs): 8 warps as 2 (M) x 4 (N), each 32x32 of
//     mma.sync m16n8k16 with fp32 accumulators; stages [BM][BK+8] and
//     [BN][BK+8] (k contiguous; the pad spreads the fragment loads over all
//     banks). fp8 scales are applied to a per-k-block accumulator when the
//     block (or, without block scales, the whole K) is done, exactly where
//     the reference's native_w8a8_block_matmul applies them.
//   * SIMT mode (fp32): stages transposed [BK][BM+4] / [BK][BN+4], every
//     thread 4 rows x 8 columns of fp32 FMA; fp8 scales are folded into the
//     decoded operands (q·s, as the reference dequantises per-tensor ones).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::RoundTo;
using detail::StoreFromFloat;

constexpr int BM = 64, BN = 128, kThreads = 256;
constexpr int kModeSimt = 0, kModeF16 = 1, kModeBf16 = 2;

__device__ __forceinline__ float Fp8ToFloat(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// 8 consecutive raw elements (up to 32 bytes) of one row.
struct Raw {
  uint4 v[2];
};

__device__ __forceinline__ void Zero(Raw& r) {
  r.v[0] = make_uint4(0, 0, 0, 0);
  r.v[1] = r.v[0];
}

__device__ __forceinline__ void LoadRaw(Raw& r, const void* base, int64_t elem, int bytes_x2) {
  // bytes_x2: 2 x bytes per element (int4 = 1).
  const char* p = static_cast<const char*>(base) + elem * bytes_x2 / 2;
  switch (bytes_x2) {
    case 8:  // fp32
      r.v[0] = __ldg(reinterpret_cast<const uint4*>(p));
      r.v[1] = __ldg(reinterpret_cast<const uint4*>(p) + 1);
      return;
    case 4:
      r.v[0] = __ldg(reinterpret_cast<const uint4*>(p));
      return;
    case 2: {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
      r.v[0].x = u.x;
      r.v[0].y = u.y;
      return;
    }
    default:
      r.v[0].x = __ldg(reinterpret_cast<const unsigned*>(p));
  }
}

__device__ __forceinline__ void RawFloats(const Raw& r, int kind, float* out) {
  // kind: 0 fp32, 1 fp16, 2 bf16 (DType's values, kernels/common/types.h).
  if (kind == 0) {
    const float* f = reinterpret_cast<const float*>(&r.v[0]);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = f[j];
  } else if (kind == 1) {
    const __half* h = reinterpret_cast<const __half*>(&r.v[0]);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = __half2float(h[j]);
  } else {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&r.v[0]);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = __bfloat162float(h[j]);
  }
}

__device__ __forceinline__ uint8_t RawByte(const Raw& r, int j) {
  return reinterpret_cast<const uint8_t*>(&r.v[0])[j];
}

template <int kMode>
struct Cfg {
  static constexpr bool kMma = kMode != kModeSimt;
  static constexpr int BK = kMma ? 32 : 16;
  static constexpr int kChunksPerRow = BK / 8;
  static constexpr int kAChunks = BM * kChunksPerRow;
  static constexpr int kWChunks = BN * kChunksPerRow;
  static constexpr int kAPer = (kAChunks + kThreads - 1) / kThreads;
  static constexpr int kWPer = kWChunks / kThreads;
  // MMA: [BM][BK+8] and [BN][BK+8] 16-bit; SIMT: [BK][BM+4] and [BK][BN+4] fp32.
  static constexpr int kLda = kMma ? BK + 8 : BM + 4;
  static constexpr int kLdw = kMma ? BK + 8 : BN + 4;
  static constexpr int kAElems = kMma ? BM * kLda : BK * kLda;
  static constexpr int kWElems = kMma ? BN * kLdw : BK * kLdw;
  static constexpr int kElemBytes = kMma ? 2 : 4;
  static constexpr int kSmemBytes = 2 * (kAElems + kWElems) * kElemBytes;
  static_assert(kWChunks % kThreads == 0, "whole W chunks per thread");
};

template <int kMode>
__global__ void __launch_bounds__(kThreads) QuantGemmKernel(MoeQuantGemmArgs p, int subtiles) {
  using C = Cfg<kMode>;
  constexpr int BK = C::BK;
  using CT = std::conditional_t<kMode == kModeF16, __half,
                                std::conditional_t<kMode == kModeBf16, __nv_bfloat16, float>>;
  __shared__ __align__(16) unsigned char smem_raw[C::kSmemBytes];
  __shared__ int64_t s_arow[BM];
  __shared__ int64_t s_slot[BM];
  CT* smem = reinterpret_cast<CT*>(smem_raw);

  const int64_t tile = blockIdx.x / subtiles;
  const int sub = blockIdx.x % subtiles;
  if (tile * p.block_m >= *p.num_tokens_post_padded) return;
  const int64_t row0 = tile * p.block_m + static_cast<int64_t>(sub) * BM;
  const int64_t row_end = (tile + 1) * p.block_m;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int e = p.expert_ids[tile];
  const int tid = threadIdx.x;
  if (tid < BM) {
    const int64_t r = row0 + tid;
    const int64_t slot = r < row_end ? p.sorted_token_ids[r] : -1;
    const bool valid = slot >= 0 && slot < p.numel;
    s_slot[tid] = valid ? slot : -1;
    s_arow[tid] = valid ? slot / p.a_row_div : -1;
  }
  __syncthreads();
  const int64_t N = p.N, K = p.K;

  if (e < 0 || e >= p.num_local_experts) {  // not a local expert: zero rows
    for (int i = tid; i < BM * BN; i += kThreads) {
      const int64_t slot = s_slot[i / BN], n = n0 + i % BN;
      if (slot >= 0 && n < N) StoreFromFloat(p.c, slot * N + n, p.c_type, 0.0f);
    }
    return;
  }

  const MoeQuantWeights& w = p.w;
  const bool fp8w = w.kind == DType::kFp8E4m3;
  const bool wblock = w.scale_kind == MoeWeightScale::kBlock;
  const int w_bx2 = w.kind == DType::kFloat32                                   ? 8
                    : (w.kind == DType::kFloat16 || w.kind == DType::kBFloat16) ? 4
                    : w.kind == DType::kInt4Packed                              ? 1
                                                                                : 2;
  const int a_bx2 = p.a_fp8 ? 2 : p.a_type == DType::kFloat32 ? 8 : 4;
  const int64_t kta = p.a_group > 0 ? (K + p.a_group - 1) / p.a_group : 1;
  const int64_t nbn = wblock ? (N + w.block_n - 1) / w.block_n : 1;
  const int64_t nbk = wblock ? (K + w.block_k - 1) / w.block_k : 1;
  const int64_t groups = w.scale_kind == MoeWeightScale::kGroup ? K / w.group_size : 1;
  const int64_t w_row0 = static_cast<int64_t>(e) * N;

  // This thread's chunks: 8 consecutive k of one row.
  int a_r[C::kAPer], a_kc[C::kAPer];
  bool a_on[C::kAPer];
#pragma unroll
  for (int i = 0; i < C::kAPer; ++i) {
    const int c = tid + i * kThreads;
    a_on[i] = c < C::kAChunks;
    a_r[i] = a_on[i] ? c / C::kChunksPerRow : 0;
    a_kc[i] = c % C::kChunksPerRow;
  }
  int w_r[C::kWPer], w_kc[C::kWPer];
#pragma unroll
  for (int i = 0; i < C::kWPer; ++i) {
    const int c = tid + i * kThreads;
    w_r[i] = c / C::kChunksPerRow;
    w_kc[i] = c % C::kChunksPerRow;
  }
  Raw ra[C::kAPer], rw[C::kWPer];

  auto load_raw = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < C::kAPer; ++i) {
      Zero(ra[i]);
      const int64_t arow = a_on[i] ? s_arow[a_r[i]] : -1;
      const int64_t k = k0 + a_kc[i] * 8;
      if (arow >= 0 && k < K) LoadRaw(ra[i], p.a, arow * K + k, a_bx2);
    }
#pragma unroll
    for (int i = 0; i < C::kWPer; ++i) {
      Zero(rw[i]);
      const int64_t n = n0 + w_r[i];
      const int64_t k = k0 + w_kc[i] * 8;
      if (n < N && k < K) LoadRaw(rw[i], w.data, (w_row0 + n) * K + k, w_bx2);
    }
  };

  // Decodes the raw chunks of step k0 into stage `buf`.
  auto store_stage = [&](int buf, int64_t k0) {
    CT* As = smem + buf * C::kAElems;
    CT* Ws = smem + 2 * C::kAElems + buf * C::kWElems;
    auto put = [&](CT* base, int ld, int r, int kc, const float* v) {
      if constexpr (C::kMma) {
        alignas(16) CT h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if constexpr (kMode == kModeF16) {
            h[j] = __float2half_rn(v[j]);
          } else {
            h[j] = __float2bfloat16_rn(v[j]);
          }
        }
        *reinterpret_cast<uint4*>(base + r * ld + kc * 8) = *reinterpret_cast<const uint4*>(h);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) base[(kc * 8 + j) * ld + r] = v[j];
      }
    };
#pragma unroll
    for (int i = 0; i < C::kAPer; ++i) {
      if (!a_on[i]) continue;
      float v[8];
      const int64_t k = k0 + a_kc[i] * 8;
      if (p.a_fp8) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = Fp8ToFloat(RawByte(ra[i], j));
        const int64_t arow = s_arow[a_r[i]];
        if (!C::kMma && arow >= 0 && k < K) {  // fold the activation scale
          if (p.a_group == 0) {
            const float s = p.a_scale[arow];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] *= s;
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] *= p.a_scale[arow * kta + (k + j) / p.a_group];
          }
        }
      } else {
        RawFloats(ra[i], static_cast<int>(p.a_type), v);
      }
      put(As, C::kLda, a_r[i], a_kc[i], v);
    }
#pragma unroll
    for (int i = 0; i < C::kWPer; ++i) {
      float v[8];
      const int64_t n = n0 + w_r[i];
      const int64_t k = k0 + w_kc[i] * 8;
      const bool in = n < N && k < K;
      switch (w.kind) {
        case DType::kFloat32:
        case DType::kFloat16:
        case DType::kBFloat16:
          RawFloats(rw[i], static_cast<int>(w.kind), v);
          break;
        case DType::kFp8E4m3:
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = Fp8ToFloat(RawByte(rw[i], j));
          if (!C::kMma && in) {  // fold the weight scale
            if (w.scale_kind == MoeWeightScale::kPerTensor) {
              const float s = w.scale[e];
#pragma unroll
              for (int j = 0; j < 8; ++j) v[j] *= s;
            } else if (w.scale_kind == MoeWeightScale::kPerChannel) {
              const float s = w.scale[w_row0 + n];
#pragma unroll
              for (int j = 0; j < 8; ++j) v[j] *= s;
            } else {
              const float* srow = w.scale + (static_cast<int64_t>(e) * nbn + n / w.block_n) * nbk;
#pragma unroll
              for (int j = 0; j < 8; ++j) v[j] *= srow[(k + j) / w.block_k];
            }
          }
          break;
        default: {  // int8 / int4 with group scales
          const bool int4 = w.kind == DType::kInt4Packed;
          const int64_t g0 = (w_row0 + n) * groups;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float q;
            if (int4) {
              const uint8_t b = RawByte(rw[i], j >> 1);
              q = static_cast<float>((j & 1) ? (b >> 4) : (b & 0x0f));
            } else if (w.zero != nullptr) {
              q = static_cast<float>(RawByte(rw[i], j));
            } else {
              q = static_cast<float>(static_cast<int8_t>(RawByte(rw[i], j)));
            }
            float zp = 0.0f, s = 0.0f;
            if (in) {
              const int64_t g = g0 + (k + j) / w.group_size;
              s = w.scale[g];
              zp = w.zero != nullptr ? static_cast<float>(w.zero[g]) : int4 ? 8.0f : 0.0f;
            }
            // (q - zp) · s; the MMA modes then round to the activation dtype
            // (the compute type), as the reference does.
            v[j] = __fmul_rn(q - zp, s);
          }
        }
      }
      put(Ws, C::kLdw, w_r[i], w_kc[i], v);
    }
  };

  const int64_t ktiles = (K + BK - 1) / BK;
  load_raw(0);
  store_stage(0, 0);
  __syncthreads();

  if constexpr (C::kMma) {
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
    float acc[2][4][4], part[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][j][c] = part[i][j][c] = 0.0f;
    // fp8: the k-block of the scales (the whole K without block scales).
    const int64_t kblock = fp8w && wblock ? w.block_k : INT64_MAX / 2;

    auto flush = [&](int64_t t) {  // acc += part · scales of k-block t; part = 0
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t arow = s_arow[wm + i * 16 + g + h * 8];
          float sa = 1.0f;
          if (fp8w && arow >= 0) sa = p.a_scale[p.a_group == 0 ? arow : arow * kta + t];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int64_t n = std::min<int64_t>(n0 + wn + j * 8 + 2 * tg + c, N - 1);
              float sw = 1.0f;
              if (fp8w) {
                sw = w.scale_kind == MoeWeightScale::kPerTensor ? w.scale[e]
                     : w.scale_kind == MoeWeightScale::kPerChannel
                         ? w.scale[w_row0 + n]
                         : w.scale[(static_cast<int64_t>(e) * nbn + n / w.block_n) * nbk + t];
              }
              float& pv = part[i][j][h * 2 + c];
              acc[i][j][h * 2 + c] += pv * (sa * sw);
              pv = 0.0f;
            }
          }
        }
      }
    };

    for (int64_t kt = 0; kt < ktiles; ++kt) {
      const int buf = static_cast<int>(kt & 1);
      const bool more = kt + 1 < ktiles;
      if (more) load_raw((kt + 1) * BK);
      const CT* As = smem + buf * C::kAElems;
      const CT* Ws = smem + 2 * C::kAElems + buf * C::kWElems;
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        uint32_t fa[2][4], fb[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const CT* base = As + (wm + i * 16 + g) * C::kLda + kk + 2 * tg;
          fa[i][0] = *reinterpret_cast<const uint32_t*>(base);
          fa[i][1] = *reinterpret_cast<const uint32_t*>(base + 8 * C::kLda);
          fa[i][2] = *reinterpret_cast<const uint32_t*>(base + 8);
          fa[i][3] = *reinterpret_cast<const uint32_t*>(base + 8 * C::kLda + 8);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const CT* base = Ws + (wn + j * 8 + g) * C::kLdw + kk + 2 * tg;
          fb[j][0] = *reinterpret_cast<const uint32_t*>(base);
          fb[j][1] = *reinterpret_cast<const uint32_t*>(base + 8);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if constexpr (kMode == kModeBf16) {
              detail::quant::Mma16816<__nv_bfloat16>(part[i][j], fa[i], fb[j][0], fb[j][1]);
            } else {
              detail::quant::Mma16816<__half>(part[i][j], fa[i], fb[j][0], fb[j][1]);
            }
          }
      }
      const int64_t k_done = (kt + 1) * BK;
      if (!more || k_done % kblock == 0)
        flush((std::min<int64_t>(k_done, K) - 1) / std::min(kblock, K));
      if (more) store_stage(buf ^ 1, (kt + 1) * BK);
      __syncthreads();
    }

    const float* bias = p.bias != nullptr ? p.bias + w_row0 : nullptr;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t slot = s_slot[wm + i * 16 + g + h * 8];
        if (slot < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int64_t n = n0 + wn + j * 8 + 2 * tg + c;
            if (n >= N) continue;
            float v = RoundTo(p.c_type, acc[i][j][h * 2 + c]);
            if (bias != nullptr) v = v + RoundTo(p.c_type, bias[n]);
            StoreFromFloat(p.c, slot * N + n, p.c_type, v);
          }
        }
      }
    }
  } else {
    const int ty = tid >> 4, tx = tid & 15;
    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      const int buf = static_cast<int>(kt & 1);
      const bool more = kt + 1 < ktiles;
      if (more) load_raw((kt + 1) * BK);
      const float* As = reinterpret_cast<const float*>(smem) + buf * C::kAElems;
      const float* Ws = reinterpret_cast<const float*>(smem) + 2 * C::kAElems + buf * C::kWElems;
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        const float4 a = *reinterpret_cast<const float4*>(As + kk * C::kLda + ty * 4);
        const float4 b0 = *reinterpret_cast<const float4*>(Ws + kk * C::kLdw + tx * 4);
        const float4 b1 = *reinterpret_cast<const float4*>(Ws + kk * C::kLdw + 64 + tx * 4);
        const float av[4] = {a.x, a.y, a.z, a.w};
        const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      if (more) store_stage(buf ^ 1, (kt + 1) * BK);
      __syncthreads();
    }
    const float* bias = p.bias != nullptr ? p.bias + w_row0 : nullptr;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t slot = s_slot[ty * 4 + i];
      if (slot < 0) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
        if (n >= N) continue;
        float v = RoundTo(p.c_type, acc[i][j]);
        if (bias != nullptr) v = v + RoundTo(p.c_type, bias[n]);
        StoreFromFloat(p.c, slot * N + n, p.c_type, v);
      }
    }
  }
}

}  // namespace

absl::Status LaunchMoeQuantGemm(const MoeQuantGemmArgs& g, cudaStream_t stream) {
  if (!g.a_fp8) {
    if (absl::Status s = CheckFloatDType(g.a_type, "moe_quant_gemm: a_type"); !s.ok()) return s;
  }
  if (absl::Status s = CheckFloatDType(g.c_type, "moe_quant_gemm: c_type"); !s.ok()) return s;
  if (!IsFloatDType(g.w.kind) && g.w.kind != DType::kFp8E4m3 && g.w.kind != DType::kInt8 &&
      g.w.kind != DType::kInt4Packed) {
    return absl::InvalidArgumentError("moe_quant_gemm: unsupported weight dtype");
  }
  const MoeQuantWeights& w = g.w;
  if (g.N <= 0) return absl::InvalidArgumentError("moe_quant_gemm: N must be positive");
  if (g.K <= 0 || g.K % 8 != 0) {
    return absl::InvalidArgumentError("moe_quant_gemm: K must be a positive multiple of 8");
  }
  if (g.a_row_div <= 0 || g.block_m <= 0 || g.num_local_experts <= 0) {
    return absl::InvalidArgumentError(
        "moe_quant_gemm: a_row_div, block_m and num_local_experts must be positive");
  }
  if (g.numel < 0 || g.num_blocks < 0 || g.numel > INT32_MAX) {
    return absl::InvalidArgumentError("moe_quant_gemm: numel / num_blocks out of range");
  }
  const bool fp8w = w.kind == DType::kFp8E4m3;
  const bool intw = w.kind == DType::kInt8 || w.kind == DType::kInt4Packed;
  if (fp8w != g.a_fp8) {
    return absl::InvalidArgumentError(
        "moe_quant_gemm: fp8 weights need fp8 activations and "
        "other weights float activations");
  }
  const bool scale_ok =
      fp8w   ? (w.scale_kind == MoeWeightScale::kPerTensor ||
              w.scale_kind == MoeWeightScale::kPerChannel || w.scale_kind == MoeWeightScale::kBlock)
      : intw ? w.scale_kind == MoeWeightScale::kGroup
             : w.scale_kind == MoeWeightScale::kNone;
  if (!scale_ok) {
    return absl::InvalidArgumentError("moe_quant_gemm: scale kind does not fit the weights");
  }
  if (w.scale_kind != MoeWeightScale::kNone && w.scale == nullptr) {
    return absl::InvalidArgumentError("moe_quant_gemm: weight scales are null");
  }
  if (w.scale_kind == MoeWeightScale::kBlock && (w.block_n <= 0 || w.block_k <= 0)) {
    return absl::InvalidArgumentError("moe_quant_gemm: block sizes must be positive");
  }
  if (intw && (w.group_size <= 0 || g.K % w.group_size != 0)) {
    return absl::InvalidArgumentError("moe_quant_gemm: group_size must divide K");
  }
  if (g.a_fp8 && (g.a_scale == nullptr || g.a_group < 0)) {
    return absl::InvalidArgumentError("moe_quant_gemm: fp8 activations need scales");
  }
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (g.a == nullptr || w.data == nullptr || g.c == nullptr || g.sorted_token_ids == nullptr ||
      g.expert_ids == nullptr || g.num_tokens_post_padded == nullptr) {
    return absl::InvalidArgumentError("moe_quant_gemm: null pointer");
  }
  if (!Aligned16(g.a) || !Aligned16(w.data)) {
    return absl::InvalidArgumentError("moe_quant_gemm: a and w must be 16-byte aligned");
  }
  const int subtiles = (g.block_m + BM - 1) / BM;
  const int64_t m_tiles = g.num_blocks * subtiles;
  const int64_t n_tiles = (g.N + BN - 1) / BN;
  if (m_tiles > INT32_MAX || n_tiles > 65535) {
    return absl::InvalidArgumentError("moe_quant_gemm: grid too large");
  }
  // Tensor cores where every operand is exact in the 16-bit input type:
  // fp8 values in fp16 (with block scales when the k-block is whole k steps),
  // int / float weights rounded to (or stored in) bf16 / fp16 activations.
  int mode = kModeSimt;
  if (fp8w) {
    const bool block = w.scale_kind == MoeWeightScale::kBlock;
    if ((!block && g.a_group == 0) ||
        (block && g.a_group == w.block_k && w.block_k % Cfg<kModeF16>::BK == 0)) {
      mode = kModeF16;
    }
  } else if (g.a_type != DType::kFloat32 && g.c_type == g.a_type) {
    const DType same = g.a_type == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
    if (intw || w.kind == same) mode = g.a_type == DType::kFloat16 ? kModeF16 : kModeBf16;
  }
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(n_tiles));
  switch (mode) {
    case kModeF16:
      QuantGemmKernel<kModeF16><<<grid, kThreads, 0, stream>>>(g, subtiles);
      break;
    case kModeBf16:
      QuantGemmKernel<kModeBf16><<<grid, kThreads, 0, stream>>>(g, subtiles);
      break;
    default:
      QuantGemmKernel<kModeSimt><<<grid, kThreads, 0, stream>>>(g, subtiles);
  }
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("QuantGemmKernel");
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
