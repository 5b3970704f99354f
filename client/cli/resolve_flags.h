// The `kplan resolve` / `kplan explain` flags, spelled as vLLM's CLI spells
// them, and their translation into a ResolveKernelConfigRequest. A JSON
// request file (--request) is read first; flags given on the command line
// override its fields.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli/args.h"
#include "kplan/v1/service.pb.h"

namespace kplan::cli {

struct ResolveFlags {
  std::string request_file;
  // KernelConfig
  std::string moe_backend, linear_backend, sparse_indexer_topk_backend;
  std::vector<std::string> ir_op_priority;            // op=a,b
  std::vector<std::string> linear_backend_per_quant;  // quant=backend
  std::optional<bool> enable_flashinfer_autotune, enable_rocm_segmented_attn_autotune,
      enable_cutedsl_warmup, enable_jit_warmup, monokernel;
  // Platform and environment
  std::string platform, device_name;
  bool use_inductor = false, enforce_eager = false;
  std::vector<std::string> env;  // KEY=VALUE
  // Model
  std::string architectures, num_experts, experts_per_token, hidden_size, intermediate_size,
      activation, routing_method, scoring_func, num_expert_group, topk_group, routed_scaling_factor,
      dtype, weight_quant, activation_quant, swiglu_limit, quant_scheme, weight_bits;
  bool renormalize = false, e_score_correction_bias = false, enable_lora = false,
       allow_vllm_cutlass = false;
  // Parallel
  std::string tensor_parallel_size, data_parallel_size, prefill_context_parallel_size,
      sequence_parallel_size, all2all_backend;
  bool enable_expert_parallel = false, enable_eplb = false;

  void Register(ArgParser& parser);
  // Builds the request: the file's (if any), then the flags on top.
  absl::StatusOr<v1::ResolveKernelConfigRequest> BuildRequest() const;
};

// Parses the short platform form ("cuda:9.0+flashinfer") into a proto Platform.
absl::StatusOr<v1::Platform> PlatformProtoFromSpec(const std::string& spec);

}  // namespace kplan::cli
