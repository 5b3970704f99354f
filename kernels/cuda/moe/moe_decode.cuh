// Device pieces of the decode-sized MoE layers, shared by the two-kernel form
// (moe_decode.cu) and the one-kernel form (moe_decode_layer.cu) so that both
// compute every value with the same instructions in the same order: the
// local expert of a slot, the warp dot product and the rounding of a GEMM
// output; and the one-kernel form's launcher, which the entry point
// (LaunchMoeDecodeExperts, moe_decode.cu) calls. Internal to kernels/cuda/moe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_experts.h"

namespace kplan::kernels::cuda::detail {

// The one-kernel form of `args`, which ValidateMoeDecodeArgs accepted, with
// num_tokens > 0: UNAVAILABLE, with nothing launched, where it cannot run
// (moe_experts.h, MoeDecodeLayerEnabled); CUDA errors otherwise.
absl::Status LaunchMoeDecodeLayer(const MoeDecodeArgs& args, cudaStream_t stream);

}  // namespace kplan::kernels::cuda::detail

namespace kplan::kernels::cuda::detail::decode {

// The local index of slot s's expert, or -1 (out of range, or not local
// under an expert map). kBeforeWait: read through the L2 (ld.global.cg), as
// a kernel reads ids before its PDL wait (moe_quant_matvec.cu's
// PairCombineKernel): complete by then, since the kernel before it
// released it only after its own wait (pdl.cuh), and the L2 is where another
// SM's writes are coherent.
template <bool kBeforeWait = false>
__device__ __forceinline__ int LocalExpert(const int32_t* ids, const int32_t* map, int num_experts,
                                           int num_local, int64_t s) {
  const int e = kBeforeWait ? __ldcg(ids + s) : ids[s];
  if (e < 0 || e >= num_experts) return -1;
  const int l = map == nullptr ? e : kBeforeWait ? __ldcg(map + e) : map[e];
  return l >= 0 && l < num_local ? l : -1;
}

// How a dot product reads its 16-byte vectors.
struct LdgLoad {  // read-only data cache
  __device__ __forceinline__ int4 operator()(const int4* p) const { return __ldg(p); }
};
struct GenericLoad {  // shared or global memory, through the generic address
  __device__ __forceinline__ int4 operator()(const int4* p) const { return *p; }
};
// R dot products of length K (a multiple of 8, 16-byte aligned rows) with
// one vector x: out[r] = Σ_i w[r][i] · x[i], valid in every lane. Lane l
// takes the vectors l, l + 32, ... and sums their products in fp32 in that
// order (fmaf, element by element), then the warp sums the lanes in a fixed
// butterfly: a row's value does not depend on R, on the loads or on which
// warp computes it. The loads go out in batches of kBatch vectors per lane
// and row, all of a batch before its first product: a short row (Qwen3's
// down rows are 3 vectors per lane) is one round trip to memory, not one
// per vector. kBatch 1, for rows in shared memory: a loop unrolled by 4.
template <typename T, int R, int kBatch = (R == 1 ? 8 : 4), typename WLoad = LdgLoad,
          typename XLoad = LdgLoad>
__device__ __forceinline__ void Dots(const T* const (&w)[R], const T* x, int64_t K, int lane,
                                     float (&out)[R], WLoad wload = {}, XLoad xload = {}) {
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int64_t vecs = K / 8;
  const int4* x4 = reinterpret_cast<const int4*>(x);
#pragma unroll(kBatch == 1 ? 4 : 1)
  for (int64_t base = lane; base < vecs; base += 32 * kBatch) {
    int4 a[kBatch][R], b[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = base + 32 * u;
      if (i < vecs) {
        b[u] = xload(x4 + i);
#pragma unroll
        for (int r = 0; r < R; ++r) a[u][r] = wload(reinterpret_cast<const int4*>(w[r]) + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (base + 32 * u >= vecs) break;
      const T* tb = reinterpret_cast<const T*>(&b[u]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const T* ta = reinterpret_cast<const T*>(&a[u][r]);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r] = fmaf(ToFloat(ta[e]), ToFloat(tb[e]), acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    out[r] = acc[r];
  }
}

// A GEMM output element as the grouped GEMM stores it, as float: round(acc),
// with a bias round(round(acc) + round(b)).
template <typename T>
__device__ __forceinline__ float Rounded(float acc, const float* bias) {
  float v = ToFloat(FromFloat<T>(acc));
  if (bias != nullptr) v = ToFloat(FromFloat<T>(v + ToFloat(FromFloat<T>(*bias))));
  return v;
}

}  // namespace kplan::kernels::cuda::detail::decode
