#include "base/checked_size.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace kplan {

std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxTensorDims)) {
    return absl::StrCat("[", absl::StrJoin(shape.subspan(0, kMaxTensorDims), ", "), ", ... (",
                        shape.size(), " dims)]");
  }
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<int64_t> ShapeElements(absl::Span<const int64_t> shape, absl::string_view field,
                                      const ShapeLimits& limits) {
  const std::string where = absl::StrCat(field, ".shape");
  if (shape.size() > static_cast<size_t>(limits.max_dims)) {
    return InvalidField(where, absl::StrCat(field, " has ", shape.size(), " dims; at most ",
                                            limits.max_dims, " are allowed"));
  }
  int64_t extent = 1;
  bool empty = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return InvalidField(
          where, absl::StrCat(field, " shape ", ShapeText(shape), ": dim ", d, " is negative"));
    }
    if (shape[d] == 0) {
      empty = true;
      continue;
    }
    std::optional<int64_t> next = CheckedMul(extent, shape[d]);
    if (!next || *next > limits.max_elements) {
      return InvalidField(where,
                          absl::StrCat(field, " shape ", ShapeText(shape), " spans more than ",
                                       limits.max_elements, " elements"));
    }
    extent = *next;
  }
  return empty ? 0 : extent;
}

absl::StatusOr<int64_t> ShapeBytes(absl::Span<const int64_t> shape, int64_t element_bytes,
                                   absl::string_view field, const ShapeLimits& limits) {
  KPLAN_ASSIGN_OR_RETURN(int64_t elements, ShapeElements(shape, field, limits));
  std::optional<int64_t> bytes = CheckedMul(elements, element_bytes);
  if (!bytes || *bytes > limits.max_bytes) {
    return InvalidField(absl::StrCat(field, ".shape"),
                        absl::StrCat(field, " shape ", ShapeText(shape), " needs more than ",
                                     limits.max_bytes, " bytes"));
  }
  return *bytes;
}

absl::StatusOr<int64_t> CheckTensorBytes(absl::Span<const int64_t> shape, int64_t element_bytes,
                                         int64_t data_size, absl::string_view field,
                                         const ShapeLimits& limits) {
  KPLAN_ASSIGN_OR_RETURN(int64_t bytes, ShapeBytes(shape, element_bytes, field, limits));
  if (data_size != bytes) {
    return InvalidField(absl::StrCat(field, ".data"),
                        absl::StrCat(field, " holds ", data_size, " bytes; its shape ",
                                     ShapeText(shape), " needs ", bytes));
  }
  return ShapeElements(shape, field, limits);
}

}  // namespace kplan
