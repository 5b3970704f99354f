#include "server/rpc/moe_convert.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/checked_size.h"
#include "base/status.h"

namespace kplan::rpc {
namespace {

// The element type of activations (hidden states, outputs).
absl::StatusOr<kernels::DType> ActDType(v1::DType d, absl::string_view field) {
  switch (d) {
    case v1::DTYPE_FLOAT32:
      return kernels::DType::kFloat32;
    case v1::DTYPE_FLOAT16:
      return kernels::DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return kernels::DType::kBFloat16;
    default:
      return InvalidField(field, absl::StrCat("activations are float32, float16 or bfloat16, got ",
                                              v1::DType_Name(d)));
  }
}

absl::Status ExpectDType(const v1::Tensor& t, v1::DType want, absl::string_view field) {
  if (t.dtype() != want) {
    return InvalidField(field, absl::StrCat(field, " must be ", v1::DType_Name(want), ", got ",
                                            v1::DType_Name(t.dtype())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertsSpec> ExpertsSpecFromProto(const v1::ExpertsHeader& h) {
  ExpertsSpec s;
  s.experts_id = h.experts_id();
  s.num_experts = h.num_experts();
  s.hidden = h.hidden_size();
  s.intermediate = h.intermediate_size();
  if (!h.activation().empty()) s.activation = h.activation();
  s.has_bias = h.has_bias();
  const v1::ExpertsQuantization& q = h.quantization();
  s.quant.scheme = q.scheme();
  if (q.block_n()) s.quant.block_n = q.block_n();
  if (q.block_k()) s.quant.block_k = q.block_k();
  if (q.group_size()) s.quant.group_size = q.group_size();
  s.quant.has_zero_points = q.has_zero_points();
  if (!q.activation_scale().empty()) s.quant.activation_scale = q.activation_scale();
  if (q.has_a1_scale()) s.quant.a1_scale = q.a1_scale();
  if (q.has_a2_scale()) s.quant.a2_scale = q.a2_scale();
  switch (h.dtype()) {
    case v1::DTYPE_FLOAT32:
      s.dtype = kernels::DType::kFloat32;
      break;
    case v1::DTYPE_FLOAT16:
      s.dtype = kernels::DType::kFloat16;
      break;
    case v1::DTYPE_BFLOAT16:
      s.dtype = kernels::DType::kBFloat16;
      break;
    case v1::DTYPE_FLOAT8_E4M3:
      s.dtype = kernels::DType::kFp8E4m3;
      break;
    case v1::DTYPE_INT8:
      s.dtype = kernels::DType::kInt8;
      break;
    case v1::DTYPE_UINT8:  // int4, two per byte
      s.dtype = kernels::DType::kInt4Packed;
      break;
    default:
      return InvalidField("dtype",
                          absl::StrCat("unsupported weight dtype ", v1::DType_Name(h.dtype())));
  }
  return s;
}

absl::StatusOr<MoeRunInput> MoeRunInputFromProto(v1::RunMoERequest& p) {
  MoeRunInput in;
  KPLAN_ASSIGN_OR_RETURN(in.act_dtype, ActDType(p.hidden_states().dtype(), "hidden_states.dtype"));
  in.hidden_shape.assign(p.hidden_states().shape().begin(), p.hidden_states().shape().end());
  in.hidden_states = std::move(*p.mutable_hidden_states()->mutable_data());
  if (p.has_router_logits()) {
    KPLAN_RETURN_IF_ERROR(ExpectDType(p.router_logits(), v1::DTYPE_FLOAT32, "router_logits.dtype"));
    in.logits_shape.assign(p.router_logits().shape().begin(), p.router_logits().shape().end());
    in.router_logits = std::move(*p.mutable_router_logits()->mutable_data());
    const v1::RoutingConfig& r = p.routing();
    in.routing.top_k = r.top_k();
    in.routing.routing_method = r.routing_method();
    in.routing.num_expert_group = r.num_expert_group();
    in.routing.topk_group = r.topk_group();
    if (r.has_routed_scaling_factor()) in.routing.routed_scaling_factor = r.routed_scaling_factor();
    if (r.has_e_score_correction_bias()) {
      KPLAN_RETURN_IF_ERROR(ExpectDType(r.e_score_correction_bias(), v1::DTYPE_FLOAT32,
                                        "routing.e_score_correction_bias.dtype"));
      const std::string& b = r.e_score_correction_bias().data();
      in.routing.e_score_correction_bias.resize(b.size() / 4);
      if (!in.routing.e_score_correction_bias.empty()) {  // memcpy(null, ..., 0) is UB
        std::memcpy(in.routing.e_score_correction_bias.data(), b.data(),
                    in.routing.e_score_correction_bias.size() * 4);
      }
    }
  }
  if (p.has_topk_ids() || p.has_topk_weights()) {
    KPLAN_RETURN_IF_ERROR(ExpectDType(p.topk_ids(), v1::DTYPE_INT32, "topk_ids.dtype"));
    KPLAN_RETURN_IF_ERROR(ExpectDType(p.topk_weights(), v1::DTYPE_FLOAT32, "topk_weights.dtype"));
    if (!std::equal(p.topk_ids().shape().begin(), p.topk_ids().shape().end(),
                    p.topk_weights().shape().begin(), p.topk_weights().shape().end())) {
      return InvalidField("topk_weights.shape", "topk_weights must have the shape of topk_ids");
    }
    in.topk_shape.assign(p.topk_ids().shape().begin(), p.topk_ids().shape().end());
    in.topk_ids = std::move(*p.mutable_topk_ids()->mutable_data());
    in.topk_weights = std::move(*p.mutable_topk_weights()->mutable_data());
  }
  in.apply_router_weight_on_input = p.apply_router_weight_on_input();
  return in;
}

void MoeRunOutputToProto(MoeRunOutput& out, kernels::DType act_dtype, int64_t hidden,
                         bool return_routing, v1::RunMoEResponse* p) {
  v1::Tensor* o = p->mutable_output();
  o->set_dtype(act_dtype == kernels::DType::kFloat32   ? v1::DTYPE_FLOAT32
               : act_dtype == kernels::DType::kFloat16 ? v1::DTYPE_FLOAT16
                                                       : v1::DTYPE_BFLOAT16);
  o->add_shape(out.num_tokens);
  o->add_shape(hidden);
  *o->mutable_data() = std::move(out.output);
  if (return_routing) {
    for (v1::Tensor* t : {p->mutable_topk_ids(), p->mutable_topk_weights()}) {
      t->add_shape(out.num_tokens);
      t->add_shape(out.top_k);
    }
    p->mutable_topk_ids()->set_dtype(v1::DTYPE_INT32);
    p->mutable_topk_ids()->set_data(out.topk_ids.data(), out.topk_ids.size() * 4);
    p->mutable_topk_weights()->set_dtype(v1::DTYPE_FLOAT32);
    p->mutable_topk_weights()->set_data(out.topk_weights.data(), out.topk_weights.size() * 4);
  }
}

absl::StatusOr<RunMoeRequest> RunMoeRequestFromProto(const ExpertStore& store,
                                                     v1::RunMoERequest& p) {
  RunMoeRequest r;
  KPLAN_ASSIGN_OR_RETURN(r.experts, store.Get(p.experts_id()));
  KPLAN_ASSIGN_OR_RETURN(r.input, MoeRunInputFromProto(p));
  // kernel_config.moe_backend as KernelConfig normalises it; the backend
  // itself is the oracle's choice (ChooseMoeRoute) unless the group runs it.
  absl::StatusOr<std::string> backend = NormalizeMoeBackend(p.kernel_config().moe_backend());
  if (!backend.ok()) return NestField(backend.status(), "kernel_config");
  r.moe_backend = *std::move(backend);
  if (!p.parallel().all2all_backend().empty()) {
    r.parallel.all2all_backend = p.parallel().all2all_backend();
  }
  r.return_routing = p.return_routing();
  r.explain = p.explain();
  r.skip_device = p.skip_device();
  return r;
}

absl::Status SharedMemoryOff(absl::string_view field) {
  absl::Status off = absl::FailedPreconditionError(
      "shared-memory regions are off on this server (--allow_shared_memory)");
  return field.empty() ? off : WithField(off, field);
}

namespace {

// A reference into a CUDA region joins `device`: all of a call's on one GPU.
absl::Status JoinDevice(const ShmView& view, absl::string_view field, MoeDeviceTensors* device) {
  if (device->device >= 0 && device->device != view.device()) {
    return InvalidField(
        field, absl::StrCat("a call's CUDA shared-memory tensors are on one GPU; ", device->field,
                            " is on cuda:", device->device, ", this one on cuda:", view.device()));
  }
  if (device->field.empty()) device->field = std::string(field);
  device->device = view.device();
  device->holds.push_back(view.region);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RunMoeShm> ResolveRunMoeShm(const ShmRegistry* regions, v1::RunMoERequest& p,
                                           MoeDeviceTensors* device) {
  RunMoeShm shm;
  // Only the tensors present: a mutable_*() would make an absent one present.
  const std::pair<const char*, v1::Tensor*> inputs[] = {
      {"hidden_states", p.has_hidden_states() ? p.mutable_hidden_states() : nullptr},
      {"router_logits", p.has_router_logits() ? p.mutable_router_logits() : nullptr},
      {"topk_ids", p.has_topk_ids() ? p.mutable_topk_ids() : nullptr},
      {"topk_weights", p.has_topk_weights() ? p.mutable_topk_weights() : nullptr}};
  for (auto [name, t] : inputs) {
    if (t == nullptr || !t->has_shm()) continue;
    const std::string field = absl::StrCat(name, ".shm");
    if (regions == nullptr) return SharedMemoryOff(field);
    if (!t->data().empty()) {
      return InvalidField(field, absl::StrCat(name,
                                              " has both data and a shared-memory "
                                              "reference; give one"));
    }
    const v1::SharedMemoryRef& ref = t->shm();
    KPLAN_ASSIGN_OR_RETURN(ShmView view,
                           regions->Resolve(ref.region(), ref.offset(), ref.byte_size(), field));
    const bool on_gpu = view.device() >= 0;
    // By the name: p.mutable_router_logits() here would add an absent one.
    const std::string_view tensor = name;
    if (tensor == "topk_ids" || tensor == "topk_weights") {
      // Copied out below: only the bytes its shape says (4 a slot), and at
      // most kMaxTopKShmBytes, so a small request cannot make the server copy a
      // large (perhaps sparse) region.
      KPLAN_RETURN_IF_ERROR(ExpectDType(*t,
                                        tensor == "topk_ids" ? v1::DTYPE_INT32 : v1::DTYPE_FLOAT32,
                                        absl::StrCat(name, ".dtype")));
      ShapeLimits limits;
      limits.max_bytes = kMaxTopKShmBytes;
      KPLAN_ASSIGN_OR_RETURN(const int64_t bytes, ShapeBytes(t->shape(), 4, name, limits));
      if (view.size != bytes) {
        return InvalidField(absl::StrCat(field, ".byte_size"),
                            absl::StrCat(name, " of shape ", ShapeText(t->shape()), " takes ",
                                         bytes, " bytes; the reference has ", view.size));
      }
    }
    if (on_gpu && tensor == "hidden_states") {
      KPLAN_RETURN_IF_ERROR(JoinDevice(view, field, device));
      device->hidden_states = view.data;
      device->hidden_bytes = view.size;
    } else if (on_gpu && tensor == "router_logits") {
      KPLAN_RETURN_IF_ERROR(JoinDevice(view, field, device));
      device->router_logits = view.data;
      device->logits_bytes = view.size;
    } else if (on_gpu) {
      // The given top-k is checked on the host before it indexes anything:
      // small, it comes over (M x k x 4 bytes).
      t->mutable_data()->resize(static_cast<size_t>(view.size));
      KPLAN_RETURN_IF_ERROR(WithField(view.CopyTo(t->mutable_data()->data()), field));
    } else if (tensor == "hidden_states") {
      shm.hidden_states = std::move(view);  // read in place
    } else if (tensor == "router_logits") {
      shm.router_logits = std::move(view);  // read in place
    } else {
      t->set_data(view.data, static_cast<size_t>(view.size));
    }
    t->clear_shm();
  }
  if (!p.has_output_shm()) return shm;
  if (regions == nullptr) return SharedMemoryOff("output_shm");
  const v1::SharedMemoryRef& ref = p.output_shm();
  KPLAN_ASSIGN_OR_RETURN(
      ShmView view, regions->Resolve(ref.region(), ref.offset(), ref.byte_size(), "output_shm"));
  int64_t want = static_cast<int64_t>(p.hidden_states().data().size());
  if (shm.hidden_states) want = shm.hidden_states->size;
  if (device->hidden_states != nullptr) want = device->hidden_bytes;
  if (view.size != want) {
    return InvalidField("output_shm.byte_size", absl::StrCat("the output takes ", want,
                                                             " bytes (those of hidden_states); "
                                                             "output_shm.byte_size is ",
                                                             view.size));
  }
  if (view.device() >= 0) {
    KPLAN_RETURN_IF_ERROR(JoinDevice(view, "output_shm", device));
    device->output = view.data;
  }
  shm.output = std::move(view);
  return shm;
}

void AttachRunMoeShm(const RunMoeShm& shm, std::function<bool()> cancelled, MoeRunInput* in) {
  if (shm.hidden_states) in->hidden_states = HostBytes(*shm.hidden_states);
  if (shm.router_logits) in->router_logits = HostBytes(*shm.router_logits);
  if (!shm.output || shm.output->device() >= 0) return;
  for (const std::optional<ShmView>* input : {&shm.hidden_states, &shm.router_logits}) {
    if (*input && shm.output->Overlaps(**input)) return;
  }
  in->host_output.view = *shm.output;
  in->host_output.cancelled = std::move(cancelled);
}

absl::Status RunMoeResultToProto(RunMoeResult& result, const MoeRunTiming& timing,
                                 const RunMoeAnswer& answer, v1::RunMoEResponse* response) {
  // Output in a CUDA region, or written in place: the path wrote it there.
  if (answer.output_shm && answer.output_shm->device() < 0 && !result.output.in_place) {
    KPLAN_RETURN_IF_ERROR(WithField(answer.output_shm->region->CheckIntact(), "output_shm.region"));
    // Sizes agree: output_shm's was checked against hidden_states', which
    // the input checks made [M, H] in the output's dtype.
    const std::string& out = result.output.output;
    const size_t n = std::min(out.size(), static_cast<size_t>(answer.output_shm->size));
    if (n > 0) std::memcpy(answer.output_shm->data, out.data(), n);
    result.output.output.clear();
  }
  MoeRunOutputToProto(result.output, answer.act_dtype, answer.hidden, answer.return_routing,
                      response);
  if (answer.output_shm) *response->mutable_output()->mutable_shm() = answer.output_ref;
  const MoeExecutionPlan& in = result.plan;
  v1::MoEExecution* plan = response->mutable_plan();
  plan->set_backend(in.backend);
  plan->set_experts_kernel(in.experts_kernel);
  plan->set_dispatch(in.dispatch);
  for (const MoeCandidate& c : in.candidates) {
    v1::MoECandidate* out = plan->add_candidates();
    out->set_backend(c.backend);
    out->set_experts_kernel(c.experts_kernel);
    out->set_accepted(c.accepted);
    out->set_reason(c.reason);
  }
  for (const std::string& d : in.devices) plan->add_devices(d);
  if (!in.all2all_backend.empty()) plan->set_all2all_backend(in.all2all_backend);
  if (in.ep_size != 0) plan->set_ep_size(in.ep_size);
  v1::MoETiming* t = response->mutable_timing();
  t->set_queue_us(absl::ToDoubleMicroseconds(timing.queue));
  t->set_device_us(absl::ToDoubleMicroseconds(timing.device));
  const auto since = [&](absl::Time at) {
    return at == absl::InfinitePast() ? 0.0 : absl::ToDoubleMicroseconds(at - answer.arrival);
  };
  t->set_decoded_at_us(since(answer.decoded));
  t->set_queued_at_us(since(timing.queued));
  t->set_device_start_at_us(since(timing.device_start));
  t->set_device_end_at_us(since(timing.device_end));
  t->set_coalesced_requests(timing.coalesced_requests);
  const double encoded = since(absl::Now());
  t->set_encoded_at_us(encoded);
  t->set_total_us(encoded);
  return absl::OkStatus();
}

}  // namespace kplan::rpc
