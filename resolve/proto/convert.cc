#include "resolve/proto/convert.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "resolve/plan/vocabulary.h"

namespace kplan::rpc {
namespace {

std::string OrDefault(const std::string& value, absl::string_view fallback) {
  return value.empty() ? std::string(fallback) : value;
}

int SizeOrOne(int32_t size) { return size == 0 ? 1 : size; }

// A list holding one element is vLLM's plain-string form: "a, b" -> [a, b].
std::vector<std::string> PriorityFromProto(
    const google::protobuf::RepeatedPtrField<std::string>& r) {
  if (r.size() == 1) return SplitPriorityString(r[0]);
  return std::vector<std::string>(r.begin(), r.end());
}

constexpr std::pair<v1::PlatformKind, PlatformKind> kKinds[] = {
    {v1::PLATFORM_KIND_CUDA, PlatformKind::kCuda}, {v1::PLATFORM_KIND_ROCM, PlatformKind::kRocm},
    {v1::PLATFORM_KIND_CPU, PlatformKind::kCpu},   {v1::PLATFORM_KIND_XPU, PlatformKind::kXpu},
    {v1::PLATFORM_KIND_TPU, PlatformKind::kTpu},   {v1::PLATFORM_KIND_OOT, PlatformKind::kOot},
};

}  // namespace

google::protobuf::RepeatedPtrField<std::string>* MutablePriority(v1::IrOpPriorityConfig* p,
                                                                 absl::string_view op) {
  if (op == "rms_norm") return p->mutable_rms_norm();
  if (op == "fused_add_rms_norm") return p->mutable_fused_add_rms_norm();
  if (op == "gelu_and_mul_sparse") return p->mutable_gelu_and_mul_sparse();
  return nullptr;
}

KernelConfig KernelConfigFromProto(const v1::KernelConfig& p) {
  KernelConfig c;
  c.moe_backend = OrDefault(p.moe_backend(), "auto");
  c.linear_backend = OrDefault(p.linear_backend(), "auto");
  c.sparse_indexer_topk_backend = OrDefault(p.sparse_indexer_topk_backend(), "auto");
  const v1::IrOpPriorityConfig& ir = p.ir_op_priority();
  c.ir_op_priority.of("rms_norm") = PriorityFromProto(ir.rms_norm());
  c.ir_op_priority.of("fused_add_rms_norm") = PriorityFromProto(ir.fused_add_rms_norm());
  c.ir_op_priority.of("gelu_and_mul_sparse") = PriorityFromProto(ir.gelu_and_mul_sparse());
  if (p.has_enable_flashinfer_autotune()) {
    c.enable_flashinfer_autotune = p.enable_flashinfer_autotune();
  }
  if (p.has_enable_rocm_segmented_attn_autotune()) {
    c.enable_rocm_segmented_attn_autotune = p.enable_rocm_segmented_attn_autotune();
  }
  if (p.has_enable_cutedsl_warmup()) c.enable_cutedsl_warmup = p.enable_cutedsl_warmup();
  if (p.has_enable_jit_warmup()) c.enable_jit_warmup = p.enable_jit_warmup();
  if (p.has_monokernel()) c.monokernel = p.monokernel();
  if (!p.linear_backend_per_quant().empty()) {
    c.linear_backend_per_quant.emplace(p.linear_backend_per_quant().begin(),
                                       p.linear_backend_per_quant().end());
  }
  return c;
}

void KernelConfigToProto(const KernelConfig& c, v1::KernelConfig* p) {
  p->Clear();
  p->set_moe_backend(c.moe_backend);
  p->set_linear_backend(c.linear_backend);
  p->set_sparse_indexer_topk_backend(c.sparse_indexer_topk_backend);
  for (absl::string_view op : IrOpNames()) {
    auto* field = MutablePriority(p->mutable_ir_op_priority(), op);
    for (const std::string& provider : c.ir_op_priority.of(op)) field->Add(std::string(provider));
  }
  if (c.enable_flashinfer_autotune)
    p->set_enable_flashinfer_autotune(*c.enable_flashinfer_autotune);
  p->set_enable_rocm_segmented_attn_autotune(c.enable_rocm_segmented_attn_autotune);
  p->set_enable_cutedsl_warmup(c.enable_cutedsl_warmup);
  p->set_enable_jit_warmup(c.enable_jit_warmup);
  p->set_monokernel(c.monokernel);
  if (c.linear_backend_per_quant) {
    p->mutable_linear_backend_per_quant()->insert(c.linear_backend_per_quant->begin(),
                                                  c.linear_backend_per_quant->end());
  }
}

ParallelConfig ParallelConfigFromProto(const v1::ParallelConfig& p) {
  ParallelConfig c;
  c.tp_size = SizeOrOne(p.tp_size());
  c.dp_size = SizeOrOne(p.dp_size());
  c.pcp_size = SizeOrOne(p.pcp_size());
  c.sp_size = SizeOrOne(p.sp_size());
  c.tp_rank = p.tp_rank();
  c.dp_rank = p.dp_rank();
  c.pcp_rank = p.pcp_rank();
  c.enable_expert_parallel = p.enable_expert_parallel();
  c.all2all_backend = OrDefault(p.all2all_backend(), "allgather_reducescatter");
  c.enable_eplb = p.enable_eplb();
  return c;
}

void ParallelConfigToProto(const ParallelConfig& c, v1::ParallelConfig* p) {
  p->Clear();
  p->set_tp_size(c.tp_size);
  p->set_dp_size(c.dp_size);
  p->set_pcp_size(c.pcp_size);
  p->set_sp_size(c.sp_size);
  p->set_tp_rank(c.tp_rank);
  p->set_dp_rank(c.dp_rank);
  p->set_pcp_rank(c.pcp_rank);
  p->set_enable_expert_parallel(c.enable_expert_parallel);
  p->set_all2all_backend(c.all2all_backend);
  p->set_enable_eplb(c.enable_eplb);
}

absl::StatusOr<Platform> PlatformFromProto(const v1::Platform& p,
                                           std::vector<std::string>* warnings) {
  Platform c;
  bool known_kind = false;
  for (const auto& [proto_kind, kind] : kKinds) {
    if (proto_kind == p.kind()) {
      c.kind = kind;
      known_kind = true;
    }
  }
  if (!known_kind) {
    return InvalidField("platform.kind",
                        "platform.kind must be one of PLATFORM_KIND_CUDA, _ROCM, _CPU, _XPU, "
                        "_TPU or _OOT when a platform is given");
  }
  if (p.has_device_capability()) {
    if (p.device_capability().major() < 0 || p.device_capability().minor() < 0) {
      return InvalidField("platform.device_capability", "device capability must not be negative");
    }
    c.capability = DeviceCapability{p.device_capability().major(), p.device_capability().minor()};
  } else if (c.is_cuda()) {
    return InvalidField("platform.device_capability",
                        "a CUDA platform needs device_capability (e.g. major 9, minor 0)");
  }
  c.device_name = p.device_name();
  std::vector<std::string> unknown;
  for (const std::string& lib : p.libraries()) {
    if (!Contains(KnownLibraries(), lib)) unknown.push_back(lib);
    c.libraries.insert(lib);
  }
  if (!unknown.empty() && warnings) {
    warnings->push_back(absl::StrCat(
        "platform.libraries: unknown librar", unknown.size() == 1 ? "y " : "ies ",
        absl::StrJoin(unknown, ", "), " (known: ", absl::StrJoin(KnownLibraries(), ", "), ")"));
  }
  c.use_inductor = p.use_inductor();
  c.enforce_eager = p.enforce_eager();
  c.gcn_arch_name = p.gcn_arch_name();
  return c;
}

void PlatformToProto(const Platform& c, v1::Platform* p) {
  p->Clear();
  for (const auto& [proto_kind, kind] : kKinds) {
    if (kind == c.kind) p->set_kind(proto_kind);
  }
  if (c.capability) {
    p->mutable_device_capability()->set_major(c.capability->major);
    p->mutable_device_capability()->set_minor(c.capability->minor);
  }
  p->set_device_name(c.device_name);
  for (const std::string& lib : c.libraries) p->add_libraries(lib);
  p->set_use_inductor(c.use_inductor);
  p->set_enforce_eager(c.enforce_eager);
  p->set_gcn_arch_name(c.gcn_arch_name);
}

}  // namespace kplan::rpc
