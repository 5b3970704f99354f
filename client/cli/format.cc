#include "client/cli/format.h"

#include <algorithm>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/platform/platform.h"
#include "resolve/proto/moe_plan_convert.h"
#include "resolve/proto/convert.h"

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
  Row(out, "  backend",
      p.backend_value().empty() || p.backend_value() == p.backend()
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

std::string Bytes(int64_t b) {
  if (b < 1024) return absl::StrCat(b, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

namespace {

// Rows of cells, left-aligned in columns two spaces apart.
std::string Table(const std::vector<std::vector<std::string>>& rows, absl::string_view indent) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line(indent);
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, c + 1 < row.size()
                                 ? absl::StrFormat("%-*s  ", static_cast<int>(width[c]), row[c])
                                 : row[c]);
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Placement(const v1::ExpertsInfo& e) {
  std::vector<std::string> parts;
  for (const v1::ExpertsPlacement& p : e.placement()) {
    parts.push_back(p.num_experts() == e.num_experts() || p.num_experts() == 0
                        ? p.device()
                        : absl::StrFormat("%s[%d..%d)", p.device(), p.first_expert(),
                                          p.first_expert() + p.num_experts()));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

// "ready", or how far a load has come: "loading 40% (3/8 experts)".
std::string State(const v1::ExpertsInfo& e) {
  if (e.state() != v1::EXPERTS_STATE_LOADING) return "ready";
  const v1::ExpertsLoadProgress& p = e.progress();
  if (p.preload() && p.bytes_done() == 0) return "preload queued";
  const int64_t percent = p.bytes_total() > 0 ? 100 * p.bytes_done() / p.bytes_total() : 0;
  return absl::StrFormat("loading %d%% (%d/%d experts)", percent, p.experts_done(),
                         p.experts_total());
}

}  // namespace

std::string FormatExperts(const google::protobuf::RepeatedPtrField<v1::ExpertsInfo>& sets) {
  if (sets.empty()) return "no expert sets loaded\n";
  // One table, a row per set; then each expert-parallel set's shards.
  std::vector<std::vector<std::string>> rows = {{"ID", "STATE", "EXPERTS", "HIDDEN", "INTERMEDIATE",
                                                 "DTYPE/QUANT", "ACTIVATION", "BYTES",
                                                 "PLACEMENT"}};
  std::string shards;
  for (const v1::ExpertsInfo& e : sets) {
    std::string dtype = rpc::WireFromProtoDType(e.dtype());
    if (!e.quantization().empty()) absl::StrAppend(&dtype, "/", e.quantization());
    rows.push_back({e.experts_id(), State(e), absl::StrCat(e.num_experts()),
                    absl::StrCat(e.hidden_size()), absl::StrCat(e.intermediate_size()), dtype,
                    e.activation(), Bytes(e.bytes()), Placement(e)});
    if (e.shards().empty()) continue;
    std::vector<std::vector<std::string>> shard_rows = {
        {"RANK", "DEVICE", "FIRST EXPERT", "EXPERTS", "BYTES"}};
    for (const v1::ExpertShard& s : e.shards()) {
      shard_rows.push_back({absl::StrCat(s.rank()), s.device(), absl::StrCat(s.first_expert()),
                            absl::StrCat(s.num_experts()), Bytes(s.bytes())});
    }
    absl::StrAppend(&shards, "\n", e.experts_id(), " shards (expert parallel, ", e.shards_size(),
                    " ranks):\n", Table(shard_rows, "  "));
  }
  return Table(rows, "") + shards;
}

std::string FormatMoeRun(const MoeRunSummary& s) {
  std::string out;
  const v1::MoEExecution& p = s.plan;
  Row(out, "experts", absl::StrCat(s.experts_id, " (", s.tokens, " tokens)"));
  Row(out, "backend", p.backend());
  Row(out, "experts kernel", p.experts_kernel().empty() ? "-" : p.experts_kernel());
  Row(out, "dispatch", p.dispatch().empty() ? "-" : p.dispatch());
  Row(out, "devices", List(p.devices()));
  Row(out, "all2all backend", p.all2all_backend().empty() ? "-" : p.all2all_backend());
  Row(out, "ep size", p.ep_size() == 0 ? "-" : absl::StrCat(p.ep_size()));
  if (!p.candidates().empty()) {
    absl::StrAppend(&out, "candidates (in the order tried):\n");
    std::vector<std::vector<std::string>> rows;
    for (const v1::MoECandidate& c : p.candidates()) {
      rows.push_back({c.backend(), c.experts_kernel().empty() ? "-" : c.experts_kernel(),
                      c.accepted() ? "accepted" : absl::StrCat("rejected: ", c.reason())});
    }
    absl::StrAppend(&out, Table(rows, "  "));
  }
  const std::string which =
      s.runs > 1 ? absl::StrCat("timing (median of ", s.runs, " runs)") : std::string("timing");
  absl::StrAppend(&out, which, ":\n");
  Row(out, "  queue", absl::StrFormat("%.1f us", s.timing.queue_us()));
  Row(out, "  device", absl::StrFormat("%.1f us", s.timing.device_us()));
  Row(out, "  total (server)", absl::StrFormat("%.1f us", s.timing.total_us()));
  Row(out, "  round trip (client)", absl::StrFormat("%.1f us", s.round_trip_us));
  const int32_t shared = s.timing.coalesced_requests();
  Row(out, "coalesced",
      shared == 0   ? std::string("no (coalescing off or not applicable)")
      : shared == 1 ? std::string("no (ran alone)")
                    : absl::StrCat("yes (", shared, " requests in one launch)"));
  return out;
}

namespace {

// A JSON text nested one level deeper (protobuf's JSON indents by one space).
std::string Nested(std::string json) {
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return absl::StrReplaceAll(json, {{"\n", "\n "}});
}

}  // namespace

std::string JsonObject(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out = "{";
  for (const auto& [key, json] : members) {
    absl::StrAppend(&out, out.size() > 1 ? "," : "", "\n ", JsonString(key), ": ", Nested(json));
  }
  return out + "\n}\n";
}

std::string JsonArray(const std::vector<std::string>& items) {
  if (items.empty()) return "[]";
  std::string out = "[";
  for (const std::string& json : items) {
    absl::StrAppend(&out, out.size() > 1 ? "," : "", "\n ", Nested(json));
  }
  return out + "\n]";
}

std::string JsonString(const std::string& s) {
  google::protobuf::Value v;
  v.set_string_value(s);
  std::string out;
  // Only bytes that are not UTF-8 fail (a flag's value): null, still JSON.
  if (!google::protobuf::util::MessageToJsonString(v, &out).ok()) return "null";
  return out;
}

std::string ExplainToJson(const v1::ResolveKernelConfigResponse& r) {
  std::vector<std::string> plans, warnings;
  if (r.has_moe_plan()) plans.push_back(ToJson(r.moe_plan()));
  for (const v1::MoEPlan& p : r.moe_layer_plans()) plans.push_back(ToJson(p));
  for (const std::string& w : r.warnings()) warnings.push_back(JsonString(w));
  return JsonObject({{"moe_plans", JsonArray(plans)}, {"warnings", JsonArray(warnings)}});
}

std::string MoeRunToJson(const MoeRunSummary& s) {
  return JsonObject({{"experts_id", JsonString(s.experts_id)},
                     {"tokens", absl::StrCat(s.tokens)},
                     {"runs", absl::StrCat(s.runs)},
                     {"plan", ToJson(s.plan)},
                     {"timing", ToJson(s.timing)},
                     {"round_trip_us", absl::StrFormat("%.1f", s.round_trip_us)}});
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  // dtype fields in the words the tables and flags use: "bfloat16", not
  // "DTYPE_BFLOAT16", and an expert set's state as the table's first word:
  // "ready", "loading" (quoted keys, so no string value can match).
  static const std::regex kWord(
      "(\"[a-z_]*dtype\": |\"state\": )\"((DTYPE|EXPERTS_STATE)_[A-Z0-9_]+)\"");
  std::string words;
  auto last = out.cbegin();
  for (std::sregex_iterator it(out.begin(), out.end(), kWord), end; it != end; ++it) {
    std::string word;
    if (v1::DType dtype = v1::DTYPE_UNSPECIFIED; v1::DType_Parse((*it)[2].str(), &dtype)) {
      word = rpc::WireFromProtoDType(dtype);
    } else if (v1::ExpertsState state = v1::EXPERTS_STATE_UNSPECIFIED;
               v1::ExpertsState_Parse((*it)[2].str(), &state) &&
               state != v1::EXPERTS_STATE_UNSPECIFIED) {
      word =
          absl::AsciiStrToLower(v1::ExpertsState_Name(state).substr(sizeof("EXPERTS_STATE_") - 1));
    }
    words.append(last, (*it)[0].first);
    words += word.empty() ? it->str() : absl::StrCat((*it)[1].str(), "\"", word, "\"");
    last = (*it)[0].second;
  }
  words.append(last, out.cend());
  return words;
}

}  // namespace kplan::cli
