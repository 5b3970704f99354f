// The MoE routing kernel alone (kernels/cuda/moe/moe_ops.h, LaunchMoeRouting).
// At one token the routing warp sits on the decode layer's critical path
// (docs/PERF.md, sessions 9 and 10).
//
// Per routing (method, E, k) and token count M: random logits (never zero)
// in a pool of --sets device buffers; first set 0 is routed and checked
// against the CPU reference (moe::RouteTokens): the weights of rows with
// the same ids must agree within 1e-5 relative (NaN fails), and at most one
// row in a thousand may have other ids (a near-tie of fp32 scores can flip
// a pick; moe_gpu_test checks that each such row is one), else the row
// fails. Then one CUDA graph of --sets launches (set s in
// launch s) is replayed in event-timed batches (MedianMs, bench_check.h)
// after a warm-up: the median microseconds per launch. --json FILE writes
// the table's rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_check.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_ops.h"

ABSL_FLAG(std::string, tokens, "1,8,64,4096", "Comma-separated token counts M");
ABSL_FLAG(int, sets, 16, "Logit sets, one per launch of a graph");
ABSL_FLAG(int, samples, 100, "Timed batches (graph replays) per row");
ABSL_FLAG(double, warmup_s, 1.0, "Seconds of replays before the first timed row");
ABSL_FLAG(std::string, json, "", "Also write the rows as JSON to this file");

