#include "resolve/proto/moe_plan_convert.h"

namespace kplan::rpc {
namespace {

struct DTypeRow {
  v1::DType proto;
  const char* wire;
};
constexpr DTypeRow kDTypes[] = {
    {v1::DTYPE_FLOAT32, "float32"},   {v1::DTYPE_FLOAT16, "float16"},
    {v1::DTYPE_BFLOAT16, "bfloat16"}, {v1::DTYPE_FLOAT8_E4M3, "float8_e4m3"},
    {v1::DTYPE_INT8, "int8"},         {v1::DTYPE_UINT8, "uint8"},
    {v1::DTYPE_INT32, "int32"},       {v1::DTYPE_INT64, "int64"},
};

}  // namespace

std::string WireFromProtoDType(v1::DType dtype) {
  for (const DTypeRow& r : kDTypes) {
    if (r.proto == dtype) return r.wire;
  }
  return "";
}

v1::DType ProtoDTypeFromWire(const std::string& wire) {
  for (const DTypeRow& r : kDTypes) {
    if (wire == r.wire) return r.proto;
  }
  return v1::DTYPE_UNSPECIFIED;
}

MoeLayerSpec MoeLayerFromProto(const v1::MoELayerConfig& p) {
  MoeLayerSpec c;
  c.name = p.name();
  c.num_experts = p.num_experts();
  c.experts_per_token = p.experts_per_token();
  c.hidden_dim = p.hidden_dim();
  c.intermediate_size = p.intermediate_size();
  c.activation = p.activation();
  c.routing_method = p.routing_method();
  c.scoring_func = p.scoring_func();
  c.renormalize = p.renormalize();
  c.num_expert_group = p.num_expert_group();
  c.topk_group = p.topk_group();
  c.has_e_score_correction_bias = p.has_e_score_correction_bias();
  if (p.has_routed_scaling_factor()) c.routed_scaling_factor = p.routed_scaling_factor();
  c.in_dtype = p.in_dtype();
  c.router_logits_dtype = p.router_logits_dtype();
  c.weight_quant = p.weight_quant();
  c.activation_quant = p.activation_quant();
  c.is_lora_enabled = p.is_lora_enabled();
  if (p.has_swiglu_limit()) c.swiglu_limit = p.swiglu_limit();
  c.has_bias = p.has_bias();
  c.max_num_tokens = p.max_num_tokens();
  c.allow_vllm_cutlass = p.allow_vllm_cutlass();
  c.weight_bits = p.weight_bits();
  c.quant_scheme = p.quant_scheme();
  return c;
}

void MoePlanToProto(const MoePlan& c, v1::MoEPlan* p) {
  p->Clear();
  p->set_layer(c.layer);
  p->set_scheme(c.scheme);
  p->set_backend(c.backend);
  p->set_backend_value(c.backend_value);
  p->set_experts_kernel(c.experts_kernel);
  p->set_monolithic(c.monolithic);
  p->set_activation_format(c.activation_format);
  p->set_prepare_finalize(c.prepare_finalize);
  p->set_topk_indices_dtype(c.topk_indices_dtype);
  p->set_output_is_reduced(c.output_is_reduced);
  p->set_hidden_dim(c.hidden_dim);
  p->set_intermediate_size_per_partition(c.intermediate_size_per_partition);
  p->set_log_line(c.log_line);
  for (const MoeCandidate& m : c.candidates) {
    v1::MoECandidate* out = p->add_candidates();
    out->set_backend(m.backend);
    out->set_experts_kernel(m.experts_kernel);
    out->set_accepted(m.accepted);
    out->set_reason(m.reason);
  }
  p->set_executable(c.executable);
  p->set_weight_key(c.weight_key);
  p->set_activation_key(c.activation_key);
  p->set_routing_method(c.routing_method);
  p->set_weight_layout(c.weight_layout);
}

MoePlan MoePlanFromProto(const v1::MoEPlan& p) {
  MoePlan c;
  c.layer = p.layer();
  c.scheme = p.scheme();
  c.backend = p.backend();
  c.backend_value = p.backend_value();
  c.experts_kernel = p.experts_kernel();
  c.monolithic = p.monolithic();
  c.activation_format = p.activation_format();
  c.prepare_finalize = p.prepare_finalize();
  c.topk_indices_dtype = p.topk_indices_dtype();
  c.output_is_reduced = p.output_is_reduced();
  c.hidden_dim = p.hidden_dim();
  c.intermediate_size_per_partition = p.intermediate_size_per_partition();
  c.log_line = p.log_line();
  for (const v1::MoECandidate& m : p.candidates()) {
    c.candidates.push_back(MoeCandidate{m.backend(), m.experts_kernel(), m.accepted(), m.reason()});
  }
  c.executable = p.executable();
  c.weight_key = p.weight_key();
  c.activation_key = p.activation_key();
  c.routing_method = p.routing_method();
  c.weight_layout = p.weight_layout();
  return c;
}

}  // namespace kplan::rpc
