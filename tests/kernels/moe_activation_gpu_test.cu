// The batched SiLU of the fused epilogue (moe_math::SiluN, GatedSiluN in
// kernels/cuda/moe/moe_activation_math.cuh) against the one-at-a-time form
// every other kernel uses (Silu, Gated): the same bits. Exhaustive over
// every bf16 and every fp16 value (the fused epilogue's SiLU sees only
// values rounded to the GEMM's dtype), then over every fp32 bit pattern,
// and gated pairs with and without a clamp limit on fresh random data
// (seed printed; MOE_ACTIVATION_GPU_TEST_SEED=<n> repeats one). Skips
// without a device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/moe/moe_activation_math.cuh"
#include "tests/testing/gpu_test_util.h"

namespace kplan {
namespace {

namespace mm = kernels::cuda::moe_math;
using test_util::DeviceBuf;

constexpr int kN = 16;  // values per SiluN call, as the fused epilogue takes them

// out1[i] = Silu(x[i]), outn[i] the same value through SiluN, kN at a time.
__global__ void SiluKernel(const float* x, int64_t n, float* out1, float* outn) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kN;
  if (base >= n) return;
  float v[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = base + i < n ? x[base + i] : 0.0f;
  mm::SiluN(v);
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    if (base + i < n) {
      out1[base + i] = mm::Silu(x[base + i]);
      outn[base + i] = v[i];
    }
  }
}

__global__ void GatedKernel(const float* a, const float* b, int64_t n,
                            kernels::cuda::MoeActParams p, float* out1, float* outn) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kN;
  if (base >= n) return;
  float va[kN], vb[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    va[i] = base + i < n ? a[base + i] : 0.0f;
    vb[i] = base + i < n ? b[base + i] : 0.0f;
  }
  mm::GatedSiluN(p, va, vb);
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    if (base + i < n) {
      out1[base + i] = mm::Gated(kernels::MoeActivation::kSilu, p, a[base + i], b[base + i]);
      outn[base + i] = va[i];
    }
  }
}

// Every fp32 bit pattern through Silu and SiluN (kN consecutive patterns a
// thread step): *count the values whose bits differ (NaN against NaN
// equal), *first the smallest such pattern.
__global__ void SweepKernel(unsigned long long* count, uint32_t* first) {
  const uint64_t chunks = (uint64_t{1} << 32) / kN;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t c = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    float x[kN], v[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = v[i] = __uint_as_float(static_cast<uint32_t>(c * kN + i));
    mm::SiluN(v);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const float one = mm::Silu(x[i]);
      const bool same =
          __float_as_uint(one) == __float_as_uint(v[i]) || (one != one && v[i] != v[i]);
      if (!same) {
        atomicAdd(count, 1ull);
        atomicMin(first, __float_as_uint(x[i]));
      }
    }
  }
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Bits that differ between the two outputs (NaN against NaN counts as equal).
int64_t Differ(const std::vector<float>& one, const std::vector<float>& batch,
               const std::vector<float>& x) {
  int64_t differ = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    const bool both_nan = one[i] != one[i] && batch[i] != batch[i];
    if (!both_nan && Bits(one[i]) != Bits(batch[i])) {
      if (++differ <= 5) {
        ADD_FAILURE() << "x " << x[i] << " (0x" << std::hex << Bits(x[i]) << "): Silu 0x"
                      << Bits(one[i]) << ", SiluN 0x" << Bits(batch[i]) << std::dec;
      }
    }
  }
  return differ;
}

std::vector<float> Launch(const std::vector<float>& x, std::vector<float>* batch) {
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceBuf<float> dx(x), d1(x.size()), dn(x.size());
  const int64_t threads = (n + kN - 1) / kN;
  SiluKernel<<<static_cast<unsigned>((threads + 255) / 256), 256>>>(dx.p, n, d1.p, dn.p);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> one(x.size());
  batch->resize(x.size());
  EXPECT_EQ(cudaMemcpy(one.data(), d1.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(batch->data(), dn.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return one;
}

TEST(MoeActivationGpuTest, SiluNOnEveryBf16AndFp16Value) {
  SKIP_WITHOUT_CUDA();
  std::vector<float> x;
  for (uint32_t u = 0; u < 65536; ++u) x.push_back(FromBits(u << 16));  // bf16
  for (uint32_t u = 0; u < 65536; ++u) {
    __half_raw h;
    h.x = static_cast<uint16_t>(u);
    x.push_back(__half2float(__half(h)));
  }
  std::vector<float> batch;
  const std::vector<float> one = Launch(x, &batch);
  EXPECT_EQ(Differ(one, batch, x), 0);
  // The slow path ran (values out of the fast path's range are in the set).
  int64_t slow = 0;
  for (float v : x)
    slow += !(v > -40.0f && std::fabs(v) <= 0x1p100f && (std::fabs(v) >= 0x1p-60f || v == 0.0f));
  EXPECT_GT(slow, 1000);
}

TEST(MoeActivationGpuTest, SiluNOnEveryFloat) {
  SKIP_WITHOUT_CUDA();
  DeviceBuf<unsigned long long> count(1);
  DeviceBuf<uint32_t> first(1);
  ASSERT_EQ(cudaMemset(count.p, 0, sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMemset(first.p, 0xff, sizeof(uint32_t)), cudaSuccess);
  SweepKernel<<<132 * 8, 256>>>(count.p, first.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long n = 0;
  uint32_t f = 0;
  ASSERT_EQ(cudaMemcpy(&n, count.p, sizeof(n), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&f, first.p, sizeof(f), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(n, 0u) << "first differing input 0x" << std::hex << f << " (" << FromBits(f) << ")";
}

TEST(MoeActivationGpuTest, GatedSiluNWithAndWithoutClamp) {
  SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(test_util::SplitMix(
      test_util::TestSeed("moe_activation_gpu_test", "MOE_ACTIVATION_GPU_TEST_SEED") ^ 1));
  const int64_t n = 1 << 20;
  std::normal_distribution<float> normal(0.0f, 10.0f);
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) a[i] = normal(rng), b[i] = normal(rng);
  DeviceBuf<float> da(a), db(b), d1(n), dn(n);
  for (bool clamp : {false, true}) {
    SCOPED_TRACE(clamp ? "clamp 7" : "no clamp");
    kernels::cuda::MoeActParams p;
    p.has_clamp_limit = clamp;
    p.clamp_limit = 7.0f;
    GatedKernel<<<static_cast<unsigned>((n / kN + 255) / 256), 256>>>(da.p, db.p, n, p, d1.p, dn.p);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> one(n), batch(n);
    ASSERT_EQ(cudaMemcpy(one.data(), d1.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(batch.data(), dn.p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(Differ(one, batch, a), 0);
  }
}

}  // namespace
}  // namespace kplan
