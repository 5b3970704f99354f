// Running one IR op on request: the entry point of the RunIrOp RPC. Inputs
// arrive as host buffers (row-major little-endian bytes, as the API's Tensor
// message carries them), named by vLLM's parameter names; the op runs on the
// CPU or on one CUDA device and stream; outputs come back as host buffers with
// the provider that ran. A per-request priority override is passed down to
// this one dispatch only, so concurrent requests never see each other's.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/ir/registry.h"
#include "server/ir/tensor.h"

namespace kplan {

// A dense row-major tensor in host memory.
struct IrHostTensor {
  kernels::DType dtype = kernels::DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;  // numel * element size bytes
};

struct IrNamedTensor {
  std::string name;
  IrHostTensor tensor;
};

struct IrDeviceSelection {
  IrDevice device;         // CPU, or the CUDA device to run on
  void* stream = nullptr;  // cudaStream_t on that device; null: the default stream
};

struct IrOpRequest {
  std::string op;  // "rms_norm", "fused_add_rms_norm", "gelu_and_mul_sparse"
  // By vLLM parameter name: "x", "x_residual", "weight" (absent weight: None).
  std::vector<IrNamedTensor> tensors;
  // Scalars by vLLM parameter name; each is an error for an op without it.
  std::optional<double> epsilon;
  std::optional<int64_t> variance_size;
  std::optional<double> std_multiplier;
  std::optional<std::string> approximate;
  // The priority for this request only (as `with op.set_priority(...)`);
  // absent: the server's default for the op.
  std::optional<std::vector<std::string>> priority;
  IrDeviceSelection device;
  // The CPU path stops between row blocks once it has passed.
  absl::Time deadline = absl::InfiniteFuture();
};

struct IrOpResult {
  std::string op;
  std::string provider;       // the provider that ran
  std::string provider_uuid;  // IrProviderUuid(op, provider)
  // The filtered priority list dispatch walked (vLLM's get_priority()).
  std::vector<std::string> priority;
  std::vector<IrNamedTensor> outputs;  // "out" (and "residual" for fused_add_rms_norm)
  std::vector<std::string> warnings;   // vLLM warnings this call emitted
};

// Validates the request (INVALID_ARGUMENT naming the field: the parameter
// name, e.g. "x", "epsilon", "priority"), dispatches and runs. Errors: an
// unknown op is NOT_FOUND; a CUDA device this build or host lacks is
// FAILED_PRECONDITION; CUDA failures are INTERNAL or RESOURCE_EXHAUSTED.
absl::StatusOr<IrOpResult> RunIrOp(const IrRegistry& registry, const IrOpRequest& request);

// The process-wide registry: builtin ops, kplan supported when
// CudaKernelsAvailable(), server defaults set. Created on first use.
IrRegistry& GlobalIrRegistry();

// RunIrOp on GlobalIrRegistry().
absl::StatusOr<IrOpResult> RunIrOp(const IrOpRequest& request);

// The default priority of `op` as the registry filtered it (["kplan",
// "native"] on a server with CUDA kernels and a device, else ["native"]);
// empty for an unknown op. For GetServerInfo.
std::vector<std::string> DefaultPriorityFor(const IrRegistry& registry, absl::string_view op);
std::vector<std::string> DefaultPriorityFor(absl::string_view op);

}  // namespace kplan
