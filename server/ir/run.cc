#include "server/ir/run.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked_size.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/ir/builtin_ops.h"
#include "spdlog/spdlog.h"

#if KPLAN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "absl/cleanup/cleanup.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/status.h"
#endif

namespace kplan {
namespace {

// Python's TypeError texts for a call with missing or unknown arguments.
absl::Status MissingArgument(const IrOp& op, const std::string& param) {
  return InvalidField(
      param, absl::StrCat(op.name(), "() missing 1 required positional argument: '", param, "'"));
}

absl::Status UnexpectedArgument(const IrOp& op, const std::string& name) {
  return InvalidField(
      ClientText(name),
      absl::StrCat(op.name(), "() got an unexpected keyword argument '", ClientText(name), "'"));
}

const IrParam* FindParam(const IrOp& op, absl::string_view name) {
  for (const IrParam& p : op.signature().params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

bool IsTensorParam(const IrParam& p) {
  return p.type == IrParamType::kTensor || p.type == IrParamType::kOptionalTensor;
}

// The request's scalars by parameter name.
std::map<std::string, IrValue> Scalars(const IrOpRequest& r) {
  std::map<std::string, IrValue> out;
  if (r.epsilon) out["epsilon"] = *r.epsilon;
  if (r.variance_size) out["variance_size"] = *r.variance_size;
  if (r.std_multiplier) out["std_multiplier"] = *r.std_multiplier;
  if (r.approximate) out["approximate"] = *r.approximate;
  return out;
}

// A default value as the IrValue the op expects.
IrValue DefaultValue(const IrParam& p) {
  if (*p.default_value == "None") return IrNone{};
  switch (p.type) {
    case IrParamType::kStr:
      return *p.default_value;
    case IrParamType::kFloat:
      return std::strtod(p.default_value->c_str(), nullptr);
    case IrParamType::kInt:
    case IrParamType::kOptionalInt:
      return static_cast<int64_t>(std::strtoll(p.default_value->c_str(), nullptr, 10));
    case IrParamType::kBool:
      return *p.default_value == "True";
    default:
      return IrNone{};
  }
}

// The bytes a client sent for a tensor against its shape, with checked
// products (a wrapped product once let [2^62, 4] with no data through).
absl::Status CheckHostTensor(const IrNamedTensor& t) {
  return CheckTensorBytes(t.tensor.shape, kernels::DTypeSize(t.tensor.dtype),
                          static_cast<int64_t>(t.tensor.data.size()), t.name)
      .status();
}

// The arguments in signature order; tensors on `device` at `data[name]`.
absl::StatusOr<IrArgs> BuildArgs(const IrOp& op, const IrOpRequest& request, IrDevice device,
                                 const std::map<std::string, void*>& data) {
  const std::map<std::string, IrValue> scalars = Scalars(request);
  for (const auto& [name, value] : scalars) {
    const IrParam* p = FindParam(op, name);
    if (p == nullptr || IsTensorParam(*p)) return UnexpectedArgument(op, name);
  }
  IrArgs args;
  for (const IrParam& p : op.signature().params) {
    if (IsTensorParam(p)) {
      const IrNamedTensor* t = nullptr;
      for (const IrNamedTensor& n : request.tensors) {
        if (n.name == p.name) t = &n;
      }
      if (t == nullptr) {
        // The API cannot tell an absent tensor from None: absent is None.
        if (p.type == IrParamType::kOptionalTensor) {
          args.values.push_back(IrNone{});
          continue;
        }
        return MissingArgument(op, p.name);
      }
      args.values.push_back(
          TensorView::Contiguous(data.at(p.name), t->tensor.dtype, t->tensor.shape, device));
      continue;
    }
    auto it = scalars.find(p.name);
    if (it == scalars.end()) {
      if (!p.default_value) return MissingArgument(op, p.name);
      args.values.push_back(DefaultValue(p));
      continue;
    }
    args.values.push_back(it->second);
  }
  return args;
}

struct Prepared {
  const IrOp* op = nullptr;
  IrArgs args;
  std::vector<IrOutputSpec> outputs;
  const IrOpImpl* impl = nullptr;
  IrOpResult result;
  // Every output is empty: the op is done once validated (no kernel walks
  // the rows of a [N, 0] tensor).
  bool nothing_to_compute = true;
};

// Everything up to the choice of implementation, on views of host memory.
absl::StatusOr<Prepared> Prepare(const IrRegistry& registry, const IrOpRequest& request) {
  Prepared p;
  p.op = registry.Find(request.op);
  if (p.op == nullptr) {
    return WithField(absl::NotFoundError(absl::StrCat("Unknown IR op '", ClientText(request.op),
                                                      "'; this server has ",
                                                      absl::StrJoin(registry.OpNames(), ", "))),
                     "op");
  }
  std::map<std::string, void*> host;
  for (const IrNamedTensor& t : request.tensors) {
    const IrParam* param = FindParam(*p.op, t.name);
    if (param == nullptr || !IsTensorParam(*param)) return UnexpectedArgument(*p.op, t.name);
    if (host.count(t.name) > 0) {
      return InvalidField(
          t.name, absl::StrCat(p.op->name(), "() got multiple values for argument '", t.name, "'"));
    }
    KPLAN_RETURN_IF_ERROR(CheckHostTensor(t));
    host[t.name] = const_cast<char*>(t.tensor.data.data());
  }
  KPLAN_ASSIGN_OR_RETURN(p.args, BuildArgs(*p.op, request, request.device.device, host));
  KPLAN_ASSIGN_OR_RETURN(p.outputs, p.op->OutputSpecs(p.args));

  IrDispatchOptions options;
  if (request.priority) options.priority = &*request.priority;
  options.resolved_priority = &p.result.priority;
  options.warnings = &p.result.warnings;
  absl::StatusOr<const IrOpImpl*> impl = p.op->Dispatch(p.args, options);
  if (!impl.ok()) {
    return impl.status().code() == absl::StatusCode::kInvalidArgument
               ? WithField(impl.status(), "priority")
               : impl.status();
  }
  p.impl = *impl;
  p.result.op = p.op->name();
  p.result.provider = p.impl->provider();
  p.result.provider_uuid = p.impl->uuid();
  for (const IrOutputSpec& o : p.outputs) {
    KPLAN_ASSIGN_OR_RETURN(int64_t bytes, ShapeBytes(o.shape, kernels::DTypeSize(o.dtype), o.name));
    IrNamedTensor t{o.name, {o.dtype, o.shape, std::string()}};
    t.tensor.data.resize(static_cast<size_t>(bytes));
    if (bytes > 0) p.nothing_to_compute = false;
    p.result.outputs.push_back(std::move(t));
  }
  return p;
}

absl::StatusOr<IrOpResult> RunOnCpu(Prepared p, absl::Time deadline) {
  std::vector<TensorView> outs;
  for (IrNamedTensor& o : p.result.outputs) {
    outs.push_back(TensorView::Contiguous(o.tensor.data.data(), o.tensor.dtype, o.tensor.shape));
  }
  IrExecContext ctx;
  ctx.deadline = deadline;
  KPLAN_RETURN_IF_ERROR(p.impl->Run(p.args, outs, ctx));
  return std::move(p.result);
}

#if KPLAN_HAVE_CUDA
absl::StatusOr<IrOpResult> RunOnCuda(Prepared p, const IrOpRequest& request) {
  const int index = request.device.device.index;
  auto stream = static_cast<cudaStream_t>(request.device.stream);
  KPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));

  // One stream-ordered block for all of the request's device buffers,
  // released (and the stream drained) on every exit path.
  kernels::cuda::DeviceArena arena(stream);
  std::map<std::string, int64_t> offsets;
  for (const IrNamedTensor& t : request.tensors) {
    offsets[t.name] = arena.Reserve(static_cast<int64_t>(t.tensor.data.size()));
  }
  std::vector<int64_t> out_offsets;
  for (const IrNamedTensor& o : p.result.outputs) {
    out_offsets.push_back(arena.Reserve(static_cast<int64_t>(o.tensor.data.size())));
  }
  absl::Cleanup release = [&arena, stream] {
    if (arena.base() == nullptr) return;
    arena.Release();
    cudaStreamSynchronize(stream);
  };
  KPLAN_RETURN_IF_ERROR(arena.Allocate());

  std::map<std::string, void*> device_data;
  for (const IrNamedTensor& t : request.tensors) {
    char* dst = arena.At<char>(offsets[t.name]);
    device_data[t.name] = dst;
    if (!t.tensor.data.empty()) {
      KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, t.tensor.data.data(), t.tensor.data.size(),
                                                 cudaMemcpyHostToDevice, stream));
    }
  }
  KPLAN_ASSIGN_OR_RETURN(IrArgs args,
                         BuildArgs(*p.op, request, request.device.device, device_data));
  std::vector<TensorView> outs;
  for (size_t i = 0; i < p.result.outputs.size(); ++i) {
    IrHostTensor& o = p.result.outputs[i].tensor;
    char* dst = arena.At<char>(out_offsets[i]);
    // Poison: an element the kernel fails to write reads back as NaN.
    if (!o.data.empty()) {
      KPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0xff, o.data.size(), stream));
    }
    outs.push_back(TensorView::Contiguous(dst, o.dtype, o.shape, request.device.device));
  }
  KPLAN_RETURN_IF_ERROR(p.impl->Run(args, outs, IrExecContext{stream}));
  for (size_t i = 0; i < p.result.outputs.size(); ++i) {
    std::string& host = p.result.outputs[i].tensor.data;
    if (host.empty()) continue;
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), outs[i].data, host.size(), cudaMemcpyDeviceToHost, stream));
  }
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return std::move(p.result);
}
#endif

