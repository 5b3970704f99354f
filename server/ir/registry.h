// vLLM's IR op registry (vllm/ir/op.py) in C++: ops with a native
// implementation, providers registered per op with a static `supported` flag
// and an optional per-call `supports_args` predicate, priority filtering and
// dispatch, with vLLM's error texts kept verbatim.
//
// Priorities come in three layers, innermost first:
//   1. a priority passed with one dispatch (IrDispatchOptions::priority): what
//      a request's override should use, since requests run concurrently and
//      may hop threads;
//   2. a thread-scoped override (IrOp::SetPriority, RAII like vLLM's
//      `with op.set_priority(...)`, nestable, restored on every exit path);
//   3. the op's process-wide default (IrOp::SetDefault), thread-safe.
// A scope or per-call priority never leaks into another thread or request.
//
// Error mapping: vLLM's ValueError -> INVALID_ARGUMENT, assertions about the
// registry's own state -> FAILED_PRECONDITION, "internal bug" RuntimeErrors ->
// INTERNAL.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/ir/tensor.h"

namespace kplan {

// ---------------------------------------------------------------- signatures

// The Python parameter types the IR ops use, with their torch schema names.
enum class IrParamType {
  kTensor,          // Tensor
  kOptionalTensor,  // Tensor?
  kFloat,           // float
  kInt,             // SymInt
  kOptionalInt,     // SymInt?
  kBool,            // bool
  kStr,             // str
};

struct IrParam {
  std::string name;
  IrParamType type = IrParamType::kTensor;
  // The default as Python's str() prints it ("None", "none", "1e-06"); unset:
  // no default (inspect.Parameter.empty).
  std::optional<std::string> default_value;
  bool keyword_only = false;
};

// A native implementation's signature; `outputs` Tensors returned.
struct IrSignature {
  std::vector<IrParam> params;
  int outputs = 1;
  // torch.library.infer_schema's text, e.g.
  // "(Tensor x, Tensor? weight, float epsilon, SymInt? variance_size=None) -> Tensor".
  std::string Schema() const;
};

// ------------------------------------------------------------------ arguments

struct IrNone {};
// One argument value: None, a tensor, a float, an int, a bool or a str.
using IrValue = std::variant<IrNone, TensorView, double, int64_t, bool, std::string>;

// The positional arguments of one call, all of them (defaults applied).
struct IrArgs {
  std::vector<IrValue> values;

  size_t size() const { return values.size(); }
  bool is_none(size_t i) const { return std::holds_alternative<IrNone>(values[i]); }
  const TensorView& tensor(size_t i) const { return std::get<TensorView>(values[i]); }
  // nullptr for None.
  const TensorView* optional_tensor(size_t i) const { return std::get_if<TensorView>(&values[i]); }
  double f64(size_t i) const { return std::get<double>(values[i]); }
  std::optional<int64_t> optional_int(size_t i) const {
    if (const auto* v = std::get_if<int64_t>(&values[i])) return *v;
    return std::nullopt;
  }
  const std::string& str(size_t i) const { return std::get<std::string>(values[i]); }
};

// Where an implementation runs: the CUDA stream (a cudaStream_t; null is the
// default stream) for device tensors. The current CUDA device is the tensors'.
struct IrExecContext {
  void* stream = nullptr;
  // CPU implementations stop between row blocks past it (DEADLINE_EXCEEDED).
  absl::Time deadline = absl::InfiniteFuture();
};

// Computes the op into `outputs` (preallocated, contiguous, on the inputs'
// device), as the native implementation would return them.
using IrImplFn = std::function<absl::Status(
    const IrArgs& args, absl::Span<const TensorView> outputs, const IrExecContext& ctx)>;

// vLLM's supports_args callable, with its declared parameters (which must
// match the native signature's names and defaults, as vLLM checks).
struct IrArgsPredicate {
  std::vector<IrParam> params;
  std::function<bool(const IrArgs&)> fn;  // empty: "not a callable"
};

// ----------------------------------------------------------------- providers

class IrOp;

// op.register_impl(provider, supported=..., supports_args=..., inplace=...)(fn).
struct IrImplSpec {
  std::string provider;
  bool supported = true;
  std::optional<IrArgsPredicate> supports_args;
  bool inplace = false;
  IrSignature signature;  // the implementation's own; must equal the native one
  IrImplFn fn;
};

class IrOpImpl {
 public:
  const std::string& provider() const { return provider_; }
  const IrOp& op() const { return *op_; }
  bool supported() const { return supported_.load(std::memory_order_acquire); }
  bool inplace() const { return inplace_; }
  // supports_args is None.
  bool supports_all_args() const { return !predicate_; }
  bool SupportsArgs(const IrArgs& args) const { return !predicate_ || predicate_(args); }
  // The provider's uuid (IrProviderUuid of resolve/plan/vocabulary.h).
  const std::string& uuid() const { return uuid_; }
  absl::Status Run(const IrArgs& args, absl::Span<const TensorView> outputs,
                   const IrExecContext& ctx) const;

