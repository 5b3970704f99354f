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
#include <type_traits>

#include "base/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/ir/ir_ops.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/status.h"

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
  if constexpr (std::is_same_v<T, __nv_bfloat16> && kVec % 2 == 0) {
    // bf16 pairs: y rounded to bf16, then one bf16x2 multiply by w, which
    // rounds the (exact in fp32) product once: the same bits as the fp32 path
    // below, without converting w.
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      float s0 = ToFloat(a.v[j]), s1 = ToFloat(a.v[j + 1]);
      if constexpr (kFused) {
        s0 += ToFloat(b.v[j]);
        s1 += ToFloat(b.v[j + 1]);
      }
      __nv_bfloat162 y = __floats2bfloat162_rn(s0 * inv, s1 * inv);
      if (has_w) y = __hmul2(y, __halves2bfloat162(w.v[j], w.v[j + 1]));
      o.v[j] = y.x;
      o.v[j + 1] = y.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float s = ToFloat(a.v[j]);
      if constexpr (kFused) s += ToFloat(b.v[j]);
      float y = s * inv;
      if (has_w) y = ToFloat(FromFloat<T>(y)) * ToFloat(w.v[j]);
      o.v[j] = FromFloat<T>(y);
    }
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

// Operand access of the norm kernels. With kHints, 16-byte inputs read once
// skip L1 (`ld.global.nc.L1::no_allocate`, keeping L1 for the weight) and
// outputs are streaming stores (`st.global.cs`, evict-first).
template <typename P>
union PackBits {
  P p;
  uint4 u;
};

template <bool kHints, typename P>
__device__ __forceinline__ P LoadIn(const P* ptr) {
  if constexpr (kHints && sizeof(P) == 16) {
    PackBits<P> b;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(b.u.x), "=r"(b.u.y), "=r"(b.u.z), "=r"(b.u.w)
        : "l"(ptr));
    return b.p;
  } else {
    return *ptr;
  }
}

template <bool kHints, typename P>
__device__ __forceinline__ void StoreOut(P* ptr, const P& v) {
  if constexpr (kHints && sizeof(P) == 16) {
    PackBits<P> b;
    b.p = v;
    __stcs(reinterpret_cast<uint4*>(ptr), b.u);
  } else {
    *ptr = v;
  }
}

// Makes the compiler forget how `p` was computed: what is live across the
// block reduction is then the packed vectors, not their fp32 conversions
// (twice the registers; nvcc otherwise keeps those and spills).
template <typename P>
__device__ __forceinline__ void Launder(P& p) {
  if constexpr (sizeof(P) == 16) {
    PackBits<P> b;
    b.p = p;
    asm volatile("" : "+r"(b.u.x), "+r"(b.u.y), "+r"(b.u.z), "+r"(b.u.w));
    p = b.p;
  }
}

// fused_add_rms_norm when kFused, rms_norm otherwise. `w` may be null.
// Launch shape (see NormVariant below): kThreads threads per block (0: take
// blockDim.x, at most kMaxThreads), each holding kVpt vectors per operand in
// registers. Block b handles rows b, b + gridDim.x, ...: with gridDim.x ==
// rows one block per row, with a smaller grid persistent. A thread always owns
// the same columns, so its weight vectors are loaded once per block and stay in
// registers. With kPrefetch (the legacy shape) the next row's vectors are
// loaded before the current row is reduced (only matters for a persistent
// grid) and the weight stays in registers; without, the weight is read after
// the reduction, from L1 (inputs bypass L1 with kHints), so that only the
// row's packed vectors are live across the reduction.
template <typename T, int kVec, bool kFused, int kThreads, int kVpt, bool kPrefetch, bool kHints,
          int kMinBlocks>
