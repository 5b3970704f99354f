#include "absl/strings/string_view.h"
#include "resolve/plan/kernel_config.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/pyjson.h"
#include "base/pyrepr.h"
#include "base/status.h"
#include "resolve/plan/vocabulary.h"

namespace kplan {
namespace {

// pydantic's literal_error line, naming the rejected input as pydantic does.
absl::Status LiteralError(absl::string_view field, const std::vector<absl::string_view>& allowed,
                          absl::string_view input) {
  return InvalidField(
      field, absl::StrCat(PydanticLiteralError(allowed), " [type=literal_error, input_value=",
                          PydanticInputValue(input), ", input_type=str]"));
}

// KernelConfig._normalize_*_backend followed by the Literal check.
absl::Status NormalizeBackend(absl::string_view field,
                              const std::vector<absl::string_view>& allowed, std::string& value) {
  // A mode="before" validator: the Literal check, and its error's
  // input_value, see the normalised string.
  std::string normalized = absl::StrReplaceAll(absl::AsciiStrToLower(value), {{"-", "_"}});
  if (!Contains(allowed, normalized)) return LiteralError(field, allowed, normalized);
  value = std::move(normalized);
  return absl::OkStatus();
}

}  // namespace

IrOpPriorityConfig::IrOpPriorityConfig() {
  for (absl::string_view op : IrOpNames()) priority[std::string(op)];
}

IrOpPriorityConfig IrOpPriorityConfig::WithDefault(const std::vector<std::string>& fallback) {
  IrOpPriorityConfig c;
  for (auto& [op, list] : c.priority) list = fallback;
  return c;
}

std::vector<std::string> SplitPriorityString(absl::string_view value) {
  std::string no_spaces = absl::StrReplaceAll(value, {{" ", ""}});
  return absl::StrSplit(no_spaces, ',');
}

absl::StatusOr<KernelConfig> NormalizeKernelConfig(KernelConfig config) {
  // The fields in KernelConfig's declaration order (pydantic's error order).
  KPLAN_RETURN_IF_ERROR(NormalizeBackend("moe_backend", MoeBackendValues(), config.moe_backend));
  KPLAN_RETURN_IF_ERROR(NormalizeBackend("sparse_indexer_topk_backend",
                                         SparseIndexerTopkBackendValues(),
                                         config.sparse_indexer_topk_backend));
  KPLAN_RETURN_IF_ERROR(
      NormalizeBackend("linear_backend", LinearBackendValues(), config.linear_backend));
  if (config.linear_backend_per_quant) {
    if (config.linear_backend_per_quant->empty()) {
      return InvalidField("linear_backend_per_quant",
                          "Dictionary should have at least 1 item after validation, not 0");
    }
    for (const auto& [quant, backend] : *config.linear_backend_per_quant) {
      if (!Contains(LinearBackendValues(), backend)) {
        return LiteralError(absl::StrCat("linear_backend_per_quant.", quant), LinearBackendValues(),
                            backend);
      }
    }
  }
  for (const auto& [op, list] : config.ir_op_priority.priority) {
    std::vector<absl::string_view> known = IrProvidersOf(op);
    for (const std::string& provider : list) {
      if (!Contains(known, provider)) {
        std::vector<std::string> names(known.begin(), known.end());
        return InvalidField(
            absl::StrCat("ir_op_priority.", op),
            absl::StrCat("All providers in priority must be registered implementations. ",
                         "Provider ", PyRepr(provider), " is not registered for op ", op,
                         "; registered providers: ", PyRepr(names)));
      }
    }
  }
  return config;
}

namespace {

// vLLM derives the MoE layer's sp_size (make_parallel_config): tp_size
// where the layer is sequence parallel, which needs
// ParallelConfig.use_sequence_parallel_moe, else 1. Checked on the request
// and again after binding passthrough (not a sequence-parallel backend).
absl::Status CheckSequenceParallel(const ParallelConfig& config) {
  if (config.sp_size != 1) {
    if (config.sp_size != config.tp_size) {
      return InvalidField("sp_size", absl::StrCat("sp_size must be 1 or tp_size (", config.tp_size,
                                                  "), got ", config.sp_size));
    }
    if (!config.enable_expert_parallel || config.tp_size <= 1 || config.dp_size <= 1 ||
        !Contains(SequenceParallelMoeAll2AllBackends(), config.all2all_backend)) {
      std::vector<std::string> backends(SequenceParallelMoeAll2AllBackends().begin(),
                                        SequenceParallelMoeAll2AllBackends().end());
      return InvalidField(
          "sp_size",
          absl::StrCat("sp_size = tp_size needs sequence-parallel MoE "
                       "(use_sequence_parallel_moe): enable_expert_parallel, tp_size > 1, "
                       "dp_size > 1 and all2all_backend in ",
                       PyRepr(backends)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParallelConfig> NormalizeParallelConfig(ParallelConfig config,
                                                       std::vector<std::string>* warnings) {
  struct SizeRank {
    absl::string_view size_name;
    int size;
    absl::string_view rank_name;
    int rank;
  };
  for (const SizeRank& s : {SizeRank{"tp_size", config.tp_size, "tp_rank", config.tp_rank},
                            SizeRank{"dp_size", config.dp_size, "dp_rank", config.dp_rank},
                            SizeRank{"pcp_size", config.pcp_size, "pcp_rank", config.pcp_rank},
                            SizeRank{"sp_size", config.sp_size, "", 0}}) {
    if (s.size < 1) {
      return InvalidField(s.size_name,
                          absl::StrCat(s.size_name, " must be at least 1, got ", s.size));
    }
    if (!s.rank_name.empty() && (s.rank < 0 || s.rank >= s.size)) {
      return InvalidField(s.rank_name,
                          absl::StrCat(s.rank_name, " must be in [0, ", s.size, "), got ", s.rank));
    }
  }
  // FusedMoEParallelConfig flattens dp x pcp x tp into one rank space (and
  // multiplies by sp for the world); Python ints never wrap, ours would.
  int64_t world = 1;
  for (int size : {config.dp_size, config.pcp_size, config.tp_size, config.sp_size}) {
    world *= size;  // each in [1, 2^31): no int64 overflow while world <= INT32_MAX
    if (world > INT32_MAX) break;
  }
  if (world > INT32_MAX) {
    return InvalidField(
        "tp_size", absl::StrCat("dp_size * pcp_size * tp_size * sp_size must be at most ",
                                INT32_MAX, ", got ", config.dp_size, " * ", config.pcp_size, " * ",
                                config.tp_size, " * ", config.sp_size));
  }
  if (Contains(RemovedAll2AllBackends(), config.all2all_backend)) {
    if (warnings) {
      warnings->push_back(absl::StrCat("The '", config.all2all_backend,
                                       "' all2all backend has been removed. Falling back to '",
                                       kDefaultAll2AllBackend, "'."));
    }
    config.all2all_backend = std::string(kDefaultAll2AllBackend);
  }
  if (!Contains(All2AllBackendValues(), config.all2all_backend)) {
    return LiteralError("all2all_backend", All2AllBackendValues(), config.all2all_backend);
  }
  // ParallelConfig._validate_parallel_config's EPLB checks (not its
  // CUDA-alike platform check).
  if (config.enable_eplb) {
    if (!config.enable_expert_parallel) {
      return InvalidField("enable_eplb", "enable_expert_parallel must be True to use EPLB.");
    }
    if (static_cast<int64_t>(config.tp_size) * config.pcp_size * config.dp_size <= 1) {
      return InvalidField(
          "enable_eplb",
          absl::StrCat("EPLB requires tensor, prefill-context, or data "
                       "parallelism, but got TP=",
                       config.tp_size, ", PCP=", config.pcp_size, ", DP=", config.dp_size, "."));
    }
  }
  KPLAN_RETURN_IF_ERROR(CheckSequenceParallel(config));
  return config;
}

absl::Status ValidateFlashinferMoeEpModel(absl::string_view moe_backend,
                                          const std::vector<std::string>& architectures) {
  if (moe_backend != kFlashinferMoeEpDeepGemm) return absl::OkStatus();
  for (const std::string& arch : architectures) {
    if (Contains(FlashinferMoeEpArchitectures(), arch)) return absl::OkStatus();
  }
  const auto& archs = FlashinferMoeEpArchitectures();
  return InvalidField(
      "kernel_config.moe_backend",
      absl::StrCat("moe_backend=", PyRepr(moe_backend),
                   " is only supported for DeepSeek-V4 models (",
                   PyReprSorted(std::vector<std::string>(archs.begin(), archs.end())),
                   "), but the model is ", PyRepr(architectures), "."));
}

absl::Status BindPassthroughAll2AllBackend(absl::string_view moe_backend, ParallelConfig& parallel,
                                           std::vector<std::string>* warnings) {
  const std::string& a2a = parallel.all2all_backend;
  if (DispatchesItself(moe_backend)) {
    if (a2a == kPassthroughAll2AllBackend) return absl::OkStatus();
    if (a2a != kDefaultAll2AllBackend) {
      return InvalidField("parallel.all2all_backend",
                          absl::StrCat("moe_backend=", PyRepr(moe_backend),
                                       " dispatches and combines itself and cannot be paired with "
                                       "all2all_backend=",
                                       PyRepr(a2a), "; leave --all2all-backend unset."));
    }
    if (warnings) {
      warnings->push_back(
          absl::StrCat("moe_backend=", PyRepr(moe_backend),
                       ": using all2all_backend=", PyRepr(kPassthroughAll2AllBackend),
                       " (dispatch and combine run inside the MoE backend)."));
    }
    parallel.all2all_backend = std::string(kPassthroughAll2AllBackend);
    return absl::OkStatus();
  }
  if (a2a == kPassthroughAll2AllBackend) {
    // The text cites vLLM's FLASHINFER_MOE_EP_BACKENDS verbatim; kplan_ep is
    // accepted as well (DispatchesItself) and documented in the README.
    const auto& fi = FlashinferMoeEpBackends();
    return InvalidField(
        "parallel.all2all_backend",
        absl::StrCat("all2all_backend=", PyRepr(a2a),
                     " is only valid with a moe_backend that dispatches and combines itself (",
                     PyReprSorted(std::vector<std::string>(fi.begin(), fi.end())),
                     "), got moe_backend=", PyRepr(moe_backend), "."));
  }
  return absl::OkStatus();
}

IrOpPriorityConfig DefaultIrOpPriority(const Platform& platform, const EnvVars& env) {
  const std::vector<std::string> native = {"native"};
  // using_inductor; enforce_eager sets the compilation mode to NONE
  // (VllmConfig.__post_init__), which turns inductor off.
  const bool inductor = platform.use_inductor && !platform.enforce_eager;
  auto with_prefix = [](std::string first, std::vector<std::string> rest) {
    rest.insert(rest.begin(), std::move(first));
    return rest;
  };
  if (platform.is_cuda() || platform.is_rocm()) {
    // CudaPlatform / RocmPlatform.get_default_ir_op_priority.
    std::vector<std::string> fallback =
        inductor ? native : std::vector<std::string>{"vllm_c", "native"};
    IrOpPriorityConfig c = IrOpPriorityConfig::WithDefault(fallback);
    bool fast_rms = platform.is_cuda()
                        ? env.Flag("VLLM_USE_OINK_OPS", false)
                        : (!platform.enforce_eager && env.Flag("VLLM_ROCM_USE_AITER", false) &&
                           env.Flag("VLLM_ROCM_USE_AITER_RMSNORM", true));
    if (fast_rms) {
      std::string provider = platform.is_cuda() ? "oink" : "aiter";
      c.of("rms_norm") = with_prefix(provider, fallback);
      c.of("fused_add_rms_norm") = with_prefix(provider, fallback);
    }
    c.of("gelu_and_mul_sparse") = {"triton", "native"};
    return c;
  }
  if (platform.is_xpu()) {
    return IrOpPriorityConfig::WithDefault(
        inductor ? native : std::vector<std::string>{"xpu_kernels", "native"});
  }
  return IrOpPriorityConfig::WithDefault(native);  // Platform interface default
}

absl::Status SetPlatformDefaults(KernelConfig& config, const ModelInfo* model,
                                 ParallelConfig& parallel, const Platform& platform,
                                 const EnvVars& env, std::vector<std::string>* warnings) {
  if (model != nullptr) {
    KPLAN_RETURN_IF_ERROR(ValidateFlashinferMoeEpModel(config.moe_backend, model->architectures));
  }
  KPLAN_RETURN_IF_ERROR(BindPassthroughAll2AllBackend(config.moe_backend, parallel, warnings));
  if (absl::Status s = CheckSequenceParallel(parallel); !s.ok()) return NestField(s, "parallel");
  IrOpPriorityConfig defaults = DefaultIrOpPriority(platform, env);
  for (auto& [op, current] : config.ir_op_priority.priority) {
    for (const std::string& provider : defaults.of(op)) {
      if (std::find(current.begin(), current.end(), provider) == current.end()) {
        current.push_back(provider);
      }
    }
  }
  return absl::OkStatus();
}

std::string ComputeHash(const IrOpPriorityConfig& config) {
  PyJson::Object factors;
  PyJson::Object impls;
  for (const auto& [op, list] : config.priority) {
    factors[op] = PyJson::StringList(list);
    PyJson::Object uuids;
    for (const std::string& provider : list) uuids[provider] = IrProviderUuid(op, provider);
    impls[op] = PyJson(std::move(uuids));
  }
  factors["_impls"] = PyJson(std::move(impls));
  return HashFactors(PyJson(std::move(factors)));
}

std::string ComputeHash(const KernelConfig& config) {
  // get_hash_factors() minus the ignored fields; ir_op_priority is replaced by
  // its own hash, linear_backend_per_quant is ignored while None.
  PyJson::Object factors;
  factors["monokernel"] = config.monokernel;
  factors["moe_backend"] = config.moe_backend;
  factors["sparse_indexer_topk_backend"] = config.sparse_indexer_topk_backend;
  factors["linear_backend"] = config.linear_backend;
  if (config.linear_backend_per_quant) {
    // normalize_value(Mapping): sorted (key, value) pairs, an array of arrays.
    PyJson::Array pairs;
    for (const auto& [k, v] : *config.linear_backend_per_quant) {
      pairs.emplace_back(PyJson::Array{PyJson(k), PyJson(v)});
    }
    factors["linear_backend_per_quant"] = PyJson(std::move(pairs));
  }
  factors["ir_op_priority"] = ComputeHash(config.ir_op_priority);
  return HashFactors(PyJson(std::move(factors)));
}

std::string DescribeIrOpPriority(const IrOpPriorityConfig& config) {
  std::string out = "IrOpPriorityConfig(";
  bool first = true;
  for (absl::string_view op : IrOpNames()) {
    if (!first) out += ", ";
    first = false;
    absl::StrAppend(&out, op, "=", PyRepr(config.of(op)));
  }
  return out + ")";
}

}  // namespace kplan
