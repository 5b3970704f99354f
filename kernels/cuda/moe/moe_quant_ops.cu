// fp8 activation quantisers and the fp32 elementwise steps of the emulation
// route (moe_quant_gemm.h). The fp8 conversion is the reference's
// FloatToFp8E4m3 (kernels/cpu/moe/moe_dtypes.cc) bit for bit rather than the
// hardware cvt, and scales are computed with the reference's operations in
// its order (IEEE division, no contraction), so a quantised activation is the
// same byte on both paths. The activation formulas are
// moe_activation_math.cuh's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/moe/moe_routing.cuh"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::LoadAsFloat;
using detail::WarpMax;
using detail::quant::Fp8GroupScale;
using detail::quant::Fp8Quantise;
using detail::quant::Fp8TensorScale;
using detail::quant::Fp8TokenScale;
using moe_math::Gated;
using moe_math::Plain;

constexpr int kThreads = 256;

// max|x| over the block (NaN ignored, as std::max in the reference).
__device__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0f;
  v = WarpMax(v);
  __syncthreads();
  return v;
}

// partial[b]: max|x| over block b's elements (grid-stride), one float per
// block: no zeroed cell and no atomics, so the chain stays kernels launched
// with PDL (a memset node in a graph, and the kernel after it, start only
// once everything before has drained).
__global__ void AbsMaxKernel(DType t, const void* in, int64_t n, float* partial) {
  __shared__ float red[32];
  detail::PdlWaitThenRelease();
  float m = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(LoadAsFloat(in, i, t)));
  }
  m = BlockMax(m, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// Per group: one warp per (row, group) of `group` consecutive k, so that a
// decode-sized activation (a few rows of up to 14336) spreads over the chip
// instead of one CTA per row walking its groups in turn (docs/PERF.md,
// session 13); the warps loop when there are more groups than the grid.
// fn(r, gi, k0, k1, lane) for the warp's (row r, group gi), its k in [k0, k1);
// the warps of `blocks` blocks (this one `block`) share the groups.
template <typename F>
__device__ __forceinline__ void ForEachGroup(int64_t rows, int64_t K, int group, unsigned block,
                                             unsigned blocks, F&& fn) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int64_t groups = (K + group - 1) / group;
  for (int64_t item = block * static_cast<int64_t>(warps) + (threadIdx.x >> 5);
       item < rows * groups; item += static_cast<int64_t>(blocks) * warps) {
    const int64_t r = item / groups, gi = item % groups, k0 = gi * group;
    fn(r, gi, k0, std::min<int64_t>(K, k0 + group), lane);
  }
}

__global__ void QuantGroupKernel(DType t, const void* in, int64_t rows, int64_t K, int group,
                                 uint8_t* q, float* scale) {
  detail::PdlWaitThenRelease();
  const int64_t groups = (K + group - 1) / group;
  auto quantise = [&](int64_t r, int64_t gi, int64_t k0, int64_t k1, int lane) {
    const int64_t base = r * K;
    float m = 0.0f;
    for (int64_t k = k0 + lane; k < k1; k += 32) {
      m = fmaxf(m, fabsf(LoadAsFloat(in, base + k, t)));
    }
    const float s = Fp8GroupScale(WarpMax(m));
    for (int64_t k = k0 + lane; k < k1; k += 32)
      q[base + k] = Fp8Quantise(LoadAsFloat(in, base + k, t), s);
    if (lane == 0) scale[r * groups + gi] = s;
  };
  ForEachGroup(rows, K, group, blockIdx.x, gridDim.x, quantise);
}

// The same two steps on 2-byte activations whose groups start 4-element
// aligned: lane l holds elements 4 l .. 4 l + 3 (+ 128 p, p < kP) of its
// group in registers from one 8-byte load to its 4 bytes, where the kernel
// above loads each element twice, 2 bytes at a time (docs/PERF.md, session
// 15). The same maximum (exact in any order) and formula per element. A
// kernel's own blocks (QuantGroupVecKernel) or the side job of the routing
// kernel (QuantGroupVecJob).
template <typename T, int kP>
struct QuantGroupVecJob {
  const T* in;
  int64_t rows, K;
  int group;
  uint8_t* q;
  float* scale;
  __device__ __forceinline__ void operator()(unsigned block, unsigned blocks) const;
};

