#include "server/ir/builtin_ops.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/cpu/ir_ops.h"
#include "base/client_text.h"
#include "base/status.h"
#include "resolve/plan/vocabulary.h"

#if KPLAN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/ir/ir_ops.h"
#endif

namespace kplan {
namespace {

// Parameter positions.
constexpr size_t kRmsX = 0, kRmsWeight = 1, kRmsEps = 2, kRmsVar = 3;
constexpr size_t kFusedX = 0, kFusedRes = 1, kFusedWeight = 2, kFusedEps = 3, kFusedVar = 4;
constexpr size_t kGeluX = 0, kGeluStd = 1, kGeluApprox = 2;

IrSignature RmsNormSignature() {
  return {{{"x", IrParamType::kTensor, std::nullopt},
           {"weight", IrParamType::kOptionalTensor, std::nullopt},
           {"epsilon", IrParamType::kFloat, std::nullopt},
           {"variance_size", IrParamType::kOptionalInt, "None"}},
          1};
}

IrSignature FusedAddRmsNormSignature() {
  return {{{"x", IrParamType::kTensor, std::nullopt},
           {"x_residual", IrParamType::kTensor, std::nullopt},
           {"weight", IrParamType::kOptionalTensor, std::nullopt},
           {"epsilon", IrParamType::kFloat, std::nullopt},
           {"variance_size", IrParamType::kOptionalInt, "None"}},
          2};
}

IrSignature GeluAndMulSparseSignature() {
  return {{{"x", IrParamType::kTensor, std::nullopt},
           {"std_multiplier", IrParamType::kFloat, std::nullopt},
           {"approximate", IrParamType::kStr, "none"}},
          1};
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// `b_name`: the argument blamed when `b` is not on `a`'s device.
absl::Status SameDevice(const TensorView& a, const TensorView& b, absl::string_view b_name) {
  if (a.device == b.device) return absl::OkStatus();
  // torch's text.
  return InvalidField(
      b_name, absl::StrCat("Expected all tensors to be on the same device, but found at least two "
                           "devices, ",
                           a.device.ToString(), " and ", b.device.ToString(), "!"));
}

absl::Status CheckTensor(const TensorView& t, absl::string_view name) {
  if (t.shape.size() != t.strides.size()) {
    return InvalidField(name, absl::StrCat(name, ": shape and strides differ in length"));
  }
  if (t.dim() < 1) {
    return InvalidField(name, absl::StrCat(name, " must have at least one dimension"));
  }
  if (t.dim() - 1 > kernels::kIrMaxLeadDims) {
    return InvalidField(name, absl::StrCat(name, " has ", t.dim(), " dimensions; at most ",
                                           kernels::kIrMaxLeadDims + 1, " are supported"));
  }
  for (int64_t s : t.shape) {
    if (s < 0) return InvalidField(name, absl::StrCat(name, " has a negative size"));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return InvalidField(name, absl::StrCat(name, " has no data"));
  }
  return absl::OkStatus();
}

absl::Status CheckWeight(const TensorView& x, const TensorView* weight) {
  if (weight == nullptr) return absl::OkStatus();
  if (absl::Status s = CheckTensor(*weight, "weight"); !s.ok()) return s;
  if (weight->dim() != 1 || weight->size(0) != x.size(-1)) {
    return InvalidField("weight",
                        absl::StrCat("weight must have shape [", x.size(-1),
                                     "] (the last dim of x), got ", ShapeStr(weight->shape)));
  }
  return SameDevice(x, *weight, "weight");
}

absl::Status CheckVarianceSize(const TensorView& x, std::optional<int64_t> variance_size) {
  if (!variance_size) return absl::OkStatus();
  if (*variance_size < 1 || *variance_size > x.size(-1)) {
    return InvalidField("variance_size",
                        absl::StrCat("variance_size must be in [1, ", x.size(-1),
                                     "] (the last dim of x), got ", *variance_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<IrOutputSpec>> RmsNormOutputs(const IrArgs& a) {
  const TensorView& x = a.tensor(kRmsX);
  if (absl::Status s = CheckTensor(x, "x"); !s.ok()) return s;
  if (absl::Status s = CheckWeight(x, a.optional_tensor(kRmsWeight)); !s.ok()) return s;
  if (absl::Status s = CheckVarianceSize(x, a.optional_int(kRmsVar)); !s.ok()) return s;
  return std::vector<IrOutputSpec>{{"out", x.dtype, x.shape}};
}

absl::StatusOr<std::vector<IrOutputSpec>> FusedAddRmsNormOutputs(const IrArgs& a) {
  const TensorView& x = a.tensor(kFusedX);
  const TensorView& r = a.tensor(kFusedRes);
  if (absl::Status s = CheckTensor(x, "x"); !s.ok()) return s;
  if (absl::Status s = CheckTensor(r, "x_residual"); !s.ok()) return s;
  if (r.shape != x.shape) {
    return InvalidField("x_residual", absl::StrCat("x_residual must have the shape of x ",
                                                   ShapeStr(x.shape), ", got ", ShapeStr(r.shape)));
  }
  if (absl::Status s = SameDevice(x, r, "x_residual"); !s.ok()) return s;
  if (absl::Status s = CheckWeight(x, a.optional_tensor(kFusedWeight)); !s.ok()) return s;
  if (absl::Status s = CheckVarianceSize(x, a.optional_int(kFusedVar)); !s.ok()) return s;
  return std::vector<IrOutputSpec>{{"out", x.dtype, x.shape}, {"residual", x.dtype, x.shape}};
}

// The approximate mode's check (GeluAndMulSparse's text); any multiplier
// is the op's to take, as vLLM's op takes any float.
absl::Status CheckGeluApproximate(const std::string& approximate) {
  if (approximate != "none" && approximate != "tanh") {
    return InvalidField("approximate",
                        absl::StrCat("Unknown approximate mode: ", ClientText(approximate)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<IrOutputSpec>> GeluAndMulSparseOutputs(const IrArgs& a) {
  if (absl::Status s = CheckGeluApproximate(a.str(kGeluApprox)); !s.ok()) {
    return s;
  }
  const TensorView& x = a.tensor(kGeluX);
  if (absl::Status s = CheckTensor(x, "x"); !s.ok()) return s;
  if (x.size(-1) % 2 != 0) {
    return InvalidField(
        "x",
        absl::StrCat("gelu_and_mul_sparse needs an even last dim of x (gate and up halves), got ",
                     x.size(-1)));
  }
  std::vector<int64_t> shape = x.shape;
  shape.back() /= 2;
  return std::vector<IrOutputSpec>{{"out", x.dtype, shape}};
}

// --------------------------------------------------------------- native

absl::Status CheckOutputs(absl::Span<const TensorView> outputs, size_t n) {
  // The outputs are the server's own buffers: a mismatch is a bug here.
  if (outputs.size() != n) return absl::InternalError("wrong number of outputs");
  for (const TensorView& o : outputs) {
    if (!o.is_contiguous()) return absl::InternalError("outputs must be contiguous");
  }
  return absl::OkStatus();
}

kernels::IrRowsIn RowsIn(const TensorView& t) {
  kernels::IrRowsIn in;
  in.data = t.data;
  in.type = t.dtype;
  t.RowLayout(&in.layout);  // dims checked by the output function
  return in;
}

kernels::IrWeightIn WeightIn(const TensorView* w) {
  kernels::IrWeightIn in;
  if (w != nullptr) {
    in.data = w->data;
    in.type = w->dtype;
    in.stride = w->strides[0];
  }
  return in;
}

#if !KPLAN_HAVE_CUDA
absl::Status NoCuda() {
  return WithField(absl::FailedPreconditionError(
                       "CUDA tensors need a build with CUDA kernels (this one has none)"),
                   "device");
}
#endif

// The CPU kernels' stop check for a request's deadline (none without one).
kernels::cpu::IrStop StopAt(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return {};
  return [deadline] { return absl::Now() >= deadline; };
}

absl::Status Finished(bool finished, absl::string_view op, int64_t rows) {
  if (finished) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("the deadline passed while ", op, " ran over ",
                                                  rows, " rows; nothing was returned"));
}

absl::Status NativeRmsNorm(const IrArgs& a, absl::Span<const TensorView> outputs,
                           const IrExecContext& ctx) {
  KPLAN_RETURN_IF_ERROR(CheckOutputs(outputs, 1));
  const TensorView& x = a.tensor(kRmsX);
  const int64_t cols = x.size(-1);
  const int64_t vs = a.optional_int(kRmsVar).value_or(cols);
  const float eps = static_cast<float>(a.f64(kRmsEps));
  if (x.device.is_cpu()) {
    return Finished(
        kernels::cpu::RmsNorm(RowsIn(x), x.rows(), cols, WeightIn(a.optional_tensor(kRmsWeight)),
                              eps, vs, outputs[0].data, StopAt(ctx.deadline)),
        "rms_norm", x.rows());
  }
#if KPLAN_HAVE_CUDA
  return kernels::cuda::NativeRmsNorm(RowsIn(x), x.rows(), cols,
                                      WeightIn(a.optional_tensor(kRmsWeight)), eps, vs,
                                      outputs[0].data, static_cast<cudaStream_t>(ctx.stream));
#else
  return NoCuda();
#endif
}

absl::Status NativeFusedAddRmsNorm(const IrArgs& a, absl::Span<const TensorView> outputs,
                                   const IrExecContext& ctx) {
  KPLAN_RETURN_IF_ERROR(CheckOutputs(outputs, 2));
  const TensorView& x = a.tensor(kFusedX);
  const TensorView& r = a.tensor(kFusedRes);
  const int64_t cols = x.size(-1);
  const int64_t vs = a.optional_int(kFusedVar).value_or(cols);
  const float eps = static_cast<float>(a.f64(kFusedEps));
  if (x.device.is_cpu()) {
    return Finished(
        kernels::cpu::FusedAddRmsNorm(RowsIn(x), RowsIn(r), x.rows(), cols,
                                      WeightIn(a.optional_tensor(kFusedWeight)), eps, vs,
                                      outputs[0].data, outputs[1].data, StopAt(ctx.deadline)),
        "fused_add_rms_norm", x.rows());
  }
#if KPLAN_HAVE_CUDA
  return kernels::cuda::NativeFusedAddRmsNorm(
      RowsIn(x), RowsIn(r), x.rows(), cols, WeightIn(a.optional_tensor(kFusedWeight)), eps, vs,
      outputs[0].data, outputs[1].data, static_cast<cudaStream_t>(ctx.stream));
#else
  return NoCuda();
#endif
}

absl::Status NativeGeluAndMulSparse(const IrArgs& a, absl::Span<const TensorView> outputs,
                                    const IrExecContext& ctx) {
  KPLAN_RETURN_IF_ERROR(CheckOutputs(outputs, 1));
  KPLAN_RETURN_IF_ERROR(CheckGeluApproximate(a.str(kGeluApprox)));
  const TensorView& x = a.tensor(kGeluX);
  const int64_t d = x.size(-1) / 2;
  const float mult = static_cast<float>(a.f64(kGeluStd));
  const bool tanh = a.str(kGeluApprox) == "tanh";
  if (x.device.is_cpu()) {
    return Finished(kernels::cpu::GeluAndMulSparse(RowsIn(x), x.rows(), d, mult, tanh,
                                                   outputs[0].data, StopAt(ctx.deadline)),
                    "gelu_and_mul_sparse", x.rows());
  }
#if KPLAN_HAVE_CUDA
  return kernels::cuda::NativeGeluAndMulSparse(RowsIn(x), x.rows(), d, mult, tanh, outputs[0].data,
                                               static_cast<cudaStream_t>(ctx.stream));
#else
  return NoCuda();
#endif
}

// ---------------------------------------------------------------- kplan

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// A CUDA tensor the kplan kernels can read as rows: contiguous last dim,
// evenly spaced rows, sizes within int32.
bool KplanRowsOk(const TensorView& t, int64_t* row_stride) {
  return t.device.is_cuda() && t.RowsWithStride(row_stride) && t.rows() <= kInt32Max &&
         t.size(-1) <= kInt32Max;
}

bool KplanWeightOk(const TensorView& x, const TensorView* w) {
  return w == nullptr || (w->dtype == x.dtype && w->device == x.device && w->dim() == 1 &&
                          (w->strides[0] == 1 || w->shape[0] <= 1));
}

bool KplanSupportsRmsNorm(const IrArgs& a) {
  const TensorView& x = a.tensor(kRmsX);
  int64_t rs;
  return !a.optional_int(kRmsVar) && KplanRowsOk(x, &rs) &&
         KplanWeightOk(x, a.optional_tensor(kRmsWeight));
}

bool KplanSupportsFusedAddRmsNorm(const IrArgs& a) {
  const TensorView& x = a.tensor(kFusedX);
  const TensorView& r = a.tensor(kFusedRes);
  int64_t rs;
  return !a.optional_int(kFusedVar) && KplanRowsOk(x, &rs) && KplanRowsOk(r, &rs) &&
         r.dtype == x.dtype && r.shape == x.shape &&
         KplanWeightOk(x, a.optional_tensor(kFusedWeight));
}

bool KplanSupportsGeluAndMulSparse(const IrArgs& a) {
  int64_t rs;
  return KplanRowsOk(a.tensor(kGeluX), &rs);
}

#if KPLAN_HAVE_CUDA
kernels::cuda::KplanRows KRows(const TensorView& t) {
  int64_t rs = 0;
  t.RowsWithStride(&rs);
  return {t.data, rs};
}
kernels::cuda::KplanRowsOut KOut(const TensorView& t) { return {t.data, t.size(-1)}; }
#endif

absl::Status KplanRmsNorm(const IrArgs& a, absl::Span<const TensorView> outputs,
                          const IrExecContext& ctx) {
  KPLAN_RETURN_IF_ERROR(CheckOutputs(outputs, 1));
#if KPLAN_HAVE_CUDA
  const TensorView& x = a.tensor(kRmsX);
  const TensorView* w = a.optional_tensor(kRmsWeight);
  return kernels::cuda::KplanRmsNorm(x.dtype, KRows(x), x.rows(), x.size(-1), w ? w->data : nullptr,
                                     static_cast<float>(a.f64(kRmsEps)), KOut(outputs[0]),
                                     static_cast<cudaStream_t>(ctx.stream));
#else
  return NoCuda();
#endif
}

absl::Status KplanFusedAddRmsNorm(const IrArgs& a, absl::Span<const TensorView> outputs,
                                  const IrExecContext& ctx) {
  KPLAN_RETURN_IF_ERROR(CheckOutputs(outputs, 2));
#if KPLAN_HAVE_CUDA
  const TensorView& x = a.tensor(kFusedX);
  const TensorView* w = a.optional_tensor(kFusedWeight);
  return kernels::cuda::KplanFusedAddRmsNorm(
      x.dtype, KRows(x), KRows(a.tensor(kFusedRes)), x.rows(), x.size(-1), w ? w->data : nullptr,
      static_cast<float>(a.f64(kFusedEps)), KOut(outputs[0]), KOut(outputs[1]),
      static_cast<cudaStream_t>(ctx.stream));
#else
  return NoCuda();
#endif
}

absl::Status KplanGeluAndMulSparse(const IrArgs& a, absl::Span<const TensorView> outputs,
                                   const IrExecContext& ctx) {
  KPLAN_RETURN_IF_ERROR(CheckOutputs(outputs, 1));
  KPLAN_RETURN_IF_ERROR(CheckGeluApproximate(a.str(kGeluApprox)));
#if KPLAN_HAVE_CUDA
  const TensorView& x = a.tensor(kGeluX);
  const float mult = static_cast<float>(a.f64(kGeluStd));
  return kernels::cuda::KplanGeluAndMulSparse(x.dtype, KRows(x), x.rows(), x.size(-1) / 2, mult,
                                              a.str(kGeluApprox) == "tanh", KOut(outputs[0]),
                                              static_cast<cudaStream_t>(ctx.stream));
#else
  return NoCuda();
#endif
}

struct BuiltinOp {
  absl::string_view name;
  IrSignature (*signature)();
  IrImplFn native;
  IrOutputFn outputs;
  bool allow_inplace;
  IrImplFn kplan;
  bool (*kplan_supports)(const IrArgs&);
};

std::vector<BuiltinOp> BuiltinOps() {
  return {
      {kIrRmsNorm, RmsNormSignature, NativeRmsNorm, RmsNormOutputs, false, KplanRmsNorm,
       KplanSupportsRmsNorm},
      {kIrFusedAddRmsNorm, FusedAddRmsNormSignature, NativeFusedAddRmsNorm, FusedAddRmsNormOutputs,
       true, KplanFusedAddRmsNorm, KplanSupportsFusedAddRmsNorm},
      {kIrGeluAndMulSparse, GeluAndMulSparseSignature, NativeGeluAndMulSparse,
       GeluAndMulSparseOutputs, false, KplanGeluAndMulSparse, KplanSupportsGeluAndMulSparse},
  };
}

}  // namespace

absl::Status RegisterBuiltinIrOps(IrRegistry& registry, const IrBuiltinOptions& options) {
  for (const BuiltinOp& b : BuiltinOps()) {
    IrOpSpec spec;
    spec.name = std::string(b.name);
    spec.signature = b.signature();
    spec.native = b.native;
    spec.outputs = b.outputs;
    spec.allow_inplace = b.allow_inplace;
    KPLAN_ASSIGN_OR_RETURN(IrOp * op, registry.RegisterOp(std::move(spec)));

    IrImplSpec kplan;
    kplan.provider = std::string(kIrKplanProvider);
    kplan.supported = options.kplan_supported;
    kplan.supports_args = IrArgsPredicate{b.signature().params, b.kplan_supports};
    kplan.signature = b.signature();
    kplan.fn = b.kplan;
    KPLAN_RETURN_IF_ERROR(op->RegisterImpl(std::move(kplan)));

    // vLLM's other providers: known names, nothing to run here.
    for (absl::string_view provider : IrProvidersOf(b.name)) {
      if (provider == "native" || provider == kIrKplanProvider) continue;
      IrImplSpec other;
      other.provider = std::string(provider);
      other.supported = false;
      other.signature = b.signature();
      other.fn = [name = std::string(b.name), p = std::string(provider)](
                     const IrArgs&, absl::Span<const TensorView>, const IrExecContext&) {
        return absl::UnimplementedError(
            absl::StrCat("provider ", p, " of op ", name, " is not available on this server"));
      };
      KPLAN_RETURN_IF_ERROR(op->RegisterImpl(std::move(other)));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ServerDefaultIrPriority(bool kplan_supported) {
  if (kplan_supported) return {std::string(kIrKplanProvider), "native"};
  return {"native"};
}

absl::StatusOr<std::unique_ptr<IrRegistry>> MakeBuiltinIrRegistry(const IrBuiltinOptions& options) {
  auto registry = std::make_unique<IrRegistry>();
  KPLAN_RETURN_IF_ERROR(RegisterBuiltinIrOps(*registry, options));
  const std::vector<std::string> defaults = ServerDefaultIrPriority(options.kplan_supported);
  for (const std::string& name : registry->OpNames()) {
    KPLAN_RETURN_IF_ERROR(registry->Find(name)->SetDefault(defaults));
  }
  return registry;
}

bool CudaKernelsAvailable() {
#if KPLAN_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

IrArgs RmsNormArgs(const TensorView& x, const TensorView* weight, double epsilon,
                   std::optional<int64_t> variance_size) {
  IrArgs a;
  a.values = {x, weight ? IrValue(*weight) : IrValue(IrNone{}), epsilon,
              variance_size ? IrValue(*variance_size) : IrValue(IrNone{})};
  return a;
}

IrArgs FusedAddRmsNormArgs(const TensorView& x, const TensorView& x_residual,
                           const TensorView* weight, double epsilon,
                           std::optional<int64_t> variance_size) {
  IrArgs a;
  a.values = {x, x_residual, weight ? IrValue(*weight) : IrValue(IrNone{}), epsilon,
              variance_size ? IrValue(*variance_size) : IrValue(IrNone{})};
  return a;
}

IrArgs GeluAndMulSparseArgs(const TensorView& x, double std_multiplier, std::string approximate) {
  IrArgs a;
  a.values = {x, std_multiplier, std::move(approximate)};
  return a;
}

}  // namespace kplan
