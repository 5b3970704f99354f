// The `kplan` provider's GPU kernels. Memory-bound, so the design is about
// bytes and bytes in flight: a block reduces a row; each thread issues all of
// its 16-byte loads (up to kVecsPerThread vectors per operand) before using
// any, keeps them in registers across the block reduction, and writes each
// output once, so a row crosses device memory once each way. The norm kernels
// are persistent (one wave of resident blocks looping over rows) and load the
// next row before reducing the current one. Rows longer than
// blockDim * kVecsPerThread vectors re-read their tail after the reduction
// (mostly from L2).
#include <algorithm>

#include "kernels/cuda/ir_cuda_status.h"
#include "kernels/cuda/ir_device_math.cuh"
#include "kernels/cuda/ir_ops.h"

namespace kplan::kernels::cuda {
namespace {

using detail::BlockSum;
using detail::FromFloat;
using detail::ToFloat;

constexpr int kVecsPerThread = 4;
// 512 threads leave the compiler up to 128 registers, enough to keep every
// vector of a thread in flight without spilling.
constexpr int kMaxThreads = 512;

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T, int kVec, bool kFused>
__device__ __forceinline__ Pack<T, kVec> NormalizePack(const Pack<T, kVec>& a,
                                                       const Pack<T, kVec>& b,
                                                       const Pack<T, kVec>& w, bool has_w,
                                                       float inv) {
  Pack<T, kVec> o;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float s = ToFloat(a.v[j]);
    if constexpr (kFused) s += ToFloat(b.v[j]);
    float y = s * inv;
    if (has_w) y = ToFloat(FromFloat<T>(y)) * ToFloat(w.v[j]);
    o.v[j] = FromFloat<T>(y);
  }
  return o;
}

template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> GeluPack(const Pack<T, kVec>& g, const Pack<T, kVec>& u,
                                                  float cutoff, bool tanh_approximate) {
  Pack<T, kVec> o;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float sparse = fmaxf(ToFloat(g.v[j]) - cutoff, 0.f);
    o.v[j] = FromFloat<T>(detail::Gelu(sparse, tanh_approximate) * ToFloat(u.v[j]));
  }
  return o;
}