template <typename T, int kP>
__global__ void QuantGroupVecKernel(const QuantGroupVecJob<T, kP> job) {
  detail::PdlWaitThenRelease();
  job(blockIdx.x, gridDim.x);
}

template <typename T, int kP>
__device__ __forceinline__ void QuantGroupVecJob<T, kP>::operator()(unsigned block,
                                                                    unsigned blocks) const {
  const int64_t groups = (K + group - 1) / group;
  auto quantise = [&](int64_t r, int64_t gi, int64_t k0, int64_t k1, int lane) {
    float v[kP][4];
    float m = 0.0f;
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const int64_t k = k0 + 4 * lane + 128 * p;
      uint2 w = make_uint2(0u, 0u);
      if (k < k1) w = __ldg(reinterpret_cast<const uint2*>(in + r * K + k));
      const T* h = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[p][j] = detail::ToFloat(h[j]);
        m = fmaxf(m, fabsf(v[p][j]));
      }
    }
    const float s = Fp8GroupScale(WarpMax(m));
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const int64_t k = k0 + 4 * lane + 128 * p;
      if (k >= k1) continue;
      uint32_t b = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) b |= static_cast<uint32_t>(Fp8Quantise(v[p][j], s)) << (8 * j);
      *reinterpret_cast<uint32_t*>(q + r * K + k) = b;
    }
    if (lane == 0) scale[r * groups + gi] = s;
  };
  ForEachGroup(rows, K, group, block, blocks, quantise);
}

// Per token: one block per row (the row's max, then its values).
__global__ void QuantTokenKernel(DType t, const void* in, int64_t K, uint8_t* q, float* scale) {
  __shared__ float red[32];
  detail::PdlWaitThenRelease();
  const int64_t r = blockIdx.x;
  const int64_t base = r * K;
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    m = fmaxf(m, fabsf(LoadAsFloat(in, base + k, t)));
  const float s = Fp8TokenScale(BlockMax(m, red));
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    q[base + k] = Fp8Quantise(LoadAsFloat(in, base + k, t), s);
  if (threadIdx.x == 0) scale[r] = s;
}

// Per token on 2-byte activations with K % 8 == 0: one block of kTokenThreads
// per row, 16-byte loads kTokenBatch at a time per thread (a decode row of
// 14336 in one round trip where the kernel above walks it 2 bytes a thread
// at a time), the row's max, then the loads again for the bytes.
constexpr int kTokenThreads = 512, kTokenBatch = 4;
template <typename T>
__global__ void __launch_bounds__(kTokenThreads)
    QuantTokenVecKernel(const T* in, int64_t K, uint8_t* q, float* scale) {
  __shared__ float red[32];
  detail::PdlWaitThenRelease();
  const int64_t r = blockIdx.x, nv = K / 8;
  const uint4* row = reinterpret_cast<const uint4*>(in + r * K);
  auto for_vectors = [&](auto&& fn) {
    for (int64_t base = 0; base < nv; base += int64_t{kTokenThreads} * kTokenBatch) {
      uint4 w[kTokenBatch];
#pragma unroll
      for (int u = 0; u < kTokenBatch; ++u) {
        const int64_t i = base + u * kTokenThreads + threadIdx.x;
        w[u] = i < nv ? __ldg(row + i) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kTokenBatch; ++u) {
        const int64_t i = base + u * kTokenThreads + threadIdx.x;
        if (i < nv) fn(i, reinterpret_cast<const T*>(&w[u]));
      }
    }
  };
  float m = 0.0f;
  for_vectors([&](int64_t, const T* h) {
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(detail::ToFloat(h[j])));
  });
  const float s = Fp8TokenScale(BlockMax(m, red));
  for_vectors([&](int64_t i, const T* h) {
    uint32_t b[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      b[j / 4] |= static_cast<uint32_t>(Fp8Quantise(detail::ToFloat(h[j]), s)) << (8 * (j % 4));
    }
    reinterpret_cast<uint2*>(q + r * K)[i] = make_uint2(b[0], b[1]);
  });
  if (threadIdx.x == 0) scale[r] = s;
}

