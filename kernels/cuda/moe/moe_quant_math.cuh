// Device steps shared by the quantised expert GEMMs (moe_quant_gemm.cu,
// moe_quant_decode.cu, moe_quant_matvec.cu): the fp8 quantisation of
// activations (below, also moe_quant_ops.cu's and moe_gemm_ws_fp8_sm90.cu's), the decoding of
// stored quantised int weights, so that every GPU route that dequantises them in registers (the
// decode tiles, the dequant route's dequantiser, the int4 matvec tiles and the int8 rows) does it
// as the CPU reference does, and the m16n8k16 mma they feed. Internal to kernels/cuda/moe.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/ir/ir_device_math.cuh"

namespace kplan::kernels::cuda::detail::quant {

// Word i (compile-time after unrolling) of a 16-byte vector (int4 / uint4).
template <typename V>
__device__ __forceinline__ uint32_t WordOf(const V& v, int i) {
  return static_cast<uint32_t>(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}

// d += A·B on mma.sync m16n8k16 in T (bf16 / fp16), fp32 accumulation:
// A the 16 x 16 operand's four registers, B the 16 x 8 one's two.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// (q - zp)·s in fp32, q given as the low bits of an fp32 2^23 + q and zp as
// zp_biased = 2^23 + zp (the subtraction is exact); the caller rounds it to
// the activation type, as the CPU reference does.
__device__ __forceinline__ float Deq(uint32_t q, float zp_biased, float s) {
  return __fmul_rn(__int_as_float(0x4B000000 | q) - zp_biased, s);
}

// (a & b) | c in one instruction: with two different constants b and c the
// compiler emits two LOP3s, one immediate each (docs/PERF.md, session 13).
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// k / group_size for the group sizes of int weights: a shift where
// group_size is a power of two (every GPTQ / AWQ checkpoint's), else a
// division. Made on the host by For.
struct GroupDiv {
  int size, shift;  // shift -1: not a power of two
  static GroupDiv For(int group_size) {
    int s = -1;
    if (group_size > 0 && (group_size & (group_size - 1)) == 0) {
      s = 0;
      while ((1 << s) < group_size) ++s;
    }
    return {group_size, s};
  }
  __device__ __forceinline__ int64_t operator()(int64_t k) const {
    return shift >= 0 ? k >> shift : k / size;
  }
  // The same in 32 bits, for k < 2^31 (a shift or a 32-bit division).
  __device__ __forceinline__ int operator()(int k) const {
    return shift >= 0 ? k >> shift : k / size;
  }
};

// The biased zero point of an int group: the stored one, or the implied one
// (int4: 8; signed int8 is read as q + 128, hence 128).
__device__ __forceinline__ float BiasedZero(const uint8_t* zero, int64_t gi, bool int4) {
  const float zp = zero != nullptr ? static_cast<float>(__ldg(zero + gi)) : int4 ? 8.0f : 128.0f;
  return 8388608.0f + zp;
}

// The stored ints of one group (scale s, biased zero point zpb as BiasedZero
// gives it) dequantised to T pairs: Pairs(word) gives a 32-bit word's weights
// as consecutive pairs, each round_T((q - zp)·s), the value Deq rounded to
// T gives. int4: element 2i in the low nibble of byte i, four pairs; int8:
// bytes (0, 1) and (2, 3), two pairs (signed int8 flipped by the caller).
//
// Where it is exact the arithmetic is packed, two weights per instruction:
// M | q is the T value M + q (M = 128 in bf16, 1024 in fp16: a unit ulp),
// minus M + zp is q - zp exactly, times s rounded once in T. That is the
// reference's value when s is exact in T: its fp32 product of q - zp (at
// most 8 significant bits) and s (at most 11) is exact (subnormals and
// overflow included), and both round that product to T once. (For a NaN
// scale, or an infinite one times 0, both give NaN, the GPU's canonical one
// where the CPU's keeps a payload.) Exact here: s representable in T; M + zp
// and M + q representable (bf16: zp and q below 128, so int8 is never packed
// in bf16). Scales stored in the activation type, as GPTQ / AWQ checkpoints
// keep them, take the packed form; any other group takes Deq per weight.
template <typename T, bool kInt4>
class IntGroupDequant {
 public:
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr uint32_t kMagic = kBf16 ? 0x4300u : 0x6400u;  // M as T bits

  __device__ __forceinline__ IntGroupDequant(float s, float zpb) : s_(s), zpb_(zpb) {
    const float zp = zpb - 8388608.0f;
    const bool s_exact =
        kBf16 ? (__float_as_uint(s) & 0xffffu) == 0u : __half2float(__float2half_rn(s)) == s;
    packed_ = s_exact && (kBf16 ? kInt4 && zp < 128.0f : true);
    if (packed_) {
      const float m = kBf16 ? 128.0f : 1024.0f;
      zero2_ = AsT2(Pack2<T>(m + zp, m + zp));  // exact: checked above
      scale2_ = AsT2(Pack2<T>(s, s));
    }
  }

  // Whether the group takes the packed form.
  __device__ __forceinline__ bool packed() const { return packed_; }

  // Every pair of word wd (pair i: int4 nibbles 2i, 2i + 1, i.e. byte i;
  // int8 bytes 2i, 2i + 1), one branch for the word.
  template <int kN>
  __device__ __forceinline__ void Pairs(uint32_t wd, uint32_t (&out)[kN]) const {
    Pairs(wd, out, packed_);
  }
  // The same in the form the caller names: `packed` may be true only where
  // packed() is (e.g. the __all_sync of every lane's packed(), so that the
  // branch is the same across the warp); false is always exact.
  template <int kN>
  __device__ __forceinline__ void Pairs(uint32_t wd, uint32_t (&out)[kN], bool packed) const {
    static_assert(kN == (kInt4 ? 4 : 2), "int4: 4 pairs per word, int8: 2");
    if (packed) {
#pragma unroll
      for (int i = 0; i < kN; ++i) out[i] = PackedPair(wd, i);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) out[i] = ScalarPair(wd, i);
    }
  }

 private:
  using T2 = std::conditional_t<kBf16, __nv_bfloat162, __half2>;
  static __device__ __forceinline__ T2 AsT2(uint32_t v) { return *reinterpret_cast<const T2*>(&v); }

  // Pair i of word wd (int4 nibbles 2i, 2i + 1, i.e. byte i; int8 bytes 2i,
  // 2i + 1): PackedPair in the packed form (packed_ only), ScalarPair per
  // weight. Callers go a word at a time (Pairs): a branch per pair measured
  // far slower than the arithmetic it saves (docs/PERF.md, session 12).
  __device__ __forceinline__ uint32_t PackedPair(uint32_t wd, int i) const {
    uint32_t v;
    if constexpr (kInt4) {
      // Byte i of wd (nibbles 2i, 2i + 1) and of wd >> 4 (nibble 2i + 1
      // low) to halves 0 / 1, low nibbles kept, M's bits or-ed in.
      v = AndOr(__byte_perm(wd, wd >> 4, (4 + i) << 8 | i), 0x000f000fu, kMagic << 16 | kMagic);
    } else {
      v = __byte_perm(wd, kMagic >> 8, 0x4040u | (2 * i + 1) << 8 | (2 * i));
    }
    const T2 w = __hmul2_rn(__hsub2_rn(AsT2(v), zero2_), scale2_);  // _rn: never contracted
    return *reinterpret_cast<const uint32_t*>(&w);
  }
  __device__ __forceinline__ uint32_t ScalarPair(uint32_t wd, int i) const {
    constexpr int kBits = kInt4 ? 4 : 8;
    const uint32_t two = (wd >> (2 * kBits * i)) & ((1u << (2 * kBits)) - 1u);
    return Pack2<T>(Deq(two & ((1u << kBits) - 1u), zpb_, s_), Deq(two >> kBits, zpb_, s_));
  }

  float s_, zpb_;
  bool packed_ = false;
  T2 zero2_, scale2_;  // M + zp and s in both halves (packed_ only)
};

// The formulas of LaunchMoeFp8Quantize (moe_quant_gemm.h), one definition
// for its kernels and the fp8 GEMM 1 that quantises its own output
// (moe_gemm_ws_fp8_sm90.cu).
constexpr float kFp8Max = 448.0f;
constexpr float kFp8PerTokenMinScale = 1.0f / (kFp8Max * 512.0f);
constexpr float kFp8GroupEps = 1e-10f;

// moe::FloatToFp8E4m3(f, /*saturate=*/true) bit for bit (the reference's
// rounding, not the hardware cvt's).
__device__ __forceinline__ uint8_t FloatToFp8Sat(float f) {
  const uint32_t bits = __float_as_uint(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;
  if (abs >= 0x43e00000u) return sign | 0x7e;
  if (abs < 0x3c800000u) {
    const float q = rintf(__fmul_rn(__uint_as_float(abs), 512.0f));
    return sign | static_cast<uint8_t>(q);
  }
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t exp = (rounded >> 23) - 127 + 7;
  const uint32_t mant = (rounded >> 20) & 0x7u;
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}

// The scales from a maximum |x| (NaN never wins: callers take maxima with
// fmaxf, as std::max does in the reference).
__device__ __forceinline__ float Fp8GroupScale(float max_abs) {
  return __fdiv_rn(fmaxf(max_abs, kFp8GroupEps), kFp8Max);
}
__device__ __forceinline__ float Fp8TokenScale(float max_abs) {
  return fmaxf(__fdiv_rn(max_abs, kFp8Max), kFp8PerTokenMinScale);
}
// static_scale when positive, else the dynamic one over the whole tensor.
__device__ __forceinline__ float Fp8TensorScale(float static_scale, float max_abs) {
  if (static_scale > 0.0f) return static_scale;
  return max_abs > 0.0f ? __fdiv_rn(max_abs, kFp8Max) : 1.0f;
}
__device__ __forceinline__ uint8_t Fp8Quantise(float x, float scale) {
  return FloatToFp8Sat(__fdiv_rn(x, scale));
}

}  // namespace kplan::kernels::cuda::detail::quant
