// The expert half of a fused MoE layer on the GPU (moe_experts.h): grouped
// GEMM over moe_align_block_size tiles, activations, weighted combine.
//
// Grouped GEMM. One CTA per (BLOCK_M tile of sorted_token_ids, BLOCK_N
// column tile); blockIdx.x walks the M tiles so that neighbouring CTAs are
// mostly the same expert and the same weight tile (L2 reuse of W, the
// dominant traffic). 256 threads = 8 warps as 2 (M) x 4 (N), each warp
// 32x32 = 2x2 WMMA 16x16x16 fragments with fp32 accumulators. Operands go
// through shared memory in a 3-stage cp.async pipeline:
//   A stage [BM][BK+8]: rows gathered on the fly from A[slot / a_row_div]
//                       (sentinel rows and the K tail are zero-filled),
//   W stage [BN][BK+8]: rows n of W[e] (row-major [N, K]), read by WMMA as a
//                       column-major K x N matrix_b (the N tail zero-filled).
// The +8 element pad keeps 16-byte cp.async alignment and spreads the rows
// over the banks. The epilogue parks the fp32 tile in the (drained) pipeline
// buffers, then rounds, adds the bias, rounds again, and scatters each row to
// its slot. Shared memory: 3 * (64 + 128) * 40 * 2 = 45 KiB (static).
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/ir_cuda_status.h"
#include "kernels/cuda/ir_device_math.cuh"
#include "kernels/cuda/moe_experts.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;

constexpr int BM = kMoeGemmBlockM, BN = kMoeGemmBlockN, BK = kMoeGemmBlockK;
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kLds = BK + 8;  // smem row pitch (elements)
constexpr int kLdc = BN + 4;  // epilogue fp32 row pitch
constexpr int kStageElems = (BM + BN) * kLds;
constexpr int kSmemBytes = kStages * kStageElems * 2;
static_assert(BM * kLdc * 4 <= kSmemBytes, "epilogue tile must fit the pipeline buffers");
static_assert(BM * BK / 8 == kThreads, "one A chunk per thread");
static_assert(BN * BK / 8 == 2 * kThreads, "two W chunks per thread");

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