// Per tensor: the scale is static, or the maximum of AbsMaxKernel's
// `partials` per-block maxima (each CTA reduces them), so every element on
// its own thread, and the scale repeated per row.
__global__ void QuantTensorKernel(DType t, const void* in, int64_t rows, int64_t K,
                                  float static_scale, const float* partial, int partials,
                                  uint8_t* q, float* scale) {
  __shared__ float red[32];
  detail::PdlWaitThenRelease();
  float m = 0.0f;
  if (!(static_scale > 0.0f)) {
    for (int i = threadIdx.x; i < partials; i += blockDim.x) m = fmaxf(m, partial[i]);
    m = BlockMax(m, red);
  }
  const float s = Fp8TensorScale(static_scale, m);
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < rows * K; i += stride) q[i] = Fp8Quantise(LoadAsFloat(in, i, t), s);
  for (int64_t r = first; r < rows; r += stride) scale[r] = s;
}

// --- fp32 elementwise steps.

__global__ void ActivationF32Kernel(MoeActivation act, MoeActParams p, const float* in,
                                    int64_t rows, int64_t d, bool gated, float* out) {
  const int64_t total = rows * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / d, c = i % d;
    const float* x = in + r * (gated ? 2 * d : d);
    if (!gated) {
      out[i] = Plain(act, x[c]);
    } else if (act == MoeActivation::kSwigluOai) {
      out[i] = Gated(act, p, x[2 * c], x[2 * c + 1]);
    } else {
      out[i] = Gated(act, p, x[c], x[d + c]);
    }
  }
}

__global__ void CombineF32Kernel(const float* y, const float* w, int64_t M, int k, int64_t H,
                                 float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * H;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / H, h = i % H;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float v = y[(m * k + j) * H + h];
      acc = __fadd_rn(acc, w != nullptr ? __fmul_rn(v, w[m * k + j]) : v);
    }
    out[i] = acc;
  }
}

__global__ void ScaleRowsF32Kernel(const float* a, const float* w, int64_t rows, int64_t width,
                                   float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __fmul_rn(a[i], w[i / width]);
  }
}

// fn(static_cast<T*>(nullptr)) with T the 2-byte type `t` names (bf16 or fp16).
template <typename F>
auto ByTwoByteType(DType t, F&& fn) {
  return t == DType::kBFloat16 ? fn(static_cast<__nv_bfloat16*>(nullptr))
                               : fn(static_cast<__half*>(nullptr));
}

// CTAs of `threads` for a grid-stride launch over n elements: at most
// kMoeFp8QuantScratchFloats (16 per SM of an H200), so that AbsMaxKernel's
// per-block maxima fit the scratch.
int Blocks(int64_t n, int threads = kThreads) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((n + threads - 1) / threads, kMoeFp8QuantScratchFloats)));
}

// Which kernel (or pair) LaunchMoeFp8Quantize runs for its arguments.
enum class QuantForm {
  kNone,      // no rows
  kGroupVec,  // QuantGroupVecKernel<T, 1> (group <= 128) or <T, 2>
  kGroup,     // QuantGroupKernel
  kTensor,    // AbsMaxKernel (dynamic) and QuantTensorKernel
  kTokenVec,  // QuantTokenVecKernel
  kToken,     // QuantTokenKernel
};

