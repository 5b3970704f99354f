#include "client/cli/format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "server/oracle/moe_plan.h"
#include "server/platform/platform.h"
#include "server/rpc/moe_convert.h"
#include "server/rpc/convert.h"

namespace kplan::cli {
namespace {

void Row(std::string& out, absl::string_view key, absl::string_view value) {
  absl::StrAppend(&out, absl::StrFormat("%-36s %s\n", absl::StrCat(key, ":"), value));
}

std::string Describe(const v1::Platform& p) {
  absl::StatusOr<Platform> platform = rpc::PlatformFromProto(p, nullptr);
  return platform.ok() ? DescribePlatform(*platform) : "(invalid platform)";
}

std::string List(const google::protobuf::RepeatedPtrField<std::string>& items) {
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

void FormatMoePlan(std::string& out, const v1::MoEPlan& p) {
  std::string title = p.layer().empty() ? "moe plan" : absl::StrCat("moe plan (", p.layer(), ")");
  absl::StrAppend(&out, "\n", title, "\n");
  Row(out, "  scheme", p.scheme());
  Row(out, "  backend", p.backend_value().empty() || p.backend_value() == p.backend()
                            ? p.backend()
                            : absl::StrCat(p.backend(), " (", p.backend_value(), ")"));
  Row(out, "  experts kernel", p.experts_kernel().empty() ? "-" : p.experts_kernel());
  Row(out, "  kind", p.monolithic() ? "monolithic" : "modular");
  Row(out, "  activation format", p.activation_format());
  Row(out, "  prepare/finalize", p.prepare_finalize());
  Row(out, "  hidden / intermediate",
      absl::StrCat(p.hidden_dim(), " / ", p.intermediate_size_per_partition()));
  Row(out, "  executable here", p.executable() ? "yes" : "no");
  if (!p.log_line().empty()) Row(out, "  vLLM would log", p.log_line());
}

}  // namespace

std::string FormatResolve(const v1::ResolveKernelConfigResponse& r) {
  std::string out;
  const v1::KernelConfig& kc = r.kernel_config();
  Row(out, "platform", Describe(r.platform()));
  Row(out, "moe_backend", kc.moe_backend());
  Row(out, "linear_backend", kc.linear_backend());
  Row(out, "sparse_indexer_topk_backend", kc.sparse_indexer_topk_backend());
  for (const auto& kv : kc.linear_backend_per_quant()) {
    Row(out, absl::StrCat("linear_backend[", kv.first, "]"), kv.second);
  }
  Row(out, "ir_op_priority.rms_norm", List(kc.ir_op_priority().rms_norm()));
  Row(out, "ir_op_priority.fused_add_rms_norm", List(kc.ir_op_priority().fused_add_rms_norm()));
  Row(out, "ir_op_priority.gelu_and_mul_sparse", List(kc.ir_op_priority().gelu_and_mul_sparse()));
  Row(out, "monokernel", kc.monokernel() ? "true" : "false");
  Row(out, "all2all_backend", r.parallel().all2all_backend());
  Row(out, "config_hash", r.config_hash());
  if (r.has_moe_plan()) FormatMoePlan(out, r.moe_plan());
  for (const v1::MoEPlan& p : r.moe_layer_plans()) FormatMoePlan(out, p);
  for (const std::string& w : r.warnings()) absl::StrAppend(&out, "warning: ", w, "\n");
  return out;
}

std::vector<MoePlan> MoePlansOf(const v1::ResolveKernelConfigResponse& r) {
  std::vector<MoePlan> plans;
  if (r.has_moe_plan()) plans.push_back(rpc::MoePlanFromProto(r.moe_plan()));
  for (const v1::MoEPlan& p : r.moe_layer_plans()) plans.push_back(rpc::MoePlanFromProto(p));
  return plans;
}

std::string FormatComparison(const v1::ResolveKernelConfigResponse& a,
                             const v1::ResolveKernelConfigResponse& b) {
  const std::string la = Describe(a.platform());
  const std::string lb = Describe(b.platform());
  std::string out = absl::StrCat("comparing ", la, "  vs  ", lb, "\n\n");
  struct Field {
    std::string name, va, vb;
  };
  const v1::KernelConfig& ka = a.kernel_config();
  const v1::KernelConfig& kb = b.kernel_config();
  const std::vector<Field> fields = {
      {"ir_op_priority.rms_norm", List(ka.ir_op_priority().rms_norm()),
       List(kb.ir_op_priority().rms_norm())},
      {"ir_op_priority.fused_add_rms_norm", List(ka.ir_op_priority().fused_add_rms_norm()),
       List(kb.ir_op_priority().fused_add_rms_norm())},
      {"ir_op_priority.gelu_and_mul_sparse", List(ka.ir_op_priority().gelu_and_mul_sparse()),
       List(kb.ir_op_priority().gelu_and_mul_sparse())},
      {"all2all_backend", a.parallel().all2all_backend(), b.parallel().all2all_backend()},
      {"config_hash", a.config_hash(), b.config_hash()},
  };
  for (const Field& f : fields) {
    if (f.va == f.vb) {
      Row(out, f.name, absl::StrCat(f.va, "  (same)"));
    } else {
      Row(out, f.name, absl::StrCat(f.va, "  ->  ", f.vb));
    }
  }
  std::vector<MoePlan> pa = MoePlansOf(a), pb = MoePlansOf(b);
  for (size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
    absl::StrAppend(&out, "\n", ComparePlans(pa[i], la, pb[i], lb));
  }
  return out;
}

std::string FormatServerInfo(const v1::GetServerInfoResponse& r) {
  std::string out;
  Row(out, "version", absl::StrCat(r.version(), " (", r.build().git_revision(), ")"));
  Row(out, "cuda (build)", r.build().cuda_version().empty() ? "none" : r.build().cuda_version());
  Row(out, "nccl (build)", r.build().nccl_version().empty() ? "none" : r.build().nccl_version());
  Row(out, "cuda architectures",
      r.build().cuda_architectures().empty() ? "-" : r.build().cuda_architectures());
  Row(out, "cuda driver", r.cuda_driver_version().empty() ? "none" : r.cuda_driver_version());
  Row(out, "platform", Describe(r.platform()));
  if (r.devices().empty()) Row(out, "devices", "none (CPU reference path)");
  for (const v1::Device& d : r.devices()) {
    Row(out, absl::StrCat("device ", d.index()),
        absl::StrFormat("%s (sm_%d%d, %.1f GiB, %d SMs)", d.name(), d.capability().major(),
                        d.capability().minor(), d.total_memory_bytes() / double(1 << 30),
                        d.multiprocessor_count()));
  }
  Row(out, "executable backends",
      r.executable_backends().empty() ? "-" : List(r.executable_backends()));
  Row(out, "max message bytes", absl::StrCat(r.limits().max_message_bytes()));
  return out;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

}  // namespace kplan::cli
