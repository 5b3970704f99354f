#include "server/ir/tensor.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"

namespace kplan {

absl::string_view IrDTypeName(kernels::DType dtype) {
  // The IR ops' subset of DType; anything else is not an IR tensor type.
  return kernels::IsFloatDType(dtype) ? kernels::DTypeName(dtype) : "unknown";
}

std::optional<kernels::DType> IrDTypeFromName(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (absl::StartsWith(n, "torch.")) n = n.substr(6);
  if (n == "float32" || n == "float" || n == "fp32") return kernels::DType::kFloat32;
  if (n == "float16" || n == "half" || n == "fp16") return kernels::DType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return kernels::DType::kBFloat16;
  return std::nullopt;
}

std::string IrDevice::ToString() const { return is_cpu() ? "cpu" : absl::StrCat("cuda:", index); }

TensorView TensorView::Contiguous(void* data, kernels::DType dtype, std::vector<int64_t> shape,
                                  IrDevice device) {
  TensorView t;
  t.dtype = dtype;
  t.device = device;
  t.data = data;
  t.strides.assign(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    t.strides[d] = t.strides[d + 1] * shape[d + 1];
  }
  t.shape = std::move(shape);
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t TensorView::rows() const {
  int64_t n = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

bool TensorView::RowsWithStride(int64_t* row_stride) const {
  if (shape.empty()) return false;
  if (shape.back() != 1 && strides.back() != 1) return false;
  // Leading dims collapse when each one's stride is the next one's stride
  // times its size (size-1 dims do not matter).
  int64_t inner = -1;  // stride of one row step
  int64_t span = 1;    // rows covered by the dims after d
  for (int64_t d = dim() - 2; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (inner < 0) {
      inner = strides[d];
    } else if (strides[d] != inner * span) {
      return false;
    }
    span *= shape[d];
  }
  *row_stride = inner < 0 ? shape.back() : inner;
  return true;
}

bool TensorView::RowLayout(kernels::IrRowLayout* layout) const {
  if (shape.empty() || dim() - 1 > kernels::kIrMaxLeadDims) return false;
  kernels::IrRowLayout l;
  l.lead_dims = static_cast<int32_t>(dim() - 1);
  for (int64_t d = 0; d + 1 < dim(); ++d) {
    l.lead_sizes[d] = shape[d];
    l.lead_strides[d] = strides[d];
  }
  l.col_stride = strides.back();
  *layout = l;
  return true;
}

std::string TensorView::Describe() const {
  return absl::StrCat(IrDTypeName(dtype), "[", absl::StrJoin(shape, ", "), "] ", device.ToString());
}

}  // namespace kplan