// The form, after LaunchMoeFp8Quantize's checks (an error where they fail).
absl::StatusOr<QuantForm> QuantFormOf(MoeFp8ActQuant mode, DType in_type, const void* in,
                                      int64_t rows, int64_t K, int group, float static_scale,
                                      const float* scratch, const uint8_t* q, const float* scale) {
  if (absl::Status s = CheckFloatDType(in_type, "moe_fp8_quantize"); !s.ok()) return s;
  if (rows < 0 || K <= 0) return absl::InvalidArgumentError("moe_fp8_quantize: bad sizes");
  if (mode == MoeFp8ActQuant::kPerGroup && group <= 0) {
    return absl::InvalidArgumentError("moe_fp8_quantize: group must be positive");
  }
  if (rows == 0) return QuantForm::kNone;
  if (rows > INT32_MAX) return absl::InvalidArgumentError("moe_fp8_quantize: too many rows");
  const bool dynamic_tensor = mode == MoeFp8ActQuant::kPerTensor && !(static_scale > 0.0f);
  if (in == nullptr || q == nullptr || scale == nullptr || (dynamic_tensor && scratch == nullptr)) {
    return absl::InvalidArgumentError("moe_fp8_quantize: null pointer");
  }
  const bool two_byte = in_type != DType::kFloat32;  // bf16 / fp16
  const auto aligned = [](const void* p, uintptr_t n) {
    return reinterpret_cast<uintptr_t>(p) % n == 0;
  };
  switch (mode) {
    case MoeFp8ActQuant::kPerGroup:
      return two_byte && K % 4 == 0 && group % 4 == 0 && group <= 256 && aligned(in, 8) &&
                     aligned(q, 4)
                 ? QuantForm::kGroupVec
                 : QuantForm::kGroup;
    case MoeFp8ActQuant::kPerTensor:
      return QuantForm::kTensor;
    case MoeFp8ActQuant::kPerToken:
      break;
  }
  return two_byte && K % 8 == 0 && aligned(in, 16) && aligned(q, 8) ? QuantForm::kTokenVec
                                                                    : QuantForm::kToken;
}

}  // namespace

absl::Status LaunchMoeFp8Quantize(MoeFp8ActQuant mode, DType in_type, const void* in, int64_t rows,
                                  int64_t K, int group, float static_scale, float* scratch,
                                  uint8_t* q, float* scale, cudaStream_t stream) {
  const absl::StatusOr<QuantForm> form =
      QuantFormOf(mode, in_type, in, rows, K, group, static_scale, scratch, q, scale);
  if (!form.ok()) return form.status();
  const auto by_type = [&](auto&& fn) {
    return ByTwoByteType(in_type, [&](auto* t) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(t)>>;
      return fn(static_cast<const T*>(in));
    });
  };
  const dim3 group_grid(
      mode == MoeFp8ActQuant::kPerGroup ? Blocks(rows * ((K + group - 1) / group) * 32) : 1);
  switch (*form) {
    case QuantForm::kNone:
      return absl::OkStatus();
    case QuantForm::kGroupVec:
      KPLAN_CUDA_RETURN_IF_ERROR(by_type([&](auto* x) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
        return group <= 128
                   ? detail::LaunchPdl(QuantGroupVecKernel<T, 1>, group_grid, dim3(kThreads), 0,
                                       stream, QuantGroupVecJob<T, 1>{x, rows, K, group, q, scale})
                   : detail::LaunchPdl(QuantGroupVecKernel<T, 2>, group_grid, dim3(kThreads), 0,
                                       stream, QuantGroupVecJob<T, 2>{x, rows, K, group, q, scale});
      }));
      break;
    case QuantForm::kGroup:
      KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(QuantGroupKernel, group_grid, dim3(kThreads), 0,
                                                   stream, in_type, in, rows, K, group, q, scale));
      break;
    case QuantForm::kTensor: {
      const bool dynamic = !(static_scale > 0.0f);
      const int partials = dynamic ? Blocks(rows * K) : 0;
      if (dynamic) {
        KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(AbsMaxKernel, dim3(partials), dim3(kThreads),
                                                     0, stream, in_type, in, rows * K, scratch));
      }
      KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(QuantTensorKernel, dim3(Blocks(rows * K)),
                                                   dim3(kThreads), 0, stream, in_type, in, rows, K,
                                                   static_scale, scratch, partials, q, scale));
      break;
    }
    case QuantForm::kTokenVec:
      KPLAN_CUDA_RETURN_IF_ERROR(by_type([&](auto* x) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
        return detail::LaunchPdl(QuantTokenVecKernel<T>, dim3(static_cast<unsigned>(rows)),
                                 dim3(kTokenThreads), 0, stream, x, K, q, scale);
      }));
      break;
    case QuantForm::kToken:
      KPLAN_CUDA_RETURN_IF_ERROR(
          detail::LaunchPdl(QuantTokenKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0,
                            stream, in_type, in, K, q, scale));
      break;
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeRoutingAndFp8Quantize(const MoeRoutingParams& routing, const float* logits,
                                            int64_t num_tokens, float* topk_weights,
                                            int32_t* topk_ids, MoeFp8ActQuant mode, DType in_type,
                                            const void* in, int64_t rows, int64_t K, int group,
                                            float static_scale, float* scratch, uint8_t* q,
                                            float* scale, cudaStream_t stream) {
  const absl::StatusOr<QuantForm> form =
      QuantFormOf(mode, in_type, in, rows, K, group, static_scale, scratch, q, scale);
  if (!form.ok()) return form.status();
  // The side job: QuantGroupVecKernel<T, 1>'s warp per (row, group), in
  // blocks of the routing kernel's warps; other forms run apart.
  if (*form != QuantForm::kGroupVec || group > 128) {
    KPLAN_RETURN_IF_ERROR(
        LaunchMoeRouting(routing, logits, num_tokens, topk_weights, topk_ids, stream));
    return LaunchMoeFp8Quantize(mode, in_type, in, rows, K, group, static_scale, scratch, q, scale,
                                stream);
  }
  return ByTwoByteType(in_type, [&](auto* t) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(t)>>;
    const T* x = static_cast<const T*>(in);
    const int blocks =
        Blocks(rows * ((K + group - 1) / group) * 32, detail::routing::kWarpsPerBlock * 32);
    return detail::routing::LaunchRoutingWith(routing, logits, num_tokens, topk_weights, topk_ids,
                                              QuantGroupVecJob<T, 1>{x, rows, K, group, q, scale},
                                              blocks, stream);
  });
}

