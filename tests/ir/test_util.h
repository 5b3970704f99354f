// Helpers for the IR tests: host tensors from float values and back, and the
// provider-vs-native tolerances of vllm/ir/tolerances.py.
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ir_float.h"
#include "server/ir/run.h"

namespace kplan::testing_ir {

inline IrHostTensor Host(kernels::DType dtype, std::vector<int64_t> shape,
                         const std::vector<float>& v) {
  IrHostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(v.size() * static_cast<size_t>(kernels::DTypeSize(dtype)));
  for (size_t i = 0; i < v.size(); ++i) {
    kernels::cpu::StoreFromFloat(t.data.data(), static_cast<int64_t>(i), dtype, v[i]);
  }
  return t;
}

inline std::vector<float> Values(const IrHostTensor& t) {
  const size_t n = t.data.size() / static_cast<size_t>(kernels::DTypeSize(t.dtype));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = kernels::cpu::LoadAsFloat(t.data.data(), static_cast<int64_t>(i), t.dtype);
  }
  return v;
}

// Fresh random values in [-2, 2) away from zero (never all zeros).
inline std::vector<float> RandomValues(size_t n, std::mt19937& rng, kernels::DType dtype) {
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) {
    float r = dist(rng);
    if (std::fabs(r) < 1e-3f) r = 0.5f;
    x = kernels::cpu::RoundTo(dtype, r);  // representable, so both sides see the same input
  }
  return v;
}

struct Tolerance {
  double atol;
  double rtol;
};

// vllm/ir/tolerances.py; the rms ops override float16 to 1e-2 / 2e-3.
inline Tolerance ToleranceFor(kernels::DType dtype, bool rms_op) {
  switch (dtype) {
    case kernels::DType::kFloat32:
      return {1e-5, 1.3e-6};
    case kernels::DType::kFloat16:
      return rms_op ? Tolerance{1e-2, 2e-3} : Tolerance{1e-3, 1e-3};
    case kernels::DType::kBFloat16:
      return {1e-3, 1.6e-2};
    default:  // not an IR op type
      break;
  }
  return {0, 0};
}

// torch.testing.assert_close: |a - e| <= atol + rtol * |e|, NaN never passes.
// Returns the number of mismatches and the first one in *first.
inline size_t CountMismatches(const std::vector<float>& actual, const std::vector<float>& expected,
                              Tolerance tol, std::string* first) {
  size_t bad = 0;
  if (actual.size() != expected.size()) {
    if (first) *first = "size differs";
    return actual.size() + expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok =
        !std::isnan(a) && !std::isnan(e) && std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
    if (!ok) {
      if (bad == 0 && first != nullptr) {
        *first = "index " + std::to_string(i) + ": got " + std::to_string(a) + ", expected " +
                 std::to_string(e);
      }
      ++bad;
    }
  }
  return bad;
}

}  // namespace kplan::testing_ir
