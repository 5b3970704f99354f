// The IR ops this server hosts, with vLLM's signatures and semantics
// (vllm/ir/ops/layernorm.py, the Gemma3n gelu_and_mul_sparse):
//   rms_norm(x, weight, epsilon, variance_size=None) -> out
//   fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> (out, residual)
//   gelu_and_mul_sparse(x, std_multiplier, approximate="none") -> out
// and their providers:
//   native  reference semantics, fp32 math: CPU kernels for host tensors, a
//           simple GPU kernel for device tensors (any strides, mixed dtypes).
//   kplan   optimised CUDA kernels; statically supported only when the build
//           has CUDA kernels and a device is present (injected through
//           IrBuiltinOptions); supports_args: CUDA tensors whose rows have a
//           contiguous last dim and an even stride, one dtype for x, residual
//           and weight, a contiguous weight, variance_size None.
//   every other provider vLLM knows for the op (resolve/plan/vocabulary.h:
//   vllm_c, aiter, oink, xpu_kernels, triton): registered with
//   supported=False, so vLLM's priority lists filter down to what runs here.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/ir/registry.h"

namespace kplan {

inline constexpr absl::string_view kIrRmsNorm = "rms_norm";
inline constexpr absl::string_view kIrFusedAddRmsNorm = "fused_add_rms_norm";
inline constexpr absl::string_view kIrGeluAndMulSparse = "gelu_and_mul_sparse";
inline constexpr absl::string_view kIrKplanProvider = "kplan";

struct IrBuiltinOptions {
  // Static `supported` of the kplan provider.
  bool kplan_supported = false;
};

// Registers the three ops, native, kplan and the vocabulary's other providers.
absl::Status RegisterBuiltinIrOps(IrRegistry& registry, const IrBuiltinOptions& options);

// A registry with the builtin ops and the server defaults set on every op.
absl::StatusOr<std::unique_ptr<IrRegistry>> MakeBuiltinIrRegistry(const IrBuiltinOptions& options);

// The server's default priority: ["kplan", "native"] when kplan is supported,
// else ["native"].
std::vector<std::string> ServerDefaultIrPriority(bool kplan_supported);

// True when this build has CUDA kernels and at least one CUDA device is
// visible (always false in a CPU-only build, which never calls CUDA).
bool CudaKernelsAvailable();

// Argument lists in the ops' parameter order.
IrArgs RmsNormArgs(const TensorView& x, const TensorView* weight, double epsilon,
                   std::optional<int64_t> variance_size = std::nullopt);
IrArgs FusedAddRmsNormArgs(const TensorView& x, const TensorView& x_residual,
                           const TensorView* weight, double epsilon,
                           std::optional<int64_t> variance_size = std::nullopt);
IrArgs GeluAndMulSparseArgs(const TensorView& x, double std_multiplier,
                            std::string approximate = "none");

}  // namespace kplan
