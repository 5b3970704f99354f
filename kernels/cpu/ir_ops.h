// CPU reference kernels of the IR ops: the `native` provider's semantics of
// vLLM's vllm/ir/ops (fp32 math, rounding to the output dtype where PyTorch
// rounds). Plain functions over raw pointers; the caller validates shapes.
// Outputs are dense [rows, cols] (or [rows, d]) in the input's element type.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cpu/ir_types.h"

namespace kplan::kernels::cpu {

// Each kernel below asks `stop` (when given) once per kIrRowsPerStopCheck
// rows whether to give up, so a request past its deadline does not hold the
// thread; it returns false when it stopped early (the output is then
// incomplete and must not be returned), true when it finished.
inline constexpr int64_t kIrRowsPerStopCheck = 256;
using IrStop = std::function<bool()>;

// rms_norm(x, weight, epsilon, variance_size):
//   var = mean(x[..., :variance_size]^2) (fp32); y = x * rsqrt(var + eps);
//   with a weight: y = y.to(weight.dtype) * weight; out = y.to(x.dtype).
// variance_size in [1, cols] (cols for None).
bool RmsNorm(const IrRowsIn& x, int64_t rows, int64_t cols, const IrWeightIn& weight, float epsilon,
             int64_t variance_size, void* out, const IrStop& stop = {});

// fused_add_rms_norm: s = x + residual in fp32; residual_out = s.to(x.dtype);
// out = rms_norm of s (the fp32 sum, not the rounded residual).
bool FusedAddRmsNorm(const IrRowsIn& x, const IrRowsIn& residual, int64_t rows, int64_t cols,
                     const IrWeightIn& weight, float epsilon, int64_t variance_size, void* out,
                     void* residual_out, const IrStop& stop = {});

// gelu_and_mul_sparse over rows of 2*d: gate = x[:d], up = x[d:];
// cutoff = mean(gate) + std(gate, unbiased=False) * std_multiplier;
// out = gelu(relu(gate - cutoff), approximate) * up.
bool GeluAndMulSparse(const IrRowsIn& x, int64_t rows, int64_t d, float std_multiplier,
                      bool tanh_approximate, void* out, const IrStop& stop = {});

// GELU as PyTorch computes it in fp32 (approximate "none" or "tanh").
float Gelu(float x, bool tanh_approximate);

}  // namespace kplan::kernels::cpu