__global__ void __launch_bounds__(kThreads > 0 ? kThreads : kMaxThreads, kMinBlocks)
    KplanNormKernel(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ res,
                    int64_t res_stride, const T* __restrict__ w, int rows, int nvec, int cols,
                    float eps, T* __restrict__ out, int64_t out_stride, T* __restrict__ res_out,
                    int64_t res_out_stride) {
  using P = Pack<T, kVec>;
  __shared__ float scratch[32];
  const int tid = threadIdx.x;
  const int nt = kThreads > 0 ? kThreads : static_cast<int>(blockDim.x);
  const bool has_w = w != nullptr;
  const P* wr = reinterpret_cast<const P*>(w);
  const int cached = kVpt * nt;  // vectors of a row held in registers

  auto load = [&](int64_t row, P* xv, P* rv) {
    const P* xr = reinterpret_cast<const P*>(x + row * x_stride);
    const P* rr = kFused ? reinterpret_cast<const P*>(res + row * res_stride) : nullptr;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) {
        xv[i] = LoadIn<kHints>(xr + idx);
        if constexpr (kFused) rv[i] = LoadIn<kHints>(rr + idx);
      }
    }
  };

  int64_t row = blockIdx.x;
  if (row >= rows) return;
  P xa[kVpt], ra[kVpt], wa[kVpt];
  // The first row's loads go out before the weight's (L2/L1 resident).
  load(row, xa, ra);
  if (kPrefetch && has_w) {
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) wa[i] = wr[idx];
    }
  }
  for (;;) {
    const P* xr = reinterpret_cast<const P*>(x + row * x_stride);
    const P* rr = kFused ? reinterpret_cast<const P*>(res + row * res_stride) : nullptr;
    P* orow = reinterpret_cast<P*>(out + row * out_stride);
    P* rorow = kFused ? reinterpret_cast<P*>(res_out + row * res_out_stride) : nullptr;
    const int64_t next = row + gridDim.x;

    // Prefetch the next row while this one is reduced and written.
    P xn[kPrefetch ? kVpt : 1], rn[kPrefetch ? kVpt : 1];
    if constexpr (kPrefetch) {
      if (next < rows) load(next, xn, rn);
    }

    // Sum of squares of s = x (+ residual) in fp32; write the new residual.
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
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
        if constexpr (kFused) StoreOut<kHints>(rorow + idx, r);
      }
    }
    // Rows longer than the register cache: their tail is read here and again
    // below (not unrolled: that would cost registers the cached part needs).
#pragma unroll 1
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
    for (int i = 0; i < kVpt; ++i) {
      const int idx = tid + i * nt;
      if (idx < nvec) {
        if constexpr (!kPrefetch) {
          Launder(xa[i]);
          if constexpr (kFused) Launder(ra[i]);
          if (has_w) wa[i] = wr[idx];
        }
        StoreOut<kHints>(orow + idx,
                         NormalizePack<T, kVec, kFused>(xa[i], ra[i], wa[i], has_w, inv));
      }
    }
#pragma unroll 1
    for (int idx = tid + cached; idx < nvec; idx += nt) {
      P b, wv;
      if constexpr (kFused) b = rr[idx];
      if (has_w) wv = wr[idx];
      orow[idx] = NormalizePack<T, kVec, kFused>(xr[idx], b, wv, has_w, inv);
    }
    if (next >= rows) break;
    row = next;
    if constexpr (kPrefetch) {
#pragma unroll
      for (int i = 0; i < kVpt; ++i) {
        xa[i] = xn[i];
        if constexpr (kFused) ra[i] = rn[i];
      }
    } else {
      load(row, xa, ra);
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

// Elements per 16-byte vector.
int VecWidth(DType t) { return 16 / DTypeSize(t); }

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
  KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KPLAN_ASSIGN_OR_RETURN(sms, MultiprocessorCount(device));
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  *blocks = std::max(1, sms * per_sm);
  return absl::OkStatus();
}

// A compiled launch shape of the norm kernels: threads per block (0: by row
// length, ThreadsFor), vectors per thread, next-row prefetch, cache hints, and
// the blocks per SM the register budget must allow (__launch_bounds__: 65536 /
// (threads * kMinBlocks) registers at most; without it nvcc gives 256x4 bf16
// fused 186 registers, one block per SM).
template <int kThreads, int kVpt, bool kPrefetch, bool kHints, int kMinBlocks>
struct NormShape {};

// Legacy shape: the only one compiled for fp16, fp32 and the scalar path.
using DefaultShape = NormShape<0, kVecsPerThread, true, false, 1>;

struct NormArgs {
  bool fused;
  KplanRows x, residual;
  int64_t rows, cols;
  const void* weight;
  float eps;
  KplanRowsOut out, residual_out;
  cudaStream_t stream;
};

template <typename T, int kVec, bool kFused, int kThreads, int kVpt, bool kPrefetch, bool kHints,
          int kMinBlocks>
absl::Status LaunchNorm(const NormArgs& a, bool persistent) {
  const int nvec = static_cast<int>(a.cols / kVec);
  const int threads = kThreads > 0 ? kThreads : ThreadsFor(nvec);
  auto kernel = KplanNormKernel<T, kVec, kFused, kThreads, kVpt, kPrefetch, kHints, kMinBlocks>;
  int64_t grid = a.rows;
  if (persistent) {
    int resident = 0;
    if (absl::Status s = ResidentBlocks(kernel, threads, &resident); !s.ok()) return s;
    grid = std::min<int64_t>(a.rows, resident);
  }
  kernel<<<static_cast<unsigned>(grid), threads, 0, a.stream>>>(
      static_cast<const T*>(a.x.data), a.x.row_stride, static_cast<const T*>(a.residual.data),
      a.residual.row_stride, static_cast<const T*>(a.weight), static_cast<int>(a.rows), nvec,
      static_cast<int>(a.cols), a.eps, static_cast<T*>(a.out.data), a.out.row_stride,
      static_cast<T*>(a.residual_out.data), a.residual_out.row_stride);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("KplanNormKernel");
  return absl::OkStatus();
}

