// The expert half of a fused MoE layer on the GPU (moe_experts.h): grouped
// GEMM over moe_align_block_size tiles, activations, weighted combine.
//
// The grouped GEMM itself is in moe_gemm_sm90.cu.
#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;

// ---------------------------------------------------------------------------
// Activations: the formulas of moe_activation_math.cuh.

using moe_math::Gated;
using moe_math::Plain;

// Element i of a GEMM output: the stored value, or with split-K partials
// their sum in split order rounded to T (what the GEMM's own reduction
// would have stored).
template <typename T>
struct GemmOut {
  const T* v;
  MoeSplitInput split;
  int64_t total;  // elements of one split's partials
  __device__ __forceinline__ float operator[](int64_t i) const {
    if (split.partials == nullptr) return ToFloat(v[i]);
    float s = 0.0f;
    for (int z = 0; z < split.splits; ++z) s += split.partials[z * total + i];
    return ToFloat(FromFloat<T>(s));
  }
};

template <typename T>
__global__ void ActivationKernel(MoeActivation act, MoeActParams p, GemmOut<T> in, int64_t rows,
                                 int64_t d, bool gated, T* out) {
  detail::PdlWaitThenRelease();
  const int64_t total = rows * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / d, c = i % d;
    float v;
    if (!gated) {
      v = Plain(act, in[i]);
    } else if (act == MoeActivation::kSwigluOai) {
      const int64_t x = r * 2 * d;
      v = Gated(act, p, in[x + 2 * c], in[x + 2 * c + 1]);
    } else {
      const int64_t x = r * 2 * d;
      v = Gated(act, p, in[x + c], in[x + d + c]);
    }
    out[i] = FromFloat<T>(v);
  }
}

// Eight consecutive elements of T at a 16-byte aligned address, as floats.
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* t = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = ToFloat(t[j]);
}

template <typename T>
__device__ __forceinline__ void Store8(T* p, const float* f) {
  uint4 u;
  T* t = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) t[j] = FromFloat<T>(f[j]);
  *reinterpret_cast<uint4*>(p) = u;
}

// ActivationKernel eight outputs a thread through 16-byte loads and stores
// (the scalar form moved 2 bytes a thread: Mixtral's 64-token intermediate,
// 11 MB, took 13 us). Same formula per element: bit-identical. For stored
// (not split) inputs with d % 8 == 0 and 16-byte aligned rows.
template <typename T>
__global__ void ActivationVec8Kernel(MoeActivation act, MoeActParams p, const T* in, int64_t rows,
                                     int64_t d, bool gated, T* out) {
  detail::PdlWaitThenRelease();
  const int64_t dv = d / 8, total = rows * dv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / dv, c = (i % dv) * 8;
    float v[8];
    if (!gated) {
      float x[8];
      Load8(in + r * d + c, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = Plain(act, x[j]);
    } else if (act == MoeActivation::kSwigluOai) {
      float x[16];  // gate, up interleaved
      Load8(in + r * 2 * d + 2 * c, x);
      Load8(in + r * 2 * d + 2 * c + 8, x + 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = Gated(act, p, x[2 * j], x[2 * j + 1]);
    } else {
      float g[8], u[8];
      Load8(in + r * 2 * d + c, g);
      Load8(in + r * 2 * d + d + c, u);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = Gated(act, p, g[j], u[j]);
    }
    Store8(out + r * d + c, v);
  }
}

// ---------------------------------------------------------------------------
// Combine and input scaling. Multiply and add are rounded separately
// (__fmul_rn / __fadd_rn: no FMA contraction), as the CPU reference does.

template <typename T>
__global__ void CombineKernel(GemmOut<T> y, const float* w, int64_t M, int k, int64_t H, T* out) {
  detail::PdlWaitThenRelease();
  const int64_t total = M * H;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / H, h = i % H;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float v = y[(m * k + j) * H + h];
      acc = __fadd_rn(acc, w != nullptr ? __fmul_rn(v, w[m * k + j]) : v);
    }
    out[i] = FromFloat<T>(acc);
  }
}

