// Checked sizes: every shape and byte count a client controls goes through
// here before it sizes an allocation, a loop or a kernel. Products and sums
// are overflow-checked, each tensor has at most kMaxTensorDims dims, and its
// extent (the product of its dims with 0 counted as 1, which bounds every
// partial product such as "rows" of a [2^62, 0] tensor) is at most a limit.
// The default limit is the largest gRPC message (2^31 bytes), so no tensor
// that travels inline can name more elements than it could carry; server-side
// sources (files, streamed expert sets) pass their own byte budget.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kplan {

inline constexpr int kMaxTensorDims = 8;
inline constexpr int64_t kMaxWireElements = int64_t{1} << 31;

// a * b, a + b; nullopt on int64 overflow (operands may be negative).
std::optional<int64_t> CheckedMul(int64_t a, int64_t b);
std::optional<int64_t> CheckedAdd(int64_t a, int64_t b);

struct ShapeLimits {
  int max_dims = kMaxTensorDims;
  // Bound on the extent (product of dims, 0 counted as 1) and on the bytes.
  int64_t max_elements = kMaxWireElements;
  int64_t max_bytes = kMaxWireElements;
};

// The number of elements of `shape`, after checking every dim is >= 0, the
// rank and the extent against `limits`. INVALID_ARGUMENT naming
// "<field>.shape" otherwise (RESOURCE_EXHAUSTED is for budgets, not shapes).
absl::StatusOr<int64_t> ShapeElements(absl::Span<const int64_t> shape, absl::string_view field,
                                      const ShapeLimits& limits = {});

// "[2, 3]"; past kMaxTensorDims dims "[..., ... (N dims)]", so a client's
// shape never makes a text long.
std::string ShapeText(absl::Span<const int64_t> shape);

// ShapeElements times `element_bytes`, checked against limits.max_bytes.
absl::StatusOr<int64_t> ShapeBytes(absl::Span<const int64_t> shape, int64_t element_bytes,
                                   absl::string_view field, const ShapeLimits& limits = {});

// ShapeBytes, then that `data_size` (the bytes the client sent) equals it:
// INVALID_ARGUMENT naming "<field>.data" otherwise. Returns the element count.
absl::StatusOr<int64_t> CheckTensorBytes(absl::Span<const int64_t> shape, int64_t element_bytes,
                                         int64_t data_size, absl::string_view field,
                                         const ShapeLimits& limits = {});

}  // namespace kplan
