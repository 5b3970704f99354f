// The fp8 e4m3 block-scaled grouped GEMMs of the MoE layer at the
// DeepSeek-V3 shape (E=256, top-8, H=7168, I=2048; 128 x 128 weight blocks,
// 1 x 128 activation groups), against a dense fp8 cuBLASLt GEMM of the same
// K and the same useful FLOPs in the same run:
//   GEMM 1: C1[slot] = A[slot / 8] · W13[e]ᵀ   N = 2I = 4096, K = 7168
//   GEMM 2: Y[slot]  = A2[slot]    · W2[e]ᵀ    N = 7168,     K = 2048
// Routing: softmax top-8 over random logits (LaunchMoeRouting), then
// moe_align_block_size with 128-slot blocks. Random fp8 operands (never NaN)
// and scales generated on the device. Kernels:
//   ws_fp8   LaunchMoeGroupedGemmWsFp8 (moe_gemm_ws_fp8.h), the new one
//   tc_fp8   LaunchMoeGroupedGemm with fp8 (moe_gemm_sm90.cu), the layer's
//            fp8 GEMM before (KPLAN_MOE_FP8_GEMM=old)
//   emul     LaunchMoeQuantGemm (moe_quant_gemm.h), the emulation kernel
//   cublasLt dense [numel, K] x [N, K]ᵀ, e4m3 in, bf16 out, fp32 compute
// The floor of each grouped GEMM: the larger of the dense GEMM's time (the
// same FLOPs) and the time to read the weights (and block scales) of the
// experts the routing hits at the device-copy roofline measured in the same
// run (copy_roofline.cuh); a dense GEMM reads one expert's worth of weights.
// Each grouped kernel's output (poisoned with NaN first) is checked against
// the emulation kernel's: ‖d‖/‖ref‖ and the count of NaN (unwritten) values.
// Times: CUDA events around batches of launches after a warm-up, medians.
// Usage: moe_fp8_gemm_bench [--tokens 4096] [--json out.json] [--warmup_s 3]
//        [--kernels ws_fp8,tc_fp8,emul,cublasLt]  (the ones timed; each grouped one checked)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/copy_roofline.cuh"
#include "bench/cublas_check.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"

namespace kc = kplan::kernels::cuda;
using kplan::kernels::DType;

namespace {

__device__ __forceinline__ uint64_t Hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Random e4m3 bytes (every finite value, never NaN).
__global__ void FillFp8(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint8_t b = static_cast<uint8_t>(Hash(seed ^ (static_cast<uint64_t>(i) * 0x100000001b3ull)));
    if ((b & 0x7f) == 0x7f) b ^= 0x08;
    p[i] = b;
  }
}
// lo + (hi - lo) · u, u uniform in [0, 1).
__global__ void FillF32(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(Hash(seed + 7919 * i) >> 40) / 16777216.0f;
    p[i] = lo + (hi - lo) * u;
  }
}
// sums[0] += Σ (x - r)², sums[1] += Σ r², sums[2] += count(isnan(x)), over bf16 x / r.
__global__ void Compare(const __nv_bfloat16* x, const __nv_bfloat16* r, int64_t n, double* sums) {
  double d = 0.0, s = 0.0, bad = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float a = __bfloat162float(x[i]), b = __bfloat162float(r[i]);
    if (isnan(a) || isnan(b)) {
      bad += 1.0;
      continue;
    }
    d += double(a - b) * (a - b);
    s += double(b) * b;
  }
  atomicAdd(&sums[0], d);
  atomicAdd(&sums[1], s);
  atomicAdd(&sums[2], bad);
}

void* Alloc(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

// Dense D[M, N] = X[M, K] · W[N, K]ᵀ in e4m3 -> bf16 (column-major: D^T = W · X^T, "TN").
struct DenseFp8 {
  cublasLtHandle_t lt{};
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = 64 << 20;
  void *x = nullptr, *w = nullptr, *d = nullptr;
  int64_t M = 0, N = 0, K = 0;
  DenseFp8(int64_t m, int64_t n, int64_t k) : M(m), N(n), K(k) {
    CHECK_CUBLAS(cublasLtCreate(&lt));
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K));  // W as K x N
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, M, K));  // X as K x M
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));     // D as N x M
    ws = Alloc(ws_bytes);
    x = Alloc(M * K);
    w = Alloc(N * K);
    d = Alloc(M * N * 2);
    FillFp8<<<1024, 256>>>(static_cast<uint8_t*>(x), M * K, 11);
    FillFp8<<<1024, 256>>>(static_cast<uint8_t*>(w), N * K, 12);
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &h, &found));
    if (found < 1) {
      std::fprintf(stderr, "cublasLt: no fp8 algorithm\n");
      std::exit(1);
    }
    algo = h.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void Run(cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    CHECK_CUBLAS(
        cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, d, lc, d, lc, &algo, ws, ws_bytes, s));
  }
  ~DenseFp8() {
    cudaFree(ws);
    cudaFree(x);
    cudaFree(w);
    cudaFree(d);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
  }
};

