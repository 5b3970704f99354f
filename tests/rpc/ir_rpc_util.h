// Helpers for RunIrOp tests: random float32/bfloat16 tensors and decoding.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kplan/v1/service.pb.h"

namespace kplan::rpc::testing {

inline uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float FromBf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A tensor of `values` (fresh random data chosen by the caller) in `dtype`
// (DTYPE_FLOAT32 or DTYPE_BFLOAT16); `values` is rounded to what was sent.
inline v1::NamedTensor MakeTensor(const std::string& name, std::vector<int64_t> shape,
                                  std::vector<float>& values, v1::DType dtype) {
  v1::NamedTensor t;
  t.set_name(name);
  t.mutable_tensor()->set_dtype(dtype);
  for (int64_t d : shape) t.mutable_tensor()->add_shape(d);
  std::string bytes;
  if (dtype == v1::DTYPE_BFLOAT16) {
    bytes.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t h = ToBf16(values[i]);
      values[i] = FromBf16(h);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  } else {
    bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  t.mutable_tensor()->set_data(bytes);
  return t;
}

inline std::vector<float> Decode(const v1::Tensor& t) {
  std::vector<float> out;
  if (t.dtype() == v1::DTYPE_BFLOAT16) {
    for (size_t i = 0; i + 1 < t.data().size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, &t.data()[i], 2);
      out.push_back(FromBf16(h));
    }
  } else {
    out.resize(t.data().size() / 4);
    std::memcpy(out.data(), t.data().data(), out.size() * 4);
  }
  return out;
}

inline std::vector<float> RandomValues(size_t n, std::mt19937& rng, float lo = -2, float hi = 2) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// rms_norm in double: x * rsqrt(mean(x^2) + eps) * weight, per row.
inline std::vector<double> RmsNormReference(const std::vector<float>& x,
                                            const std::vector<float>& w, int64_t rows,
                                            int64_t hidden, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < hidden; ++i) ss += double(x[r * hidden + i]) * x[r * hidden + i];
    double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t i = 0; i < hidden; ++i) out[r * hidden + i] = x[r * hidden + i] * inv * w[i];
  }
  return out;
}

}  // namespace kplan::rpc::testing
