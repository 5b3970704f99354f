// PlanMoeLayer: scheme detection, FusedMoEConfig construction, oracle
// selection, prepare/finalize and size round-ups; plus the human renderings.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/pyrepr.h"
#include "base/status.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/oracle/oracle.h"
#include "resolve/oracle/routing_methods.h"

namespace kplan {
namespace {

using Q = QuantKey;

struct SchemeKeys {
  std::string scheme;
  Q w = Q::kNone;
  Q a = Q::kNone;
};

bool IsFp8Weight(Q w) {
  return w == Q::kFp8StaticTensorSym || w == Q::kFp8StaticChannelSym ||
         w == Q::kFp8Static128BlockSym;
}
bool IsWna16Weight(Q w) {
  return w == Q::kInt4Static || w == Q::kInt4Static32 || w == Q::kInt4StaticAsym ||
         w == Q::kInt4Static32Asym || w == Q::kInt8Static;
}
bool IsW4A8Weight(Q w) {
  return w == Q::kInt4W4A8StaticGroup128Sym || w == Q::kInt4W4A8StaticGroup64Sym ||
         w == Q::kInt4W4A8StaticGroup32Sym || w == Q::kInt4W4A8StaticChannelSym;
}

std::vector<std::string> KeyNames() {
  std::vector<std::string> names;
  for (Q k : AllQuantKeys()) names.emplace_back(QuantKeyName(k));
  return names;
}

// Scheme from (weight_quant, activation_quant, quant_scheme), with the keys
// each oracle is called with.
absl::StatusOr<SchemeKeys> DetectScheme(const MoeLayerSpec& layer) {
  std::optional<Q> w = QuantKeyFromName(layer.weight_quant);
  if (!w) {
    return InvalidField("weight_quant",
                        absl::StrCat("unknown QuantKey ", PyRepr(layer.weight_quant),
                                     "; expected one of ", PyRepr(KeyNames())));
  }
  std::optional<Q> a = QuantKeyFromName(layer.activation_quant);
  if (!a) {
    return InvalidField("activation_quant",
                        absl::StrCat("unknown QuantKey ", PyRepr(layer.activation_quant),
                                     "; expected one of ", PyRepr(KeyNames())));
  }
  SchemeKeys k{"", *w, *a};
  if (!layer.quant_scheme.empty()) {
    if (OracleFor(layer.quant_scheme) == nullptr) {
      std::vector<std::string> schemes;
      for (absl::string_view s : OracleSchemes()) schemes.emplace_back(s);
      return InvalidField("quant_scheme",
                          absl::StrCat("unknown quant_scheme ", PyRepr(layer.quant_scheme),
                                       "; expected one of ", PyRepr(schemes)));
    }
    k.scheme = layer.quant_scheme;
  } else if (k.w == Q::kNone) {
    if (k.a != Q::kNone) {
      return InvalidField("activation_quant",
                          "activation_quant is set but weight_quant is empty: activations are "
                          "quantized only together with weights");
    }
    k.scheme = "unquantized";
  } else if (IsFp8Weight(k.w)) {
    k.scheme = "fp8";
  } else if (k.w == Q::kMxfp8Static) {
    k.scheme = "mxfp8";
  } else if (k.w == Q::kNvfp4Static) {
    k.scheme = "nvfp4";
  } else if (k.w == Q::kMxfp4Static) {
    k.scheme = "mxfp4";
  } else if (k.w == Q::kInt8StaticChannelSym) {
    k.scheme = "int8";
  } else if (IsWna16Weight(k.w)) {
    k.scheme = "wna16";
  } else if (IsW4A8Weight(k.w)) {
    k.scheme = k.a == Q::kInt8DynamicTokenSym ? "w4a8_int8" : "w4a8";
  } else {
    return InvalidField("weight_quant",
                        absl::StrCat(PyRepr(layer.weight_quant), " is not a MoE weight QuantKey"));
  }
  // Keys the oracles fix or default.
  const std::string& s = k.scheme;
  if (s == "mxfp8") {
    k.w = Q::kMxfp8Static;
    k.a = Q::kMxfp8Dynamic;
  } else if (s == "int8") {
    if (k.w == Q::kNone) k.w = Q::kInt8StaticChannelSym;
    if (k.a == Q::kNone) k.a = Q::kInt8DynamicTokenSym;
  } else if (s == "wna16") {
    if (k.w == Q::kNone) k.w = layer.weight_bits == 8 ? Q::kInt8Static : Q::kInt4Static;
    k.a = Q::kNone;
  } else if (s == "mxfp4" || s == "mxfp4_deepseek_v4") {
    k.w = Q::kMxfp4Static;
  } else if (s == "fp8" && k.w == Q::kNone) {
    k.w = Q::kFp8Static128BlockSym;
    if (k.a == Q::kNone) k.a = Q::kFp8Dynamic128Sym;
  } else if (s == "nvfp4" && k.w == Q::kNone) {
    k.w = Q::kNvfp4Static;
    if (k.a == Q::kNone) k.a = Q::kNvfp4Dynamic;
  } else if (s == "w4a8") {
    if (k.w == Q::kNone) k.w = Q::kInt4W4A8StaticGroup128Sym;
    if (k.a == Q::kNone) k.a = Q::kFp8DynamicTokenSym;
  } else if (s == "w4a8_int8") {
    if (k.w == Q::kNone) k.w = Q::kInt4W4A8StaticChannelSym;
    if (k.a == Q::kNone) k.a = Q::kInt8DynamicTokenSym;
  } else if (s == "unquantized" && (k.w != Q::kNone || k.a != Q::kNone)) {
    return InvalidField("quant_scheme",
                        "quant_scheme 'unquantized' with weight_quant/activation_quant set");
  }
  return k;
}

bool OneOf(absl::string_view v, std::initializer_list<absl::string_view> set) {
  return std::find(set.begin(), set.end(), v) != set.end();
}

absl::Status ValidateLayer(const MoeLayerSpec& l) {
  if (l.num_experts <= 0) return InvalidField("num_experts", "num_experts must be > 0");
  if (l.experts_per_token <= 0 || l.experts_per_token > l.num_experts) {
    return InvalidField("experts_per_token",
                        absl::StrCat("experts_per_token must be in [1, num_experts=", l.num_experts,
                                     "], got ", l.experts_per_token));
  }
  if (l.hidden_dim <= 0) return InvalidField("hidden_dim", "hidden_dim must be > 0");
  if (l.intermediate_size <= 0) {
    return InvalidField("intermediate_size", "intermediate_size must be > 0");
  }
  if (!OneOf(l.in_dtype, {"", "bfloat16", "float16", "float32"})) {
    return InvalidField("in_dtype", absl::StrCat("in_dtype must be bfloat16, float16 or float32, "
                                                 "got ",
                                                 PyRepr(l.in_dtype)));
  }
  if (!OneOf(l.router_logits_dtype, {"", "bfloat16", "float16", "float32"})) {
    return InvalidField("router_logits_dtype",
                        absl::StrCat("router_logits_dtype must be bfloat16, float16 or float32, "
                                     "got ",
                                     PyRepr(l.router_logits_dtype)));
  }
  if (!OneOf(l.scoring_func, {"", "softmax", "sigmoid", "sqrtsoftplus"})) {
    return InvalidField("scoring_func",
                        absl::StrCat("Unsupported scoring function: ", l.scoring_func));
  }
  if (l.weight_bits != 0 && l.weight_bits != 4 && l.weight_bits != 8) {
    return InvalidField("weight_bits",
                        absl::StrCat("weight_bits must be 4 or 8, got ", l.weight_bits));
  }
  if (l.max_num_tokens < 0) return InvalidField("max_num_tokens", "max_num_tokens must be > 0");
  if (l.num_expert_group > 0 && l.topk_group <= 0) {
    return InvalidField("topk_group",
                        "num_expert_group and topk_group must be provided when use_grouped_topk "
                        "is True");
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<absl::string_view>& KplanMoeBackends() {
  static const auto* v =
      new std::vector<absl::string_view>{"kplan", "kplan_batched", "kplan_ep", "emulation"};
  return *v;
}

absl::StatusOr<MoePlan> PlanMoeLayer(const MoeLayerSpec& layer, absl::string_view moe_backend,
                                     const ParallelConfig& parallel, const Platform& platform,
                                     const EnvVars& env, const PlanOptions& options) {
  KPLAN_RETURN_IF_ERROR(ValidateLayer(layer));
  absl::StatusOr<MoEActivation> parsed =
      MoEActivationFromStr(layer.activation.empty() ? "silu" : layer.activation);
  if (!parsed.ok()) return InvalidField("activation", parsed.status().message());
  const MoEActivation act = *parsed;
  RoutingMethodType routing;
  if (layer.routing_method.empty()) {
    routing =
        GetRoutingMethodType(layer.scoring_func.empty() ? "softmax" : layer.scoring_func,
                             layer.experts_per_token, layer.renormalize, layer.num_expert_group,
                             layer.has_e_score_correction_bias, layer.routed_scaling_factor);
  } else if (const RoutingMethodInfo* r = FindRoutingMethod(layer.routing_method)) {
    routing = r->type;
  } else {
    return InvalidField("routing_method",
                        absl::StrCat("unknown RoutingMethodType ", PyRepr(layer.routing_method)));
  }
  KPLAN_ASSIGN_OR_RETURN(SchemeKeys keys, DetectScheme(layer));

  FusedMoEParallelConfig pc = FusedMoEParallelConfig::Make(parallel);
  if (pc.enable_eplb && layer.num_experts % pc.ep_size != 0) {
    return InvalidField("num_experts",
                        absl::StrCat("EPLB currently only supports even distribution of experts "
                                     "across ranks. Got ",
                                     layer.num_experts, " experts and ", pc.ep_size, " EP ranks."));
  }
  KPLAN_ASSIGN_OR_RETURN(int hidden, RoundUpLayerHiddenSize(layer.hidden_dim, layer.in_dtype, pc));
  KPLAN_ASSIGN_OR_RETURN(FusedMoEConfig moe,
                         FusedMoEConfig::Make(layer, act, routing, pc, moe_backend, platform, env));
  moe.hidden_dim = hidden;

  const MoEKernelOracle* oracle = OracleFor(keys.scheme);
  const bool execution = !options.executable_backends.empty();
  SelectionContext ctx{platform, env, moe, layer.allow_vllm_cutlass, execution};
  KPLAN_ASSIGN_OR_RETURN(
      Selection sel,
      execution ? oracle->SelectExecutable(ctx, keys.w, keys.a, options.executable_backends)
                : oracle->SelectBackend(ctx, keys.w, keys.a));

  MoePlan plan;
  plan.layer = layer.name;
  KPLAN_RETURN_IF_ERROR(oracle->MakeKernel(sel, ctx, plan));
  plan.weight_key = std::string(QuantKeyName(keys.w));
  if (sel.experts == nullptr) plan.activation_key = std::string(QuantKeyName(keys.a));
  plan.routing_method = std::string(RoutingMethodName(routing));
  return plan;
}

// --- renderings ----------------------------------------------------------------

namespace {

std::string YesNo(bool b) { return b ? "yes" : "no"; }

std::string Chosen(const MoePlan& p) {
  if (p.experts_kernel.empty()) return absl::StrCat(p.backend, " (no experts kernel)");
  return absl::StrCat(p.backend, " -> ", p.experts_kernel);
}

// The rejection reason `plan` recorded for (backend, kernel), if it tried it.
std::optional<std::string> ReasonFor(const MoePlan& plan, absl::string_view backend,
                                     absl::string_view kernel) {
  for (const MoeCandidate& c : plan.candidates) {
    if (c.backend == backend && (kernel.empty() || c.experts_kernel == kernel) && !c.accepted) {
      return c.reason;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string ExplainPlan(const MoePlan& p) {
  std::string out =
      absl::StrCat("MoE layer", p.layer.empty() ? "" : absl::StrCat(" '", p.layer, "'"),
                   ": scheme ", p.scheme, ", weight ", p.weight_key, ", activation ",
                   p.activation_key, ", routing ", p.routing_method, "\n\n");
  size_t wb = 7, wk = 14;
  for (const MoeCandidate& c : p.candidates) {
    wb = std::max(wb, c.backend.size());
    wk = std::max(wk, c.experts_kernel.size());
  }
  absl::StrAppend(&out, absl::StrFormat("%3s  %-*s  %-*s  %-8s  %s\n", "#", wb, "backend", wk,
                                        "experts kernel", "verdict", "reason"));
  int i = 0;
  for (const MoeCandidate& c : p.candidates) {
    absl::StrAppend(
        &out, absl::StrFormat("%3d  %-*s  %-*s  %-8s  %s\n", ++i, wb, c.backend, wk,
                              c.experts_kernel, c.accepted ? "accepted" : "rejected", c.reason));
  }
  if (p.candidates.empty()) absl::StrAppend(&out, "     (no candidates tried)\n");
  absl::StrAppend(&out, "\nchosen: ", Chosen(p), " [value '", p.backend_value, "']",
                  p.monolithic ? ", monolithic" : ", modular", "\n");
  absl::StrAppend(&out, "  activation format: ", p.activation_format, "\n");
  absl::StrAppend(&out,
                  "  prepare/finalize:  ", p.prepare_finalize.empty() ? "-" : p.prepare_finalize,
                  " (topk ids ", p.topk_indices_dtype.empty() ? "any dtype" : p.topk_indices_dtype,
                  ", output reduced: ", YesNo(p.output_is_reduced), ")\n");
  absl::StrAppend(&out, "  sizes:             hidden ", p.hidden_dim, ", intermediate/partition ",
                  p.intermediate_size_per_partition, "\n");
  absl::StrAppend(&out, "  weight layout:     ", p.weight_layout, "\n");
  absl::StrAppend(&out, "  executable here:   ", YesNo(p.executable), "\n");
  if (!p.log_line.empty()) absl::StrAppend(&out, "  vLLM log:          ", p.log_line, "\n");
  return out;
}

std::string ComparePlans(const MoePlan& a, absl::string_view label_a, const MoePlan& b,
                         absl::string_view label_b) {
  struct Row {
    const char* name;
    std::string va, vb;
  };
  auto dtype = [](const MoePlan& p) {
    return p.topk_indices_dtype.empty() ? std::string("any") : p.topk_indices_dtype;
  };
  std::vector<Row> rows = {
      {"scheme", a.scheme, b.scheme},
      {"backend", a.backend, b.backend},
      {"experts kernel", a.experts_kernel, b.experts_kernel},
      {"monolithic", YesNo(a.monolithic), YesNo(b.monolithic)},
      {"activation format", a.activation_format, b.activation_format},
      {"prepare/finalize", a.prepare_finalize, b.prepare_finalize},
      {"topk ids dtype", dtype(a), dtype(b)},
      {"output reduced", YesNo(a.output_is_reduced), YesNo(b.output_is_reduced)},
      {"hidden", absl::StrCat(a.hidden_dim), absl::StrCat(b.hidden_dim)},
      {"intermediate/partition", absl::StrCat(a.intermediate_size_per_partition),
       absl::StrCat(b.intermediate_size_per_partition)},
      {"weight layout", a.weight_layout, b.weight_layout},
      {"executable", YesNo(a.executable), YesNo(b.executable)},
  };
  size_t wa = std::max<size_t>(label_a.size(), 8);
  for (const Row& r : rows) wa = std::max(wa, r.va.size());
  std::string out = absl::StrFormat("  %-22s  %-*s  %s\n", "", wa, label_a, label_b);
  int changed = 0;
  for (const Row& r : rows) {
    const bool diff = r.va != r.vb;
    changed += diff;
    absl::StrAppend(&out, absl::StrFormat("%s %-22s  %-*s  %s\n", diff ? "*" : " ", r.name, wa,
                                          r.va.empty() ? "-" : r.va, r.vb.empty() ? "-" : r.vb));
  }
  if (changed == 0) {
    absl::StrAppend(&out, "\nno differences\n");
    return out;
  }
  absl::StrAppend(&out, "\nwhy they differ:\n");
  auto explain = [&](const MoePlan& self, absl::string_view self_label, const MoePlan& other) {
    if (other.backend == self.backend && other.experts_kernel == self.experts_kernel) return;
    std::optional<std::string> why = ReasonFor(self, other.backend, other.experts_kernel);
    if (why) {
      absl::StrAppend(&out, "  ", self_label, " rejected ", Chosen(other), ": ", *why, "\n");
    } else if (!other.backend.empty()) {
      absl::StrAppend(&out, "  ", self_label, " chose ", Chosen(self), " before trying ",
                      other.backend, "\n");
    }
  };
  explain(a, label_a, b);
  explain(b, label_b, a);
  return out;
}

}  // namespace kplan
