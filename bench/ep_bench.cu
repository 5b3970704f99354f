// Expert-parallel dispatch on two GPUs (server/moe/ep/gpu_ep.h): what each
// strategy's communication costs, next to NCCL's own all-to-all, and the
// layer on 2 GPUs against the same layer on 1.
//
// Shape: DeepSeek-V3 (E=256, top-8, H=7168, I=2048, bf16, silu), experts
// placed linearly (128 per GPU), softmax top-8 renormalised routing from
// random logits (so about half of every token's slots live on the other GPU).
// For M tokens per rank (default 1, 128, 4096):
//  * per strategy, both ranks run RunMoeExpertParallelOnGpu from their own
//    threads (inputs and outputs in pinned host memory), W warm-up steps then
//    N timed steps; the step's own CUDA events on the communicator's stream
//    split it into prologue (header exchange, upload, routing), dispatch,
//    experts, combine (incl. the final combine / cast kernels), download.
//    comm = dispatch + combine; bytes = payload bytes rank 0 sent to the
//    other GPU in them (rows, ids, weights, partial sums: what the strategy
//    must move, not NCCL's protocol overhead); GB/s = bytes / comm. Medians
//    over the N steps of rank 0; the layer time is the median of
//    max(rank 0, rank 1) of dispatch + experts + combine.
//  * NCCL all-to-all: ncclAlltoAll with equal chunks, per rank the volume the
//    kplan_all2allv dispatch sends to the other GPU (chunk = that volume);
//    events around each call, median of N; GB/s = chunk / time.
//  * 1 GPU: EnqueueMoeLayer with all 256 experts on GPU 0 over the 2M tokens
//    of both ranks (routing -> combine), events, median of N.
//  * passthrough (moe_backend kplan_ep): the kplan_ep transport sized for
//    exactly M tokens per rank (ReserveGpuEpWorkspace before the M's steps;
//    the transport is created in the first warm-up step). No host collective
//    in the step; its bytes: rank 0's dispatched rows (one per token and
//    remote destination, plus the ids) and the expert rows it gets back.
// Before anything is timed, ~2 s of single-GPU layers warm the clocks. The
// last lines compare the EP layer times (the issue's goal: passthrough below
// both NCCL strategies at <= 128 tokens per rank).
//
// Usage: ep_bench [--tokens 1,128,4096] [--iters 40] [--warmup 5]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "bench/bench_check.h"
#include "kernels/comm/nccl_communicator.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "server/moe/ep/gpu_ep.h"
#include "server/moe/expert_set.h"
#include "server/moe/gpu_layer.h"
#include "server/moe/gpu_runner.h"
#include "server/moe/moe_runner.h"

namespace {

using kplan::GpuExperts;
using kplan::kernels::DType;
using kplan::moe::ep::EpStrategy;
using kplan::moe::ep::GpuEpLayer;
using kplan::moe::ep::GpuEpStats;
using kplan::moe::ep::GpuEpWorkspace;
using Clock = std::chrono::steady_clock;
namespace kc = kplan::kernels::cuda;

#define CHECK_NCCL(expr)                                                                          \
  do {                                                                                            \
    ncclResult_t _r = (expr);                                                                     \
    if (_r != ncclSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, ncclGetErrorString(_r)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

constexpr int kRanks = 2;
constexpr int kE = 256, kK = 8;
constexpr int64_t kH = 7168, kI = 2048;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// n non-zero bf16 ±(1 + m/128)·2^(base - 0..3), by threads.
void RandomBf16(char* dst, int64_t n, int base, uint64_t key) {
  const int threads =
      static_cast<int>(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
      for (int64_t i = b; i < e; ++i) {
        const uint32_t r = static_cast<uint32_t>(Mix(key + static_cast<uint64_t>(i)));
        const uint16_t v =
            static_cast<uint16_t>((r & 0x8000) | ((127 + base - (r & 3)) << 7) | ((r >> 2) & 127));
        std::memcpy(dst + i * 2, &v, 2);
      }
    });
  }
  for (auto& th : pool) th.join();
}

std::string RandomBf16String(int64_t n, int base, uint64_t key) {
  std::string s(static_cast<size_t>(n * 2), '\0');
  RandomBf16(s.data(), n, base, key);
  return s;
}

using kplan::bench::Median;

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// Pinned host buffer.
struct Pinned {
  explicit Pinned(size_t bytes) { CHECK_CUDA(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), 0)); }
  ~Pinned() { cudaFreeHost(p); }
  void* p = nullptr;
};

