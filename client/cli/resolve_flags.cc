#include "client/cli/resolve_flags.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "base/status.h"
#include "resolve/platform/platform.h"
#include "resolve/proto/convert.h"

namespace kplan::cli {
namespace {

absl::Status SetInt(const std::string& flag, const std::string& value, int32_t* out) {
  if (value.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(value, out)) {
    return InvalidField(flag, absl::StrCat("--", flag, " needs an integer, got '", value, "'"));
  }
  return absl::OkStatus();
}

absl::Status SetFloat(const std::string& flag, const std::string& value,
                      void (v1::MoELayerConfig::*setter)(float), v1::MoELayerConfig* moe) {
  if (value.empty()) return absl::OkStatus();
  float f = 0;
  if (!absl::SimpleAtof(value, &f)) {
    return InvalidField(flag, absl::StrCat("--", flag, " needs a number, got '", value, "'"));
  }
  (moe->*setter)(f);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, std::string>> SplitKeyValue(const std::string& flag,
                                                                  const std::string& item) {
  size_t eq = item.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidField(flag, absl::StrCat("--", flag, " expects KEY=VALUE, got '", item, "'"));
  }
  return std::make_pair(item.substr(0, eq), item.substr(eq + 1));
}

void SetIfGiven(const std::string& value, std::string* field) {
  if (!value.empty()) *field = value;
}

}  // namespace

void ResolveFlags::Register(ArgParser& p) {
  p.AddString("request", "FILE", "JSON ResolveKernelConfigRequest to start from", &request_file);
  p.AddString("moe-backend", "NAME", "KernelConfig.moe_backend (auto, triton, deep_gemm, ...)",
              &moe_backend);
  p.AddString("linear-backend", "NAME", "KernelConfig.linear_backend", &linear_backend);
  p.AddString("sparse-indexer-topk-backend", "NAME", "KernelConfig.sparse_indexer_topk_backend",
              &sparse_indexer_topk_backend);
  p.AddRepeated("ir-op-priority", "OP=P1,P2", "IR op priority, e.g. rms_norm=vllm_c,native",
                &ir_op_priority);
  p.AddRepeated("linear-backend-per-quant", "QUANT=BACKEND",
                "linear_backend override for one quant scheme", &linear_backend_per_quant);
  p.AddTriState("enable-flashinfer-autotune", "KernelConfig.enable_flashinfer_autotune",
                &enable_flashinfer_autotune);
  p.AddTriState("enable-rocm-segmented-attn-autotune",
                "KernelConfig.enable_rocm_segmented_attn_autotune",
                &enable_rocm_segmented_attn_autotune);
  p.AddTriState("enable-cutedsl-warmup", "KernelConfig.enable_cutedsl_warmup",
                &enable_cutedsl_warmup);
  p.AddTriState("enable-jit-warmup", "KernelConfig.enable_jit_warmup", &enable_jit_warmup);
  p.AddTriState("monokernel", "KernelConfig.monokernel", &monokernel);
  p.AddString("platform", "SPEC",
              "plan for this platform: cuda:9.0, cuda:10.0+flashinfer,deep_gemm, rocm:gfx950, "
              "cpu, xpu (default: the server's own)",
              &platform);
  p.AddString("device-name", "NAME", "device name reported for --platform", &device_name);
  p.AddSwitch("use-inductor", "compilation uses inductor (IR defaults become native)",
              &use_inductor);
  p.AddSwitch("enforce-eager", "vLLM's --enforce-eager: no CUDA graphs, no inductor",
              &enforce_eager);
  p.AddRepeated("env", "KEY=VALUE", "environment variable as vLLM would see it", &env);
  p.AddString("architectures", "A,B", "model architectures (e.g. DeepseekV4ForCausalLM)",
              &architectures);
  p.AddString("num-experts", "N", "MoE: global number of experts", &num_experts);
  p.AddString("top-k,experts-per-token", "K", "MoE: top-k experts per token", &experts_per_token);
  p.AddString("hidden-size", "H", "MoE: hidden size", &hidden_size);
  p.AddString("intermediate-size", "I", "MoE: expert intermediate size (unsharded)",
              &intermediate_size);
  p.AddString("activation", "ACT", "MoE: activation (silu, gelu, swigluoai, ...)", &activation);
  p.AddString("routing-method,routing", "NAME",
              "MoE: RoutingMethodType (Renormalize, DeepSeekV3, ...)", &routing_method);
  p.AddString("scoring-func", "FUNC", "MoE: softmax, sigmoid or sqrtsoftplus", &scoring_func);
  p.AddSwitch("renormalize", "MoE: renormalize top-k weights", &renormalize);
  p.AddString("num-expert-group", "N", "MoE: expert groups (grouped top-k)", &num_expert_group);
  p.AddString("topk-group", "N", "MoE: groups kept per token", &topk_group);
  p.AddSwitch("e-score-correction-bias", "MoE: router has a correction bias",
              &e_score_correction_bias);
  p.AddString("routed-scaling-factor", "X", "MoE: routed scaling factor", &routed_scaling_factor);
  p.AddString("dtype", "DTYPE", "activation dtype: bfloat16, float16, float32", &dtype);
  p.AddString("weight-quant", "KEY", "weight QuantKey, e.g. kFp8Static128BlockSym", &weight_quant);
  p.AddString("activation-quant", "KEY", "activation QuantKey, e.g. kFp8Dynamic128Sym",
              &activation_quant);
  p.AddString("quant-scheme", "NAME", "scheme override: mxfp4_deepseek_v4, w4a8, w4a8_int8",
              &quant_scheme);
  p.AddString("weight-bits", "N", "wna16 weight bits (4 or 8)", &weight_bits);
  p.AddString("swiglu-limit", "X", "MoE: SwiGLU clamp limit", &swiglu_limit);
  p.AddSwitch("enable-lora", "LoRA is enabled", &enable_lora);
  p.AddSwitch("allow-vllm-cutlass", "fp8: vLLM CUTLASS allowed (compressed-tensors W8A8)",
              &allow_vllm_cutlass);
  p.AddString("tensor-parallel-size", "N", "ParallelConfig.tp_size", &tensor_parallel_size);
  p.AddAlias("-tp", "tensor-parallel-size");
  p.AddString("data-parallel-size", "N", "ParallelConfig.dp_size", &data_parallel_size);
  p.AddAlias("-dp", "data-parallel-size");
  p.AddString("prefill-context-parallel-size", "N", "ParallelConfig.pcp_size",
              &prefill_context_parallel_size);
  p.AddString("sequence-parallel-size", "N",
              "MoE sequence parallelism: 1, or the TP size with -ep, -dp > 1 (vLLM's sp_size)",
              &sequence_parallel_size);
  p.AddSwitch("enable-expert-parallel", "ParallelConfig.enable_expert_parallel",
              &enable_expert_parallel);
  p.AddAlias("-ep", "enable-expert-parallel");
  p.AddString("all2all-backend", "NAME", "ParallelConfig.all2all_backend", &all2all_backend);
  p.AddSwitch("enable-eplb", "ParallelConfig.enable_eplb", &enable_eplb);
}

absl::StatusOr<v1::Platform> PlatformProtoFromSpec(const std::string& spec) {
  KPLAN_ASSIGN_OR_RETURN(Platform platform, ParsePlatformSpec(spec));
  v1::Platform out;
  rpc::PlatformToProto(platform, &out);
  return out;
}

absl::StatusOr<v1::ResolveKernelConfigRequest> ResolveFlags::BuildRequest() const {
  v1::ResolveKernelConfigRequest req;
  if (!request_file.empty()) {
    std::ifstream in(request_file);
    if (!in) return InvalidField("request", absl::StrCat("cannot read ", request_file));
    std::stringstream text;
    text << in.rdbuf();
    auto status = google::protobuf::util::JsonStringToMessage(text.str(), &req);
    if (!status.ok()) {
      return InvalidField("request",
                          absl::StrCat(request_file, ": ", std::string(status.message())));
    }
  }
  v1::KernelConfig* kc = req.mutable_kernel_config();
  SetIfGiven(moe_backend, kc->mutable_moe_backend());
  SetIfGiven(linear_backend, kc->mutable_linear_backend());
  SetIfGiven(sparse_indexer_topk_backend, kc->mutable_sparse_indexer_topk_backend());
  for (const std::string& item : ir_op_priority) {
    KPLAN_ASSIGN_OR_RETURN(auto kv, SplitKeyValue("ir-op-priority", item));
    google::protobuf::RepeatedPtrField<std::string>* list = nullptr;
    if (kv.first == "rms_norm") list = kc->mutable_ir_op_priority()->mutable_rms_norm();
    if (kv.first == "fused_add_rms_norm") {
      list = kc->mutable_ir_op_priority()->mutable_fused_add_rms_norm();
    }
    if (kv.first == "gelu_and_mul_sparse") {
      list = kc->mutable_ir_op_priority()->mutable_gelu_and_mul_sparse();
    }
    if (list == nullptr) {
      return InvalidField("ir-op-priority",
                          absl::StrCat("unknown IR op '", kv.first,
                                       "'; expected rms_norm, fused_add_rms_norm or "
                                       "gelu_and_mul_sparse"));
    }
    list->Clear();
    list->Add(std::string(kv.second));  // one string: split by the server as vLLM does
  }
  for (const std::string& item : linear_backend_per_quant) {
    KPLAN_ASSIGN_OR_RETURN(auto kv, SplitKeyValue("linear-backend-per-quant", item));
    (*kc->mutable_linear_backend_per_quant())[kv.first] = kv.second;
  }
  if (enable_flashinfer_autotune) kc->set_enable_flashinfer_autotune(*enable_flashinfer_autotune);
  if (enable_rocm_segmented_attn_autotune) {
    kc->set_enable_rocm_segmented_attn_autotune(*enable_rocm_segmented_attn_autotune);
  }
  if (enable_cutedsl_warmup) kc->set_enable_cutedsl_warmup(*enable_cutedsl_warmup);
  if (enable_jit_warmup) kc->set_enable_jit_warmup(*enable_jit_warmup);
  if (monokernel) kc->set_monokernel(*monokernel);

  if (!platform.empty()) {
    KPLAN_ASSIGN_OR_RETURN(*req.mutable_platform(), PlatformProtoFromSpec(platform));
  }
  if (!device_name.empty()) req.mutable_platform()->set_device_name(device_name);
  if (use_inductor) req.mutable_platform()->set_use_inductor(true);
  if (enforce_eager) req.mutable_platform()->set_enforce_eager(true);
  for (const std::string& item : env) {
    KPLAN_ASSIGN_OR_RETURN(auto kv, SplitKeyValue("env", item));
    (*req.mutable_env())[kv.first] = kv.second;
  }

  if (!architectures.empty()) {
    req.mutable_model()->clear_architectures();
    for (absl::string_view a : absl::StrSplit(architectures, ',', absl::SkipEmpty())) {
      req.mutable_model()->add_architectures(std::string(a));
    }
  }
  const bool any_moe = !num_experts.empty() || !experts_per_token.empty() || !hidden_size.empty() ||
                       !intermediate_size.empty() || !activation.empty() ||
                       !routing_method.empty() || !scoring_func.empty() || !weight_quant.empty() ||
                       !activation_quant.empty() || !dtype.empty() || renormalize || enable_lora ||
                       !swiglu_limit.empty() || !quant_scheme.empty() ||
                       !num_expert_group.empty() || e_score_correction_bias || allow_vllm_cutlass ||
                       !weight_bits.empty();
  if (any_moe) {
    v1::MoELayerConfig* moe = req.mutable_model()->mutable_moe();
    int32_t v = 0;
    KPLAN_RETURN_IF_ERROR(SetInt("num-experts", num_experts, &v));
    if (!num_experts.empty()) moe->set_num_experts(v);
    KPLAN_RETURN_IF_ERROR(SetInt("top-k", experts_per_token, &v));
    if (!experts_per_token.empty()) moe->set_experts_per_token(v);
    KPLAN_RETURN_IF_ERROR(SetInt("hidden-size", hidden_size, &v));
    if (!hidden_size.empty()) moe->set_hidden_dim(v);
    KPLAN_RETURN_IF_ERROR(SetInt("intermediate-size", intermediate_size, &v));
    if (!intermediate_size.empty()) moe->set_intermediate_size(v);
    KPLAN_RETURN_IF_ERROR(SetInt("num-expert-group", num_expert_group, &v));
    if (!num_expert_group.empty()) moe->set_num_expert_group(v);
    KPLAN_RETURN_IF_ERROR(SetInt("topk-group", topk_group, &v));
    if (!topk_group.empty()) moe->set_topk_group(v);
    KPLAN_RETURN_IF_ERROR(SetInt("weight-bits", weight_bits, &v));
    if (!weight_bits.empty()) moe->set_weight_bits(v);
    SetIfGiven(activation, moe->mutable_activation());
    SetIfGiven(routing_method, moe->mutable_routing_method());
    SetIfGiven(scoring_func, moe->mutable_scoring_func());
    SetIfGiven(dtype, moe->mutable_in_dtype());
    SetIfGiven(weight_quant, moe->mutable_weight_quant());
    SetIfGiven(activation_quant, moe->mutable_activation_quant());
    SetIfGiven(quant_scheme, moe->mutable_quant_scheme());
    if (renormalize) moe->set_renormalize(true);
    if (e_score_correction_bias) moe->set_has_e_score_correction_bias(true);
    if (enable_lora) moe->set_is_lora_enabled(true);
    if (allow_vllm_cutlass) moe->set_allow_vllm_cutlass(true);
    KPLAN_RETURN_IF_ERROR(SetFloat("routed-scaling-factor", routed_scaling_factor,
                                   &v1::MoELayerConfig::set_routed_scaling_factor, moe));
    KPLAN_RETURN_IF_ERROR(
        SetFloat("swiglu-limit", swiglu_limit, &v1::MoELayerConfig::set_swiglu_limit, moe));
  }

  v1::ParallelConfig* par = req.mutable_parallel();
  int32_t v = 0;
  KPLAN_RETURN_IF_ERROR(SetInt("tensor-parallel-size", tensor_parallel_size, &v));
  if (!tensor_parallel_size.empty()) par->set_tp_size(v);
  KPLAN_RETURN_IF_ERROR(SetInt("data-parallel-size", data_parallel_size, &v));
  if (!data_parallel_size.empty()) par->set_dp_size(v);
  KPLAN_RETURN_IF_ERROR(SetInt("prefill-context-parallel-size", prefill_context_parallel_size, &v));
  if (!prefill_context_parallel_size.empty()) par->set_pcp_size(v);
  KPLAN_RETURN_IF_ERROR(SetInt("sequence-parallel-size", sequence_parallel_size, &v));
  if (!sequence_parallel_size.empty()) par->set_sp_size(v);
  if (enable_expert_parallel) par->set_enable_expert_parallel(true);
  if (enable_eplb) par->set_enable_eplb(true);
  SetIfGiven(all2all_backend, par->mutable_all2all_backend());
  return req;
}

}  // namespace kplan::cli
