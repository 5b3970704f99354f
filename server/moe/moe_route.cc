#include "server/moe/moe_route.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/env.h"
#include "base/status.h"
#include "resolve/oracle/routing_methods.h"
#include "resolve/plan/kernel_config.h"

namespace kplan {
namespace {

using Q = QuantKey;

// The fp8 activation key of an fp8 per-tensor / per-channel set.
Q Fp8ActivationKey(const ExpertsQuantSpec& q) {
  if (q.activation_scale == "per_token") return Q::kFp8DynamicTokenSym;
  return q.a1_scale ? Q::kFp8StaticTensorSym : Q::kFp8DynamicTensorSym;
}

// (weight, activation) QuantKeys of a set's quantization; none x none unquantised.
std::pair<Q, Q> QuantKeysOf(const ExpertsQuantSpec& q) {
  if (q.scheme == "fp8_per_tensor") return {Q::kFp8StaticTensorSym, Fp8ActivationKey(q)};
  if (q.scheme == "fp8_per_channel") return {Q::kFp8StaticChannelSym, Fp8ActivationKey(q)};
  if (q.scheme == "fp8_block") return {Q::kFp8Static128BlockSym, Q::kFp8Dynamic128Sym};
  if (q.scheme == "int8_group") return {Q::kInt8Static, Q::kNone};
  if (q.scheme == "int4_group") {
    const bool g32 = q.group_size == 32;
    if (q.has_zero_points) return {g32 ? Q::kInt4Static32Asym : Q::kInt4StaticAsym, Q::kNone};
    return {g32 ? Q::kInt4Static32 : Q::kInt4Static, Q::kNone};
  }
  return {Q::kNone, Q::kNone};
}

// Scoring and renormalisation a layer routed by `method` declares (the
// routing-method table), as get_routing_method_type would derive them back.
// A method the runner does not route never gets here (RoutingSpecFor rejects
// it first); it keeps softmax.
void SetScoring(absl::string_view method, MoeLayerSpec& l) {
  const RoutingMethodInfo* m = FindRoutingMethod(method);
  if (m == nullptr || m->router == RouterKind::kNone) {
    l.scoring_func = "softmax";
    return;
  }
  l.scoring_func = std::string(m->scoring);
  if (m->renormalize) l.renormalize = true;
}

// The user string of the plan's backend member (KPLAN -> kplan).
std::string UserBackend(absl::string_view member) { return absl::AsciiStrToLower(member); }

// "bfloat16 weights", "fp8_block 64x128 weights (H 4096, I 1024)".
std::string WeightsOf(const ExpertsSpec& spec) {
  const ExpertsQuantSpec& q = spec.quant;
  std::string what = q.scheme.empty() ? WireDTypeName(spec.dtype) : q.scheme;
  if (q.scheme == "fp8_block") absl::StrAppend(&what, " ", q.block_n, "x", q.block_k);
  return absl::StrCat(what, " weights (H ", spec.hidden, ", I ", spec.intermediate, ")");
}

constexpr absl::string_view kEmulationKernel = "KplanEmulationExperts";

// The executable backend of a kplan experts class: only the emulation runs
// anything; the rest are kplan's kernels.
absl::string_view BackendOfKernel(absl::string_view experts_kernel) {
  return experts_kernel == kEmulationKernel ? "emulation" : "kplan";
}

// The route deviates from an accepted KPLAN: the candidate says why, and the
// emulation that runs instead is the accepted one.
void RunAsEmulation(MoeRoute& r, absl::string_view why) {
  for (MoeCandidate& c : r.plan.candidates) {
    if (c.accepted && c.backend == r.plan.backend) {
      c.accepted = false;
      c.reason = absl::StrCat("the oracle accepted it, but ", why);
    }
  }
  r.plan.candidates.push_back({"EMULATION", std::string(kEmulationKernel), true, ""});
  r.backend = "emulation";
  r.experts_kernel = std::string(kEmulationKernel);
}

}  // namespace

MoeLayerSpec LayerSpecOf(const ExpertsSpec& spec, const MoeRunInput& input,
                         const MoeRunShape& shape) {
  MoeLayerSpec l;
  l.name = spec.experts_id;
  l.num_experts = spec.num_experts;
  l.experts_per_token = shape.top_k;
  l.hidden_dim = static_cast<int32_t>(spec.hidden);
  l.intermediate_size = static_cast<int32_t>(spec.intermediate);
  l.activation = spec.activation;
  l.in_dtype = std::string(kernels::DTypeName(input.act_dtype));
  l.has_bias = spec.has_bias;
  if (shape.by_logits) {
    const MoeRouting& r = input.routing;
    l.routing_method = r.routing_method.empty() ? "Default" : r.routing_method;
    SetScoring(l.routing_method, l);
    l.num_expert_group = r.num_expert_group;
    l.topk_group = r.topk_group;
    l.has_e_score_correction_bias = !r.e_score_correction_bias.empty();
    l.routed_scaling_factor = r.routed_scaling_factor;
    l.router_logits_dtype = "float32";
  } else {
    l.routing_method = "Custom";  // the caller routed: top-k ids and weights given
  }
  auto [w, a] = QuantKeysOf(spec.quant);
  l.weight_quant = w == Q::kNone ? "" : std::string(QuantKeyName(w));
  l.activation_quant = a == Q::kNone ? "" : std::string(QuantKeyName(a));
  if (spec.quant.scheme == "int8_group") l.weight_bits = 8;
  if (spec.quant.scheme == "int4_group") l.weight_bits = 4;
  return l;
}

MoeRoute RouteThatRan(const MoeRoute& chosen, absl::string_view ran, int64_t num_tokens) {
  MoeRoute r = chosen;
  if (ran.empty() || ran == chosen.experts_kernel) return r;
  // The oracle's choice for the layer stays, unaccepted, beside the call's.
  const absl::string_view backend = BackendOfKernel(ran);
  for (MoeCandidate& c : r.plan.candidates) {
    if (!c.accepted) continue;
    c.accepted = false;
    c.reason = absl::StrCat("accepted for the layer; this call's ", num_tokens, " token",
                            num_tokens == 1 ? "" : "s", " ran ", ran, " on the GPU");
  }
  r.plan.candidates.push_back(
      {absl::AsciiStrToUpper(backend), std::string(ran), true, std::string()});
  r.backend = std::string(backend);
  r.experts_kernel = std::string(ran);
  return r;
}

absl::string_view MoeRouteKindName(MoeRouteKind kind) {
  switch (kind) {
    case MoeRouteKind::kGpuFast:
      return "gpu_fast";
    case MoeRouteKind::kGpuEmulation:
      return "gpu_emulation";
    case MoeRouteKind::kCpuReference:
      return "cpu_reference";
    case MoeRouteKind::kExpertParallel:
      return "expert_parallel";
  }
  return "";
}

namespace {

absl::StatusOr<std::string> NormalizeOnce(absl::string_view moe_backend) {
  KernelConfig config;
  if (!moe_backend.empty()) config.moe_backend = std::string(moe_backend);
  KPLAN_ASSIGN_OR_RETURN(KernelConfig normalized, NormalizeKernelConfig(std::move(config)));
  return normalized.moe_backend;
}

}  // namespace

absl::StatusOr<std::string> NormalizeMoeBackend(absl::string_view moe_backend) {
  // Pure, and asked on every RunMoE, where validating a whole KernelConfig
  // cost more than the rest of decode (docs/PERF.md, session 29): the
  // default's answer is computed once, and those of valid names kept (a
  // bounded number: their spellings in any letter case are many).
  if (moe_backend.empty()) {
    static const auto* const kDefault = new absl::StatusOr<std::string>(NormalizeOnce(""));
    return *kDefault;
  }
  static constexpr size_t kMaxKept = 256;
  static absl::Mutex mu(absl::kConstInit);
  static auto* const kept ABSL_PT_GUARDED_BY(mu) =
      new absl::flat_hash_map<std::string, std::string>();
  {
    absl::MutexLock lock(&mu);
    if (auto it = kept->find(moe_backend); it != kept->end()) return it->second;
  }
  absl::StatusOr<std::string> normalized = NormalizeOnce(moe_backend);
  if (normalized.ok()) {
    absl::MutexLock lock(&mu);
    if (kept->size() < kMaxKept) kept->emplace(std::string(moe_backend), *normalized);
  }
  return normalized;
}

absl::StatusOr<MoeRoute> ChooseMoeRoute(const ExpertsSpec& spec, const MoeRunInput& input,
                                        absl::string_view moe_backend,
                                        const MoeResidency& residency, const Platform& platform,
                                        const std::vector<std::string>& executable_backends) {
  KPLAN_ASSIGN_OR_RETURN(MoeRunShape shape, CheckMoeRunInput(spec, input));
  PlanOptions options;
  options.executable_backends = executable_backends;
  // No VLLM_* environment: the env-driven steps pick vLLM's backends only.
  KPLAN_ASSIGN_OR_RETURN(
      MoePlan plan, PlanMoeLayer(LayerSpecOf(spec, input, shape), moe_backend, ParallelConfig{},
                                 platform, EnvVars{}, options));
  MoeRoute r;
  r.plan = std::move(plan);
  r.backend = UserBackend(r.plan.backend);
  r.experts_kernel = r.plan.experts_kernel;
  const std::string& b = r.plan.backend;
  if (b == "KPLAN") {
    if (residency.on_gpu && residency.fast_path) {
      r.kind = MoeRouteKind::kGpuFast;
    } else if (residency.on_gpu) {
      r.kind = MoeRouteKind::kGpuEmulation;
      RunAsEmulation(r, absl::StrCat("the fast kernels do not take ", WeightsOf(spec), " with ",
                                     kernels::DTypeName(input.act_dtype),
                                     " activations; the GPU emulation route takes it"));
    } else {
      r.kind = MoeRouteKind::kCpuReference;
      RunAsEmulation(r, "the set is not resident on a GPU; the CPU reference ran");
    }
  } else if (b == "EMULATION") {
    r.kind = residency.on_gpu && !residency.fast_path ? MoeRouteKind::kGpuEmulation
                                                      : MoeRouteKind::kCpuReference;
  } else if (b == "KPLAN_EP") {
    r.kind = MoeRouteKind::kExpertParallel;
  } else {
    // KPLAN_BATCHED, or anything a future executable list admits unmapped.
    return WithField(
        absl::FailedPreconditionError(absl::StrCat(
            "moe_backend '", r.backend, "' (", r.plan.experts_kernel, ", ",
            r.plan.activation_format,
            " activation format) has no kernels on this server: RunMoE runs the standard "
            "format (kplan, emulation)")),
        "moe_backend");
  }
  return r;
}

int64_t MoeRouteCache::TokenBucket(int64_t num_tokens) {
  int64_t bucket = num_tokens > 0 ? 1 : 0;
  while (bucket > 0 && bucket < num_tokens) bucket *= 2;
  return bucket;
}

absl::StatusOr<std::shared_ptr<const MoeRoute>> MoeRouteCache::Choose(
    const std::shared_ptr<const ExpertSet>& set, const MoeRunInput& input,
    absl::string_view moe_backend, const MoeResidency& residency, const Platform& platform,
    const std::vector<std::string>& executable_backends) {
  const ExpertsSpec& spec = set->spec();
  KPLAN_ASSIGN_OR_RETURN(const MoeRunShape shape, CheckMoeRunInput(spec, input));
  // Everything of the request LayerSpecOf and ChooseMoeRoute read.
  const MoeRouting& r = input.routing;
  std::string key =
      absl::StrCat(kernels::DTypeName(input.act_dtype), "|", shape.top_k, "|", moe_backend, "|",
                   residency.on_gpu, residency.fast_path, "|", TokenBucket(shape.num_tokens), "|");
  if (shape.by_logits) {
    absl::StrAppend(&key, "logits|", r.routing_method, "|", r.num_expert_group, "|", r.topk_group,
                    "|", !r.e_score_correction_bias.empty(), "|",
                    r.routed_scaling_factor ? absl::StrCat(*r.routed_scaling_factor) : "-");
  } else {
    absl::StrAppend(&key, "ids");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto id = routes_.find(spec.experts_id);
    if (id != routes_.end()) {
      auto it = id->second.find(key);
      if (it != id->second.end()) {
        // The same instance: not expired, and no other owner group.
        const std::weak_ptr<const ExpertSet>& cached = it->second.set;
        if (!cached.expired() && !cached.owner_before(set) && !set.owner_before(cached)) {
          return it->second.route;
        }
      }
    }
    ++misses_;
  }
  KPLAN_ASSIGN_OR_RETURN(MoeRoute chosen, ChooseMoeRoute(spec, input, moe_backend, residency,
                                                         platform, executable_backends));
  auto route = std::make_shared<const MoeRoute>(std::move(chosen));
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_ >= max_entries_) {
    // Drop the older half (rare: the key space per set is small).
    const uint64_t cut = next_serial_ - entries_ / 2;
    for (auto id = routes_.begin(); id != routes_.end();) {
      entries_ -= std::erase_if(id->second, [cut](const auto& e) { return e.second.serial < cut; });
      id = id->second.empty() ? routes_.erase(id) : std::next(id);
    }
  }
  auto [it, inserted] =
      routes_[spec.experts_id].insert_or_assign(std::move(key), Entry{set, route, next_serial_++});
  if (inserted) ++entries_;
  return route;
}

void MoeRouteCache::Invalidate(const std::string& experts_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto id = routes_.find(experts_id);
  if (id == routes_.end()) return;
  entries_ -= id->second.size();
  routes_.erase(id);
}

size_t MoeRouteCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

int64_t MoeRouteCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace kplan
