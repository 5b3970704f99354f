// The `native` provider's GPU kernels: one block per row, run-time element
// types, any strides, two passes over the row (statistics, then output).
// Correctness first; the kplan kernels (ir_kplan.cu) are the fast path.
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/ir/ir_ops.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

constexpr int kThreads = 256;

using detail::BlockSum;
using detail::LoadAsFloat;
using detail::RoundTo;
using detail::StoreFromFloat;

__device__ __forceinline__ float NativeIn(const IrRowsIn& in, int64_t row_off, int64_t c) {
  return LoadAsFloat(in.data, row_off + c * in.layout.col_stride, in.type);
}

// One row of rms_norm or fused_add_rms_norm (residual.data != nullptr).
__global__ void __launch_bounds__(kThreads)
    NativeRmsNormKernel(IrRowsIn x, IrRowsIn residual, int64_t cols, IrWeightIn weight,
                        float epsilon, int64_t variance_size, void* out, void* residual_out) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t xo = x.layout.RowOffset(row);
  const bool fused = residual.data != nullptr;
  const int64_t ro = fused ? residual.layout.RowOffset(row) : 0;
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float s = NativeIn(x, xo, c);
    if (fused) {
      s += NativeIn(residual, ro, c);
      StoreFromFloat(residual_out, row * cols + c, x.type, s);
    }
    if (c < variance_size) sum += s * s;
  }
  sum = BlockSum(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(variance_size) + epsilon);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float s = NativeIn(x, xo, c);
    if (fused) s += NativeIn(residual, ro, c);
    float y = s * inv;
    if (weight.data != nullptr) {
      const float w = LoadAsFloat(weight.data, c * weight.stride, weight.type);
      y = RoundTo(weight.type, RoundTo(weight.type, y) * w);
    }
    StoreFromFloat(out, row * cols + c, x.type, y);
  }
}

__global__ void __launch_bounds__(kThreads)
    NativeGeluAndMulSparseKernel(IrRowsIn x, int64_t d, float std_multiplier, bool tanh_approximate,
                                 void* out) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t xo = x.layout.RowOffset(row);
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) sum += NativeIn(x, xo, c);
  const float mean = BlockSum(sum, scratch) / static_cast<float>(d);
  float sq = 0.f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float dev = NativeIn(x, xo, c) - mean;
    sq += dev * dev;
  }
  const float stddev = sqrtf(BlockSum(sq, scratch) / static_cast<float>(d));
  const float cutoff = mean + stddev * std_multiplier;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float gate = fmaxf(NativeIn(x, xo, c) - cutoff, 0.f);
    const float up = NativeIn(x, xo, d + c);
    StoreFromFloat(out, row * d + c, x.type, detail::Gelu(gate, tanh_approximate) * up);
  }
}

constexpr int64_t kMaxGridX = 2147483647;

}  // namespace

absl::Status NativeRmsNorm(const IrRowsIn& x, int64_t rows, int64_t cols, const IrWeightIn& weight,
                           float epsilon, int64_t variance_size, void* out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (rows > kMaxGridX) return absl::InvalidArgumentError("too many rows for one launch");
  NativeRmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, IrRowsIn{}, cols, weight, epsilon, variance_size, out, nullptr);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("NativeRmsNormKernel");
  return absl::OkStatus();
}

absl::Status NativeFusedAddRmsNorm(const IrRowsIn& x, const IrRowsIn& residual, int64_t rows,
                                   int64_t cols, const IrWeightIn& weight, float epsilon,
                                   int64_t variance_size, void* out, void* residual_out,
                                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (rows > kMaxGridX) return absl::InvalidArgumentError("too many rows for one launch");
  NativeRmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, residual, cols, weight, epsilon, variance_size, out, residual_out);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("NativeRmsNormKernel(fused)");
  return absl::OkStatus();
}

absl::Status NativeGeluAndMulSparse(const IrRowsIn& x, int64_t rows, int64_t d,
                                    float std_multiplier, bool tanh_approximate, void* out,
                                    cudaStream_t stream) {
  if (rows == 0 || d == 0) return absl::OkStatus();
  if (rows > kMaxGridX) return absl::InvalidArgumentError("too many rows for one launch");
  NativeGeluAndMulSparseKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, d, std_multiplier, tanh_approximate, out);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("NativeGeluAndMulSparseKernel");
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
