// Types shared by the IR op launchers (rms_norm, fused_add_rms_norm,
// gelu_and_mul_sparse) of kernels/cpu and kernels/cuda: the element types and a
// row layout that describes where every row of a [..., cols] tensor starts for
// any strides, so the reference (native) kernels accept every view vLLM's
// native implementation accepts. Plain data, usable from host and device code.
#pragma once

#include <cstdint>

#include "kernels/common/types.h"

namespace kplan::kernels {

// Leading dimensions a row layout can describe (tensors up to 7-D).
inline constexpr int kIrMaxLeadDims = 6;

// Element offsets of the rows of a [d0, ..., dn-1, cols] view: row r (row-major
// over the leading dims) starts at RowOffset(r); element c of a row sits at
// c * col_stride from there.
struct IrRowLayout {
  int32_t lead_dims = 0;
  int64_t lead_sizes[kIrMaxLeadDims] = {};
  int64_t lead_strides[kIrMaxLeadDims] = {};
  int64_t col_stride = 1;

  KPLAN_HD int64_t RowOffset(int64_t row) const {
    int64_t offset = 0;
    for (int d = lead_dims - 1; d >= 0; --d) {
      const int64_t size = lead_sizes[d];
      offset += (row % size) * lead_strides[d];
      row /= size;
    }
    return offset;
  }

  // A dense [rows, cols] matrix whose rows are `row_stride` elements apart.
  static IrRowLayout Rows(int64_t rows, int64_t row_stride) {
    IrRowLayout l;
    l.lead_dims = 1;
    l.lead_sizes[0] = rows;
    l.lead_strides[0] = row_stride;
    l.col_stride = 1;
    return l;
  }
};

// A read-only operand of the reference kernels.
struct IrRowsIn {
  const void* data = nullptr;
  DType type = DType::kFloat32;
  IrRowLayout layout;
};

// An optional 1-D weight of `cols` elements (data == nullptr: no weight).
struct IrWeightIn {
  const void* data = nullptr;
  DType type = DType::kFloat32;
  int64_t stride = 1;
};

}  // namespace kplan::kernels