struct GemmParams {
  const void* a;
  const void* w;
  const float* bias;
  void* c;
  const int32_t* sorted;
  const int32_t* expert_ids;
  const int32_t* post;
  int64_t numel, N, K;
  int a_row_div;
  int num_local_experts;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) GroupedGemmKernel(GemmParams p) {
  using namespace nvcuda;
  __shared__ __align__(128) unsigned char smem_raw[kSmemBytes];
  __shared__ int64_t s_arow[BM];  // A row of each tile row, -1 for sentinels
  __shared__ int64_t s_slot[BM];  // output row, -1 for sentinels
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int tile = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  if (static_cast<int64_t>(tile) * BM >= *p.post) return;
  const int e = p.expert_ids[tile];
  const int tid = threadIdx.x;
  if (tid < BM) {
    const int64_t slot = p.sorted[static_cast<int64_t>(tile) * BM + tid];
    const bool valid = slot >= 0 && slot < p.numel;
    s_slot[tid] = valid ? slot : -1;
    s_arow[tid] = valid ? slot / p.a_row_div : -1;
  }
  __syncthreads();

  const T* A = static_cast<const T*>(p.a);
  T* C = static_cast<T*>(p.c);
  const int64_t N = p.N, K = p.K;

  if (e < 0 || e >= p.num_local_experts) {  // non-local expert: zeros
    for (int i = tid; i < BM * BN; i += kThreads) {
      const int r = i / BN, col = i % BN;
      const int64_t slot = s_slot[r], n = n0 + col;
      if (slot >= 0 && n < N) C[slot * N + n] = FromFloat<T>(0.0f);
    }
    return;
  }
  const T* W = static_cast<const T*>(p.w) + static_cast<int64_t>(e) * N * K;

  // This thread's chunks: A row tid/4, W rows tid/4 and tid/4 + 64; 8
  // elements (16 bytes) at column (tid%4)*8 of the K step.
  const int ld_row = tid >> 2, ld_col = (tid & 3) * 8;
  const int64_t a_row = s_arow[ld_row];
  const T* a_src = a_row >= 0 ? A + a_row * K : A;
  const int64_t wn0 = n0 + ld_row, wn1 = n0 + ld_row + 64;
  const T* w_src0 = W + std::min<int64_t>(wn0, N - 1) * K;
  const T* w_src1 = W + std::min<int64_t>(wn1, N - 1) * K;

  auto load_stage = [&](int stage, int64_t k0) {
    T* As = smem + stage * kStageElems;
    T* Bs = As + BM * kLds;
    const int64_t k = k0 + ld_col;
    const bool kin = k < K;
    CpAsync16(As + ld_row * kLds + ld_col, kin && a_row >= 0 ? a_src + k : A, kin && a_row >= 0);
    CpAsync16(Bs + ld_row * kLds + ld_col, kin && wn0 < N ? w_src0 + k : W, kin && wn0 < N);
    CpAsync16(Bs + (ld_row + 64) * kLds + ld_col, kin && wn1 < N ? w_src1 + k : W,
              kin && wn1 < N);
  };

  const int warp = tid >> 5;
  const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int64_t ktiles = (K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, static_cast<int64_t>(s) * BK);
    CpAsyncCommit();
  }
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage kt landed for all threads; stage kt-1 is free
    const int64_t next = kt + kStages - 1;
    if (next < ktiles) load_stage(static_cast<int>(next % kStages), next * BK);
    CpAsyncCommit();

    const T* As = smem + static_cast<int>(kt % kStages) * kStageElems;
    const T* Bs = As + BM * kLds;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], As + (wm + i * 16) * kLds + kk, kLds);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], Bs + (wn + j * 16) * kLds + kk, kLds);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers

  float* Cs = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(Cs + (wm + i * 16) * kLdc + wn + j * 16, acc[i][j], kLdc,
                              wmma::mem_row_major);
  __syncthreads();

  const float* bias = p.bias != nullptr ? p.bias + static_cast<int64_t>(e) * N : nullptr;
  for (int i = tid; i < BM * BN; i += kThreads) {
    const int r = i / BN, col = i % BN;
    const int64_t slot = s_slot[r], n = n0 + col;
    if (slot < 0 || n >= N) continue;
    T v = FromFloat<T>(Cs[r * kLdc + col]);
    if (bias != nullptr) v = FromFloat<T>(ToFloat(v) + ToFloat(FromFloat<T>(bias[n])));
    C[slot * N + n] = v;
  }
}