// CombineKernel eight hidden columns a thread through 16-byte loads; the
// same sum in the same order: bit-identical. For stored (not split) inputs
// with H % 8 == 0 and 16-byte aligned rows.
template <typename T>
__global__ void CombineVec8Kernel(const T* y, const float* w, int64_t M, int k, int64_t H, T* out) {
  detail::PdlWaitThenRelease();
  const int64_t hv = H / 8, total = M * hv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / hv, h = (i % hv) * 8;
    float acc[8] = {};
#pragma unroll 4
    for (int j = 0; j < k; ++j) {
      float v[8];
      Load8(y + (m * k + j) * H + h, v);
      const float wj = w != nullptr ? w[m * k + j] : 1.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c)
        acc[c] = __fadd_rn(acc[c], w != nullptr ? __fmul_rn(v[c], wj) : v[c]);
    }
    Store8(out + m * H + h, acc);
  }
}

template <typename T>
__global__ void ScaleRowsKernel(const T* a, const float* w, int64_t rows, int64_t width, T* out) {
  detail::PdlWaitThenRelease();
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = ToFloat(FromFloat<T>(w[i / width]));
    out[i] = FromFloat<T>(__fmul_rn(ToFloat(a[i]), s));
  }
}

int ElementwiseBlocks(int64_t n, int threads) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 132 * 16)));
}

}  // namespace

