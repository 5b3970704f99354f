// Where the server's device hop goes for small RunMoE calls (#15: "server
// device time within 10 us of the kernel time at 1 token"). In one process,
// no RPC, on cuda:0, one random bf16 set (default Qwen3-30B-A3B: E=128,
// top-8, H=2048, I=768), routed by random logits; per token count the
// medians over --iters calls of
//   hop_graph    RunMoeOnGpu as the server runs it (--cuda_graphs on, its
//                copies by the SMs): host wall clock from the call to its
//                return, output on the host;
//   hop_dma      hop_graph with its copies by the copy engines
//                (GpuRunOptions::stage_by_sm false);
//   hop_eager    the same without the graph;
//   layer_gpu    the layer's own GPU time inside an eager hop (CUDA events
//                after the upload and before the download: GpuRunStats);
//   layer_alone  a graph of the layer only, inputs already on the device:
//                launch to synchronised, host wall clock (the kernels'
//                latency as one isolated call sees it);
//   copies       a graph of the hop's two copies only (the upload of hidden
//                states and logits, the download of ids, weights, output);
//   copies_sm    the same two copies by the SMs through the pinned buffer's
//                device mapping (kernels::cuda::LaunchMoeStageCopy, as
//                hop_graph copies);
//   sync_floor   a graph of one 4-byte memset: launch to synchronised.
// The first call of each kind is checked against the eager hop's bits (the
// graphed hop and the isolated layer must agree byte for byte) before any
// is timed.
//   moe_hop_bench [--tokens 1,8] [--iters 500] [--shape E,k,H,I] [--csv FILE]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/runtime/stream.h"
#include "server/moe/gpu_layer.h"
#include "server/moe/gpu_runner.h"
#include "tests/moe/random_moe.h"

ABSL_FLAG(std::string, tokens, "1,8", "Comma-separated tokens per call");
ABSL_FLAG(int, iters, 500, "Timed calls per (tokens, kind); medians over them");
ABSL_FLAG(std::string, shape, "128,8,2048,768",
          "The random bf16 set: experts, top-k, hidden, intermediate (default Qwen3-30B-A3B)");
ABSL_FLAG(std::string, csv, "", "Write the rows as CSV to this file");