template <typename T, int kVec, int kThreads, int kVpt, bool kPrefetch, bool kHints, int kMinBlocks>
absl::Status LaunchNorm(NormShape<kThreads, kVpt, kPrefetch, kHints, kMinBlocks>, const NormArgs& a,
                        bool persistent) {
  if (a.fused) {
    return LaunchNorm<T, kVec, true, kThreads, kVpt, kPrefetch, kHints, kMinBlocks>(a, persistent);
  }
  return LaunchNorm<T, kVec, false, kThreads, kVpt, kPrefetch, kHints, kMinBlocks>(a, persistent);
}

// The launch variants ir_bench --sweep times (bf16 vector path; every other
// case runs the legacy shape whatever the variant). Names: p = persistent grid
// (one wave of resident blocks), row = one block per row; TxV = threads x
// vectors per thread; pf = next-row prefetch; h = cache hints (no-L1 loads,
// streaming stores).
#define KPLAN_NORM_VARIANTS(X)                                              \
  X(kP256x4pf, "p256x4pf", (DefaultShape), true)                            \
  X(kRow256x4pf, "row_dyn4", (DefaultShape), false)                         \
  X(kRow1024x1h, "row1024x1h", (NormShape<1024, 1, false, true, 2>), false) \
  X(kRow512x2h, "row512x2h", (NormShape<512, 2, false, true, 2>), false)    \
  X(kRow256x4h, "row256x4h", (NormShape<256, 4, false, true, 2>), false)    \
  X(kRow512x2, "row512x2", (NormShape<512, 2, false, false, 2>), false)     \
  X(kP1024x1h, "p1024x1h", (NormShape<1024, 1, false, true, 2>), true)      \
  X(kP512x2h, "p512x2h", (NormShape<512, 2, false, true, 2>), true)         \
  X(kP256x4h, "p256x4h", (NormShape<256, 4, false, true, 2>), true)         \
  X(kP512x2, "p512x2", (NormShape<512, 2, false, false, 2>), true)

enum NormVariant : int {
#define KPLAN_X(id, name, shape, persistent) id,
  KPLAN_NORM_VARIANTS(KPLAN_X)
#undef KPLAN_X
      kNormVariantCount
};

constexpr const char* kNormVariantNames[] = {
#define KPLAN_X(id, name, shape, persistent) name,
    KPLAN_NORM_VARIANTS(KPLAN_X)
#undef KPLAN_X
};

// Production choice: the first line whose element type matches, with
// min_cols <= cols <= max_cols and rows >= min_rows; none: kP256x4pf.
// Switch the production kernel by editing the variant on a line.
struct NormPick {
  DType type;
  int64_t min_cols, max_cols, min_rows;
  NormVariant variant;
};
constexpr NormPick kNormPicks[] = {
    {DType::kBFloat16, 2048, 8192, 1, kRow256x4h},  // <- production bf16 (sweep: ir_bench --sweep)
};

NormVariant PickNorm(DType type, int64_t rows, int64_t cols) {
  for (const NormPick& p : kNormPicks) {
    if (p.type == type && cols >= p.min_cols && cols <= p.max_cols && rows >= p.min_rows) {
      return p.variant;
    }
  }
  return kP256x4pf;
}

template <typename T>
absl::Status DispatchNorm(NormVariant variant, const NormArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec =
      a.cols % kVec == 0 && Aligned16(a.x.data) && a.x.row_stride % kVec == 0 &&
      Aligned16(a.out.data) && a.out.row_stride % kVec == 0 &&
      (a.weight == nullptr || Aligned16(a.weight)) &&
      (!a.fused || (Aligned16(a.residual.data) && a.residual.row_stride % kVec == 0 &&
                    Aligned16(a.residual_out.data) && a.residual_out.row_stride % kVec == 0));
  if (!vec) return LaunchNorm<T, 1>(DefaultShape{}, a, true);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    switch (variant) {
#define KPLAN_X(id, name, shape, persistent) \
  case id:                                   \
    return LaunchNorm<T, kVec>(KPLAN_UNPAREN shape{}, a, persistent);
#define KPLAN_UNPAREN(...) __VA_ARGS__
      KPLAN_NORM_VARIANTS(KPLAN_X)
#undef KPLAN_X
#undef KPLAN_UNPAREN
      default:
        break;
    }
  }
  return LaunchNorm<T, kVec>(DefaultShape{}, a, true);
}