absl::Status CheckHalfDType(DType dtype, const char* what) {
  if (IsHalfDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(std::string(what) +
                                    ": dtype must be bfloat16 or float16, got " +
                                    std::string(DTypeName(dtype)));
}

absl::Status CheckFloatDType(DType dtype, const char* what) {
  if (IsFloatDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(std::string(what) +
                                    ": dtype must be float32, float16 or bfloat16, got " +
                                    std::string(DTypeName(dtype)));
}

absl::Status LaunchMoeActivation(MoeActivation act, const MoeActParams& params, DType dtype,
                                 const void* in, int64_t rows, int64_t in_width, void* out,
                                 int64_t out_width, cudaStream_t stream,
                                 const MoeSplitInput& split) {
  if (absl::Status s = CheckHalfDType(dtype, "moe_activation"); !s.ok()) return s;
  const int a = static_cast<int>(act);
  if (a < 0 || a > static_cast<int>(MoeActivation::kRelu2NoMul)) {
    return absl::InvalidArgumentError("moe_activation: unknown activation");
  }
  const bool gated = act < MoeActivation::kSiluNoMul;
  if (rows < 0 || out_width < 0 || in_width != (gated ? 2 * out_width : out_width)) {
    return absl::InvalidArgumentError(
        gated ? "moe_activation: gated activations expect in_width == 2 * out_width"
              : "moe_activation: _no_mul activations expect equal widths");
  }
  if (act == MoeActivation::kSwigluOaiUninterleave && !params.has_clamp_limit) {
    return absl::InvalidArgumentError("SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  }
  const int64_t total = rows * out_width;
  if (total == 0) return absl::OkStatus();
  if ((in == nullptr && split.partials == nullptr) || out == nullptr) {
    return absl::InvalidArgumentError("moe_activation: null pointer");
  }
  if (split.partials != nullptr && split.splits < 1) {
    return absl::InvalidArgumentError("moe_activation: splits must be positive");
  }
  const MoeActParams p = EffectiveActParams(params);
  const int threads = 256;
  if (split.partials == nullptr && out_width % 8 == 0 && Aligned16(in) && Aligned16(out)) {
    const int blocks = ElementwiseBlocks(total / 8, threads);
    KPLAN_CUDA_RETURN_IF_ERROR(
        dtype == DType::kBFloat16
            ? detail::LaunchPdl(ActivationVec8Kernel<__nv_bfloat16>, dim3(blocks), dim3(threads), 0,
                                stream, act, p, static_cast<const __nv_bfloat16*>(in), rows,
                                out_width, gated, static_cast<__nv_bfloat16*>(out))
            : detail::LaunchPdl(ActivationVec8Kernel<__half>, dim3(blocks), dim3(threads), 0,
                                stream, act, p, static_cast<const __half*>(in), rows, out_width,
                                gated, static_cast<__half*>(out)));
    return absl::OkStatus();
  }
  const int blocks = ElementwiseBlocks(total, threads);
  if (dtype == DType::kBFloat16) {
    const GemmOut<__nv_bfloat16> x{static_cast<const __nv_bfloat16*>(in), split, rows * in_width};
    KPLAN_CUDA_RETURN_IF_ERROR(
        detail::LaunchPdl(ActivationKernel<__nv_bfloat16>, dim3(blocks), dim3(threads), 0, stream,
                          act, p, x, rows, out_width, gated, static_cast<__nv_bfloat16*>(out)));
  } else {
    const GemmOut<__half> x{static_cast<const __half*>(in), split, rows * in_width};
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(ActivationKernel<__half>, dim3(blocks),
                                                 dim3(threads), 0, stream, act, p, x, rows,
                                                 out_width, gated, static_cast<__half*>(out)));
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeCombine(DType dtype, const void* y, const float* topk_weights,
                              int64_t num_tokens, int top_k, int64_t hidden, void* out,
                              cudaStream_t stream, const MoeSplitInput& split) {
  if (absl::Status s = CheckHalfDType(dtype, "moe_combine"); !s.ok()) return s;
  if (num_tokens < 0 || top_k <= 0 || hidden < 0) {
    return absl::InvalidArgumentError("moe_combine: bad sizes");
  }
  const int64_t total = num_tokens * hidden;
  if (total == 0) return absl::OkStatus();
  if ((y == nullptr && split.partials == nullptr) || out == nullptr) {
    return absl::InvalidArgumentError("moe_combine: null pointer");
  }
  if (split.partials != nullptr && split.splits < 1) {
    return absl::InvalidArgumentError("moe_combine: splits must be positive");
  }
  const int threads = 256;
  if (split.partials == nullptr && hidden % 8 == 0 && Aligned16(y) && Aligned16(out)) {
    const int blocks = ElementwiseBlocks(total / 8, threads);
    KPLAN_CUDA_RETURN_IF_ERROR(
        dtype == DType::kBFloat16
            ? detail::LaunchPdl(CombineVec8Kernel<__nv_bfloat16>, dim3(blocks), dim3(threads), 0,
                                stream, static_cast<const __nv_bfloat16*>(y), topk_weights,
                                num_tokens, top_k, hidden, static_cast<__nv_bfloat16*>(out))
            : detail::LaunchPdl(CombineVec8Kernel<__half>, dim3(blocks), dim3(threads), 0, stream,
                                static_cast<const __half*>(y), topk_weights, num_tokens, top_k,
                                hidden, static_cast<__half*>(out)));
    return absl::OkStatus();
  }
  const int blocks = ElementwiseBlocks(total, threads);
  if (dtype == DType::kBFloat16) {
    const GemmOut<__nv_bfloat16> v{static_cast<const __nv_bfloat16*>(y), split,
                                   num_tokens * top_k * hidden};
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
        CombineKernel<__nv_bfloat16>, dim3(blocks), dim3(threads), 0, stream, v, topk_weights,
        num_tokens, top_k, hidden, static_cast<__nv_bfloat16*>(out)));
  } else {
    const GemmOut<__half> v{static_cast<const __half*>(y), split, num_tokens * top_k * hidden};
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(CombineKernel<__half>, dim3(blocks), dim3(threads),
                                                 0, stream, v, topk_weights, num_tokens, top_k,
                                                 hidden, static_cast<__half*>(out)));
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeScaleRows(DType dtype, const void* a, const float* row_weights, int64_t rows,
                                int64_t width, void* out, cudaStream_t stream) {
  if (absl::Status s = CheckHalfDType(dtype, "moe_scale_rows"); !s.ok()) return s;
  if (rows < 0 || width < 0) return absl::InvalidArgumentError("moe_scale_rows: bad sizes");
  const int64_t total = rows * width;
  if (total == 0) return absl::OkStatus();
  if (a == nullptr || row_weights == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("moe_scale_rows: null pointer");
  }
  const int threads = 256, blocks = ElementwiseBlocks(total, threads);
  if (dtype == DType::kBFloat16) {
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(ScaleRowsKernel<__nv_bfloat16>, dim3(blocks),
                                                 dim3(threads), 0, stream,
                                                 static_cast<const __nv_bfloat16*>(a), row_weights,
                                                 rows, width, static_cast<__nv_bfloat16*>(out)));
  } else {
    KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(
        ScaleRowsKernel<__half>, dim3(blocks), dim3(threads), 0, stream,
        static_cast<const __half*>(a), row_weights, rows, width, static_cast<__half*>(out)));
  }
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