// ---------------------------------------------------------------------------
// Activations: the formulas of kernels/cpu/moe/moe_activation.cc.

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float Silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float GeluErf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float GeluTanh(float x) {
  const float kBeta = 0.79788456080286536f;
  return 0.5f * x * (1.0f + tanhf(kBeta * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float Relu2(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return r * r;
}
__device__ __forceinline__ float Clamp(float x, float lo, float hi) {
  return fminf(fmaxf(x, lo), hi);
}

__device__ __forceinline__ float Gated(MoeActKind act, const MoeActParams& p, float a, float b) {
  const float L = p.clamp_limit;
  switch (act) {
    case MoeActKind::kSilu:
      return p.has_clamp_limit ? Silu(fminf(a, L)) * Clamp(b, -L, L) : Silu(a) * b;
    case MoeActKind::kGelu:
      return GeluErf(a) * b;
    case MoeActKind::kGeluTanh:
      return GeluTanh(a) * b;
    case MoeActKind::kRelu2:
      return Relu2(a) * b;
    case MoeActKind::kSwigluOai: {  // a = gate x[2i], b = up x[2i+1]
      const float g = fminf(a, L);
      const float u = Clamp(b, -L, L);
      return (u + 1.0f) * (g * Sigmoid(p.alpha * g));
    }
    case MoeActKind::kSwigluOaiUninterleave: {
      const float g = fminf(a, L);
      const float u = Clamp(b, -L, L);
      return g * Sigmoid(p.alpha * g) * (u + p.beta);
    }
    case MoeActKind::kSwigluStep:
      return fminf(Silu(a), L) * Clamp(b, -L, L);
    default:
      return 0.0f;
  }
}

__device__ __forceinline__ float Plain(MoeActKind act, float x) {
  switch (act) {
    case MoeActKind::kSiluNoMul:
      return Silu(x);
    case MoeActKind::kGeluNoMul:
      return GeluErf(x);
    case MoeActKind::kGeluTanhNoMul:
      return GeluTanh(x);
    default:
      return Relu2(x);
  }
}

template <typename T>
__global__ void ActivationKernel(MoeActKind act, MoeActParams p, const T* in, int64_t rows,
                                 int64_t d, bool gated, T* out) {
  const int64_t total = rows * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / d, c = i % d;
    float v;
    if (!gated) {
      v = Plain(act, ToFloat(in[i]));
    } else if (act == MoeActKind::kSwigluOai) {
      const T* x = in + r * 2 * d;
      v = Gated(act, p, ToFloat(x[2 * c]), ToFloat(x[2 * c + 1]));
    } else {
      const T* x = in + r * 2 * d;
      v = Gated(act, p, ToFloat(x[c]), ToFloat(x[d + c]));
    }
    out[i] = FromFloat<T>(v);
  }
}

// ---------------------------------------------------------------------------
// Combine and input scaling. Multiply and add are rounded separately
// (__fmul_rn / __fadd_rn: no FMA contraction), as the CPU reference does.

template <typename T>
__global__ void CombineKernel(const T* y, const float* w, int64_t M, int k, int64_t H, T* out) {
  const int64_t total = M * H;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / H, h = i % H;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float v = ToFloat(y[(m * k + j) * H + h]);
      acc = __fadd_rn(acc, w != nullptr ? __fmul_rn(v, w[m * k + j]) : v);
    }
    out[i] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void ScaleRowsKernel(const T* a, const float* w, int64_t rows, int64_t width, T* out) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = ToFloat(FromFloat<T>(w[i / width]));
    out[i] = FromFloat<T>(__fmul_rn(ToFloat(a[i]), s));
  }
}

int ElementwiseBlocks(int64_t n, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads,
                                                                  132 * 16)));
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