 private:
  friend class IrOp;
  const IrOp* op_ = nullptr;
  std::string provider_;
  std::atomic<bool> supported_{true};
  bool inplace_ = false;
  std::function<bool(const IrArgs&)> predicate_;
  IrImplFn fn_;
  std::string uuid_;
};

// --------------------------------------------------------------------- ops

class IrRegistry;
class IrPriorityScope;

// Shapes and dtypes of an op's outputs for given arguments, after the op's
// own argument checks (shape agreement, vLLM's ValueErrors).
struct IrOutputSpec {
  std::string name;
  kernels::DType dtype = kernels::DType::kFloat32;
  std::vector<int64_t> shape;
};
using IrOutputFn = std::function<absl::StatusOr<std::vector<IrOutputSpec>>(const IrArgs&)>;

// register_op(f, name=..., activations=..., allow_inplace=...).
struct IrOpSpec {
  std::string name;
  IrSignature signature;
  IrImplFn native;
  IrOutputFn outputs;                                   // optional; Run-style callers need it
  std::optional<std::vector<std::string>> activations;  // default: params starting with "x"
  bool allow_inplace = false;
};

struct IrDispatchOptions {
  // A priority for this call only (a request's override); takes precedence
  // over thread scopes and the default. Filtered exactly as set_priority does.
  const std::vector<std::string>* priority = nullptr;
  // Receives the provider names of the filtered list this call walked.
  std::vector<std::string>* resolved_priority = nullptr;
  // Receives the warnings this call emitted (each vLLM warning_once text is
  // emitted once per registry; later calls see nothing).
  std::vector<std::string>* warnings = nullptr;
};

class IrOp {
 public:
  using ImplList = std::vector<const IrOpImpl*>;

  const std::string& name() const { return name_; }
  const IrSignature& signature() const { return signature_; }
  const std::string& schema() const { return schema_; }
  const std::vector<std::string>& activations() const { return activations_; }
  bool allow_inplace() const { return allow_inplace_; }

  absl::Status RegisterImpl(IrImplSpec spec);
  // nullptr when not registered.
  const IrOpImpl* impl(absl::string_view provider) const;
  // Registered providers in registration order ("native" first).
  std::vector<std::string> providers() const;
  std::vector<std::string> supported_providers() const;
  // Changes a provider's static `supported` flag after registration (a
  // device lost at run time). Lists filtered earlier keep the provider, so
  // dispatching through them fails as vLLM's would. NOT_FOUND for an unknown
  // provider; native cannot be changed (FAILED_PRECONDITION).
  absl::Status SetSupported(absl::string_view provider, bool supported);

