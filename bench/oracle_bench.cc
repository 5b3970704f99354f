// PlanMoeLayer per scheme ("auto"), on SM90 and SM100: the cost of one MoE
// kernel-plan resolution, candidate list and prepare/finalize included.
#include <benchmark/benchmark.h>

#include <string>

#include "resolve/oracle/moe_plan.h"

namespace kplan {
namespace {

struct SchemeCase {
  const char* name;
  const char* weight;
  const char* activation;
  const char* act_fn;
  const char* quant_scheme;
};

constexpr SchemeCase kSchemes[] = {
    {"unquantized", "", "", "silu", ""},
    {"fp8_block", "kFp8Static128BlockSym", "kFp8Dynamic128Sym", "silu", ""},
    {"fp8_tensor", "kFp8StaticTensorSym", "kFp8StaticTensorSym", "silu", ""},
    {"mxfp8", "kMxfp8Static", "kMxfp8Dynamic", "silu", ""},
    {"nvfp4", "kNvfp4Static", "kNvfp4Dynamic", "silu", ""},
    {"mxfp4", "kMxfp4Static", "", "swigluoai", ""},
    {"mxfp4_dsv4", "kMxfp4Static", "", "silu", "mxfp4_deepseek_v4"},
    {"int8", "kInt8StaticChannelSym", "kInt8DynamicTokenSym", "silu", ""},
    {"wna16", "kInt4Static32", "", "silu", ""},
    {"w4a8", "kInt4W4A8StaticGroup128Sym", "kFp8DynamicTokenSym", "silu", ""},
};

void BM_PlanMoeLayer(benchmark::State& state, const SchemeCase& sc, const char* platform_spec) {
  MoeLayerSpec layer;
  layer.name = "layers.0.mlp";
  layer.num_experts = 256;
  layer.experts_per_token = 8;
  layer.hidden_dim = 7168;
  layer.intermediate_size = 2048;
  layer.routing_method = "Renormalize";
  layer.activation = sc.act_fn;
  layer.weight_quant = sc.weight;
  layer.activation_quant = sc.activation;
  layer.quant_scheme = sc.quant_scheme;
  const Platform platform = ParsePlatformSpec(platform_spec).value();
  const ParallelConfig parallel;
  const EnvVars env;
  for (auto _ : state) {
    absl::StatusOr<MoePlan> plan = PlanMoeLayer(layer, "auto", parallel, platform, env);
    benchmark::DoNotOptimize(plan);
    if (!plan.ok()) state.SkipWithError(std::string(plan.status().message()).c_str());
  }
}

int Register() {
  for (const char* platform : {"cuda:9.0", "cuda:10.0"}) {
    const std::string sm = std::string(platform) == "cuda:9.0" ? "SM90" : "SM100";
    for (const SchemeCase& sc : kSchemes) {
      benchmark::RegisterBenchmark(
          ("PlanMoeLayer/" + sm + "/" + sc.name).c_str(),
          [&sc, platform](benchmark::State& s) { BM_PlanMoeLayer(s, sc, platform); })
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace kplan

BENCHMARK_MAIN();