absl::Status LaunchMoeGroupedGemm(const MoeGroupedGemmArgs& g, cudaStream_t stream) {
  if (g.N <= 0) return absl::InvalidArgumentError("moe_grouped_gemm: N must be positive");
  if (g.K <= 0 || g.K % 8 != 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: K must be a positive multiple of 8");
  }
  if (g.a_row_div <= 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: a_row_div must be positive");
  }
  if (g.num_local_experts <= 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: num_local_experts must be positive");
  }
  if (g.numel < 0 || g.num_blocks < 0 || g.numel > INT32_MAX) {
    return absl::InvalidArgumentError("moe_grouped_gemm: numel / num_blocks out of range");
  }
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (g.a == nullptr || g.w == nullptr || g.c == nullptr || g.sorted_token_ids == nullptr ||
      g.expert_ids == nullptr || g.num_tokens_post_padded == nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm: null pointer");
  }
  if (!Aligned16(g.a) || !Aligned16(g.w)) {
    return absl::InvalidArgumentError("moe_grouped_gemm: a and w must be 16-byte aligned");
  }
  const int64_t n_tiles = (g.N + BN - 1) / BN;
  if (g.num_blocks > INT32_MAX || n_tiles > 65535) {
    return absl::InvalidArgumentError("moe_grouped_gemm: grid too large");
  }
  GemmParams p{g.a,
               g.w,
               g.bias,
               g.c,
               g.sorted_token_ids,
               g.expert_ids,
               g.num_tokens_post_padded,
               g.numel,
               g.N,
               g.K,
               g.a_row_div,
               g.num_local_experts};
  const dim3 grid(static_cast<unsigned>(g.num_blocks), static_cast<unsigned>(n_tiles));
  if (g.dtype == MoeElemType::kBFloat16) {
    GroupedGemmKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
  } else {
    GroupedGemmKernel<__half><<<grid, kThreads, 0, stream>>>(p);
  }
  KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedGemmKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeActivation(MoeActKind act, const MoeActParams& params, MoeElemType dtype,
                                 const void* in, int64_t rows, int64_t in_width, void* out,
                                 int64_t out_width, cudaStream_t stream) {
  const int a = static_cast<int>(act);
  if (a < 0 || a > static_cast<int>(MoeActKind::kRelu2NoMul)) {
    return absl::InvalidArgumentError("moe_activation: unknown activation");
  }
  const bool gated = act < MoeActKind::kSiluNoMul;
  if (rows < 0 || out_width < 0 || in_width != (gated ? 2 * out_width : out_width)) {
    return absl::InvalidArgumentError(
        gated ? "moe_activation: gated activations expect in_width == 2 * out_width"
              : "moe_activation: _no_mul activations expect equal widths");
  }
  if (act == MoeActKind::kSwigluOaiUninterleave && !params.has_clamp_limit) {
    return absl::InvalidArgumentError("SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  }
  const int64_t total = rows * out_width;
  if (total == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("moe_activation: null pointer");
  }
  MoeActParams p = params;
  if (!p.has_clamp_limit) p.clamp_limit = 7.0f;  // swigluoai / swiglustep default
  const int threads = 256, blocks = ElementwiseBlocks(total, threads);
  if (dtype == MoeElemType::kBFloat16) {
    ActivationKernel<<<blocks, threads, 0, stream>>>(
        act, p, static_cast<const __nv_bfloat16*>(in), rows, out_width, gated,
        static_cast<__nv_bfloat16*>(out));
  } else {
    ActivationKernel<<<blocks, threads, 0, stream>>>(act, p, static_cast<const __half*>(in),
                                                     rows, out_width, gated,
                                                     static_cast<__half*>(out));
  }
  KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR("ActivationKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeCombine(MoeElemType dtype, const void* y, const float* topk_weights,
                              int64_t num_tokens, int top_k, int64_t hidden, void* out,
                              cudaStream_t stream) {
  if (num_tokens < 0 || top_k <= 0 || hidden < 0) {
    return absl::InvalidArgumentError("moe_combine: bad sizes");
  }
  const int64_t total = num_tokens * hidden;
  if (total == 0) return absl::OkStatus();
  if (y == nullptr || out == nullptr) return absl::InvalidArgumentError("moe_combine: null pointer");
  const int threads = 256, blocks = ElementwiseBlocks(total, threads);
  if (dtype == MoeElemType::kBFloat16) {
    CombineKernel<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(y),
                                                  topk_weights, num_tokens, top_k, hidden,
                                                  static_cast<__nv_bfloat16*>(out));
  } else {
    CombineKernel<<<blocks, threads, 0, stream>>>(static_cast<const __half*>(y), topk_weights,
                                                  num_tokens, top_k, hidden,
                                                  static_cast<__half*>(out));
  }
  KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR("CombineKernel");
  return absl::OkStatus();
}

absl::Status LaunchMoeScaleRows(MoeElemType dtype, const void* a, const float* row_weights,
                                int64_t rows, int64_t width, void* out, cudaStream_t stream) {
  if (rows < 0 || width < 0) return absl::InvalidArgumentError("moe_scale_rows: bad sizes");
  const int64_t total = rows * width;
  if (total == 0) return absl::OkStatus();
  if (a == nullptr || row_weights == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("moe_scale_rows: null pointer");
  }
  const int threads = 256, blocks = ElementwiseBlocks(total, threads);
  if (dtype == MoeElemType::kBFloat16) {
    ScaleRowsKernel<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(a),
                                                    row_weights, rows, width,
                                                    static_cast<__nv_bfloat16*>(out));
  } else {
    ScaleRowsKernel<<<blocks, threads, 0, stream>>>(static_cast<const __half*>(a), row_weights,
                                                    rows, width, static_cast<__half*>(out));
  }
  KPLAN_IR_CUDA_RETURN_IF_LAUNCH_ERROR("ScaleRowsKernel");
  return absl::OkStatus();
}

}  // namespace kplan::kernels::cuda
