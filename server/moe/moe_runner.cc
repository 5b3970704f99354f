#include "server/moe/moe_runner.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked_size.h"
#include "base/status.h"
#include "resolve/oracle/routing_methods.h"

namespace kplan {
namespace {

// vLLM's scoring_func name -> the router's scoring function.
moe::ScoringFunc ScoringOf(absl::string_view scoring) {
  if (scoring == "sigmoid") return moe::ScoringFunc::kSigmoid;
  if (scoring == "sqrtsoftplus") return moe::ScoringFunc::kSqrtSoftplus;
  return moe::ScoringFunc::kSoftmax;
}

absl::Status CheckShape(absl::string_view field, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& want, int64_t bytes, int64_t element_bytes) {
  if (shape != want) {
    return InvalidField(absl::StrCat(field, ".shape"),
                        absl::StrCat(field, " must have shape [", absl::StrJoin(want, ", "),
                                     "], got [", absl::StrJoin(shape, ", "), "]"));
  }
  return CheckTensorBytes(shape, element_bytes, bytes, field).status();
}

}  // namespace

absl::Status HostBytes::CheckIntact(absl::string_view tensor) const {
  if (!in_place()) return absl::OkStatus();
  return WithField(view_.region->CheckIntact(), absl::StrCat(tensor, ".shm.region"));
}

absl::Status MoeRunInput::CheckIntact() const {
  KPLAN_RETURN_IF_ERROR(hidden_states.CheckIntact("hidden_states"));
  return router_logits.CheckIntact("router_logits");
}

absl::Status MoeHostOutput::Writable(int64_t bytes) const {
  if (view.size != bytes) {
    return InvalidField(
        "output_shm.byte_size",
        absl::StrCat("the output takes ", bytes, " bytes; output_shm.byte_size is ", view.size));
  }
  if (cancelled && cancelled()) {
    return absl::CancelledError("the call ended before its output was written to output_shm");
  }
  return WithField(view.region->CheckIntact(), "output_shm.region");
}

absl::Status MoeHostOutput::Write(const void* src, int64_t bytes) const {
  KPLAN_RETURN_IF_ERROR(Writable(bytes));
  if (bytes > 0) std::memcpy(view.data, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::StatusOr<moe::RoutingSpec> RoutingSpecFor(const MoeRouting& r, int num_experts) {
  moe::RoutingSpec s;
  s.num_experts = num_experts;
  s.top_k = r.top_k;
  if (r.routed_scaling_factor) s.routed_scaling_factor = *r.routed_scaling_factor;
  if (!r.e_score_correction_bias.empty()) {
    if (static_cast<int>(r.e_score_correction_bias.size()) != num_experts) {
      return InvalidField("routing.e_score_correction_bias",
                          absl::StrCat("e_score_correction_bias needs ", num_experts,
                                       " values, got ", r.e_score_correction_bias.size()));
    }
    s.e_score_correction_bias = r.e_score_correction_bias.data();
  }
  const std::string& m = r.routing_method.empty() ? std::string("Default") : r.routing_method;
  // How the method routes is the routing-method table's row; this maps its
  // router kind onto the CPU reference's / the kernels' RoutingMethod.
  const RoutingMethodInfo* info = FindRoutingMethod(m);
  const RouterKind router = info == nullptr ? RouterKind::kNone : info->router;
  switch (router) {
    case RouterKind::kTopK:
      s.method = moe::RoutingMethod::kTopK;
      break;
    case RouterKind::kTopKThenSoftmax:
      s.method = moe::RoutingMethod::kTopKThenSoftmax;
      break;
    case RouterKind::kGroupedTopK:
      s.method = moe::RoutingMethod::kGroupedTopK;
      break;
    case RouterKind::kLlama4:
      s.method = moe::RoutingMethod::kLlama4;
      break;
    case RouterKind::kNone:
      return InvalidField("routing.routing_method",
                          absl::StrCat("routing_method '", m,
                                       "' is not routed here; expected Default, Renormalize, "
                                       "RenormalizeNaive, Sigmoid, SigmoidRenorm, DeepSeekV3, "
                                       "Llama4 or DeepseekV4"));
  }
  // kTopK and kGroupedTopK score and renormalise as the method says;
  // kTopKThenSoftmax and kLlama4 fix their own weighting.
  if (router == RouterKind::kTopK || router == RouterKind::kGroupedTopK) {
    s.scoring = ScoringOf(info->scoring);
    s.renormalize = info->renormalize;
  }
  if (info->grouped) {
    s.num_expert_group = r.num_expert_group;
    s.topk_group = r.topk_group;
  }
  KPLAN_RETURN_IF_ERROR(moe::ValidateRoutingSpec(s));  // fields are routing.*
  return s;
}

absl::StatusOr<MoeRunShape> CheckMoeRunInput(const ExpertsSpec& spec, const MoeRunInput& in) {
  if (in.hidden_shape.size() != 2 || in.hidden_shape[1] != spec.hidden) {
    return InvalidField("hidden_states.shape",
                        absl::StrCat("hidden_states must be [M, ", spec.hidden, "], got [",
                                     absl::StrJoin(in.hidden_shape, ", "), "]"));
  }
  MoeRunShape shape;
  const int64_t m = shape.num_tokens = in.hidden_shape[0];
  const MoeDeviceTensors& dev = in.device;
  const auto bytes = [](const auto& host, const void* device, int64_t device_bytes) {
    return device != nullptr ? device_bytes : static_cast<int64_t>(host.size());
  };
  KPLAN_RETURN_IF_ERROR(CheckShape("hidden_states", in.hidden_shape, {m, spec.hidden},
                                   bytes(in.hidden_states, dev.hidden_states, dev.hidden_bytes),
                                   kernels::DTypeSize(in.act_dtype)));
  KPLAN_RETURN_IF_ERROR(in.CheckIntact());
  shape.by_logits = in.by_logits();
  const bool by_ids = !in.topk_ids.empty() || !in.topk_shape.empty();
  if (shape.by_logits == by_ids) {
    return InvalidField("router_logits",
                        "give either router_logits with routing, or topk_ids with topk_weights");
  }
  const int e = spec.num_experts;
  if (shape.by_logits) {
    KPLAN_RETURN_IF_ERROR(CheckShape("router_logits", in.logits_shape, {m, e},
                                     bytes(in.router_logits, dev.router_logits, dev.logits_bytes),
                                     4));
    KPLAN_ASSIGN_OR_RETURN(shape.routing, RoutingSpecFor(in.routing, e));
    shape.top_k = shape.routing.top_k;
  } else {
    if (in.topk_shape.size() != 2 || in.topk_shape[0] != m || in.topk_shape[1] < 1 ||
        in.topk_shape[1] > e) {
      return InvalidField("topk_ids.shape",
                          absl::StrCat("topk_ids must be [", m, ", k] with 1 <= k <= ", e));
    }
    const int k = shape.top_k = static_cast<int>(in.topk_shape[1]);
    KPLAN_RETURN_IF_ERROR(
        CheckShape("topk_ids", in.topk_shape, {m, k}, static_cast<int64_t>(in.topk_ids.size()), 4));
    KPLAN_RETURN_IF_ERROR(CheckShape("topk_weights", in.topk_shape, {m, k},
                                     static_cast<int64_t>(in.topk_weights.size()), 4));
    const int32_t* ids = reinterpret_cast<const int32_t*>(in.topk_ids.data());
    for (int64_t t = 0; t < m * k; ++t) {
      if (ids[t] < 0 || ids[t] >= e) {
        return InvalidField("topk_ids", absl::StrCat("topk_ids[", t / k, "][", t % k,
                                                     "] = ", ids[t], " is not in [0, ", e, ")"));
      }
    }
  }
  if (in.apply_router_weight_on_input && shape.top_k != 1) {
    return InvalidField("apply_router_weight_on_input",
                        "apply_router_weight_on_input is only implemented for topk=1");
  }
  return shape;
}

absl::Status RefuseDeviceTensors(const MoeRunInput& in, absl::string_view where) {
  if (!in.device.any()) return absl::OkStatus();
  return WithField(absl::FailedPreconditionError(absl::StrCat(
                       "tensors in CUDA shared memory run only on the GPU path, and this "
                       "request runs on ",
                       where, "; send them inline or in a POSIX region")),
                   in.device.field);
}

absl::StatusOr<MoeRunOutput> RunMoeOnCpu(const ExpertSet& experts, const MoeRunInput& in,
                                         absl::Time deadline) {
  KPLAN_RETURN_IF_ERROR(RefuseDeviceTensors(in, "the CPU reference"));
  const ExpertsSpec& spec = experts.spec();
  KPLAN_ASSIGN_OR_RETURN(MoeRunShape shape, CheckMoeRunInput(spec, in));
  const int64_t m = shape.num_tokens;
  moe::MoeProblem p;
  p.num_tokens = m;
  p.hidden = spec.hidden;
  p.intermediate = spec.intermediate;
  p.num_experts = spec.num_experts;
  p.act_dtype = in.act_dtype;
  // A client's window is copied first: the CPU layer reads its input for
  // milliseconds to seconds, and a client that truncated its object in that
  // time would fault the read (SIGBUS). One copy, small next to the layer.
  std::string hidden_copy, logits_copy;
  p.hidden_states = in.hidden_states.Snapshot(&hidden_copy);
  p.activation = experts.activation();
  p.weights = experts.Weights();
  p.apply_router_weight_on_input = in.apply_router_weight_on_input;
  p.top_k = shape.top_k;
  p.deadline = deadline;
  if (shape.by_logits) {
    p.router_logits = reinterpret_cast<const float*>(in.router_logits.Snapshot(&logits_copy));
    p.routing = shape.routing;
  } else {
    p.topk_ids = reinterpret_cast<const int32_t*>(in.topk_ids.data());
    p.topk_weights = reinterpret_cast<const float*>(in.topk_weights.data());
  }
  MoeRunOutput out;
  out.num_tokens = m;
  out.top_k = p.top_k;
  out.topk_ids.resize(m * p.top_k);
  out.topk_weights.resize(m * p.top_k);
  out.output.resize(m * spec.hidden * kernels::DTypeSize(in.act_dtype));
  KPLAN_RETURN_IF_ERROR(
      moe::MoeReference(p, out.output.data(), out.topk_weights.data(), out.topk_ids.data()));
  if (in.host_output.any()) {
    // Into the client's window once the layer ran, in one copy just after
    // asking whether it may still be written (the window is never written
    // while the layer runs, for the reason above).
    KPLAN_RETURN_IF_ERROR(
        in.host_output.Write(out.output.data(), static_cast<int64_t>(out.output.size())));
    out.output.clear();
    out.in_place = true;
  }
  return out;
}

absl::string_view GpuLayerExpertsKernel(const GpuLayerFacts& f) {
  using R = kernels::cuda::MoeQuantRoute;
  if (!f.quantised) return f.fast_path ? "KplanExperts" : "KplanEmulationExperts";
  switch (f.quant_route) {
    case R::kMatvec:
    case R::kDecode:
      return "KplanQuantDecodeExperts";
    case R::kDequant:
      return "KplanDequantExperts";
    case R::kEmulation:
      break;
  }
  return f.fp8_tensor_cores ? "KplanFp8Experts" : "KplanEmulationExperts";
}

}  // namespace kplan
