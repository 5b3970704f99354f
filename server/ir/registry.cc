#include "server/ir/registry.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "resolve/plan/vocabulary.h"
#include "spdlog/spdlog.h"

namespace kplan {
namespace {

absl::string_view SchemaTypeName(IrParamType t) {
  switch (t) {
    case IrParamType::kTensor:
      return "Tensor";
    case IrParamType::kOptionalTensor:
      return "Tensor?";
    case IrParamType::kFloat:
      return "float";
    case IrParamType::kInt:
      return "SymInt";
    case IrParamType::kOptionalInt:
      return "SymInt?";
    case IrParamType::kBool:
      return "bool";
    case IrParamType::kStr:
      return "str";
  }
  return "?";
}

// str(inspect.Parameter.default).
std::string DefaultStr(const IrParam& p) {
  return p.default_value ? *p.default_value : "<class 'inspect._empty'>";
}

// The thread's scoped priorities, per op.
using ScopeMap = std::unordered_map<const IrOp*, std::shared_ptr<const IrOp::ImplList>>;
ScopeMap& ThreadScopes() {
  thread_local ScopeMap scopes;
  return scopes;
}

std::shared_ptr<const IrOp::ImplList> ThreadScope(const IrOp* op) {
  ScopeMap& scopes = ThreadScopes();
  auto it = scopes.find(op);
  return it == scopes.end() ? nullptr : it->second;
}

std::vector<std::string> Names(const IrOp::ImplList* list) {
  std::vector<std::string> out;
  if (list == nullptr) return out;
  for (const IrOpImpl* impl : *list) out.push_back(impl->provider());
  return out;
}

bool IsNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || c == '_' || (!first && c >= '0' && c <= '9');
}

}  // namespace

const std::vector<absl::string_view>& IrReservedProviders() {
  static const auto* v = new std::vector<absl::string_view>{"native", "unfused"};
  return *v;
}

absl::Status ValidateIrName(absl::string_view name, absl::string_view entity_type) {
  // _NAME_PATTERN = ^[a-z_][a-z_0-9]*$ (re.match: '$' also matches before a
  // final newline, so a trailing "\n" passes as in Python).
  absl::string_view body = name;
  if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  bool ok = !body.empty();
  for (size_t i = 0; ok && i < body.size(); ++i) ok = IsNameChar(body[i], i == 0);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(entity_type, " name '", name,
                   "' is invalid. Names must start with a letter or underscore, followed by "
                   "lowercase letters, underscores, or digits only."));
}

std::string IrSignature::Schema() const {
  std::vector<std::string> parts;
  for (const IrParam& p : params) {
    std::string s = absl::StrCat(SchemaTypeName(p.type), " ", p.name);
    if (p.default_value) {
      absl::StrAppend(&s, "=",
                      p.type == IrParamType::kStr && *p.default_value != "None"
                          ? absl::StrCat("\"", *p.default_value, "\"")
                          : *p.default_value);
    }
    parts.push_back(std::move(s));
  }
  std::string returns = "Tensor";
  if (outputs != 1) {
    std::vector<std::string> ts(static_cast<size_t>(outputs), "Tensor");
    returns = absl::StrCat("(", absl::StrJoin(ts, ", "), ")");
  }
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ") -> ", returns);
}

// ------------------------------------------------------------------ IrOpImpl

absl::Status IrOpImpl::Run(const IrArgs& args, absl::Span<const TensorView> outputs,
                           const IrExecContext& ctx) const {
  return fn_(args, outputs, ctx);
}

// --------------------------------------------------------------------- IrOp