absl::Status CheckDevice(const IrDevice& device) {
  if (device.is_cpu()) return absl::OkStatus();
#if KPLAN_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (device.index < 0 || device.index >= count) {
    return WithField(absl::FailedPreconditionError(absl::StrCat(
                         "CUDA device ", device.index, " is not present (this server sees ", count,
                         " CUDA device", count == 1 ? "" : "s", ")")),
                     "device");
  }
  return absl::OkStatus();
#else
  return WithField(absl::FailedPreconditionError(
                       absl::StrCat("CUDA device ", device.index,
                                    " requested, but this server was built without CUDA kernels")),
                   "device");
#endif
}

}  // namespace

absl::StatusOr<IrOpResult> RunIrOp(const IrRegistry& registry, const IrOpRequest& request) {
  KPLAN_RETURN_IF_ERROR(CheckDevice(request.device.device));
  KPLAN_ASSIGN_OR_RETURN(Prepared p, Prepare(registry, request));
  if (p.nothing_to_compute) return std::move(p.result);
  if (request.device.device.is_cpu()) return RunOnCpu(std::move(p), request.deadline);
#if KPLAN_HAVE_CUDA
  return RunOnCuda(std::move(p), request);
#else
  return absl::FailedPreconditionError("no CUDA kernels in this build");
#endif
}

IrRegistry& GlobalIrRegistry() {
  static IrRegistry* registry = [] {
    absl::StatusOr<std::unique_ptr<IrRegistry>> r =
        MakeBuiltinIrRegistry(IrBuiltinOptions{CudaKernelsAvailable()});
    if (!r.ok()) {
      // Only a programming error in the builtin table gets here.
      spdlog::critical("IR registry: {}", r.status().ToString());
      std::abort();
    }
    return r->release();
  }();
  return *registry;
}

absl::StatusOr<IrOpResult> RunIrOp(const IrOpRequest& request) {
  return RunIrOp(GlobalIrRegistry(), request);
}

std::vector<std::string> DefaultPriorityFor(const IrRegistry& registry, absl::string_view op) {
  const IrOp* o = registry.Find(op);
  return o == nullptr ? std::vector<std::string>{} : o->GetDefault();
}

std::vector<std::string> DefaultPriorityFor(absl::string_view op) {
  return DefaultPriorityFor(GlobalIrRegistry(), op);
}

}  // namespace kplan
