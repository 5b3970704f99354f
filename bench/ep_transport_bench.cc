// The kplan_ep transport (kernels/comm/kplan_ep_transport.h) on 2+ GPUs at
// the DeepSeek-V3 MoE shape (H = 7168, top-8 of 256 experts, bf16), next to
// ncclAlltoAll moving the same bytes in the same run.
//
// Method, per tokens-per-rank M (the transport sized for exactly M) and CTA
// count:
//  * every rank routes its M tokens to 8 distinct uniformly random experts
//    (linear placement: 128 experts per rank on 2 GPUs);
//  * check first: one eager round with Y = the received token row (a strided
//    device copy), and every result row m*k + j must equal hidden row m;
//  * graph-replayed times: one graph of --iters Dispatches and one of --iters
//    rounds (Dispatch + Return), each replayed after ~0.2 s of warm-up, CUDA
//    events around every replay, median over --reps replays divided by
//    --iters. Return = round - dispatch. Ranks replay in lockstep (the
//    kernels' device barriers pair them); the table shows the slower rank.
//  * eager per-kernel times: the same rounds launched one by one with events
//    between the kernels (medians), as a cross-check of the subtraction;
//  * bytes per rank: Dispatch moves one row per (token, destination rank
//    owning one of its experts), Return one row per (token, slot); both
//    include the rows that stay on the rank (a local copy), "remote" is the
//    part crossing NVLink. GB/s = bytes / time (10^9 B/s).
//  * ncclAlltoAll (equal chunks, the same total bytes per rank, graph-replayed
//    the same way) for the dispatch and the return volume.
//
// Usage: ep_transport_bench [--tokens 1,128,4096] [--ctas 32,64,128]
//                           [--iters 20] [--reps 25]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "bench/bench_check.h"
#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/comm/nccl_communicator.h"
#include "kernels/cuda/runtime/status.h"

