// Exact dtype conversions for the MoE reference.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/moe/moe_reference.h"

namespace kplan::moe {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace

float Fp8E4m3ToFloat(uint8_t b) {
  const bool neg = b & 0x80;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + m/8) · 2^(e-7)
  }
  return neg ? -v : v;
}

uint8_t FloatToFp8E4m3(float f, bool saturate) {
  const uint32_t bits = Bits(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;  // NaN
  if (saturate) {
    if (abs >= 0x43e00000u) return sign | 0x7e;  // >= 448 (inf included): max
  } else if (abs >= 0x43f00000u) {
    return sign | 0x7f;  // >= 480 (inf included): NaN, as torch's cast
  }
  if (abs < 0x3c800000u) {  // below 2^-6: subnormal, step 2^-9
    const float q = std::nearbyint(FromBits(abs) * 512.0f);
    return sign | static_cast<uint8_t>(q);  // q == 8 is the smallest normal, bits agree
  }
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t exp = (rounded >> 23) - 127 + 7;
  const uint32_t mant = (rounded >> 20) & 0x7u;
  return sign | static_cast<uint8_t>((exp << 3) | mant);  // 464..480 rounds to 0x7f: NaN
}

float RoundToDType(float f, kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kFloat16:
      return HalfToFloat(FloatToHalf(f));
    case kernels::DType::kBFloat16:
      return Bf16ToFloat(FloatToBf16(f));
    default:
      return f;
  }
}

void RoundToDTypeInPlace(float* x, int64_t n, kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) x[i] = HalfToFloat(FloatToHalf(x[i]));
      return;
    case kernels::DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
      return;
    default:
      return;
  }
}

void LoadFloats(const void* data, kernels::DType dtype, int64_t begin, int64_t n, float* dst) {
  switch (dtype) {
    case kernels::DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
      return;
    }
    case kernels::DType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
      return;
    }
    default:
      std::memcpy(dst, static_cast<const float*>(data) + begin, n * sizeof(float));
      return;
  }
}

float LoadFloat(const void* data, kernels::DType dtype, int64_t i) {
  switch (dtype) {
    case kernels::DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case kernels::DType::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

void StoreFloat(void* data, kernels::DType dtype, int64_t i, float value) {
  switch (dtype) {
    case kernels::DType::kFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(value);
      break;
    case kernels::DType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToBf16(value);
      break;
    default:
      static_cast<float*>(data)[i] = value;
      break;
  }
}

std::vector<uint8_t> PackInt4(const std::vector<uint8_t>& nibbles) {
  std::vector<uint8_t> out((nibbles.size() + 1) / 2, 0);
  for (size_t i = 0; i < nibbles.size(); ++i) {
    const uint8_t v = nibbles[i] & 0x0f;
    out[i / 2] |= (i & 1) ? static_cast<uint8_t>(v << 4) : v;
  }
  return out;
}

}  // namespace kplan::moe