IrOp::IrOp(IrRegistry* registry, IrOpSpec spec)
    : registry_(registry),
      name_(std::move(spec.name)),
      signature_(std::move(spec.signature)),
      schema_(signature_.Schema()),
      allow_inplace_(spec.allow_inplace),
      outputs_(std::move(spec.outputs)) {
  if (spec.activations) {
    activations_ = *spec.activations;
  } else {
    for (const IrParam& p : signature_.params) {
      if (!p.name.empty() && p.name[0] == 'x') activations_.push_back(p.name);
    }
  }
  auto native = std::make_unique<IrOpImpl>();
  native->op_ = this;
  native->provider_ = "native";
  native->supported_ = true;
  native->fn_ = std::move(spec.native);
  native->uuid_ = IrProviderUuid(name_, "native");
  impls_.push_back(std::move(native));
}

absl::Status IrOp::RegisterImpl(IrImplSpec spec) {
  const std::string& p = spec.provider;
  if (std::find(IrReservedProviders().begin(), IrReservedProviders().end(), p) !=
      IrReservedProviders().end()) {
    return absl::InvalidArgumentError(absl::StrCat("Provider name ", p, " is reserved."));
  }
  if (absl::Status s = ValidateIrName(p, "Provider"); !s.ok()) return s;
  if (impl(p) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("Implementation for provider ", p, " already registered."));
  }
  const std::string schema = spec.signature.Schema();
  if (schema != schema_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Implementation for provider ", p, " has schema '", schema,
                     "' which does not match native schema '", schema_, "' for op ", name_, "."));
  }
  if (spec.supports_args) {
    const IrArgsPredicate& pred = *spec.supports_args;
    if (!pred.fn) {
      return absl::InvalidArgumentError(
          absl::StrCat("supports_args for provider ", p, " must be a callable"));
    }
    if (std::any_of(pred.params.begin(), pred.params.end(),
                    [](const IrParam& q) { return q.keyword_only; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("supports_args for provider ", p, " cannot have keyword-only parameters"));
    }
    const auto& native_params = signature_.params;
    if (pred.params.size() != native_params.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "supports_args for provider ", p, " must have the same number of parameters (",
          pred.params.size(), ") as the native implementation (", native_params.size(), ")"));
    }
    for (size_t i = 0; i < native_params.size(); ++i) {
      const IrParam& q = pred.params[i];
      const IrParam& n = native_params[i];
      if (q.name != n.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("supports_args for provider ", p, " has parameter '", q.name,
                         "' which does not match native parameter '", n.name, "'"));
      }
      if (q.default_value != n.default_value) {
        return absl::InvalidArgumentError(absl::StrCat(
            "supports_args for provider ", p, " has parameter '", q.name, "' with default ",
            DefaultStr(q), " which does not match native default ", DefaultStr(n), "'"));
      }
    }
  }
  if (spec.inplace && !allow_inplace_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Inplace implementation cannot be registered for op ", name_,
                     " that does not allow inplace."));
  }
  if (!spec.fn) {
    return absl::InvalidArgumentError(
        absl::StrCat("Implementation for provider ", p, " of op ", name_, " has no function"));
  }
  auto impl = std::make_unique<IrOpImpl>();
  impl->op_ = this;
  impl->provider_ = p;
  impl->supported_ = spec.supported;
  impl->inplace_ = spec.inplace;
  if (spec.supports_args) impl->predicate_ = std::move(spec.supports_args->fn);
  impl->fn_ = std::move(spec.fn);
  impl->uuid_ = IrProviderUuid(name_, p);
  {
    std::unique_lock lock(mu_);
    impls_.push_back(std::move(impl));
  }
  if (!GetPriority().empty()) {
    registry_->Warn(absl::StrCat("Warning: registering new impl ", p, " for op ", name_,
                                 " while priority is set."),
                    nullptr);
  }
  return absl::OkStatus();
}

const IrOpImpl* IrOp::impl(absl::string_view provider) const {
  std::shared_lock lock(mu_);
  for (const auto& i : impls_) {
    if (i->provider_ == provider) return i.get();
  }
  return nullptr;
}

std::vector<std::string> IrOp::providers() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  for (const auto& i : impls_) out.push_back(i->provider_);
  return out;
}

std::vector<std::string> IrOp::supported_providers() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  for (const auto& i : impls_) {
    if (i->supported()) out.push_back(i->provider_);
  }
  return out;
}