namespace {

using kplan::comm::KplanEpConfig;
using kplan::comm::KplanEpTransport;
using kplan::comm::NcclCommunicator;

constexpr int kHidden = 7168, kTopK = 8, kExperts = 256;
constexpr int64_t kRowBytes = kHidden * 2;

// NCCL errors through the build's Status mapping, then CHECK_OK.
#define CHECK_NCCL(expr) \
  CHECK_OK(kplan::kernels::cuda::NcclStatus(static_cast<int>(expr), __FILE__, __LINE__, #expr))

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

using kplan::bench::Median;

// Replays `exec` `warmup` times, then `reps` times between events; median ms
// per replay. The counts must be equal on every rank (the kernels' device
// barriers pair the ranks' launches), so they never depend on a clock.
double TimeGraph(cudaGraphExec_t exec, cudaStream_t stream, int warmup, int reps) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return Median(ms);
}

template <typename F>
cudaGraphExec_t Capture(cudaStream_t stream, F body) {
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return exec;
}

struct Result {  // per rank, per config
  double disp_ms = 0, round_ms = 0, eager_disp_ms = 0, eager_ret_ms = 0;
  double a2a_disp_ms = 0, a2a_ret_ms = 0;
  int64_t disp_rows = 0, disp_remote_rows = 0, ret_rows = 0, ret_remote_rows = 0;
  bool ok = false;
};

struct Options {
  std::vector<int> tokens{1, 128, 4096};
  std::vector<int> ctas{32, 64, 128};
  int iters = 20, reps = 25;
};

void RunRank(int rank, int size, const std::string& id, const Options& opt, std::barrier<>& bar,
             std::vector<std::vector<Result>>& results) {
  CHECK_CUDA(cudaSetDevice(rank));
  auto comm_or = NcclCommunicator::Create(rank, size, id, rank, nullptr);
  CHECK_OK(comm_or.status());
  NcclCommunicator& comm = **comm_or;
  auto stream = static_cast<cudaStream_t>(comm.stream());
  int config = 0;
  for (int M : opt.tokens) {
    // Inputs: random non-zero bf16 rows, distinct uniform experts per token.
    std::mt19937 rng(1234 + 17 * rank + M);
    std::vector<uint16_t> hidden(static_cast<size_t>(M) * kHidden);
    for (auto& h : hidden) h = static_cast<uint16_t>(0x3c00 + rng() % 0x0400);  // non-zero bf16
    std::vector<int32_t> ids(static_cast<size_t>(M) * kTopK);
    std::vector<int32_t> perm(kExperts);
    for (int m = 0; m < M; ++m) {
      for (int e = 0; e < kExperts; ++e) perm[e] = e;
      for (int j = 0; j < kTopK; ++j) {
        std::swap(perm[j], perm[j + rng() % (kExperts - j)]);
        ids[m * kTopK + j] = perm[j];
      }
    }
    void *d_hidden, *d_y;
    int32_t* d_ids;
    CHECK_CUDA(cudaMalloc(&d_hidden, hidden.size() * 2));
    CHECK_CUDA(cudaMalloc(&d_ids, ids.size() * 4));
    CHECK_CUDA(cudaMemcpy(d_hidden, hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());  // the kernels run on a non-blocking stream
    const int64_t y_rows = static_cast<int64_t>(size) * M * kTopK;
    // Warm-up replays: ~0.2 s at every M (an idle H200 clocks down).
    const int warmup = std::max(10, 1000 / (1 + M / 8));
    CHECK_CUDA(cudaMalloc(&d_y, y_rows * kRowBytes));

    // Bytes: rows per destination (experts linear: E / size per rank).
    int64_t disp_rows = 0, disp_remote = 0, ret_remote = 0;
    for (int m = 0; m < M; ++m) {
      unsigned dests = 0;
      for (int j = 0; j < kTopK; ++j) {
        const int owner = ids[m * kTopK + j] / (kExperts / size);
        dests |= 1u << owner;
        ret_remote += owner != rank;
      }
      disp_rows += __builtin_popcount(dests);
      disp_remote += __builtin_popcount(dests & ~(1u << rank));
    }

    // ncclAlltoAll of the same volumes (equal chunks), graph-replayed.
    auto a2a = [&](int64_t bytes) {
      const size_t chunk = static_cast<size_t>(bytes / size / 16 * 16);
      void *s, *r;
      CHECK_CUDA(cudaMalloc(&s, std::max<size_t>(chunk * size, 16)));
      CHECK_CUDA(cudaMalloc(&r, std::max<size_t>(chunk * size, 16)));
      // One eager call first: NCCL connects its peers lazily, which a
      // capturing stream does not allow.
      CHECK_NCCL(ncclAlltoAll(s, r, chunk, ncclUint8, comm.nccl_comm(), stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      cudaGraphExec_t g = Capture(stream, [&] {
        for (int i = 0; i < opt.iters; ++i) {
          CHECK_NCCL(ncclAlltoAll(s, r, chunk, ncclUint8, comm.nccl_comm(), stream));
        }
      });
      const double ms = TimeGraph(g, stream, warmup, opt.reps) / opt.iters;
      CHECK_CUDA(cudaGraphExecDestroy(g));
      CHECK_CUDA(cudaFree(s));
      CHECK_CUDA(cudaFree(r));
      return ms;
    };
    const double a2a_disp = a2a(disp_rows * kRowBytes);
    const double a2a_ret = a2a(static_cast<int64_t>(M) * kTopK * kRowBytes);

    for (int ctas : opt.ctas) {
      Result& res = results[rank][config++];
      res.disp_rows = disp_rows, res.disp_remote_rows = disp_remote;
      res.ret_rows = static_cast<int64_t>(M) * kTopK, res.ret_remote_rows = ret_remote;
      res.a2a_disp_ms = a2a_disp, res.a2a_ret_ms = a2a_ret;
      KplanEpConfig cfg;
      cfg.max_tokens_per_rank = M;
      cfg.top_k = kTopK;
      cfg.hidden = kHidden;
      cfg.num_experts = kExperts;
      cfg.num_ctas = ctas;
      auto t_or = KplanEpTransport::Create(comm, cfg);
      CHECK_OK(t_or.status());
      KplanEpTransport& t = **t_or;

      // Check: Y = recv token row for every slot, result row m*k + j == hidden row m.
      CHECK_OK(t.Dispatch(stream, d_hidden, d_ids, M));
      for (int j = 0; j < kTopK; ++j) {
        CHECK_CUDA(cudaMemcpy2DAsync(static_cast<char*>(d_y) + j * kRowBytes, kTopK * kRowBytes,
                                     t.recv_rows(), kRowBytes, kRowBytes, t.recv_tokens(),
                                     cudaMemcpyDeviceToDevice, stream));
      }
      CHECK_OK(t.Return(stream, d_y));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      std::vector<uint16_t> result(static_cast<size_t>(M) * kTopK * kHidden);
      CHECK_CUDA(
          cudaMemcpy(result.data(), t.result_rows(), result.size() * 2, cudaMemcpyDeviceToHost));
      res.ok = true;
      for (int64_t p = 0; p < static_cast<int64_t>(M) * kTopK && res.ok; ++p) {
        res.ok = std::memcmp(&result[p * kHidden], &hidden[(p / kTopK) * kHidden], kRowBytes) == 0;
      }

      cudaGraphExec_t g_disp = Capture(stream, [&] {
        for (int i = 0; i < opt.iters; ++i) CHECK_OK(t.Dispatch(stream, d_hidden, d_ids, M));
      });
      res.disp_ms = TimeGraph(g_disp, stream, warmup, opt.reps) / opt.iters;
      CHECK_OK(t.Return(stream, d_y));  // re-arms the recv ids
      cudaGraphExec_t g_round = Capture(stream, [&] {
        for (int i = 0; i < opt.iters; ++i) {
          CHECK_OK(t.Dispatch(stream, d_hidden, d_ids, M));
          CHECK_OK(t.Return(stream, d_y));
        }
      });
      res.round_ms = TimeGraph(g_round, stream, warmup, opt.reps) / opt.iters;
      CHECK_CUDA(cudaGraphExecDestroy(g_disp));
      CHECK_CUDA(cudaGraphExecDestroy(g_round));

      // Eager, events between the kernels.
      const int n = opt.iters * 2;
      std::vector<cudaEvent_t> ev(2 * n + 1);
      for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
      CHECK_CUDA(cudaEventRecord(ev[0], stream));
      for (int i = 0; i < n; ++i) {
        CHECK_OK(t.Dispatch(stream, d_hidden, d_ids, M));
        CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
        CHECK_OK(t.Return(stream, d_y));
        CHECK_CUDA(cudaEventRecord(ev[2 * i + 2], stream));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      std::vector<double> d_ms, r_ms;
      for (int i = n / 4; i < n; ++i) {  // the first quarter warms up
        float a = 0, b = 0;
        CHECK_CUDA(cudaEventElapsedTime(&a, ev[2 * i], ev[2 * i + 1]));
        CHECK_CUDA(cudaEventElapsedTime(&b, ev[2 * i + 1], ev[2 * i + 2]));
        d_ms.push_back(a), r_ms.push_back(b);
      }
      for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));
      res.eager_disp_ms = Median(d_ms), res.eager_ret_ms = Median(r_ms);
      bar.arrive_and_wait();  // every rank done with this transport before it is destroyed
      if (rank == 0) std::printf("M=%d ctas=%d measured\n", M, ctas);
    }
    CHECK_CUDA(cudaFree(d_hidden));
    CHECK_CUDA(cudaFree(d_ids));
    CHECK_CUDA(cudaFree(d_y));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokens")
      opt.tokens = ParseList(argv[i + 1]);
    else if (flag == "--ctas")
      opt.ctas = ParseList(argv[i + 1]);
    else if (flag == "--iters")
      opt.iters = std::atoi(argv[i + 1]);
    else if (flag == "--reps")
      opt.reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  int size = 0;
  CHECK_CUDA(cudaGetDeviceCount(&size));
  size = std::min(size, 2);
  if (size < 2) {
    std::fprintf(stderr, "ep_transport_bench needs 2 GPUs, found %d\n", size);
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int nccl_version = 0;
  CHECK_NCCL(ncclGetVersion(&nccl_version));
  std::printf(
      "kplan_ep transport vs ncclAlltoAll: %d x %s, NCCL %d, H=%d top-%d of %d, bf16, "
      "iters %d, reps %d\n",
      size, prop.name, nccl_version, kHidden, kTopK, kExperts, opt.iters, opt.reps);
  auto id = NcclCommunicator::CreateUniqueId();
  CHECK_OK(id.status());
  const size_t configs = opt.tokens.size() * opt.ctas.size();
  std::vector<std::vector<Result>> results(size, std::vector<Result>(configs));
  std::barrier<> bar(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { RunRank(r, size, *id, opt, bar, results); });
  }
  for (auto& t : threads) t.join();

  auto us = [](double ms) { return ms * 1e3; };
  auto gbps = [](int64_t bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0; };
  std::printf(
      "\n| M/rank | CTAs | check | dispatch MB (remote) | dispatch us | GB/s | a2a us | a2a GB/s "
      "| return MB (remote) | return us | GB/s | a2a us | a2a GB/s | round us "
      "| eager disp us | eager ret us |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  size_t c = 0;
  for (int M : opt.tokens) {
    for (int ctas : opt.ctas) {
      Result w;  // the slower rank per column
      bool ok = true;
      for (int r = 0; r < size; ++r) {
        const Result& x = results[r][c];
        ok = ok && x.ok;
        w.disp_ms = std::max(w.disp_ms, x.disp_ms);
        w.round_ms = std::max(w.round_ms, x.round_ms);
        w.eager_disp_ms = std::max(w.eager_disp_ms, x.eager_disp_ms);
        w.eager_ret_ms = std::max(w.eager_ret_ms, x.eager_ret_ms);
        w.a2a_disp_ms = std::max(w.a2a_disp_ms, x.a2a_disp_ms);
        w.a2a_ret_ms = std::max(w.a2a_ret_ms, x.a2a_ret_ms);
      }
      const Result& r0 = results[0][c];
      const int64_t db = r0.disp_rows * kRowBytes, rb = r0.ret_rows * kRowBytes;
      const double ret_ms = w.round_ms - w.disp_ms;
      std::printf(
          "| %d | %d | %s | %.2f (%.2f) | %.1f | %.1f | %.1f | %.1f | %.2f (%.2f) | %.1f | "
          "%.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
          M, ctas, ok ? "ok" : "FAIL", db / 1e6, r0.disp_remote_rows * kRowBytes / 1e6,
          us(w.disp_ms), gbps(db, w.disp_ms), us(w.a2a_disp_ms), gbps(db, w.a2a_disp_ms), rb / 1e6,
          r0.ret_remote_rows * kRowBytes / 1e6, us(ret_ms), gbps(rb, ret_ms), us(w.a2a_ret_ms),
          gbps(rb, w.a2a_ret_ms), us(w.round_ms), us(w.eager_disp_ms), us(w.eager_ret_ms));
      ++c;
    }
  }
  return 0;
}
