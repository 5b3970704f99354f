#include "kernels/cpu/ir_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ir_float.h"

namespace kplan::kernels::cpu {
namespace {

// Element c of row r of `in`, widened to fp32.
inline float At(const IrRowsIn& in, int64_t row_offset, int64_t c) {
  return LoadAsFloat(in.data, row_offset + c * in.layout.col_stride, in.type);
}

// The normalisation tail shared by both rms ops: `s` holds the fp32 row.
void NormalizeRow(const float* s, int64_t cols, const IrWeightIn& weight, float epsilon,
                  int64_t variance_size, DType out_type, void* out, int64_t out_offset) {
  // Accumulate in double: the reference should carry less rounding than any
  // kernel it checks.
  double sum = 0;
  for (int64_t c = 0; c < variance_size; ++c) sum += static_cast<double>(s[c]) * s[c];
  const float variance = static_cast<float>(sum / static_cast<double>(variance_size));
  const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(variance + epsilon)));
  for (int64_t c = 0; c < cols; ++c) {
    float y = s[c] * inv;
    if (weight.data != nullptr) {
      const float w = LoadAsFloat(weight.data, c * weight.stride, weight.type);
      y = RoundTo(weight.type, RoundTo(weight.type, y) * w);
    }
    StoreFromFloat(out, out_offset + c, out_type, y);
  }
}

bool Stopped(const IrStop& stop, int64_t row) {
  return stop && row % kIrRowsPerStopCheck == 0 && row > 0 && stop();
}

}  // namespace

bool RmsNorm(const IrRowsIn& x, int64_t rows, int64_t cols, const IrWeightIn& weight, float epsilon,
             int64_t variance_size, void* out, const IrStop& stop) {
  variance_size = std::clamp<int64_t>(variance_size, 1, cols);
  std::vector<float> s(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (Stopped(stop, r)) return false;
    const int64_t off = x.layout.RowOffset(r);
    for (int64_t c = 0; c < cols; ++c) s[c] = At(x, off, c);
    NormalizeRow(s.data(), cols, weight, epsilon, variance_size, x.type, out, r * cols);
  }
  return true;
}

bool FusedAddRmsNorm(const IrRowsIn& x, const IrRowsIn& residual, int64_t rows, int64_t cols,
                     const IrWeightIn& weight, float epsilon, int64_t variance_size, void* out,
                     void* residual_out, const IrStop& stop) {
  variance_size = std::clamp<int64_t>(variance_size, 1, cols);
  std::vector<float> s(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (Stopped(stop, r)) return false;
    const int64_t xo = x.layout.RowOffset(r);
    const int64_t ro = residual.layout.RowOffset(r);
    for (int64_t c = 0; c < cols; ++c) {
      s[c] = At(x, xo, c) + At(residual, ro, c);
      StoreFromFloat(residual_out, r * cols + c, x.type, s[c]);
    }
    NormalizeRow(s.data(), cols, weight, epsilon, variance_size, x.type, out, r * cols);
  }
  return true;
}

float Gelu(float x, bool tanh_approximate) {
  if (tanh_approximate) {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float inner = kBeta * (x + kKappa * x * x * x);
    return 0.5f * x * (1.f + std::tanh(inner));
  }
  constexpr float kAlpha = 0.70710678118654752f;  // 1 / sqrt(2)
  return 0.5f * x * (1.f + std::erf(x * kAlpha));
}

bool GeluAndMulSparse(const IrRowsIn& x, int64_t rows, int64_t d, float std_multiplier,
                      bool tanh_approximate, void* out, const IrStop& stop) {
  for (int64_t r = 0; r < rows; ++r) {
    if (Stopped(stop, r)) return false;
    const int64_t off = x.layout.RowOffset(r);
    double sum = 0;
    for (int64_t c = 0; c < d; ++c) sum += At(x, off, c);
    const double mean = sum / static_cast<double>(d);
    double sq = 0;
    for (int64_t c = 0; c < d; ++c) {
      const double dev = At(x, off, c) - mean;
      sq += dev * dev;
    }
    const float stddev = static_cast<float>(std::sqrt(sq / static_cast<double>(d)));
    const float cutoff = static_cast<float>(mean) + stddev * std_multiplier;
    for (int64_t c = 0; c < d; ++c) {
      const float gate = std::max(At(x, off, c) - cutoff, 0.f);
      const float up = At(x, off, d + c);
      StoreFromFloat(out, r * d + c, x.type, Gelu(gate, tanh_approximate) * up);
    }
  }
  return true;
}

}  // namespace kplan::kernels::cpu