absl::Status Norm(int variant, DType type, const NormArgs& a) {
  if (a.rows == 0 || a.cols == 0) return absl::OkStatus();
  if (absl::Status s = CheckSizes(a.rows, a.cols); !s.ok()) return s;
  if (variant < 0) variant = PickNorm(type, a.rows, a.cols);
  if (variant >= kNormVariantCount) {
    return absl::InvalidArgumentError("kplan kernels: unknown norm variant");
  }
  const NormVariant v = static_cast<NormVariant>(variant);
  switch (type) {
    case DType::kFloat32:
      return DispatchNorm<float>(v, a);
    case DType::kFloat16:
      return DispatchNorm<__half>(v, a);
    case DType::kBFloat16:
      return DispatchNorm<__nv_bfloat16>(v, a);
    default:
      break;
  }
  return absl::InvalidArgumentError("kplan kernels: unknown element type");
}

template <typename T, int kVec>
absl::Status LaunchGelu(KplanRows x, int64_t rows, int64_t d, float std_multiplier,
                        bool tanh_approximate, KplanRowsOut out, cudaStream_t stream) {
  const int nvec = static_cast<int>(d / kVec);
  KplanGeluAndMulSparseKernel<T, kVec>
      <<<static_cast<unsigned>(rows), ThreadsFor(nvec), 0, stream>>>(
          static_cast<const T*>(x.data), x.row_stride, nvec, static_cast<int>(d), std_multiplier,
          tanh_approximate, static_cast<T*>(out.data), out.row_stride);
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("KplanGeluAndMulSparseKernel");
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

absl::Status KplanRmsNorm(DType type, KplanRows x, int64_t rows, int64_t cols, const void* weight,
                          float epsilon, KplanRowsOut out, cudaStream_t stream) {
  return Norm(
      -1, type,
      NormArgs{false, x, KplanRows{}, rows, cols, weight, epsilon, out, KplanRowsOut{}, stream});
}

absl::Status KplanFusedAddRmsNorm(DType type, KplanRows x, KplanRows residual, int64_t rows,
                                  int64_t cols, const void* weight, float epsilon, KplanRowsOut out,
                                  KplanRowsOut residual_out, cudaStream_t stream) {
  return Norm(-1, type,
              NormArgs{true, x, residual, rows, cols, weight, epsilon, out, residual_out, stream});
}

int KplanNormVariantCount() { return kNormVariantCount; }

const char* KplanNormVariantName(int variant) {
  return variant >= 0 && variant < kNormVariantCount ? kNormVariantNames[variant] : "?";
}

int KplanNormDefaultVariant(DType type, int64_t rows, int64_t cols) {
  return PickNorm(type, rows, cols);
}

absl::Status KplanNormWithVariant(int variant, bool fused, DType type, KplanRows x,
                                  KplanRows residual, int64_t rows, int64_t cols,
                                  const void* weight, float epsilon, KplanRowsOut out,
                                  KplanRowsOut residual_out, cudaStream_t stream) {
  if (variant < 0) return absl::InvalidArgumentError("kplan kernels: unknown norm variant");
  return Norm(variant, type,
              NormArgs{fused, x, residual, rows, cols, weight, epsilon, out, residual_out, stream});
}

absl::Status KplanGeluAndMulSparse(DType type, KplanRows x, int64_t rows, int64_t d,
                                   float std_multiplier, bool tanh_approximate, KplanRowsOut out,
                                   cudaStream_t stream) {
  if (rows == 0 || d == 0) return absl::OkStatus();
  if (absl::Status s = CheckSizes(rows, 2 * d); !s.ok()) return s;
  switch (type) {
    case DType::kFloat32:
      return DispatchGelu<float>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
    case DType::kFloat16:
      return DispatchGelu<__half>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
    case DType::kBFloat16:
      return DispatchGelu<__nv_bfloat16>(x, rows, d, std_multiplier, tanh_approximate, out, stream);
    default:
      break;
  }
  return absl::InvalidArgumentError("kplan kernels: unknown element type");
}

bool KplanVectorPath(DType type, int64_t cols, std::initializer_list<KplanRows> operands) {
  const int vec = VecWidth(type);
  if (cols % vec != 0) return false;
  for (const KplanRows& r : operands) {
    if (!Aligned16(r.data) || r.row_stride % vec != 0) return false;
  }
  return true;
}

}  // namespace kplan::kernels::cuda
