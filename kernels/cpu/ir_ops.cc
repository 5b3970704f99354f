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

double NormalIcdf(double p) {
  if (!(p > 0.0 && p < 1.0)) {
    if (p == 0.0) return -INFINITY;
    if (p == 1.0) return INFINITY;
    return NAN;
  }
  // Acklam's rational approximation (relative error < 1.2e-9), then one
  // Halley step on erfc, which brings it to double precision.
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  double x;
  if (p < kLow) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - kLow) {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log1p(-p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

}  // namespace kplan::kernels::cpu
