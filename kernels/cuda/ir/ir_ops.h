// CUDA launchers of the IR ops, in two families:
//  * Native*: the `native` provider on device tensors. Simple and general:
//    any strides (IrRowLayout), any mix of element types, one block per row,
//    fp32 accumulation. Same semantics as kernels/cpu/ir_ops.h.
//  * Kplan*: the optimised `kplan` provider. Rows with a contiguous last dim,
//    x/residual/weight/outputs of one element type, weight contiguous.
//    16-byte vector loads when the row length and every row start are 16-byte
//    aligned (a scalar path otherwise), each row read once and kept in
//    registers (a launch shape picked by element type and row length; rows
//    longer than the registers hold re-read their tail), warp-shuffle
//    reductions.
// Plain functions: raw pointers, sizes, an explicit stream, work on the
// current device; errors come back as absl::Status with file:line.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "kernels/cpu/ir_types.h"

namespace kplan::kernels::cuda {

absl::Status NativeRmsNorm(const IrRowsIn& x, int64_t rows, int64_t cols, const IrWeightIn& weight,
                           float epsilon, int64_t variance_size, void* out, cudaStream_t stream);

absl::Status NativeFusedAddRmsNorm(const IrRowsIn& x, const IrRowsIn& residual, int64_t rows,
                                   int64_t cols, const IrWeightIn& weight, float epsilon,
                                   int64_t variance_size, void* out, void* residual_out,
                                   cudaStream_t stream);

absl::Status NativeGeluAndMulSparse(const IrRowsIn& x, int64_t rows, int64_t d,
                                    float std_multiplier, bool tanh_approximate, void* out,
                                    cudaStream_t stream);

// A [rows, cols] operand of the kplan kernels: row r starts at
// data + r * row_stride elements; elements within a row are contiguous.
struct KplanRows {
  const void* data = nullptr;
  int64_t row_stride = 0;
};
struct KplanRowsOut {
  void* data = nullptr;
  int64_t row_stride = 0;
};

// out = rms_norm(x, weight|nullptr, epsilon) over the full row.
absl::Status KplanRmsNorm(DType type, KplanRows x, int64_t rows, int64_t cols, const void* weight,
                          float epsilon, KplanRowsOut out, cudaStream_t stream);

// (out, residual_out) = fused_add_rms_norm(x, residual, weight|nullptr, epsilon).
// Outputs must not overlap the inputs (rows longer than the registers hold
// re-read their inputs after writing).
absl::Status KplanFusedAddRmsNorm(DType type, KplanRows x, KplanRows residual, int64_t rows,
                                  int64_t cols, const void* weight, float epsilon, KplanRowsOut out,
                                  KplanRowsOut residual_out, cudaStream_t stream);

// out[rows, d] = gelu_and_mul_sparse(x[rows, 2d]).
absl::Status KplanGeluAndMulSparse(DType type, KplanRows x, int64_t rows, int64_t d,
                                   float std_multiplier, bool tanh_approximate, KplanRowsOut out,
                                   cudaStream_t stream);

// Launch variants of the kplan norm kernels (launch shape, grid, cache
// hints), for bench/ir_bench --sweep. KplanRmsNorm / KplanFusedAddRmsNorm run
// KplanNormDefaultVariant (the production table in ir_kplan.cu). Variants other
// than the legacy one apply to bf16 rows on the vector path; everything else
// runs the legacy shape whatever the variant.
int KplanNormVariantCount();
const char* KplanNormVariantName(int variant);
int KplanNormDefaultVariant(DType type, int64_t rows, int64_t cols);
// rms_norm (fused false; residual and residual_out ignored) or
// fused_add_rms_norm with variant `variant` in [0, KplanNormVariantCount()).
absl::Status KplanNormWithVariant(int variant, bool fused, DType type, KplanRows x,
                                  KplanRows residual, int64_t rows, int64_t cols,
                                  const void* weight, float epsilon, KplanRowsOut out,
                                  KplanRowsOut residual_out, cudaStream_t stream);

// Whether the kplan kernels take their 16-byte vector path for these rows
// (row length and all row starts 16-byte aligned); for tests and benchmarks.
bool KplanVectorPath(DType type, int64_t cols, std::initializer_list<KplanRows> operands);

}  // namespace kplan::kernels::cuda