// fused_add_rms_norm when kFused, rms_norm otherwise. `w` may be null.
// Persistent: block b handles rows b, b + gridDim.x, ...; a thread always owns
// the same columns, so its weight vectors are loaded once and stay in
// registers, and the next row's vectors are loaded before the current row is
// reduced, so every block keeps a row's worth of loads in flight.
template <typename T, int kVec, bool kFused>
__global__ void __launch_bounds__(kMaxThreads)
    KplanNormKernel(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ res,
                    int64_t res_stride, const T* __restrict__ w, int rows, int nvec, int cols,
                    float eps, T* __restrict__ out, int64_t out_stride, T* __restrict__ res_out,
                    int64_t res_out_stride) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[32];
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  const bool has_w = w != nullptr;
  const P* wr = reinterpret_cast<const P*>(w);
  const int cached = kVecsPerThread * nt;  // vectors of a row held in registers

  P wa[kVecsPerThread];
  if (has_w) {
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) wa[i] = wr[idx];
    }
  }

  P xa[kVecsPerThread], ra[kVecsPerThread];
  auto load = [&](int64_t row, P* xv, P* rv) {
    const P* xr = reinterpret_cast<const P*>(x + row * x_stride);
    const P* rr = kFused ? reinterpret_cast<const P*>(res + row * res_stride) : nullptr;
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) {
        xv[i] = xr[idx];
        if constexpr (kFused) rv[i] = rr[idx];
      }
    }
  };

  int64_t row = blockIdx.x;
  if (row < rows) load(row, xa, ra);
  for (; row < rows; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + row * x_stride);
    const P* rr = kFused ? reinterpret_cast<const P*>(res + row * res_stride) : nullptr;
    P* orow = reinterpret_cast<P*>(out + row * out_stride);
    P* rorow = kFused ? reinterpret_cast<P*>(res_out + row * res_out_stride) : nullptr;

    // Prefetch the next row while this one is reduced and written.
    P xn[kVecsPerThread], rn[kVecsPerThread];
    const int64_t next = row + gridDim.x;
    if (next < rows) load(next, xn, rn);

    // Sum of squares of s = x (+ residual) in fp32; write the new residual.
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) {
        P r;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float s = ToFloat(xa[i].v[j]);
          if constexpr (kFused) {
            s += ToFloat(ra[i].v[j]);
            r.v[j] = FromFloat<T>(s);
          }
          ss += s * s;
        }
        if constexpr (kFused) rorow[idx] = r;
      }
    }
    // Rows longer than the register cache: their tail is read here and again below.
    for (int idx = tid + cached; idx < nvec; idx += nt) {
      const P a = xr[idx];
      P b;
      if constexpr (kFused) b = rr[idx];
      P r;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float s = ToFloat(a.v[j]);
        if constexpr (kFused) {
          s += ToFloat(b.v[j]);
          r.v[j] = FromFloat<T>(s);
        }
        ss += s * s;
      }
      if constexpr (kFused) rorow[idx] = r;
    }
    ss = BlockSum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);

    // Normalise from registers, y.to(T) * w rounded to T as native does.
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) orow[idx] = NormalizePack<T, kVec, kFused>(xa[i], ra[i], wa[i], has_w, inv);
    }
    for (int idx = tid + cached; idx < nvec; idx += nt) {
      P b, wv;
      if constexpr (kFused) b = rr[idx];
      if (has_w) wv = wr[idx];
      orow[idx] = NormalizePack<T, kVec, kFused>(xr[idx], b, wv, has_w, inv);
    }
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      xa[i] = xn[i];
      if constexpr (kFused) ra[i] = rn[i];
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    KplanGeluAndMulSparseKernel(const T* __restrict__ x, int64_t x_stride, int nvec, int d,
                                float std_multiplier, bool tanh_approximate, T* __restrict__ out,
                                int64_t out_stride) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  const P* gate = reinterpret_cast<const P*>(x + row * x_stride);
  const P* up = reinterpret_cast<const P*>(x + row * x_stride + d);
  P* orow = reinterpret_cast<P*>(out + row * out_stride);

  P ga[kVecsPerThread];
  P ua[kVecsPerThread];
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const int idx = tid + i * nt;
    if (idx < nvec) {
      ga[i] = gate[idx];
      ua[i] = up[idx];
    }
  }
  // Mean, then the population variance around it (two reductions over
  // registers: as stable as the two-pass reference).
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    if (tid + i * nt < nvec) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += ToFloat(ga[i].v[j]);
    }
  }
  for (int idx = tid + kVecsPerThread * nt; idx < nvec; idx += nt) {
    const P a = gate[idx];
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += ToFloat(a.v[j]);
  }
  const float mean = BlockSum(sum, scratch) / static_cast<float>(d);
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    if (tid + i * nt < nvec) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float dev = ToFloat(ga[i].v[j]) - mean;
        sq += dev * dev;
      }
    }
  }
  for (int idx = tid + kVecsPerThread * nt; idx < nvec; idx += nt) {
    const P a = gate[idx];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float dev = ToFloat(a.v[j]) - mean;
      sq += dev * dev;
    }
  }
  const float stddev = sqrtf(BlockSum(sq, scratch) / static_cast<float>(d));
  const float cutoff = mean + stddev * std_multiplier;
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const int idx = tid + i * nt;
    if (idx < nvec) orow[idx] = GeluPack<T, kVec>(ga[i], ua[i], cutoff, tanh_approximate);
  }
  for (int idx = tid + kVecsPerThread * nt; idx < nvec; idx += nt) {
    orow[idx] = GeluPack<T, kVec>(gate[idx], up[idx], cutoff, tanh_approximate);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Elements per 16-byte vector.
int VecWidth(IrScalarType t) { return 16 / IrScalarSize(t); }

int ThreadsFor(int64_t nvec) {
  const int64_t per_thread = (nvec + kVecsPerThread - 1) / kVecsPerThread;
  const int64_t rounded = (per_thread + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(rounded, 32, kMaxThreads));
}

absl::Status CheckSizes(int64_t rows, int64_t cols) {
  if (rows > 2147483647 || cols > 2147483647) {
    return absl::InvalidArgumentError("kplan kernels: rows and row length must fit in int32");
  }
  return absl::OkStatus();
}

// Blocks of `kernel` that fit on the device at once (at least 1).
template <typename Kernel>
absl::Status ResidentBlocks(Kernel kernel, int threads, int* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  KPLAN_IR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KPLAN_IR_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KPLAN_IR_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  *blocks = std::max(1, sms * per_sm);
  return absl::OkStatus();
}

template <typename T, int kVec, bool kFused>
absl::Status LaunchNorm(KplanRows x, KplanRows residual, int64_t rows, int64_t cols,
                        const void* weight, float eps, KplanRowsOut out, KplanRowsOut residual_out,
                        cudaStream_t stream) {
  const int nvec = static_cast<int>(cols / kVec);
  const int threads = ThreadsFor(nvec);
  auto kernel = KplanNormKernel<T, kVec, kFused>;
  int resident = 0;
  if (absl::Status s = ResidentBlocks(kernel, threads, &resident); !s.ok()) return s;
  const int grid = static_cast<int>(std::min<int64_t>(rows, resident));
  kernel<<<grid, threads, 0, stream>>>(
      static_cast<const T*>(x.data), x.row_stride, static_cast<const T*>(residual.data),
      residual.row_stride, static_cast<const T*>(weight), static_cast<int>(rows), nvec,
      static_cast<int>(cols), eps, static_cast<T*>(out.data), out.row_stride,
      static_cast<T*>(residual_out.data), residual_out.row_stride);
  KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR("KplanNormKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status DispatchNorm(bool fused, KplanRows x, KplanRows residual, int64_t rows, int64_t cols,
                          const void* weight, float eps, KplanRowsOut out,
                          KplanRowsOut residual_out, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = cols % kVec == 0 && Aligned16(x.data) && x.row_stride % kVec == 0 &&
                   Aligned16(out.data) && out.row_stride % kVec == 0 &&
                   (weight == nullptr || Aligned16(weight)) &&
                   (!fused || (Aligned16(residual.data) && residual.row_stride % kVec == 0 &&
                               Aligned16(residual_out.data) &&
                               residual_out.row_stride % kVec == 0));
  if (fused) {
    if (vec) return LaunchNorm<T, kVec, true>(x, residual, rows, cols, weight, eps, out, residual_out, stream);
    return LaunchNorm<T, 1, true>(x, residual, rows, cols, weight, eps, out, residual_out, stream);
  }
  if (vec) return LaunchNorm<T, kVec, false>(x, residual, rows, cols, weight, eps, out, residual_out, stream);
  return LaunchNorm<T, 1, false>(x, residual, rows, cols, weight, eps, out, residual_out, stream);
}

absl::Status Norm(IrScalarType type, bool fused, KplanRows x, KplanRows residual, int64_t rows,
                  int64_t cols, const void* weight, float eps, KplanRowsOut out,
                  KplanRowsOut residual_out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (absl::Status s = CheckSizes(rows, cols); !s.ok()) return s;
  switch (type) {
    case IrScalarType::kFloat32:
      return DispatchNorm<float>(fused, x, residual, rows, cols, weight, eps, out, residual_out, stream);
    case IrScalarType::kFloat16:
      return DispatchNorm<__half>(fused, x, residual, rows, cols, weight, eps, out, residual_out, stream);
    case IrScalarType::kBFloat16:
      return DispatchNorm<__nv_bfloat16>(fused, x, residual, rows, cols, weight, eps, out, residual_out, stream);
  }
  return absl::InvalidArgumentError("kplan kernels: unknown element type");
}

template <typename T, int kVec>
absl::Status LaunchGelu(KplanRows x, int64_t rows, int64_t d, float std_multiplier,
                        bool tanh_approximate, KplanRowsOut out, cudaStream_t stream) {
  const int nvec = static_cast<int>(d / kVec);
  KplanGeluAndMulSparseKernel<T, kVec><<<static_cast<unsigned>(rows), ThreadsFor(nvec), 0, stream>>>(
      static_cast<const T*>(x.data), x.row_stride, nvec, static_cast<int>(d), std_multiplier,
      tanh_approximate, static_cast<T*>(out.data), out.row_stride);
  KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR("KplanGeluAndMulSparseKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status DispatchGelu(KplanRows x, int64_t rows, int64_t d, float std_multiplier,
                          bool tanh_approximate, KplanRowsOut out, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = d % kVec == 0 && Aligned16(x.data) && x.row_stride % kVec == 0 &&
                   Aligned16(out.data) && out.row_stride % kVec == 0;
  if (vec) return LaunchGelu<T, kVec>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
  return LaunchGelu<T, 1>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
}

}  // namespace

absl::Status KplanRmsNorm(IrScalarType type, KplanRows x, int64_t rows, int64_t cols,
                          const void* weight, float epsilon, KplanRowsOut out,
                          cudaStream_t stream) {
  return Norm(type, false, x, KplanRows{}, rows, cols, weight, epsilon, out, KplanRowsOut{},
              stream);
}

absl::Status KplanFusedAddRmsNorm(IrScalarType type, KplanRows x, KplanRows residual,
                                  int64_t rows, int64_t cols, const void* weight, float epsilon,
                                  KplanRowsOut out, KplanRowsOut residual_out,
                                  cudaStream_t stream) {
  return Norm(type, true, x, residual, rows, cols, weight, epsilon, out, residual_out, stream);
}

absl::Status KplanGeluAndMulSparse(IrScalarType type, KplanRows x, int64_t rows, int64_t d,
                                   float std_multiplier, bool tanh_approximate, KplanRowsOut out,
                                   cudaStream_t stream) {
  if (rows == 0 || d == 0) return absl::OkStatus();
  if (absl::Status s = CheckSizes(rows, 2 * d); !s.ok()) return s;
  switch (type) {
    case IrScalarType::kFloat32:
      return DispatchGelu<float>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
    case IrScalarType::kFloat16:
      return DispatchGelu<__half>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
    case IrScalarType::kBFloat16:
      return DispatchGelu<__nv_bfloat16>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
  }
  return absl::InvalidArgumentError("kplan kernels: unknown element type");
}

bool KplanVectorPath(IrScalarType type, int64_t cols, std::initializer_list<KplanRows> operands) {
  const int vec = VecWidth(type);
  if (cols % vec != 0) return false;
  for (const KplanRows& r : operands) {
    if (!Aligned16(r.data) || r.row_stride % vec != 0) return false;
  }
  return true;
}

}  // namespace kplan::kernels::cuda
