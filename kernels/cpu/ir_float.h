// Element loads and stores by DType for the CPU reference kernels, on
// top of base/float16.h's fp16 and bf16 conversions (round to nearest even, as
// PyTorch's .to(); NaN stays NaN).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/float16.h"
#include "kernels/cpu/ir_types.h"

namespace kplan::kernels::cpu {

// The conversions themselves live in base/float16.h (one copy for every
// layer); these names keep kernels::cpu::Bf16ToFloat(...) and friends working.
using ::kplan::Bf16ToFloat;
using ::kplan::FloatToBf16;
using ::kplan::FloatToHalf;
using ::kplan::HalfToFloat;

inline float LoadAsFloat(const void* base, int64_t index, DType t) {
  switch (t) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, static_cast<const char*>(base) + index * 4, 4);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const char*>(base) + index * 2, 2);
      return t == DType::kFloat16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
    default:  // not an IR op type (validated by the caller)
      break;
  }
  return 0.f;
}

inline void StoreFromFloat(void* base, int64_t index, DType t, float v) {
  switch (t) {
    case DType::kFloat32:
      std::memcpy(static_cast<char*>(base) + index * 4, &v, 4);
      return;
    case DType::kFloat16: {
      uint16_t h = FloatToHalf(v);
      std::memcpy(static_cast<char*>(base) + index * 2, &h, 2);
      return;
    }
    case DType::kBFloat16: {
      uint16_t h = FloatToBf16(v);
      std::memcpy(static_cast<char*>(base) + index * 2, &h, 2);
      return;
    }
    default:  // not an IR op type (validated by the caller)
      return;
  }
}

// x.to(t).to(float32): the value after rounding to `t`.
inline float RoundTo(DType t, float v) {
  switch (t) {
    case DType::kFloat32:
      return v;
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(v));
    case DType::kBFloat16:
      return Bf16ToFloat(FloatToBf16(v));
    default:  // not an IR op type (validated by the caller)
      break;
  }
  return v;
}

}  // namespace kplan::kernels::cpu