absl::Status LaunchMoeActivationF32(MoeActivation act, const MoeActParams& params, const float* in,
                                    int64_t rows, int64_t in_width, float* out, int64_t out_width,
                                    cudaStream_t stream) {
  const int a = static_cast<int>(act);
  if (a < 0 || a > static_cast<int>(MoeActivation::kRelu2NoMul)) {
    return absl::InvalidArgumentError("moe_activation: unknown activation");
  }
  const bool gated = act < MoeActivation::kSiluNoMul;
  if (rows < 0 || out_width < 0 || in_width != (gated ? 2 * out_width : out_width)) {
    return absl::InvalidArgumentError("moe_activation: widths do not fit the activation");
  }
  if (act == MoeActivation::kSwigluOaiUninterleave && !params.has_clamp_limit) {
    return absl::InvalidArgumentError("SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  }
  if (rows * out_width == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("moe_activation: null pointer");
  }
  const MoeActParams p = EffectiveActParams(params);
  ActivationF32Kernel<<<Blocks(rows * out_width), kThreads, 0, stream>>>(act, p, in, rows,
                                                                         out_width, gated, out);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("ActivationF32Kernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeCombineF32(const float* y, const float* topk_weights, int64_t num_tokens,
                                 int top_k, int64_t hidden, float* out, cudaStream_t stream) {
  if (num_tokens < 0 || top_k <= 0 || hidden < 0) {
    return absl::InvalidArgumentError("moe_combine: bad sizes");
  }
  if (num_tokens * hidden == 0) return absl::OkStatus();
  if (y == nullptr || out == nullptr)
    return absl::InvalidArgumentError("moe_combine: null pointer");
  CombineF32Kernel<<<Blocks(num_tokens * hidden), kThreads, 0, stream>>>(
      y, topk_weights, num_tokens, top_k, hidden, out);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("CombineF32Kernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeScaleRowsF32(const float* a, const float* row_weights, int64_t rows,
                                   int64_t width, float* out, cudaStream_t stream) {
  if (rows < 0 || width < 0) return absl::InvalidArgumentError("moe_scale_rows: bad sizes");
  if (rows * width == 0) return absl::OkStatus();
  if (a == nullptr || row_weights == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("moe_scale_rows: null pointer");
  }
  ScaleRowsF32Kernel<<<Blocks(rows * width), kThreads, 0, stream>>>(a, row_weights, rows, width,
                                                                    out);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("ScaleRowsF32Kernel");
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