  // _filter_priority_impls(priority).
  absl::StatusOr<ImplList> FilterPriority(const std::vector<std::string>& priority,
                                          std::vector<std::string>* warnings = nullptr) const;
  // set_default(priority): process-wide, thread-safe.
  absl::Status SetDefault(const std::vector<std::string>& priority,
                          std::vector<std::string>* warnings = nullptr);
  // Provider names of the default filtered list (empty if never set).
  std::vector<std::string> GetDefault() const;
  // get_priority() as this thread sees it: its innermost scope, else the default.
  std::vector<std::string> GetPriority() const;
  // `with op.set_priority(priority):` for the calling thread; the returned
  // scope restores the previous priority when destroyed.
  absl::StatusOr<IrPriorityScope> SetPriority(const std::vector<std::string>& priority,
                                              std::vector<std::string>* warnings = nullptr);

  // dispatch(*args): the implementation to run.
  absl::StatusOr<const IrOpImpl*> Dispatch(const IrArgs& args,
                                           const IrDispatchOptions& options = {}) const;

  // The op's argument checks and output shapes (INVALID_ARGUMENT when wrong).
  absl::StatusOr<std::vector<IrOutputSpec>> OutputSpecs(const IrArgs& args) const;

 private:
  friend class IrRegistry;
  friend class IrPriorityScope;
  IrOp(IrRegistry* registry, IrOpSpec spec);

  std::shared_ptr<const ImplList> CurrentList(const IrDispatchOptions& options,
                                              absl::StatusOr<ImplList>* per_call) const;

  IrRegistry* registry_;
  std::string name_;
  IrSignature signature_;
  std::string schema_;
  std::vector<std::string> activations_;
  bool allow_inplace_;
  IrOutputFn outputs_;

  mutable std::shared_mutex mu_;
  std::vector<std::unique_ptr<IrOpImpl>> impls_;  // registration order; never removed
  std::shared_ptr<const ImplList> default_;       // null: never set
};

// The thread-scoped priority of one op; restores the previous one (the
// enclosing scope's or none) when destroyed, also during stack unwinding.
// Must be destroyed on the thread that created it. Move-only.
class IrPriorityScope {
 public:
  IrPriorityScope(IrPriorityScope&& other) noexcept;
  IrPriorityScope& operator=(IrPriorityScope&&) = delete;
  IrPriorityScope(const IrPriorityScope&) = delete;
  ~IrPriorityScope();

 private:
  friend class IrOp;
  IrPriorityScope(const IrOp* op, std::shared_ptr<const IrOp::ImplList> list);
  const IrOp* op_;
  std::shared_ptr<const IrOp::ImplList> previous_;
  bool active_ = true;
};

// ------------------------------------------------------------------ registry

// IrOp.registry. Ops are never removed; pointers stay valid for its lifetime.
class IrRegistry {
 public:
  using WarningSink = std::function<void(const std::string&)>;

  IrRegistry();
  IrRegistry(const IrRegistry&) = delete;
  IrRegistry& operator=(const IrRegistry&) = delete;

  // register_op: name rule, keyword-only check, duplicate check.
  absl::StatusOr<IrOp*> RegisterOp(IrOpSpec spec);
  IrOp* Find(absl::string_view name);
  const IrOp* Find(absl::string_view name) const;
  std::vector<std::string> OpNames() const;

  // Where warnings go (default: spdlog warn). Thread-safe.
  void SetWarningSink(WarningSink sink);
  // logger.warning: always emitted.
  void Warn(const std::string& text, std::vector<std::string>* collected) const;
  // logger.warning_once: once per registry and text.
  void WarnOnce(const std::string& text, std::vector<std::string>* collected) const;

 private:
  mutable kplan::Mutex mu_;
  std::map<std::string, std::unique_ptr<IrOp>, std::less<>> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<WarningSink> sink_ ABSL_GUARDED_BY(mu_);
  mutable std::map<std::string, bool, std::less<>> warned_ ABSL_GUARDED_BY(mu_);
};

// RESERVED_PROVIDERS.
const std::vector<absl::string_view>& IrReservedProviders();

// vLLM's _validate_name(name, entity_type) ("Op" or "Provider").
absl::Status ValidateIrName(absl::string_view name, absl::string_view entity_type);

}  // namespace kplan
