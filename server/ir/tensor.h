// Non-owning tensor views for IR op arguments: element type (fp32, fp16,
// bf16), shape, strides in elements, a data pointer and the device it lives
// on (the CPU or one CUDA device). Op arguments mirror vLLM's torch.Tensor
// arguments, so providers' supports_args predicates can look at dtype, shape,
// strides and device exactly as vLLM's do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/cpu/ir_types.h"

namespace kplan {

// "float32", "float16", "bfloat16" (torch's dtype names without "torch.").
absl::string_view IrDTypeName(kernels::DType dtype);
// Accepts the names above and torch's aliases "float", "half", "fp32", "fp16", "bf16".
std::optional<kernels::DType> IrDTypeFromName(absl::string_view name);

struct IrDevice {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // CUDA device ordinal

  static IrDevice Cpu() { return IrDevice{}; }
  static IrDevice Cuda(int index) { return IrDevice{Kind::kCuda, index}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  bool operator==(const IrDevice& o) const {
    return kind == o.kind && (kind == Kind::kCpu || index == o.index);
  }
  // "cpu" or "cuda:<index>", as torch prints devices.
  std::string ToString() const;
};

struct TensorView {
  kernels::DType dtype = kernels::DType::kFloat32;
  IrDevice device;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements, one per dim
  void* data = nullptr;

  // A contiguous (row-major) view.
  static TensorView Contiguous(void* data, kernels::DType dtype, std::vector<int64_t> shape,
                               IrDevice device = IrDevice::Cpu());

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  // Size of dimension `d`; negative counts from the end as in torch.
  int64_t size(int64_t d) const { return shape[d < 0 ? d + dim() : d]; }
  int64_t stride(int64_t d) const { return strides[d < 0 ? d + dim() : d]; }
  int64_t numel() const;
  // Product of all dims but the last (1 for a 1-D tensor): rows of a [..., cols] view.
  int64_t rows() const;
  bool is_contiguous() const;
  // True when the view is a [rows, cols] matrix with contiguous rows spaced
  // evenly (any leading dims collapse to one stride); sets *row_stride.
  bool RowsWithStride(int64_t* row_stride) const;
  // The row layout of a [..., cols] view for the reference kernels; false
  // when the tensor has more leading dims than kernels::kIrMaxLeadDims.
  bool RowLayout(kernels::IrRowLayout* layout) const;
  // "bfloat16[4, 8] cuda:0" (no data), for logs and error texts.
  std::string Describe() const;
};

}  // namespace kplan