struct Row {
  std::string gemm, kernel;
  double ms = 0, tflops = 0, vs_dense = 0, vs_floor = 0, rel_err = -1, nan = -1;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 4096;
  std::string json;
  double warmup_s = 3.0;
  std::string kernels = "ws_fp8,tc_fp8,emul,cublasLt";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--tokens")
      M = std::atoll(v.c_str());
    else if (f == "--json")
      json = v;
    else if (f == "--warmup_s")
      warmup_s = std::atof(v.c_str());
    else if (f == "--kernels")
      kernels = v;
    else {
      std::fprintf(stderr,
                   "usage: %s [--tokens N] [--json PATH] [--warmup_s S] "
                   "[--kernels ws_fp8,tc_fp8,emul,cublasLt]\n",
                   argv[0]);
      return 2;
    }
  }
  const int E = 256, topk = 8;
  const int64_t H = 7168, I = 2048, numel = M * topk;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; DeepSeek-V3 fp8 block, %lld tokens, %lld slots\n", prop.name,
              prop.multiProcessorCount, static_cast<long long>(M), static_cast<long long>(numel));

  // Routing and alignment (128-slot blocks, as the layer at this size).
  float* logits = static_cast<float*>(Alloc(M * E * 4));
  FillF32<<<1024, 256, 0, stream>>>(logits, M * E, 1, -4.0f, 4.0f);
  float* topk_w = static_cast<float*>(Alloc(numel * 4));
  int32_t* topk_ids = static_cast<int32_t*>(Alloc(numel * 4));
  kc::MoeRoutingParams rp;
  rp.num_experts = E;
  rp.top_k = topk;
  rp.renormalize = true;
  CHECK_OK(kc::LaunchMoeRouting(rp, logits, M, topk_w, topk_ids, stream));
  constexpr int kBlockM = 128;
  const int64_t max_padded = kc::MoeAlignMaxPadded(numel, E, kBlockM, false);
  const int64_t max_blocks = kc::MoeAlignMaxBlocks(numel, E, kBlockM, false);
  int32_t* sorted = static_cast<int32_t*>(Alloc(max_padded * 4));
  int32_t* eids = static_cast<int32_t*>(Alloc(max_blocks * 4));
  int32_t* post = static_cast<int32_t*>(Alloc(4));
  CHECK_OK(kc::LaunchMoeAlignBlockSize(topk_ids, numel, kBlockM, E, nullptr, false, false, sorted,
                                       eids, post, nullptr, stream));
  int32_t padded = 0;
  CHECK_CUDA(cudaMemcpyAsync(&padded, post, 4, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::printf("slots %lld, padded to %d (%.3fx) in %d blocks of %d\n",
              static_cast<long long>(numel), padded, double(padded) / numel, padded / kBlockM,
              kBlockM);
  const int hit = ExpertsHit(topk_ids, numel);  // their weights are read
  const double copy_gbps = MeasureCopyRoofline(size_t{1} << 30, prop.multiProcessorCount, stream);
  if (copy_gbps <= 0) {
    std::fprintf(stderr, "no copy kernel produced the right output\n");
    return 1;
  }
  std::printf("experts hit %d of %d; copy roofline %.0f GB/s\n", hit, E, copy_gbps);

  struct Gemm {
    const char* name;
    int64_t a_rows, N, K;
    int a_row_div;
  } gemms[2] = {{"gemm1", M, 2 * I, H, topk}, {"gemm2", numel, H, I, 1}};

  std::vector<Row> rows;
  double dense_total_ms = 0.0;  // measured in every run, timed or not
  double floor_total_ms = 0.0;
  std::vector<DenseFp8*> dense;
  for (const Gemm& gm : gemms) dense.push_back(new DenseFp8(numel, gm.N, gm.K));
  // Warm-up: dense GEMMs for ~warmup_s.
  {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    CHECK_CUDA(cudaEventRecord(a, stream));
    float el = 0.0f;
    int n = 0;
    while (el < warmup_s * 1000.0) {
      for (int i = 0; i < 20; ++i) dense[0]->Run(stream);
      n += 20;
      CHECK_CUDA(cudaEventRecord(b, stream));
      CHECK_CUDA(cudaEventSynchronize(b));
      CHECK_CUDA(cudaEventElapsedTime(&el, a, b));
    }
    std::printf("warm-up: %d dense fp8 GEMMs in %.1f s\n", n, el / 1000.0);
  }

  for (size_t gi = 0; gi < 2; ++gi) {
    const Gemm& gm = gemms[gi];
    const int64_t nbn = (gm.N + 127) / 128, nbk = (gm.K + 127) / 128;
    uint8_t* a = static_cast<uint8_t*>(Alloc(gm.a_rows * gm.K));
    float* as = static_cast<float*>(Alloc(gm.a_rows * nbk * 4));
    uint8_t* w = static_cast<uint8_t*>(Alloc(static_cast<size_t>(E) * gm.N * gm.K));
    float* wsc = static_cast<float*>(Alloc(E * nbn * nbk * 4));
    FillFp8<<<4096, 256, 0, stream>>>(a, gm.a_rows * gm.K, 100 + gi);
    FillFp8<<<4096, 256, 0, stream>>>(w, int64_t{E} * gm.N * gm.K, 200 + gi);
    FillF32<<<1024, 256, 0, stream>>>(as, gm.a_rows * nbk, 300 + gi, 0.5f / 256, 1.5f / 256);
    FillF32<<<1024, 256, 0, stream>>>(wsc, E * nbn * nbk, 400 + gi, 0.5f / 256, 1.5f / 256);
    __nv_bfloat16* ref = static_cast<__nv_bfloat16*>(Alloc(numel * gm.N * 2));
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(Alloc(numel * gm.N * 2));
    double* sums = static_cast<double*>(Alloc(3 * 8));

    kc::MoeGroupedGemmArgs g;
    g.dtype = DType::kBFloat16;
    g.fp8 = true;
    g.a = a;
    g.a_row_div = gm.a_row_div;
    g.w = w;
    g.sorted_token_ids = sorted;
    g.expert_ids = eids;
    g.num_tokens_post_padded = post;
    g.numel = numel;
    g.num_blocks = max_blocks;
    g.N = gm.N;
    g.K = gm.K;
    g.num_local_experts = E;
    g.block_m = kBlockM;
    g.w_scale_kind = kc::MoeFp8WeightScale::kBlock;
    g.w_scale = wsc;
    g.a_scale = as;

    kc::MoeQuantGemmArgs q;
    q.a_fp8 = true;
    q.a = a;
    q.a_scale = as;
    q.a_group = 128;
    q.a_row_div = gm.a_row_div;
    q.w.kind = DType::kFp8E4m3;
    q.w.scale_kind = kc::MoeWeightScale::kBlock;
    q.w.data = w;
    q.w.scale = wsc;
    q.c_type = DType::kBFloat16;
    q.sorted_token_ids = sorted;
    q.expert_ids = eids;
    q.num_tokens_post_padded = post;
    q.block_m = kBlockM;
    q.numel = numel;
    q.num_blocks = max_blocks;
    q.N = gm.N;
    q.K = gm.K;
    q.num_local_experts = E;

    if (!kc::MoeGemmWsFp8Applies(g)) {
      std::fprintf(stderr, "%s: MoeGemmWsFp8Applies is false\n", gm.name);
      return 1;
    }
    auto launch = [&](const std::string& name, void* c) {
      if (name == "ws_fp8") {
        kc::MoeGroupedGemmArgs x = g;
        x.c = c;
        CHECK_OK(kc::LaunchMoeGroupedGemmWsFp8(x, stream));
      } else if (name == "tc_fp8") {
        kc::MoeGroupedGemmArgs x = g;
        x.c = c;
        CHECK_OK(kc::LaunchMoeGroupedGemm(x, stream));
      } else if (name == "emul") {
        kc::MoeQuantGemmArgs x = q;
        x.c = c;
        CHECK_OK(kc::LaunchMoeQuantGemm(x, stream));
      } else {
        dense[gi]->Run(stream);
      }
    };
    const double flops = 2.0 * numel * gm.N * gm.K;
    // The reference output: the emulation kernel.
    CHECK_CUDA(cudaMemsetAsync(ref, 0xff, numel * gm.N * 2, stream));
    launch("emul", ref);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    const double dense_ms = MedianMs([&] { launch("cublasLt", nullptr); }, 15, 5, stream);
    dense_total_ms += dense_ms;
    const double weight_bytes = static_cast<double>(hit) * (gm.N * gm.K + nbn * nbk * 4);
    const double read_ms = weight_bytes / (copy_gbps * 1e9) * 1e3;
    const double floor_ms = std::max(dense_ms, read_ms);
    floor_total_ms += floor_ms;
    std::printf(
        "%s: weights of the experts hit %.2f GB: %.4f ms at the copy roofline; dense %.4f "
        "ms; floor %.4f ms\n",
        gm.name, weight_bytes / 1e9, read_ms, dense_ms, floor_ms);
    for (const char* kn : {"ws_fp8", "tc_fp8", "emul", "cublasLt"}) {
      if (("," + kernels + ",").find(std::string(",") + kn + ",") == std::string::npos) continue;
      Row r;
      r.gemm = gm.name;
      r.kernel = kn;
      const bool grouped = std::strcmp(kn, "cublasLt") != 0;
      if (grouped && std::strcmp(kn, "emul") != 0) {
        CHECK_CUDA(cudaMemsetAsync(out, 0xff, numel * gm.N * 2, stream));
        launch(kn, out);
        CHECK_CUDA(cudaMemsetAsync(sums, 0, 24, stream));
        Compare<<<1024, 256, 0, stream>>>(out, ref, numel * gm.N, sums);
        double h[3];
        CHECK_CUDA(cudaMemcpyAsync(h, sums, 24, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaGetLastError());
        r.rel_err = std::sqrt(h[0] / std::max(h[1], 1e-300));
        r.nan = h[2];
      }
      const bool slow = std::strcmp(kn, "emul") == 0;
      r.ms = std::strcmp(kn, "cublasLt") == 0
                 ? dense_ms
                 : MedianMs([&] { launch(kn, out); }, slow ? 5 : 15, slow ? 1 : 5, stream);
      r.tflops = flops / (r.ms * 1e-3) / 1e12;
      r.vs_dense = dense_ms / r.ms;
      r.vs_floor = floor_ms / r.ms;
      rows.push_back(r);
    }
    cudaFree(a);
    cudaFree(as);
    cudaFree(w);
    cudaFree(wsc);
    cudaFree(ref);
    cudaFree(out);
    cudaFree(sums);
  }
  for (DenseFp8* d : dense) delete d;

  std::printf("\n%-6s %-9s %10s %9s %9s %9s %11s %6s\n", "gemm", "kernel", "ms", "TFLOP/s",
              "vs_dense", "vs_floor", "rel_err", "nan");
  for (const Row& r : rows) {
    std::printf("%-6s %-9s %10.4f %9.1f %8.1f%% %8.1f%% %11.3e %6.0f\n", r.gemm.c_str(),
                r.kernel.c_str(), r.ms, r.tflops, 100.0 * r.vs_dense, 100.0 * r.vs_floor, r.rel_err,
                r.nan);
  }
  double ws_ms = 0;
  for (const Row& r : rows) {
    if (r.kernel == "ws_fp8") ws_ms += r.ms;
  }
  std::printf(
      "both GEMMs: ws_fp8 %.4f ms, dense cuBLASLt %.4f ms: %.1f%% (goal >= 75%%); floor "
      "%.4f ms: %.1f%%\n",
      ws_ms, dense_total_ms, ws_ms > 0 ? 100.0 * dense_total_ms / ws_ms : 0.0, floor_total_ms,
      ws_ms > 0 ? 100.0 * floor_total_ms / ws_ms : 0.0);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::perror(json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"device\": \"%s\", \"tokens\": %lld, \"slots\": %lld, \"padded\": %d, "
                 "\"experts_hit\": %d, \"copy_gbps\": %.1f, \"rows\": [\n",
                 prop.name, static_cast<long long>(M), static_cast<long long>(numel), padded, hit,
                 copy_gbps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "  {\"gemm\": \"%s\", \"kernel\": \"%s\", \"ms\": %.6f, \"tflops\": %.2f, "
                   "\"vs_dense\": %.4f, \"vs_floor\": %.4f, \"rel_err\": %.4e, \"nan\": %.0f}%s\n",
                   r.gemm.c_str(), r.kernel.c_str(), r.ms, r.tflops, r.vs_dense, r.vs_floor,
                   r.rel_err, r.nan, i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