namespace {

#define CUDA_OK(expr)                                                                  \
  do {                                                                                 \
    const cudaError_t e_ = (expr);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

template <typename T>
T Ok(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void Ok(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

using kplan::bench::Median;

// Median host wall time of `call` in us over `iters` calls, after 20 warm-up.
double TimeUs(int iters, const std::function<void()>& call) {
  for (int i = 0; i < 20; ++i) call();
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(std::move(us));
}

// Captures what `enqueue` puts on `stream` into an instantiated graph.
cudaGraphExec_t Capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  enqueue();
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphDestroy(graph));
  return exec;
}

double ReplayUs(int iters, cudaGraphExec_t exec, cudaStream_t stream) {
  return TimeUs(iters, [&] {
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
  });
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Where the server's device hop goes for small RunMoE calls: the hop as the server runs "
      "it, the layer's GPU time inside it, the layer alone, the copies alone, the sync floor.\n"
      "  moe_hop_bench [--tokens 1,8] [--iters 500] [--shape E,k,H,I] [--csv FILE]");
  absl::ParseCommandLine(argc, argv);
  using namespace kplan;
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "moe_hop_bench: no CUDA device\n");
    return 1;
  }
  std::vector<int64_t> shape;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      std::fprintf(stderr, "--shape: want E,k,H,I, got '%s'\n", absl::GetFlag(FLAGS_shape).c_str());
      return 2;
    }
    shape.push_back(v);
  }
  if (shape.size() != 4) {
    std::fprintf(stderr, "--shape: want 4 values E,k,H,I\n");
    return 2;
  }
  const int E = static_cast<int>(shape[0]), k = static_cast<int>(shape[1]);
  const int64_t H = shape[2], I = shape[3];
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  std::mt19937 rng(20261205);
  std::fprintf(stderr, "moe_hop_bench: filling %d random experts ...\n", E);
  const std::shared_ptr<ExpertSet> set = RandomExpertSet(PlainSpec("hop", E, H, I), rng);
  const std::unique_ptr<GpuExperts> gpu = Ok(GpuExperts::Create(*set, 0));
  cudaStream_t stream = static_cast<cudaStream_t>(Ok(kernels::cuda::CreateDeviceStream(0)));

  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU %s; shape E=%d k=%d H=%lld I=%lld bf16; medians of %d calls, us\n", prop.name, E,
              k, static_cast<long long>(H), static_cast<long long>(I), iters);
  std::printf("%6s %10s %8s %10s %10s %12s %8s %10s %10s %14s\n", "tokens", "hop_graph", "hop_dma",
              "hop_eager", "layer_gpu", "layer_alone", "copies", "copies_sm", "sync_floor",
              "hop-layer_gpu");
  std::FILE* csv = nullptr;
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    csv = std::fopen(absl::GetFlag(FLAGS_csv).c_str(), "w");
    if (csv == nullptr) {
      std::perror(absl::GetFlag(FLAGS_csv).c_str());
      return 1;
    }
    std::fprintf(csv,
                 "gpu,tokens,hop_graph_us,hop_dma_us,hop_eager_us,layer_gpu_us,layer_alone_us,"
                 "copies_us,copies_sm_us,sync_floor_us\n");
  }
  for (absl::string_view tok : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int64_t M = 0;
    if (!absl::SimpleAtoi(tok, &M) || M <= 0) {
      std::fprintf(stderr, "--tokens: '%s' is not a positive count\n", std::string(tok).c_str());
      return 2;
    }
    MoeRunInput in = RandomMoeInput(E, H, M, kernels::DType::kBFloat16, "Renormalize", k, rng);
    // The eager hop's bits, then the graphed hop's: the same.
    const MoeRunOutput want = Ok(RunMoeOnGpu(*gpu, in, stream));
    in.cuda_graph = true;
    for (int i = 0; i < 3; ++i) {  // eager, captured, replayed
      const MoeRunOutput got = Ok(RunMoeOnGpu(*gpu, in, stream));
      if (got.output != want.output || got.topk_ids != want.topk_ids ||
          got.topk_weights != want.topk_weights) {
        std::fprintf(stderr, "M=%lld: the graphed hop's output differs from the eager one's\n",
                     static_cast<long long>(M));
        return 1;
      }
    }
    GpuRunOptions dma;
    dma.stage_by_sm = false;
    for (int i = 0; i < 3; ++i) {
      const MoeRunOutput got = Ok(RunMoeOnGpu(*gpu, in, stream, dma));
      if (got.output != want.output || got.topk_ids != want.topk_ids ||
          got.topk_weights != want.topk_weights) {
        std::fprintf(stderr, "M=%lld: the hop by copy engines differs from the eager one\n",
                     static_cast<long long>(M));
        return 1;
      }
    }
    const double hop_graph = TimeUs(iters, [&] { Ok(RunMoeOnGpu(*gpu, in, stream)); });
    const double hop_dma = TimeUs(iters, [&] { Ok(RunMoeOnGpu(*gpu, in, stream, dma)); });
    in.cuda_graph = false;
    const double hop_eager = TimeUs(iters, [&] { Ok(RunMoeOnGpu(*gpu, in, stream)); });
    std::vector<double> layer_ms;
    for (int i = 0; i < iters; ++i) {
      GpuRunStats stats;
      Ok(RunMoeOnGpu(*gpu, in, stream, {}, &stats));
      layer_ms.push_back(stats.device_ms);
    }
    const double layer_gpu = 1e3 * Median(layer_ms);

    // The layer alone, its inputs on the device.
    // Rounded up to 256 bytes (the copy kernels move 16-byte words; the
    // output's offset in h_io stays aligned).
    const auto round256 = [](int64_t b) { return (b + 255) / 256 * 256; };
    const int64_t in_bytes = round256(M * H * 2 + M * E * 4);
    const int64_t out_bytes = round256(M * k * 8 + M * H * 2);
    const int64_t ws_bytes = MoeLayerWorkspaceBytes(*gpu, M, k, E);
    void *in_p = nullptr, *out_p = nullptr, *ws_p = nullptr, *io_p = nullptr;
    CUDA_OK(cudaMalloc(&in_p, in_bytes));
    CUDA_OK(cudaMalloc(&out_p, out_bytes));
    CUDA_OK(cudaMalloc(&ws_p, ws_bytes));
    CUDA_OK(cudaMallocHost(&io_p, in_bytes + out_bytes));
    char *d_in = static_cast<char*>(in_p), *d_out = static_cast<char*>(out_p),
         *d_ws = static_cast<char*>(ws_p), *h_io = static_cast<char*>(io_p);
    std::memcpy(h_io, in.hidden_states.data(), M * H * 2);
    std::memcpy(h_io + M * H * 2, in.router_logits.data(), M * E * 4);
    CUDA_OK(cudaMemcpy(d_in, h_io, in_bytes, cudaMemcpyHostToDevice));
    MoeLayerArgs la;
    la.num_tokens = M;
    la.top_k = k;
    la.num_experts = E;
    la.hidden = d_in;
    la.router_logits = reinterpret_cast<const float*>(d_in + M * H * 2);
    la.routing = kernels::cuda::MoeRoutingParamsOf(Ok(CheckMoeRunInput(set->spec(), in)).routing);
    la.topk_ids = reinterpret_cast<int32_t*>(d_out);
    la.topk_weights = reinterpret_cast<float*>(d_out + M * k * 4);
    la.output = d_out + M * k * 8;
    const cudaGraphExec_t layer =
        Capture(stream, [&] { Ok(EnqueueMoeLayer(*gpu, la, d_ws, ws_bytes, stream)); });
    CUDA_OK(cudaGraphLaunch(layer, stream));
    CUDA_OK(cudaMemcpyAsync(h_io + in_bytes, d_out, out_bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    if (std::memcmp(h_io + in_bytes + M * k * 8, want.output.data(), M * H * 2) != 0) {
      std::fprintf(stderr, "M=%lld: the layer alone gives other bits than the hop\n",
                   static_cast<long long>(M));
      return 1;
    }
    const double layer_alone = ReplayUs(iters, layer, stream);
    const cudaGraphExec_t copies = Capture(stream, [&] {
      CUDA_OK(cudaMemcpyAsync(d_in, h_io, in_bytes, cudaMemcpyHostToDevice, stream));
      CUDA_OK(cudaMemcpyAsync(h_io + in_bytes, d_out, out_bytes, cudaMemcpyDeviceToHost, stream));
    });
    const double copies_us = ReplayUs(iters, copies, stream);
    const cudaGraphExec_t copies_sm = Capture(stream, [&] {
      Ok(kernels::cuda::LaunchMoeStageCopy(d_in, h_io, in_bytes, stream));
      Ok(kernels::cuda::LaunchMoeStageCopy(h_io + in_bytes, d_out, out_bytes, stream));
    });
    // The kernels' copy of the output is the layer's bits (and the DMA's).
    std::memset(h_io + in_bytes, 0, out_bytes);
    CUDA_OK(cudaGraphLaunch(copies_sm, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    if (std::memcmp(h_io + in_bytes + M * k * 8, want.output.data(), M * H * 2) != 0) {
      std::fprintf(stderr, "M=%lld: the kernels' copies lost bits\n", static_cast<long long>(M));
      return 1;
    }
    const double copies_sm_us = ReplayUs(iters, copies_sm, stream);
    const cudaGraphExec_t floor =
        Capture(stream, [&] { CUDA_OK(cudaMemsetAsync(d_out, 0, 4, stream)); });
    const double sync_floor = ReplayUs(iters, floor, stream);
    std::printf("%6lld %10.1f %8.1f %10.1f %10.1f %12.1f %8.1f %10.1f %10.1f %14.1f\n",
                static_cast<long long>(M), hop_graph, hop_dma, hop_eager, layer_gpu, layer_alone,
                copies_us, copies_sm_us, sync_floor, hop_graph - layer_gpu);
    if (csv != nullptr) {
      std::fprintf(csv, "%s,%lld,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f\n", prop.name,
                   static_cast<long long>(M), hop_graph, hop_dma, hop_eager, layer_gpu, layer_alone,
                   copies_us, copies_sm_us, sync_floor);
    }
    for (cudaGraphExec_t g : {layer, copies, copies_sm, floor}) CUDA_OK(cudaGraphExecDestroy(g));
    CUDA_OK(cudaFree(d_in));
    CUDA_OK(cudaFree(d_out));
    CUDA_OK(cudaFree(d_ws));
    CUDA_OK(cudaFreeHost(h_io));
  }
  if (csv != nullptr) std::fclose(csv);
  kernels::cuda::DestroyDeviceStream(stream);
  return 0;
}