struct StageMedians {
  double dispatch = 0, experts = 0, combine = 0, prologue = 0, download = 0, total = 0;
  double layer = 0;  // max over ranks of dispatch + experts + combine
  int64_t dispatch_bytes = 0, combine_bytes = 0;
  int allocations_during_timing = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> tokens = {1, 128, 4096};
  int iters = 40, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc)
      tokens = ParseList(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: ep_bench [--tokens 1,128,4096] [--iters 40] [--warmup 5]\n");
      return 2;
    }
  }
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < kRanks) {
    std::fprintf(stderr, "ep_bench needs two GPUs, found %d\n", devices);
    return 1;
  }
  const auto t_setup = Clock::now();
  // --- Experts: one host set, all of it on GPU 0, a slice per rank.
  kplan::ExpertsSpec spec;
  spec.experts_id = "deepseek-v3";
  spec.num_experts = kE;
  spec.hidden = kH;
  spec.intermediate = kI;
  spec.dtype = kplan::kernels::DType::kBFloat16;
  std::map<std::string, std::string> tensors;
  tensors["w13"] = RandomBf16String(kE * 2 * kI * kH, -7, 1);
  tensors["w2"] = RandomBf16String(kE * kH * kI, -6, 2);
  kplan::ExpertSet set(spec, std::move(tensors));
  auto full_or = GpuExperts::Create(set, 0);
  CHECK_OK(full_or.status());
  std::unique_ptr<GpuExperts> full = std::move(*full_or);
  auto placement = *kplan::moe::ep::ExpertPlacement::Linear(kE, kRanks);
  std::vector<std::unique_ptr<GpuExperts>> slices;
  std::vector<std::unique_ptr<GpuEpWorkspace>> workspaces;
  std::vector<GpuEpLayer> layers;
  for (int r = 0; r < kRanks; ++r) {
    auto s = GpuExperts::Create(set, r, placement.FirstExpert(r), placement.NumLocalExperts(r));
    CHECK_OK(s.status());
    slices.push_back(std::move(*s));
    workspaces.push_back(std::make_unique<GpuEpWorkspace>(r));
    GpuEpLayer L;
    L.hidden = kH;
    L.intermediate = kI;
    L.num_experts = kE;
    L.top_k = kK;
    L.act_dtype = kplan::kernels::DType::kBFloat16;
    L.activation = set.activation();
    L.placement = placement;
    L.local_experts = slices.back().get();
    L.workspace = workspaces.back().get();
    layers.push_back(L);
  }
  // --- Communicators: the step's (one NcclCommunicator per rank) and a raw
  // NCCL pair for ncclAlltoAll.
  auto id = kplan::comm::NcclCommunicator::CreateUniqueId();
  CHECK_OK(id.status());
  std::vector<std::unique_ptr<kplan::moe::ep::GpuEpCommunicator>> comms(kRanks);
  {
    std::vector<std::thread> th;
    for (int r = 0; r < kRanks; ++r) {
      th.emplace_back([&, r] {
        CHECK_CUDA(cudaSetDevice(r));
        auto c = kplan::comm::NcclCommunicator::Create(r, kRanks, *id, r, nullptr);
        CHECK_OK(c.status());
        comms[r] = std::make_unique<kplan::moe::ep::GpuEpCommunicator>(std::move(*c));
      });
    }
    for (auto& t : th) t.join();
  }
  ncclComm_t raw[kRanks];
  const int devs[kRanks] = {0, 1};
  CHECK_NCCL(ncclCommInitAll(raw, kRanks, devs));
  cudaStream_t raw_stream[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaStreamCreateWithFlags(&raw_stream[r], cudaStreamNonBlocking));
  }
  std::printf("setup (weights %.1f GB on GPU 0, %.1f GB per rank) %.1f s\n", full->bytes() / 1e9,
              slices[0]->bytes() / 1e9,
              std::chrono::duration<double>(Clock::now() - t_setup).count());

  const int64_t max_m = *std::max_element(tokens.begin(), tokens.end());
  // --- Single-GPU buffers for 2 * max_m tokens.
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t s0;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  const int64_t max_total = kRanks * max_m;
  void *d_hidden = nullptr, *d_out = nullptr, *d_ws = nullptr;
  float *d_logits = nullptr, *d_w = nullptr;
  int32_t* d_ids = nullptr;
  const int64_t ws_bytes = kplan::MoeLayerWorkspaceBytes(*full, max_total, kK, kE);
  CHECK_CUDA(cudaMalloc(&d_hidden, max_total * kH * 2));
  CHECK_CUDA(cudaMalloc(&d_out, max_total * kH * 2));
  CHECK_CUDA(cudaMalloc(&d_ws, ws_bytes));
  CHECK_CUDA(cudaMalloc(&d_logits, max_total * kE * 4));
  CHECK_CUDA(cudaMalloc(&d_w, max_total * kK * 4));
  CHECK_CUDA(cudaMalloc(&d_ids, max_total * kK * 4));
  kc::MoeRoutingParams rp;  // RenormalizeNaive: softmax, top-k, renormalise
  rp.num_experts = kE;
  rp.top_k = kK;
  rp.method = kplan::kernels::RoutingMethod::kTopK;
  rp.scoring = kplan::kernels::ScoringFunc::kSoftmax;
  rp.renormalize = true;
  kplan::moe::RoutingSpec host_spec;
  host_spec.num_experts = kE;
  host_spec.top_k = kK;
  host_spec.method = kplan::moe::RoutingMethod::kTopK;
  host_spec.scoring = kplan::moe::ScoringFunc::kSoftmax;
  host_spec.renormalize = true;

  auto single_layer = [&](int64_t M) {
    kplan::MoeLayerArgs a;
    a.num_tokens = M;
    a.top_k = kK;
    a.num_experts = kE;
    a.hidden = d_hidden;
    a.router_logits = d_logits;
    a.routing = rp;
    a.topk_ids = d_ids;
    a.topk_weights = d_w;
    a.output = d_out;
    CHECK_OK(kplan::EnqueueMoeLayer(*full, a, d_ws, ws_bytes, s0));
  };

  // --- Clock warm-up.
  {
    const int64_t M = std::min<int64_t>(max_total, 4096);
    std::vector<float> logits(M * kE);
    for (int64_t i = 0; i < M * kE; ++i) logits[i] = (Mix(i) >> 40) / 16777216.0f * 6 - 3;
    std::string h = RandomBf16String(M * kH, -1, 3);
    CHECK_CUDA(cudaMemcpy(d_hidden, h.data(), M * kH * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_logits, logits.data(), M * kE * 4, cudaMemcpyHostToDevice));
    const auto t0 = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - t0).count() < 2.0) {
      for (int i = 0; i < 10; ++i) single_layer(M);
      CHECK_CUDA(cudaStreamSynchronize(s0));
    }
  }

  std::printf("\nnvidia-smi topo: see the request output. NCCL_NVLS_ENABLE=%s\n",
              std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
  std::printf(
      "\nDeepSeek-V3 MoE layer (E=256, top-8, H=7168, I=2048, bf16) on 2 GPUs; medians of "
      "%d steps after %d warm-up\n\n",
      iters, warmup);
  std::printf(
      "| tokens/rank | path | dispatch ms | combine ms | comm ms | bytes sent/rank | comm "
      "GB/s | experts ms | EP layer ms | EP step ms (host->host) | 1-GPU layer ms | "
      "1-GPU/EP | vs 1 GPU |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");

  std::map<std::pair<int64_t, EpStrategy>, double> layer_ms;
  for (const int64_t M : tokens) {
    const int64_t total = kRanks * M;
    // Inputs of both ranks, pinned.
    Pinned hidden(total * kH * 2), logits(total * kE * 4), out(total * kH * 2);
    RandomBf16(static_cast<char*>(hidden.p), total * kH, -1, 1000 + M);
    float* lg = static_cast<float*>(logits.p);
    for (int64_t i = 0; i < total * kE; ++i) lg[i] = (Mix(77 * M + i) >> 40) / 16777216.0f * 6 - 3;

    // 1 GPU.
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMemcpy(d_hidden, hidden.p, total * kH * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_logits, logits.p, total * kE * 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < warmup; ++i) single_layer(total);
    std::vector<double> one;
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaEventRecord(e0, s0));
      single_layer(total);
      CHECK_CUDA(cudaEventRecord(e1, s0));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      one.push_back(ms);
    }
    const double one_ms = Median(one);
    std::string one_out(total * kH * 2, '\0');
    CHECK_CUDA(cudaMemcpy(one_out.data(), d_out, total * kH * 2, cudaMemcpyDeviceToHost));

    // The EP strategies.
    int64_t a2av_dispatch_bytes = 0;
    for (int r = 0; r < kRanks; ++r) {  // passthrough capacity: M tokens per rank
      CHECK_OK(
          kplan::moe::ep::ReserveGpuEpWorkspace(layers[r], kRanks, M, EpStrategy::kPassthrough));
    }
    for (EpStrategy strategy :
         {EpStrategy::kAll2AllV, EpStrategy::kAllGatherReduceScatter, EpStrategy::kPassthrough}) {
      std::vector<std::vector<GpuEpStats>> stats(kRanks);
      std::vector<std::vector<double>> wall(kRanks);
      std::vector<std::thread> th;
      for (int r = 0; r < kRanks; ++r) {
        th.emplace_back([&, r] {
          CHECK_CUDA(cudaSetDevice(r));
          kplan::moe::ep::MoeInputsForThisRank in;
          in.num_tokens = M;
          in.hidden_states = static_cast<char*>(hidden.p) + r * M * kH * 2;
          in.router_logits = static_cast<float*>(logits.p) + r * M * kE;
          in.routing = host_spec;
          in.output = static_cast<char*>(out.p) + r * M * kH * 2;
          for (int i = 0; i < warmup + iters; ++i) {
            GpuEpStats st;
            const auto t0 = Clock::now();
            CHECK_OK(
                kplan::moe::ep::RunMoeExpertParallelOnGpu(layers[r], in, *comms[r], strategy, &st));
            if (i >= warmup) {
              wall[r].push_back(
                  std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
              stats[r].push_back(st);
            }
          }
        });
      }
      for (auto& t : th) t.join();
      StageMedians m;
      std::vector<double> d, x, c, layer;
      for (int i = 0; i < iters; ++i) {
        const GpuEpStats& s = stats[0][i];
        d.push_back(s.dispatch_ms);
        x.push_back(s.experts_ms);
        c.push_back(s.combine_ms);
        double lmax = 0;
        for (int r = 0; r < kRanks; ++r) {
          const GpuEpStats& q = stats[r][i];
          lmax = std::max<double>(lmax, q.dispatch_ms + q.experts_ms + q.combine_ms);
        }
        layer.push_back(lmax);
      }
      m.dispatch = Median(d);
      m.experts = Median(x);
      m.combine = Median(c);
      m.layer = Median(layer);
      m.total = std::max(Median(wall[0]), Median(wall[1]));
      m.dispatch_bytes = stats[0].back().dispatch_bytes_sent;
      m.combine_bytes = strategy == EpStrategy::kPassthrough
                            ? stats[0].back().combine_bytes_received  // rows rank 0 got back
                            : stats[0].back().combine_bytes_sent;
      layer_ms[{M, strategy}] = m.layer;
      m.allocations_during_timing =
          stats[0].back().workspace_allocations - stats[0].front().workspace_allocations;
      if (strategy == EpStrategy::kAll2AllV) a2av_dispatch_bytes = m.dispatch_bytes;
      // Check against the single GPU (same routing kernel, same inputs).
      double d2 = 0, r2 = 0;
      const bool exact = std::memcmp(out.p, one_out.data(), total * kH * 2) == 0;
      for (int64_t i = 0; i < total * kH && !exact; ++i) {
        const float g = kplan::moe::LoadFloat(out.p, kplan::kernels::DType::kBFloat16, i);
        const float r = kplan::moe::LoadFloat(one_out.data(), kplan::kernels::DType::kBFloat16, i);
        d2 += (double(g) - r) * (double(g) - r);
        r2 += double(r) * r;
      }
      char check[64];
      if (exact) {
        std::snprintf(check, sizeof(check), "bit-exact");
      } else {
        std::snprintf(check, sizeof(check), "rel %.1e", std::sqrt(d2 / std::max(r2, 1e-300)));
      }
      const double comm_ms = m.dispatch + m.combine;
      const double bytes = static_cast<double>(m.dispatch_bytes + m.combine_bytes);
      std::printf(
          "| %lld | %s | %.3f | %.3f | %.3f | %.2f MB | %.1f | %.3f | %.3f | %.3f | %.3f | "
          "%.2fx | %s |%s\n",
          static_cast<long long>(M), std::string(EpStrategyName(strategy)).c_str(), m.dispatch,
          m.combine, comm_ms, bytes / 1e6, bytes / (comm_ms * 1e-3) / 1e9, m.experts, m.layer,
          m.total, one_ms, one_ms / m.layer, check,
          m.allocations_during_timing ? " (allocated while timed!)" : "");
      std::fflush(stdout);
    }

    // NCCL all-to-all of the same volume: chunk = the a2av dispatch bytes per peer.
    {
      const size_t chunk = std::max<int64_t>(a2av_dispatch_bytes, 16);
      void* sb[kRanks];
      void* rb[kRanks];
      cudaEvent_t ea[kRanks], eb[kRanks];
      for (int r = 0; r < kRanks; ++r) {
        CHECK_CUDA(cudaSetDevice(r));
        CHECK_CUDA(cudaMalloc(&sb[r], chunk * kRanks));
        CHECK_CUDA(cudaMalloc(&rb[r], chunk * kRanks));
        CHECK_CUDA(cudaMemset(sb[r], 1, chunk * kRanks));
        CHECK_CUDA(cudaEventCreate(&ea[r]));
        CHECK_CUDA(cudaEventCreate(&eb[r]));
      }
      auto run = [&](bool timed) {
        for (int r = 0; r < kRanks; ++r) {
          CHECK_CUDA(cudaSetDevice(r));
          if (timed) CHECK_CUDA(cudaEventRecord(ea[r], raw_stream[r]));
        }
        CHECK_NCCL(ncclGroupStart());
        for (int r = 0; r < kRanks; ++r) {
          CHECK_NCCL(ncclAlltoAll(sb[r], rb[r], chunk, ncclUint8, raw[r], raw_stream[r]));
        }
        CHECK_NCCL(ncclGroupEnd());
        for (int r = 0; r < kRanks; ++r) {
          CHECK_CUDA(cudaSetDevice(r));
          if (timed) CHECK_CUDA(cudaEventRecord(eb[r], raw_stream[r]));
        }
        for (int r = 0; r < kRanks; ++r) {
          CHECK_CUDA(cudaSetDevice(r));
          CHECK_CUDA(cudaStreamSynchronize(raw_stream[r]));
        }
      };
      for (int i = 0; i < warmup; ++i) run(false);
      std::vector<double> t;
      for (int i = 0; i < iters; ++i) {
        run(true);
        double worst = 0;
        for (int r = 0; r < kRanks; ++r) {
          float ms = 0;
          CHECK_CUDA(cudaEventElapsedTime(&ms, ea[r], eb[r]));
          worst = std::max<double>(worst, ms);
        }
        t.push_back(worst);
      }
      const double ms = Median(t);
      std::printf(
          "| %lld | ncclAlltoAll (same volume as the all2allv dispatch) | | | %.3f | %.2f MB "
          "| %.1f | | | | | | |\n",
          static_cast<long long>(M), ms, chunk / 1e6, chunk / (ms * 1e-3) / 1e9);
      for (int r = 0; r < kRanks; ++r) {
        CHECK_CUDA(cudaSetDevice(r));
        cudaFree(sb[r]);
        cudaFree(rb[r]);
        cudaEventDestroy(ea[r]);
        cudaEventDestroy(eb[r]);
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  for (int r = 0; r < kRanks; ++r) ncclCommDestroy(raw[r]);
  std::printf(
      "\nGoal (issue #6): passthrough EP layer below both NCCL strategies at <= 128 "
      "tokens/rank\n");
  for (const int64_t M : tokens) {
    const double pt = layer_ms[{M, EpStrategy::kPassthrough}];
    const double a2av = layer_ms[{M, EpStrategy::kAll2AllV}];
    const double agrs = layer_ms[{M, EpStrategy::kAllGatherReduceScatter}];
    std::printf(
        "  %lld tokens/rank: passthrough %.3f ms, kplan_all2allv %.3f ms, "
        "allgather_reducescatter %.3f ms -> %s%s\n",
        static_cast<long long>(M), pt, a2av, agrs,
        pt < std::min(a2av, agrs) ? "passthrough fastest" : "passthrough NOT fastest",
        M <= 128 ? " (goal applies)" : "");
  }
  {  // the transports' teardown is collective: one thread per rank
    std::vector<std::thread> th;
    for (auto& c : comms) th.emplace_back([&c] { c.reset(); });
    for (auto& t : th) t.join();
  }
  std::printf(
      "\ncomm = dispatch + combine stage times (events on the communicator stream, "
      "rank 0; include the small layout kernels and the host waits of each "
      "collective). EP layer = dispatch + experts + combine, max over ranks. "
      "1-GPU layer = EnqueueMoeLayer over both ranks' tokens on GPU 0.\n");
  return 0;
}