namespace {

namespace kc = kplan::kernels::cuda;
using kplan::kernels::RoutingMethod;
using kplan::kernels::ScoringFunc;

struct Routing {
  const char* name;
  int E, k;
  RoutingMethod method;
  ScoringFunc scoring;
  int groups, topk_group;  // grouped top-k
};

const Routing kRoutings[] = {
    {"mixtral softmax top-2", 8, 2, RoutingMethod::kTopK, ScoringFunc::kSoftmax, 0, 0},
    {"qwen3 softmax top-8", 128, 8, RoutingMethod::kTopK, ScoringFunc::kSoftmax, 0, 0},
    {"deepseek grouped top-8", 256, 8, RoutingMethod::kGroupedTopK, ScoringFunc::kSigmoid, 8, 4},
    {"512 experts top-32", 512, 32, RoutingMethod::kTopK, ScoringFunc::kSoftmax, 0, 0},
};

struct Row {
  std::string routing;
  int64_t tokens = 0;
  int64_t id_rows_differ = 0;
  double max_w_err = 0;  // relative, over rows with the same ids (inf: a NaN)
  double us = 0;
  bool ok() const { return max_w_err <= 1e-5 && id_rows_differ * 1000 <= tokens; }
};

Row RunRow(const Routing& r, int64_t M, int sets, int samples, cudaStream_t stream) {
  Row row;
  row.routing = r.name;
  row.tokens = M;
  kplan::moe::RoutingSpec spec;
  spec.num_experts = r.E;
  spec.top_k = r.k;
  spec.method = r.method;
  spec.scoring = r.scoring;
  spec.renormalize = true;
  spec.num_expert_group = r.groups;
  spec.topk_group = r.topk_group;
  kc::MoeRoutingParams p = kc::MoeRoutingParamsOf(spec);
  std::mt19937 rng(static_cast<unsigned>(M * 7919 + r.E));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> host(M * r.E), bias(r.E);
  DevBuf d_bias(r.E * 4), d_w(M * r.k * 4), d_ids(M * r.k * 4);
  for (float& b : bias) b = 0.05f * normal(rng);
  CHECK_CUDA(cudaMemcpy(d_bias.p, bias.data(), r.E * 4, cudaMemcpyHostToDevice));
  if (r.method == RoutingMethod::kGroupedTopK) {
    p.e_score_correction_bias = static_cast<const float*>(d_bias.p);
    spec.e_score_correction_bias = bias.data();
  }
  CHECK_OK(kc::ValidateMoeRoutingParams(p));
  std::vector<float> first;  // set 0's logits
  std::vector<std::unique_ptr<DevBuf>> logits;
  for (int s = 0; s < sets; ++s) {
    for (float& x : host) {
      do {
        x = normal(rng);
      } while (x == 0.0f);
    }
    if (s == 0) first = host;
    logits.push_back(std::make_unique<DevBuf>(M * r.E * 4));
    CHECK_CUDA(cudaMemcpy(logits.back()->p, host.data(), M * r.E * 4, cudaMemcpyHostToDevice));
  }
  auto launch = [&](int s) {
    CHECK_OK(kc::LaunchMoeRouting(p, static_cast<const float*>(logits[s]->p), M,
                                  static_cast<float*>(d_w.p), static_cast<int32_t*>(d_ids.p),
                                  stream));
  };
  // Set 0 against the CPU reference.
  CHECK_CUDA(cudaMemsetAsync(d_w.p, 0xff, M * r.k * 4, stream));
  CHECK_CUDA(cudaMemsetAsync(d_ids.p, 0xff, M * r.k * 4, stream));
  launch(0);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> w(M * r.k), cw(M * r.k);
  std::vector<int32_t> ids(M * r.k), cids(M * r.k);
  CHECK_CUDA(cudaMemcpy(w.data(), d_w.p, M * r.k * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ids.data(), d_ids.p, M * r.k * 4, cudaMemcpyDeviceToHost));
  CHECK_OK(kplan::moe::RouteTokens(spec, first.data(), M, cw.data(), cids.data()));
  for (int64_t t = 0; t < M; ++t) {
    const int32_t* got = ids.data() + t * r.k;
    if (!std::equal(got, got + r.k, cids.data() + t * r.k)) {
      ++row.id_rows_differ;
      continue;
    }
    for (int j = 0; j < r.k; ++j) {
      const double c = cw[t * r.k + j], g = w[t * r.k + j];
      const double err = std::fabs(g - c) / std::max(std::fabs(c), 1e-30);
      row.max_w_err = std::isnan(err) ? INFINITY : std::max(row.max_w_err, err);
    }
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int s = 0; s < sets; ++s) launch(s);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  row.us =
      1e3 / sets * MedianMs([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, samples, 4, stream);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The MoE routing kernel, checked against the CPU reference, then timed in CUDA graphs.\n"
      "usage: moe_routing_bench [--tokens 1,8,64,4096] [--sets 16] [--samples 100] "
      "[--json FILE]");
  absl::ParseCommandLine(argc, argv);
  std::vector<int64_t> tokens;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int64_t m = 0;
    if (!absl::SimpleAtoi(t, &m) || m < 1) {
      std::fprintf(stderr, "--tokens: '%s' is not a positive count\n", std::string(t).c_str());
      return 2;
    }
    tokens.push_back(m);
  }
  const int sets = std::max(1, absl::GetFlag(FLAGS_sets));
  const int samples = std::max(3, absl::GetFlag(FLAGS_samples));
  CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("device: %s\n", prop.name);
  {  // clocks up: routing launches on 4096 tokens for warmup_s
    const Routing& r = kRoutings[1];
    const int64_t M = 4096;
    kc::MoeRoutingParams p;
    p.num_experts = r.E;
    p.top_k = r.k;
    p.renormalize = true;
    DevBuf logits(M * r.E * 4), w(M * r.k * 4), ids(M * r.k * 4);
    CHECK_CUDA(cudaMemset(logits.p, 0x3f, M * r.E * 4));  // 0.75 everywhere
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
           absl::GetFlag(FLAGS_warmup_s)) {
      for (int i = 0; i < 100; ++i) {
        CHECK_OK(kc::LaunchMoeRouting(p, static_cast<const float*>(logits.p), M,
                                      static_cast<float*>(w.p), static_cast<int32_t*>(ids.p),
                                      stream));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
    }
  }
  std::vector<Row> rows;
  for (const Routing& r : kRoutings) {
    for (int64_t M : tokens) rows.push_back(RunRow(r, M, sets, samples, stream));
  }
  std::printf("\nrouting kernel, us per launch (median of graph replays)\n");
  std::printf("%-24s %6s %10s  %s\n", "routing", "tokens", "us", "check against the CPU");
  bool ok = true;
  for (const Row& r : rows) {
    std::printf("%-24s %6lld %10.2f  %s: max w err %.1e, %lld rows with other ids\n",
                r.routing.c_str(), static_cast<long long>(r.tokens), r.us, r.ok() ? "ok" : "FAIL",
                r.max_w_err, static_cast<long long>(r.id_rows_differ));
    ok = ok && r.ok();
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream out(path);
    out << "{\"device\": \"" << prop.name << "\", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? ",\n  " : "\n  ") << "{\"routing\": \"" << r.routing
          << "\", \"tokens\": " << r.tokens << ", \"us\": " << r.us << ", \"max_w_err\": ";
      if (std::isfinite(r.max_w_err)) {
        out << r.max_w_err;
      } else {
        out << "null";  // a NaN weight
      }
      out << ", \"id_rows_differ\": " << r.id_rows_differ
          << ", \"ok\": " << (r.ok() ? "true" : "false") << "}";
    }
    out << "\n]}\n";
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return ok ? 0 : 1;
}
