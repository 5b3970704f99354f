#include "absl/strings/string_view.h"
#include "resolve/plan/vocabulary.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/pyjson.h"

namespace kplan {

const std::vector<absl::string_view>& MoeBackendValues() {
  static const auto* v = new std::vector<absl::string_view>{
      // vllm/config/kernel.py MoEBackend, in declaration order.
      "auto", "triton", "batched_triton", "deep_gemm", "cutlass", "flashinfer_trtllm",
      "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl", "flashinfer_b12x",
      "b12x", "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming", "triton_unfused", "aiter",
      "aiter_mega_moe", "aiter_triton_mxfp4_bf16", "aiter_triton_mxfp4_mxfp4", "flydsl", "hpc",
      "emulation", "rdna3",
      // kplan's own CUDA kernels, admitted as one vendor family.
      "kplan", "kplan_batched", "kplan_ep"};
  return *v;
}

const std::vector<absl::string_view>& LinearBackendValues() {
  static const auto* v = new std::vector<absl::string_view>{"auto",
                                                            "cutlass",
                                                            "flashinfer_cutlass",
                                                            "flashinfer_cutedsl",
                                                            "flashinfer_trtllm",
                                                            "flashinfer_cudnn",
                                                            "flashinfer_b12x",
                                                            "b12x",
                                                            "marlin",
                                                            "humming",
                                                            "triton",
                                                            "deep_gemm",
                                                            "torch",
                                                            "aiter",
                                                            "machete",
                                                            "fbgemm",
                                                            "conch",
                                                            "exllama",
                                                            "emulation",
                                                            "xpu",
                                                            "xpu_woq"};
  return *v;
}

const std::vector<absl::string_view>& SparseIndexerTopkBackendValues() {
  static const auto* v =
      new std::vector<absl::string_view>{"auto",    "deep_select", "cooperative", "persistent",
                                         "per_row", "flashinfer",  "torch",       "aiter"};
  return *v;
}

const std::vector<absl::string_view>& All2AllBackendValues() {
  // vllm/config/parallel.py's All2AllBackend, in its order: naive and pplx
  // pass the Literal and are rewritten after it (RemovedAll2AllBackends).
  static const auto* v = new std::vector<absl::string_view>{
      "naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
      "mori_high_throughput", "mori_low_latency", "nixl_ep", "allgather_reducescatter",
      "flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided",
      "passthrough",
      // kplan's own dispatch (server/moe/ep): all-to-all-v of only the needed rows.
      "kplan_all2allv"};
  return *v;
}

const std::vector<absl::string_view>& SequenceParallelMoeAll2AllBackends() {
  static const auto* v = new std::vector<absl::string_view>{
      "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
      "mori_high_throughput",    "mori_low_latency",       "nixl_ep"};
  return *v;
}

const std::vector<absl::string_view>& RemovedAll2AllBackends() {
  static const auto* v = new std::vector<absl::string_view>{"naive", "pplx"};
  return *v;
}

const std::vector<absl::string_view>& FlashinferMoeEpBackends() {
  static const auto* v =
      new std::vector<absl::string_view>{kFlashinferMoeEpCutedsl, kFlashinferMoeEpDeepGemm};
  return *v;
}

bool DispatchesItself(absl::string_view moe_backend) {
  return Contains(FlashinferMoeEpBackends(), moe_backend) || moe_backend == "kplan_ep";
}

const std::vector<absl::string_view>& FlashinferMoeEpArchitectures() {
  static const auto* v = new std::vector<absl::string_view>{
      "DeepseekV4ForCausalLM", "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM"};
  return *v;
}

const std::vector<absl::string_view>& IrOpNames() {
  static const auto* v =
      new std::vector<absl::string_view>{"rms_norm", "fused_add_rms_norm", "gelu_and_mul_sparse"};
  return *v;
}

const std::vector<IrProviderInfo>& IrProviders() {
  // vLLM's providers (vllm/kernels/*.py) and kplan's own. Bump impl_version
  // when an implementation changes what it computes: it feeds config hashes.
  static const auto* v = new std::vector<IrProviderInfo>{
      {"rms_norm", "native", "1"},
      {"rms_norm", "vllm_c", "1"},
      {"rms_norm", "aiter", "1"},
      {"rms_norm", "oink", "1"},
      {"rms_norm", "xpu_kernels", "1"},
      {"rms_norm", "kplan", "1"},
      {"fused_add_rms_norm", "native", "1"},
      {"fused_add_rms_norm", "vllm_c", "1"},
      {"fused_add_rms_norm", "aiter", "1"},
      {"fused_add_rms_norm", "oink", "1"},
      {"fused_add_rms_norm", "xpu_kernels", "1"},
      {"fused_add_rms_norm", "kplan", "1"},
      {"gelu_and_mul_sparse", "native", "1"},
      {"gelu_and_mul_sparse", "triton", "1"},
      {"gelu_and_mul_sparse", "xpu_kernels", "1"},
      {"gelu_and_mul_sparse", "kplan", "1"},
  };
  return *v;
}

std::string IrProviderUuid(absl::string_view op, absl::string_view provider) {
  for (const IrProviderInfo& p : IrProviders()) {
    if (p.op == op && p.provider == provider) {
      return Sha256Hex(absl::StrCat("kplan.ir.", op, ".", provider, "@", p.impl_version));
    }
  }
  return "";
}

std::vector<absl::string_view> IrProvidersOf(absl::string_view op) {
  std::vector<absl::string_view> out;
  for (const IrProviderInfo& p : IrProviders()) {
    if (p.op == op) out.push_back(p.provider);
  }
  return out;
}

bool Contains(const std::vector<absl::string_view>& values, absl::string_view v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

}  // namespace kplan