absl::Status IrOp::SetSupported(absl::string_view provider, bool supported) {
  if (provider == "native") {
    return absl::FailedPreconditionError("The native implementation is always supported.");
  }
  std::shared_lock lock(mu_);
  for (const auto& i : impls_) {
    if (i->provider_ == provider) {
      i->supported_.store(supported, std::memory_order_release);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(
      absl::StrCat("No implementation for provider ", provider, " of op ", name_));
}

absl::StatusOr<IrOp::ImplList> IrOp::FilterPriority(const std::vector<std::string>& priority,
                                                    std::vector<std::string>* warnings) const {
  ImplList resolved;
  for (const std::string& p : priority) {
    const IrOpImpl* i = impl(p);
    if (i == nullptr) {
      return absl::InvalidArgumentError(
          "All providers in priority must be registered implementations.");
    }
    resolved.push_back(i);
  }
  ImplList filtered;
  for (const IrOpImpl* i : resolved) {
    if (!i->supported()) continue;  // platform-unsupported: dropped silently
    filtered.push_back(i);
    if (i->supports_all_args()) return filtered;  // everything after is unreachable
  }
  registry_->WarnOnce(
      absl::StrCat("Op ", name_,
                   ": No implementation in priority list supports all args, execution fallback "
                   "to native is possible. To silence this warning, explicitly add 'native' to "
                   "the end of the priority list"),
      warnings);
  filtered.push_back(impl("native"));
  return filtered;
}

absl::Status IrOp::SetDefault(const std::vector<std::string>& priority,
                              std::vector<std::string>* warnings) {
  absl::StatusOr<ImplList> list = FilterPriority(priority, warnings);
  if (!list.ok()) return list.status();
  auto shared = std::make_shared<const ImplList>(*std::move(list));
  std::unique_lock lock(mu_);
  default_ = std::move(shared);
  return absl::OkStatus();
}

std::vector<std::string> IrOp::GetDefault() const {
  std::shared_ptr<const ImplList> list;
  {
    std::shared_lock lock(mu_);
    list = default_;
  }
  return Names(list.get());
}

std::vector<std::string> IrOp::GetPriority() const {
  if (auto scoped = ThreadScope(this)) return Names(scoped.get());
  return GetDefault();
}

absl::StatusOr<IrPriorityScope> IrOp::SetPriority(const std::vector<std::string>& priority,
                                                  std::vector<std::string>* warnings) {
  absl::StatusOr<ImplList> list = FilterPriority(priority, warnings);
  if (!list.ok()) return list.status();
  return IrPriorityScope(this, std::make_shared<const ImplList>(*std::move(list)));
}

absl::StatusOr<const IrOpImpl*> IrOp::Dispatch(const IrArgs& args,
                                               const IrDispatchOptions& options) const {
  std::shared_ptr<const ImplList> list;
  if (options.priority != nullptr) {
    absl::StatusOr<ImplList> filtered = FilterPriority(*options.priority, options.warnings);
    if (!filtered.ok()) return filtered.status();
    list = std::make_shared<const ImplList>(*std::move(filtered));
  } else if (auto scoped = ThreadScope(this)) {
    list = std::move(scoped);
  } else {
    std::shared_lock lock(mu_);
    list = default_;
  }
  if (options.resolved_priority != nullptr) *options.resolved_priority = Names(list.get());
  if (list == nullptr || list->empty()) {
    registry_->WarnOnce(
        absl::StrCat("Priority not set for op ", name_, ", using native implementation."),
        options.warnings);
    return impl("native");
  }
  for (const IrOpImpl* i : *list) {
    if (!i->supported()) {
      return absl::FailedPreconditionError(
          absl::StrCat("Implementation ", i->provider(), " for op ", name_,
                       " not supported. All implementations in priority list must be "
                       "supported."));
    }
    if (i->SupportsArgs(args)) return i;
    SPDLOG_DEBUG("Skipping provider {} because it does not support {}", i->provider(), name_);
  }
  return absl::InternalError(
      "Priority set incorrectly: the last implementation must support all args (can be "
      "native). This is likely an internal bug");
}

absl::StatusOr<std::vector<IrOutputSpec>> IrOp::OutputSpecs(const IrArgs& args) const {
  if (!outputs_) {
    return absl::UnimplementedError(absl::StrCat("op ", name_, " has no output description"));
  }
  return outputs_(args);
}

// ----------------------------------------------------------- IrPriorityScope

IrPriorityScope::IrPriorityScope(const IrOp* op, std::shared_ptr<const IrOp::ImplList> list)
    : op_(op) {
  ScopeMap& scopes = ThreadScopes();
  auto it = scopes.find(op);
  if (it != scopes.end()) previous_ = it->second;
  scopes[op] = std::move(list);
}

IrPriorityScope::IrPriorityScope(IrPriorityScope&& other) noexcept
    : op_(other.op_), previous_(std::move(other.previous_)), active_(other.active_) {
  other.active_ = false;
}

IrPriorityScope::~IrPriorityScope() {
  if (!active_) return;
  ScopeMap& scopes = ThreadScopes();
  if (previous_ == nullptr) {
    scopes.erase(op_);
  } else {
    scopes[op_] = std::move(previous_);
  }
}

// ---------------------------------------------------------------- IrRegistry

IrRegistry::IrRegistry()
    : sink_(std::make_shared<WarningSink>(
          [](const std::string& text) { spdlog::warn("{}", text); })) {}

absl::StatusOr<IrOp*> IrRegistry::RegisterOp(IrOpSpec spec) {
  if (absl::Status s = ValidateIrName(spec.name, "Op"); !s.ok()) return s;
  kplan::MutexLock lock(&mu_);
  if (ops_.count(spec.name) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Op '", spec.name, "' is already registered."));
  }
  for (const IrParam& p : spec.signature.params) {
    if (p.keyword_only) {
      return absl::InvalidArgumentError(
          absl::StrCat("Op ", spec.name,
                       " has keyword-only arguments which are not currently supported. That's "
                       "because kwargs are not allowed during lowering."));
    }
  }
  if (!spec.native) {
    return absl::InvalidArgumentError(
        absl::StrCat("Op ", spec.name, " has no native implementation"));
  }
  const std::string name = spec.name;
  std::unique_ptr<IrOp> op(new IrOp(this, std::move(spec)));
  if (op->allow_inplace() &&
      static_cast<size_t>(op->signature().outputs) != op->activations().size()) {
    return absl::FailedPreconditionError(
        "Inplace overload requires the same number of outputs as activations.");
  }
  IrOp* raw = op.get();
  ops_.emplace(name, std::move(op));
  order_.push_back(name);
  return raw;
}

IrOp* IrRegistry::Find(absl::string_view name) {
  kplan::MutexLock lock(&mu_);
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

const IrOp* IrRegistry::Find(absl::string_view name) const {
  kplan::MutexLock lock(&mu_);
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

std::vector<std::string> IrRegistry::OpNames() const {
  kplan::MutexLock lock(&mu_);
  return order_;
}

void IrRegistry::SetWarningSink(WarningSink sink) {
  auto shared = std::make_shared<WarningSink>(std::move(sink));
  kplan::MutexLock lock(&mu_);
  sink_ = std::move(shared);
}

void IrRegistry::Warn(const std::string& text, std::vector<std::string>* collected) const {
  std::shared_ptr<WarningSink> sink;
  {
    kplan::MutexLock lock(&mu_);
    sink = sink_;
  }
  if (collected != nullptr) collected->push_back(text);
  if (sink && *sink) (*sink)(text);
}

void IrRegistry::WarnOnce(const std::string& text, std::vector<std::string>* collected) const {
  {
    kplan::MutexLock lock(&mu_);
    if (!warned_.emplace(text, true).second) return;
  }
  Warn(text, collected);
}

}  // namespace kplan
