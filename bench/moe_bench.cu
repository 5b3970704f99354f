// The GPU MoE layer (kernels/cuda/moe/moe_ops.h routing + align, moe_experts.h
// grouped GEMMs, activation, combine) timed as vLLM's benchmark_moe.py times
// fused_moe: routing through combine captured in a CUDA graph, replayed, with
// fresh random routing per layer, next to an SM copy and a cuBLAS bf16 matmul
// measured in the same run. bench/moe_baseline.py prints the same table for a
// PyTorch layer built on torch._grouped_mm.
//
// Method, per shape (weights allocated once: random non-zero bf16 scaled to
// the fan-in, uploaded through GpuExperts::Create) and token count M:
//  * a pool of R (--sets, 8) random router-logit sets [M, E] fp32 and hidden
//    sets [M, H] bf16 on the device; one CUDA graph holds R layers, layer s
//    reading set s (routing -> align -> GEMM 1 -> silu-and-mul -> GEMM 2 ->
//    combine, into its own output), so every layer in a replay routes afresh
//    and consecutive layers hit different experts;
//  * check before timing: the workspace is poisoned (NaN), the graph is
//    replayed once, and set 0's output and routing are compared with
//    RunMoeOnGpu on the same inputs (same kernels: expected bit-exact; a
//    NaN, a routing difference or rel L2 error > 1e-2 aborts the config);
//  * ~3 s of heavy work (cuBLAS GEMMs) before anything is timed (an idle H200
//    sits at a low clock), 1 s again after each shape's setup, 0.2 s of
//    replays before each config; then CUDA events around batches of graph
//    replays (a batch lasts >= ~2 ms), median over batches (at most
//    --replays batches, about --budget_s seconds), divided by R per layer.
//  * experts hit: the distinct expert ids in each set's routing (read back
//    from the device), averaged over the R sets; weight bytes = hit x
//    (2I*H + H*I) x 2. FLOPs = 2*M*k*2I*H (GEMM 1) + 2*M*k*H*I (GEMM 2).
//  * rooflines: the best of several 16-byte SM copy kernels over 1 GiB
//    (bytes read + written) and cublasGemmEx bf16 8192^3 (fp32 accumulate).
//    floor = max(weight bytes / copy, FLOPs / matmul); the bound column
//    names the larger term; %floor = floor / measured time.
//
// Routing: softmax over E, top-k, renormalise (vLLM fused_topk with
// renormalize=True; RoutingMethodType RenormalizeNaive). bf16, silu.
//
// Usage: moe_bench [--shapes mixtral,qwen3,deepseek] [--tokens 1,16,64,256,1024,4096]
//                  [--replays 200] [--sets 8] [--budget_s 1.5] [--warmup_s 3]
//                  [--copy_mib 1024] [--decode on|off] [--decode_layer on|off|both]
//                  [--ws off|on|both]
//                  [--gemm_only on|off] [--layer on|off] [--fused off|on|both]
//                  [--fp8_act_quant rule|on|off]
//                  [--quant LIST] [--route LIST] [--check_tokens N] [--variants LIST]
//                  [--json F] [--csv F]
// --ws picks the grouped GEMM of large M: off the cp.async kernel
// (moe_gemm_sm90.cu), on (the default) the warp-specialised TMA kernel
// (moe_gemm_ws.h), both every config twice, one after the other, in the same run.
// --fused: the activation in GEMM 1's epilogue (ws kernel only,
// SetMoeFusedActMode) off, on or both (the default); with it on, each bf16
// config's layer output is first compared bit for bit with the unfused
// layer's (same inputs, eager), then timed. With it on, fp8 block rows
// quantise GEMM 2's activation there too where its rule says so (what
// RunMoE runs; SetMoeGemmWsFp8ActQuantMode), or always / never with
// --fp8_act_quant on / off (until session 43 --fused on forced it on).
// --gemm_only on also times GEMM 1 and GEMM 2 of the layer alone (routing
// and align done once) for every --ws kernel, after checking the kernels'
// outputs against each other (poisoned first: every element written, no NaN).
// --decode off keeps decode-sized layers on the grouped GEMM path (the
// baseline of the decode kernels). --decode_layer picks their form: on the
// one-kernel layer (moe_decode_layer.cu), off the routing kernel and the two
// matrix-vector kernels (moe_decode.cu), both (the default) each
// decode-sized config twice; with the one-kernel form each config's output
// is first compared bit for bit with the two-kernel form's (same inputs,
// eager). The gemm column names the form that ran: dec1k or dec2k.
// --quant bf16,fp8_block,fp8_per_tensor,fp8_per_channel,int4_group,int8_group:
// the weight schemes of the layer rows (default bf16). Quantised sets (block
// 128 x 128 with 1 x 128 activation groups, per-token activation scales,
// group 128 without zero points; random non-zero values, MakeQuantSet; int
// group scales exact in bf16, as GPTQ / AWQ checkpoints store them in the
// activation type; int4_group/fp32s or int8_group/fp32s: arbitrary fp32
// scales, which the kernels dequantise a weight at a time) are
// checked before timing against the CPU reference (moe::MoeReference) on the
// first --check_tokens (64) tokens of set 0 instead of RunMoeOnGpu; their
// copy roofline counts the stored bytes of the experts hit (weights, scales).
// --route auto,emulation,decode,dequant,matvec times the quantised rows on each
// route (moe_quant_route.h; a route that does not apply falls back to auto).
// --variants default,ping_pong,cooperative,one_block,narrow,...: kernel forms
// switched against their defaults, each bf16 config once per variant in turn
// (decode-sized and quantised rows: the first variant only): ping_pong the
// warp-specialised GEMM's ping-pong consumers at every slot count,
// cooperative never (SetMoeGemmWsPingPongMode; the default takes them below
// kMoeWsPingPongMaxSlots slots per expert), one_block the align in one block
// (SetMoeAlignSpreadMode off), narrow the cp.async kernel's wide k-tiles off
// (SetMoeGemmWideMode), tall the warp-specialised GEMM's tall tiles (blocks of
// 192, SetMoeGemmWsTallTilesMode) wherever the cooperative consumers run,
// short never (the default takes them by MoeGemmWsTallTilesFor's rule);
// forms combine with '+'; each such row's layer is first compared
// bit for bit with the same layer with the form's switch the other way
// (ping_pong against cooperative and back, one_block against the spread
// align, narrow against wide, tall and short against each other). The row's gemm column names the
// variant, not the kernel that ran.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_check.h"
#include "bench/cublas_check.h"
#include "bench/copy_roofline.cuh"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/moe/expert_set.h"
#include "server/moe/gpu_layer.h"
#include "server/moe/gpu_runner.h"
#include "server/moe/moe_runner.h"
#include "tests/testing/random_data.h"

namespace {

namespace kc = kplan::kernels::cuda;
using Clock = std::chrono::steady_clock;
using kplan::test_util::RandomBf16;
using kplan::test_util::SplitMix;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------
// Random device data (never zero).

__device__ __forceinline__ uint32_t Hash(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}
// bf16 uniform in +-[0.05, 2).
__global__ void FillBf16Kernel(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = Hash(i, seed);
    float v = 0.05f + (h >> 8) / 16777216.0f * 1.95f;
    p[i] = __float2bfloat16((h & 1) ? -v : v);
  }
}
// fp32 uniform in [lo, hi).
__global__ void FillF32Kernel(float* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = lo + (hi - lo) * (Hash(i, seed) >> 8) / 16777216.0f;
  }
}
void FillBf16(void* p, size_t n, uint32_t seed) {
  FillBf16Kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CHECK_CUDA(cudaGetLastError());
}
void FillF32(float* p, size_t n, uint32_t seed, float lo, float hi) {
  FillF32Kernel<<<1024, 256>>>(p, n, seed, lo, hi);
  CHECK_CUDA(cudaGetLastError());
}

float Bf16ToFloat(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------
// Options.

struct ShapeDef {
  const char* key;
  const char* name;
  int E, k;
  int64_t H, I;
};
const ShapeDef kShapes[] = {
    {"mixtral", "Mixtral-8x7B", 8, 2, 4096, 14336},
    {"qwen3", "Qwen3-30B-A3B", 128, 8, 2048, 768},
    {"deepseek", "DeepSeek-V3", 256, 8, 7168, 2048},
};

struct Args {
  std::vector<std::string> shapes = {"mixtral", "qwen3", "deepseek"};
  std::vector<int64_t> tokens = {1, 16, 64, 256, 1024, 4096};
  int replays = 200;  // most timed batches per config
  int sets = 8;
  double budget_s = 1.5;
  double warmup_s = 3.0;
  size_t copy_mib = 1024;
  bool decode = true;  // --decode off: the grouped path at decode sizes too
  std::vector<bool> decode_layer = {false, true};  // --decode_layer: decode forms
  std::vector<bool> ws = {true};                   // --ws: the grouped GEMM kernels to run
  std::vector<bool> fused = {false, true};         // --fused: activation in GEMM 1's epilogue
  // --fp8_act_quant: fp8 block rows' GEMM 2 quantisation in GEMM 1's epilogue
  // with --fused on: its rule (what RunMoE runs), or forced on / off.
  std::string fp8_act_quant = "rule";
  bool gemm_only = false;
  bool layer = true;      // --layer off: only the --gemm_only tables
  std::string json, csv;  // --json / --csv: the layer rows, for bench/plot_moe.py
  // --quant: weight schemes of the layer rows ("bf16" = unquantised).
  std::vector<std::string> quant = {"bf16"};
  // --route: the quantised rows' routes (moe_quant_route.h modes).
  std::vector<std::string> route = {"auto"};
  int64_t check_tokens = 64;  // --check_tokens: quantised rows' CPU-reference prefix
  std::vector<std::string> variants = {"default"};  // --variants
};

// The kernel forms --variants switches, one row each: its name, its switch,
// the mode a variant sets and the default's (kFromEnv outside a variant),
// what the bit-for-bit check compares.
struct VariantForm {
  const char* name;
  void (*set)(kc::MoeKernelMode);
  kc::MoeKernelMode variant, base;
  const char* what;
};
const VariantForm kVariantForms[] = {
    {"ping_pong", kc::SetMoeGemmWsPingPongMode, kc::MoeKernelMode::kOn, kc::MoeKernelMode::kOff,
     "ping-pong vs cooperative consumers"},
    {"cooperative", kc::SetMoeGemmWsPingPongMode, kc::MoeKernelMode::kOff, kc::MoeKernelMode::kOn,
     "cooperative vs ping-pong consumers"},
    {"one_block", kc::SetMoeAlignSpreadMode, kc::MoeKernelMode::kOff, kc::MoeKernelMode::kOn,
     "align in one block vs spread"},
    {"narrow", kc::SetMoeGemmWideMode, kc::MoeKernelMode::kOff, kc::MoeKernelMode::kOn,
     "128-byte vs wide k-tiles"},
    {"tall", kc::SetMoeGemmWsTallTilesMode, kc::MoeKernelMode::kOn, kc::MoeKernelMode::kOff,
     "192-slot vs 128-slot tiles"},
    {"short", kc::SetMoeGemmWsTallTilesMode, kc::MoeKernelMode::kOff, kc::MoeKernelMode::kOn,
     "128-slot vs 192-slot tiles"},
};
constexpr size_t kNumVariantForms = sizeof(kVariantForms) / sizeof(kVariantForms[0]);

// A --variants item: the forms of kVariantForms it switches.
struct Variant {
  std::string name = "default";
  bool on[kNumVariantForms] = {};
};

Variant ParseVariant(const std::string& v) {
  Variant out;
  out.name = v;
  if (v == "default") return out;
  if (v.empty() || v.back() == '+') {
    std::fprintf(stderr, "bad --variants item '%s'\n", v.c_str());
    std::exit(2);
  }
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, '+')) {
    size_t f = 0;
    while (f < kNumVariantForms && item != kVariantForms[f].name) ++f;
    if (f == kNumVariantForms) {
      std::fprintf(stderr, "unknown --variants form '%s' in '%s'\n", item.c_str(), v.c_str());
      std::exit(2);
    }
    for (size_t g = 0; g < kNumVariantForms; ++g) {
      if (out.on[g] && kVariantForms[g].set == kVariantForms[f].set) {
        std::fprintf(stderr, "--variants '%s': '%s' and '%s' set one switch\n", v.c_str(),
                     kVariantForms[g].name, item.c_str());
        std::exit(2);
      }
    }
    out.on[f] = true;
  }
  return out;
}

// Sets the switches of `v` (kFromEnv for the forms it leaves out), or with
// reset all back to kFromEnv. Two forms may share a switch (ping_pong and
// cooperative): every switch is reset first, then the variant's forms set.
void ApplyVariant(const Variant& v, bool reset = false) {
  for (const VariantForm& form : kVariantForms) form.set(kc::MoeKernelMode::kFromEnv);
  if (reset) return;
  for (size_t f = 0; f < kNumVariantForms; ++f) {
    if (v.on[f]) kVariantForms[f].set(kVariantForms[f].variant);
  }
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s [--shapes mixtral,qwen3,deepseek] [--tokens 1,16,64,256,1024,4096] "
      "[--replays N] [--sets R] [--budget_s S] [--warmup_s S] [--copy_mib M] "
      "[--decode on|off] [--decode_layer on|off|both] [--ws off|on|both] "
      "[--gemm_only on|off] [--layer on|off] "
      "[--fused off|on|both] [--fp8_act_quant rule|on|off] [--quant "
      "bf16,fp8_block,fp8_per_tensor,fp8_per_channel,"
      "int4_group,"
      "int8_group,int4_group/fp32s,int8_group/fp32s] [--route "
      "auto,emulation,decode,dequant,matvec] [--check_tokens N] "
      "[--variants default,ping_pong,cooperative,one_block,narrow,tall,short,...] [--json FILE] "
      "[--csv FILE]\n",
      argv0);
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) Usage(argv[0]);
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--shapes") {
      a.shapes = SplitComma(v);
      for (const std::string& s : a.shapes) {
        bool known = false;
        for (const ShapeDef& d : kShapes) known |= s == d.key;
        if (!known) {
          std::fprintf(stderr, "unknown shape '%s' (mixtral, qwen3, deepseek)\n", s.c_str());
          std::exit(2);
        }
      }
    } else if (f == "--tokens") {
      a.tokens.clear();
      for (const std::string& t : SplitComma(v)) {
        const long long m = std::atoll(t.c_str());
        if (m < 1) Usage(argv[0]);
        a.tokens.push_back(m);
      }
    } else if (f == "--replays") {
      a.replays = std::max(3, std::atoi(v.c_str()));
    } else if (f == "--sets") {
      a.sets = std::max(1, std::atoi(v.c_str()));
    } else if (f == "--budget_s") {
      a.budget_s = std::atof(v.c_str());
    } else if (f == "--warmup_s") {
      a.warmup_s = std::atof(v.c_str());
    } else if (f == "--copy_mib") {
      a.copy_mib = std::strtoull(v.c_str(), nullptr, 10);
    } else if (f == "--decode") {
      if (v != "on" && v != "off") Usage(argv[0]);
      a.decode = v == "on";
    } else if (f == "--decode_layer") {
      if (v != "on" && v != "off" && v != "both") Usage(argv[0]);
      a.decode_layer = v == "both" ? std::vector<bool>{false, true} : std::vector<bool>{v == "on"};
    } else if (f == "--ws") {
      if (v != "on" && v != "off" && v != "both") Usage(argv[0]);
      a.ws = v == "both" ? std::vector<bool>{false, true} : std::vector<bool>{v == "on"};
    } else if (f == "--fp8_act_quant") {
      if (v != "rule" && v != "on" && v != "off") Usage(argv[0]);
      a.fp8_act_quant = v;
    } else if (f == "--fused") {
      if (v != "on" && v != "off" && v != "both") Usage(argv[0]);
      a.fused = v == "both" ? std::vector<bool>{false, true} : std::vector<bool>{v == "on"};
    } else if (f == "--layer") {
      if (v != "on" && v != "off") Usage(argv[0]);
      a.layer = v == "on";
    } else if (f == "--quant") {
      a.quant = SplitComma(v);
      for (const std::string& q : a.quant) {
        if (q != "bf16" && q != "fp8_block" && q != "fp8_per_tensor" && q != "fp8_per_channel" &&
            q != "int4_group" && q != "int8_group" && q != "int4_group/fp32s" &&
            q != "int8_group/fp32s") {
          std::fprintf(stderr, "unknown --quant '%s'\n", q.c_str());
          std::exit(2);
        }
      }
    } else if (f == "--variants") {
      a.variants = SplitComma(v);
      for (const std::string& x : a.variants) ParseVariant(x);  // exits on an unknown one
      if (a.variants.empty()) Usage(argv[0]);
    } else if (f == "--route") {
      a.route = SplitComma(v);
      for (const std::string& r : a.route) {
        if (r != "auto" && r != "emulation" && r != "decode" && r != "dequant" && r != "matvec") {
          Usage(argv[0]);
        }
      }
    } else if (f == "--check_tokens") {
      a.check_tokens = std::max<long long>(1, std::atoll(v.c_str()));
    } else if (f == "--json") {
      a.json = v;
    } else if (f == "--csv") {
      a.csv = v;
    } else if (f == "--gemm_only") {
      if (v != "on" && v != "off") Usage(argv[0]);
      a.gemm_only = v == "on";
    } else {
      Usage(argv[0]);
    }
  }
  return a;
}

// ---------------------------------------------------------------------------
// The matmul roofline: C = A^T B through cublasGemmEx, bf16 in/out, fp32
// accumulate, n^3.
struct Matmul {
  cublasHandle_t handle = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  int n = 8192;
  cudaStream_t stream;
  explicit Matmul(cudaStream_t s) : stream(s) {
    CHECK_CUBLAS(cublasCreate(&handle));
    CHECK_CUBLAS(cublasSetStream(handle, stream));
    const size_t elems = static_cast<size_t>(n) * n;
    CHECK_CUDA(cudaMalloc(&a, elems * 2));
    CHECK_CUDA(cudaMalloc(&b, elems * 2));
    CHECK_CUDA(cudaMalloc(&c, elems * 2));
    FillBf16(a, elems, 11);
    FillBf16(b, elems, 12);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  ~Matmul() {
    cublasDestroy(handle);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  void Run() {
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n,
                              b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }
  double Flops() const { return 2.0 * n * static_cast<double>(n) * n; }
  // Keeps the GPU busy for `seconds` (clocks up).
  int Warm(double seconds) {
    const auto t0 = Clock::now();
    int count = 0;
    while (Seconds(t0) < seconds) {
      for (int i = 0; i < 10; ++i) Run();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      count += 10;
    }
    return count;
  }
};

// ---------------------------------------------------------------------------
// One config: device buffers, the graph, the check, the timing.

struct Row {
  std::string shape, variant = "default";
  std::string quant = "bf16", route = "auto";
  double expert_bytes = 0;  // stored bytes of one expert (weights, scales, zero points)
  bool ws = false, fused = false;
  int decode = 0;  // the decode layer's form that ran: 1 or 2 kernels (0: not decode-sized)
  int64_t tokens = 0;
  bool ok = false;
  std::string note;
  double us = 0, hit = 0, gbps = 0, tflops = 0, pct_copy = 0, pct_mm = 0, floor_us = 0;
  bool compute_bound = false;
};

// ---------------------------------------------------------------------------
// Quantised expert sets (--quant) and their check against the CPU reference.

// dst[0, n) from 64 random bits per 8 bytes, in parallel: fn(bits, dst + i, count).
template <typename Fn>
void ParallelBytes(char* dst, int64_t n, uint64_t key, Fn fn) {
  kplan::test_util::ParallelDraws(n, 8, key,
                                  [&](uint64_t r, int64_t i, int64_t c) { fn(r, dst + i, c); });
}

// A quantised set of one shape (silu, no bias, block 128 x 128, group 128,
// no zero points) for a --quant name (scheme[/fp32s]): fp8 bytes with random
// sign / mantissa and exponent field 4..9 (never 0 or NaN), int bytes over
// their whole range, fp32 scales around 1 / (rms(q)·sqrt(fan-in)) · [0.5,
// 1.5); int scales rounded to bf16 unless /fp32s.
std::unique_ptr<kplan::ExpertSet> MakeQuantSet(const ShapeDef& sh, const std::string& name) {
  const std::string scheme = name.substr(0, name.find('/'));
  const bool bf16_scales = scheme.rfind("int", 0) == 0 && name.find("/fp32s") == std::string::npos;
  kplan::ExpertsSpec spec;
  spec.experts_id = std::string(sh.key) + "_" + scheme;
  spec.num_experts = sh.E;
  spec.hidden = sh.H;
  spec.intermediate = sh.I;
  spec.activation = "silu";
  spec.quant.scheme = scheme;
  // fp8 block scales take 1 x 128 activation groups (per_token is illegal).
  spec.quant.activation_scale = scheme == "fp8_block" ? "per_tensor" : "per_token";
  const bool fp8 = scheme.rfind("fp8", 0) == 0;
  spec.dtype = fp8                      ? kplan::kernels::DType::kFp8E4m3
               : scheme == "int8_group" ? kplan::kernels::DType::kInt8
                                        : kplan::kernels::DType::kInt4Packed;
  const double rms_q = fp8 ? 2.5 : scheme == "int8_group" ? 73.0 : 4.6;
  std::map<std::string, std::string> t;
  uint64_t key = SplitMix(0x9abc + sh.E);
  for (const kplan::TensorSpec& ts : kplan::ExpectedTensors(spec)) {
    int64_t n = 1;
    for (int64_t d : ts.shape) n *= d;
    key = SplitMix(key);
    const bool weight = ts.name == "w13" || ts.name == "w2";
    if (weight) {
      std::string bytes(static_cast<size_t>(n), '\0');
      if (fp8) {
        ParallelBytes(bytes.data(), n, key, [](uint64_t r, char* d, int64_t c) {
          for (int64_t j = 0; j < c; ++j) {
            const uint32_t b = static_cast<uint32_t>(r >> (8 * j)) & 0xff;
            d[j] = static_cast<char>((b & 0x80) | ((4 + ((b >> 3) & 15) % 6) << 3) | (b & 7));
          }
        });
      } else {
        ParallelBytes(bytes.data(), n, key, [](uint64_t r, char* d, int64_t c) {
          std::memcpy(d, &r, static_cast<size_t>(c));
        });
      }
      t[ts.name] = std::move(bytes);
    } else {  // fp32 scales
      const double fan_in = ts.name.rfind("w13", 0) == 0 ? sh.H : sh.I;
      const double base = 1.0 / (std::sqrt(fan_in) * rms_q);
      std::string f(static_cast<size_t>(n) * 4, '\0');
      float* dst = reinterpret_cast<float*>(f.data());
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = static_cast<float>(base * (0.5 + (SplitMix(key + i) >> 40) / 16777216.0));
        if (bf16_scales)
          dst[i] = kplan::moe::RoundToDType(dst[i], kplan::kernels::DType::kBFloat16);
      }
      t[ts.name] = std::move(f);
    }
  }
  return std::make_unique<kplan::ExpertSet>(std::move(spec), std::move(t));
}

// Whether a KPLAN_MOE_WS_DEBUG measurement variant is set (non-zero bits).
bool WsDebugVariant() {
  const char* v = std::getenv("KPLAN_MOE_WS_DEBUG");
  return v != nullptr && std::atoi(v) != 0;
}

// Set 0's first min(M, --check_tokens) tokens of a quantised row against
// moe::MoeReference on the GPU's routing (every scheme here quantises
// activations per token or per 1 x 128 group, so a token's output depends
// on that token alone). bf16 output: rel L2 <= 1e-2 (fp8, whose
// intermediate is re-quantised: 3e-2), no NaN (the output was poisoned),
// no element past 2^-4·|ref| + 2^-3·rms(ref) (fp8: at most 2 + n/10^4).
bool CheckQuantRow(const ShapeDef& sh, const kplan::ExpertSet& set, int64_t M, const Args& args,
                   const void* d_hidden, const void* d_ids, const void* d_w, const void* d_out,
                   const std::string& quant, Row* row) {
  const int64_t Mc = std::min(M, args.check_tokens), H = sh.H;
  const int k = sh.k;
  std::vector<uint16_t> hid(Mc * H), got(Mc * H), ref(Mc * H);
  std::vector<int32_t> ids(Mc * k);
  std::vector<float> w(Mc * k);
  CHECK_CUDA(cudaMemcpy(hid.data(), d_hidden, Mc * H * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(got.data(), d_out, Mc * H * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ids.data(), d_ids, Mc * k * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(w.data(), d_w, Mc * k * 4, cudaMemcpyDeviceToHost));
  kplan::moe::MoeProblem p;
  p.num_tokens = Mc;
  p.hidden = H;
  p.intermediate = sh.I;
  p.num_experts = sh.E;
  p.top_k = k;
  p.act_dtype = kplan::kernels::DType::kBFloat16;
  p.hidden_states = hid.data();
  p.activation = set.activation();
  p.weights = set.Weights();
  p.topk_ids = ids.data();
  p.topk_weights = w.data();
  p.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto t0 = Clock::now();
  const absl::Status st = kplan::moe::MoeReference(p, ref.data());
  if (!st.ok()) {
    row->note = "CPU reference failed: " + st.ToString();
    return false;
  }
  const int64_t n = Mc * H;
  double num = 0, den = 0, r2 = 0;
  int64_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = Bf16ToFloat(got[i]), r = Bf16ToFloat(ref[i]);
    if (!std::isfinite(g)) ++nan;
    num += (g - r) * (g - r);
    den += r * r;
  }
  r2 = den;
  const double rms = std::sqrt(r2 / std::max<int64_t>(1, n));
  int64_t gross = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = Bf16ToFloat(got[i]), r = Bf16ToFloat(ref[i]);
    if (std::fabs(g - r) > std::ldexp(std::fabs(r), -4) + std::ldexp(rms, -3)) ++gross;
  }
  const bool fp8 = quant.rfind("fp8", 0) == 0;
  const double rel = den > 0 ? std::sqrt(num / den) : 1.0;
  const int64_t max_gross = fp8 ? 2 + n / 10000 : 0;
  const bool ok = nan == 0 && den > 0 && rel <= (fp8 ? 3e-2 : 1e-2) && gross <= max_gross;
  char buf[200];
  std::snprintf(
      buf, sizeof(buf),
      "%s vs CPU reference on %lld tokens (rel %.1e, %lld nan, %lld past 2^-4|r|+2^-3rms, "
      "cpu %.1f s)",
      ok ? "ok" : "FAILED", static_cast<long long>(Mc), rel, static_cast<long long>(nan),
      static_cast<long long>(gross), Seconds(t0));
  std::printf("  check %-14s %-14s M=%-5lld %s\n", sh.name, quant.c_str(),
              static_cast<long long>(M), buf);
  if (!ok) row->note = std::string("CHECK FAILED: ") + buf;
  // KPLAN_MOE_WS_DEBUG variants (moe_gemm_ws_sm90.cu) may compute wrong
  // values on purpose: timed without the check, and said so.
  if (!ok && WsDebugVariant()) {
    std::printf("  (KPLAN_MOE_WS_DEBUG variant: timed unchecked)\n");
    row->note = "KPLAN_MOE_WS_DEBUG variant: not checked";
    return true;
  }
  return ok;
}

// Whether a layer row runs the bf16 decode layer (no grouped GEMM): bf16
// weights, --decode on and a decode-sized batch (MoeDecodeApplies).
bool DecodeSized(const ShapeDef& sh, int64_t M, const Args& args, bool quantised) {
  return !quantised && args.decode && kc::MoeDecodeApplies(M, sh.k, sh.E, sh.H, sh.I);
}

// `set`: the host copy of quantised experts (checked against the CPU
// reference); null for bf16 rows (checked against RunMoeOnGpu).
Row RunConfig(const ShapeDef& sh, const kplan::GpuExperts& gpu, const kplan::ExpertSet* set,
              const std::string& quant, int64_t M, const Args& args, const Variant& variant,
              double copy_gbps, double mm_tflops, cudaStream_t stream) {
  Row row;
  row.quant = quant;
  row.shape = sh.name;
  row.tokens = M;
  const int E = sh.E, k = sh.k, R = args.sets;
  const int64_t H = sh.H, I = sh.I;
  const int64_t numel = M * k;

  // Pool of R input sets; per-set routing and output; one shared workspace.
  std::vector<std::unique_ptr<DevBuf>> hidden, logits, tw, tid, out;
  for (int s = 0; s < R; ++s) {
    hidden.push_back(std::make_unique<DevBuf>(M * H * 2));
    logits.push_back(std::make_unique<DevBuf>(M * E * 4));
    tw.push_back(std::make_unique<DevBuf>(numel * 4));
    tid.push_back(std::make_unique<DevBuf>(numel * 4));
    out.push_back(std::make_unique<DevBuf>(M * H * 2));
    const uint32_t seed = static_cast<uint32_t>(1000003u * (M + 7) + 7919u * E + 31u * s);
    FillBf16(hidden[s]->p, M * H, seed);
    FillF32(logits[s]->as<float>(), M * E, seed ^ 0x5bd1e995u, -3.0f, 3.0f);
  }
  // bf16 activations for every scheme (quantised sets' own dtype is not one).
  const int64_t ws_bytes =
      kplan::MoeLayerWorkspaceBytes(gpu, M, k, E, kplan::kernels::DType::kBFloat16);
  DevBuf ws(ws_bytes);
  CHECK_CUDA(cudaDeviceSynchronize());

  kc::MoeRoutingParams rp;
  rp.num_experts = E;
  rp.top_k = k;
  rp.method = kplan::kernels::RoutingMethod::kTopK;
  rp.scoring = kplan::kernels::ScoringFunc::kSoftmax;
  rp.renormalize = true;
  CHECK_OK(kc::ValidateMoeRoutingParams(rp));

  auto enqueue_layer = [&](int s) -> absl::Status {
    kplan::MoeLayerArgs la;
    la.num_tokens = M;
    la.top_k = k;
    la.num_experts = E;
    la.hidden = hidden[s]->p;
    la.router_logits = logits[s]->as<float>();
    la.routing = rp;
    la.topk_ids = tid[s]->as<int32_t>();
    la.topk_weights = tw[s]->as<float>();
    la.output = out[s]->p;
    la.allow_decode = args.decode;
    la.act_dtype = kplan::kernels::DType::kBFloat16;
    return kplan::EnqueueMoeLayer(gpu, la, ws.p, ws_bytes, stream);
  };

  // Eager once (module load, attributes), then capture all R layers.
  const int64_t one_kernel_before = kc::MoeDecodeLayerLaunches();
  for (int s = 0; s < R; ++s) CHECK_OK(enqueue_layer(s));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  if (kc::MoeDecodeLayerLaunches() > one_kernel_before) {
    row.decode = 1;
  } else if (DecodeSized(sh, M, args, set != nullptr)) {
    row.decode = 2;
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // Whether GEMM 2's fp8 quantisation ran in GEMM 1's epilogue (its rule or
  // --fp8_act_quant): the row's note says so.
  const int64_t act_quant_before = kc::MoeGemmWsFp8ActQuantLaunches();
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int s = 0; s < R; ++s) {
    const absl::Status st = enqueue_layer(s);
    if (!st.ok()) {
      std::fprintf(stderr, "capture failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const bool act_quant_fused = kc::MoeGemmWsFp8ActQuantLaunches() > act_quant_before;

  // --- Check: poison, one replay, set 0 against RunMoeOnGpu.
  CHECK_CUDA(cudaMemsetAsync(ws.p, 0xff, ws_bytes, stream));
  for (int s = 0; s < R; ++s) {
    CHECK_CUDA(cudaMemsetAsync(out[s]->p, 0xff, M * H * 2, stream));
    CHECK_CUDA(cudaMemsetAsync(tid[s]->p, 0xff, numel * 4, stream));
    CHECK_CUDA(cudaMemsetAsync(tw[s]->p, 0xff, numel * 4, stream));
  }
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());

  if (set != nullptr && !CheckQuantRow(sh, *set, M, args, hidden[0]->p, tid[0]->p, tw[0]->p,
                                       out[0]->p, quant, &row)) {
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    return row;
  }
  if (set == nullptr) {
    kplan::MoeRunInput in;
    in.act_dtype = kplan::kernels::DType::kBFloat16;
    in.hidden_shape = {M, H};
    std::string hidden_host(M * H * 2, '\0');
    CHECK_CUDA(cudaMemcpy(hidden_host.data(), hidden[0]->p, M * H * 2, cudaMemcpyDeviceToHost));
    in.hidden_states = std::move(hidden_host);
    in.logits_shape = {M, E};
    std::string logits_host(M * E * 4, '\0');
    CHECK_CUDA(cudaMemcpy(logits_host.data(), logits[0]->p, M * E * 4, cudaMemcpyDeviceToHost));
    in.router_logits = std::move(logits_host);
    in.routing.routing_method = "RenormalizeNaive";
    in.routing.top_k = k;
    kplan::GpuRunOptions opt;
    opt.poison_workspace = true;
    auto ref = kplan::RunMoeOnGpu(gpu, in, stream, opt);
    if (!ref.ok()) {
      row.note = "RunMoeOnGpu failed: " + ref.status().ToString();
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(graph));
      return row;
    }
    std::vector<uint16_t> got(M * H);
    std::vector<int32_t> got_ids(numel);
    CHECK_CUDA(cudaMemcpy(got.data(), out[0]->p, M * H * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got_ids.data(), tid[0]->p, numel * 4, cudaMemcpyDeviceToHost));
    const uint16_t* want = reinterpret_cast<const uint16_t*>(ref->output.data());
    int64_t nan = 0, differ = 0;
    double num = 0, den = 0;
    for (int64_t i = 0; i < M * H; ++i) {
      const float g = Bf16ToFloat(got[i]), w = Bf16ToFloat(want[i]);
      if (!std::isfinite(g) || !std::isfinite(w)) ++nan;
      if (got[i] != want[i]) ++differ;
      num += (static_cast<double>(g) - w) * (static_cast<double>(g) - w);
      den += static_cast<double>(w) * w;
    }
    const int64_t id_diff = static_cast<int64_t>(
        numel - std::inner_product(got_ids.begin(), got_ids.end(), ref->topk_ids.begin(),
                                   int64_t{0}, std::plus<int64_t>(),
                                   [](int32_t a, int32_t b) { return int64_t{a == b}; }));
    const double rel = den > 0 ? std::sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
    char check[160];
    std::snprintf(check, sizeof(check),
                  "%s (rel %.1e, %lld/%lld bf16 differ, %lld nan, %lld ids differ)",
                  differ == 0 && id_diff == 0 && nan == 0 ? "bit-exact" : "tolerance", rel,
                  static_cast<long long>(differ), static_cast<long long>(M * H),
                  static_cast<long long>(nan), static_cast<long long>(id_diff));
    std::printf("  check %-14s M=%-5lld graph vs RunMoeOnGpu: %s\n", sh.name,
                static_cast<long long>(M), check);
    // The same layer with one kernel choice switched off (`off` then `on`
    // again), eager, bit for bit against the graph's set 0.
    auto same_as = [&](auto off, auto on, const char* what) {
      off();
      CHECK_CUDA(cudaMemsetAsync(ws.p, 0xff, ws_bytes, stream));
      CHECK_CUDA(cudaMemsetAsync(out[0]->p, 0xff, M * H * 2, stream));
      CHECK_OK(enqueue_layer(0));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      on();
      std::vector<uint16_t> other(M * H);
      CHECK_CUDA(cudaMemcpy(other.data(), out[0]->p, M * H * 2, cudaMemcpyDeviceToHost));
      int64_t diff = 0;
      for (int64_t i = 0; i < M * H; ++i) diff += got[i] != other[i];
      std::printf("  check %-14s M=%-5lld %s: %s (%lld/%lld bf16 differ)\n", sh.name,
                  static_cast<long long>(M), what, diff == 0 ? "bit-identical" : "DIFFER",
                  static_cast<long long>(diff), static_cast<long long>(M * H));
      return diff == 0;
    };
    const bool fused_ok = !kc::MoeFusedActEnabled() ||
                          same_as([] { kc::SetMoeFusedActMode(kc::MoeGemmWsMode::kOff); },
                                  [] { kc::SetMoeFusedActMode(kc::MoeGemmWsMode::kOn); },
                                  "fused vs unfused activation");
    const bool decode_ok =
        row.decode != 1 || same_as([] { kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kOff); },
                                   [] { kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kOn); },
                                   "one vs two decode kernels");
    // The variant's forms against the defaults, one at a time.
    std::string forms_differ;
    for (size_t f = 0; f < kNumVariantForms; ++f) {
      const VariantForm& form = kVariantForms[f];
      if (variant.on[f] &&
          !same_as([&] { form.set(form.base); }, [&] { form.set(form.variant); }, form.what)) {
        forms_differ += std::string(" (") + form.what + ": differs)";
      }
    }
    if (nan != 0 || id_diff != 0 || !(rel <= 1e-2) || den == 0 || !fused_ok || !decode_ok ||
        !forms_differ.empty()) {
      row.note = std::string("CHECK FAILED: ") + check + (fused_ok ? "" : " (fused differs)") +
                 (decode_ok ? "" : " (one-kernel decode differs)") + forms_differ;
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(graph));
      return row;
    }
  }  // bf16 check

  // --- Experts hit, per set.
  double hit_sum = 0;
  for (int s = 0; s < R; ++s) {
    hit_sum += ExpertsHit(tid[s]->as<int32_t>(), numel);
  }
  row.hit = hit_sum / R;

  // --- Timing. Warm replays (>= 0.2 s), batch sized to >= ~2 ms.
  auto replay = [&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); };
  double replay_ms;
  {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    const auto t0 = Clock::now();
    int n = 0;
    float ms = 0;
    do {
      CHECK_CUDA(cudaEventRecord(a, stream));
      for (int i = 0; i < 3; ++i) replay();
      CHECK_CUDA(cudaEventRecord(b, stream));
      CHECK_CUDA(cudaEventSynchronize(b));
      CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
      n += 3;
    } while (Seconds(t0) < 0.2 || n < 6);
    replay_ms = std::max(1e-3, ms / 3.0);
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
  }
  const int batch = std::max(1, static_cast<int>(std::ceil(2.0 / replay_ms)));
  const int samples =
      std::clamp(static_cast<int>(args.budget_s * 1e3 / (batch * replay_ms)), 5, args.replays);
  const double ms = MedianMs(replay, samples, batch, stream);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));

  row.us = ms * 1e3 / R;
  const double weight_bytes =
      row.hit * (set != nullptr ? gpu.bytes() / static_cast<double>(E) : 3.0 * I * H * 2.0);
  const double flops = 6.0 * static_cast<double>(M) * k * H * I;
  row.gbps = weight_bytes / (row.us * 1e-6) / 1e9;
  row.tflops = flops / (row.us * 1e-6) / 1e12;
  row.pct_copy = 100.0 * row.gbps / copy_gbps;
  row.pct_mm = 100.0 * row.tflops / mm_tflops;
  const double t_bytes = weight_bytes / (copy_gbps * 1e9) * 1e6;
  const double t_flops = flops / (mm_tflops * 1e12) * 1e6;
  row.floor_us = std::max(t_bytes, t_flops);
  row.compute_bound = t_flops > t_bytes;
  row.ok = true;
  char note[128];
  std::snprintf(note, sizeof(note), "%d x %d replays x %d layers%s", samples, batch, R,
                act_quant_fused ? ", fp8 act quant in GEMM 1" : "");
  row.note = note;
  return row;
}

// ---------------------------------------------------------------------------
// The grouped GEMMs alone: routing and align once on random logits, then
// GEMM 1 (hidden -> [numel, N13]) and GEMM 2 (random [numel, I] -> [numel, H])
// timed for every --ws kernel. Check first: each kernel's output is poisoned
// (0xff: NaN), computed, and compared with the first kernel's (NaN / unwritten
// elements fail; rel L2 and the number of differing bf16 values are shown).

struct GemmRow {
  std::string shape, which, check;
  int64_t tokens = 0, N = 0, K = 0;
  bool ws = false, ok = false;
  double us = 0, tflops = 0;
};

// GEMM 1 + silu-and-mul on the ws kernel: unfused (GEMM 1 into [numel, 2I],
// then LaunchMoeActivation) and fused (LaunchMoeGroupedGemmWsAct), outputs
// poisoned, compared bit for bit, then both timed.
void GemmOnlyFusedAct(const ShapeDef& sh, kc::MoeGroupedGemmArgs g, int64_t I, cudaStream_t stream,
                      std::vector<GemmRow>* out) {
  kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kOn);
  const kc::MoeActParams ap;
  const int64_t numel = g.numel;
  if (!kc::MoeGemmWsActApplies(g, kplan::kernels::MoeActivation::kSilu, ap)) {
    std::printf("  gemm-only %-14s M=%-5lld gemm1+act: the fused epilogue does not apply\n",
                sh.name, static_cast<long long>(numel / sh.k));
    return;
  }
  DevBuf c1(numel * g.N * 2), act_u(numel * I * 2), act_f(numel * I * 2);
  g.c = c1.p;
  auto unfused = [&] {
    CHECK_OK(kc::LaunchMoeGroupedGemm(g, stream));
    CHECK_OK(kc::LaunchMoeActivation(kplan::kernels::MoeActivation::kSilu, ap, g.dtype, c1.p, numel,
                                     g.N, act_u.p, I, stream));
  };
  auto fused = [&] {
    CHECK_OK(kc::LaunchMoeGroupedGemmWsAct(g, kplan::kernels::MoeActivation::kSilu, ap, act_f.p,
                                           stream));
  };
  CHECK_CUDA(cudaMemsetAsync(act_u.p, 0xff, numel * I * 2, stream));
  CHECK_CUDA(cudaMemsetAsync(act_f.p, 0xff, numel * I * 2, stream));
  unfused();
  fused();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());
  std::vector<uint16_t> u(numel * I), f(numel * I);
  CHECK_CUDA(cudaMemcpy(u.data(), act_u.p, u.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(f.data(), act_f.p, f.size() * 2, cudaMemcpyDeviceToHost));
  int64_t nan = 0, differ = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    nan += !std::isfinite(Bf16ToFloat(f[i]));
    differ += u[i] != f[i];
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%lld nan/unwritten, fused vs unfused: %lld/%zu bf16 differ",
                static_cast<long long>(nan), static_cast<long long>(differ), u.size());
  const bool ok = nan == 0 && differ == 0;
  for (int fz = 0; fz < 2; ++fz) {
    GemmRow r;
    r.shape = sh.name;
    r.which = fz ? "g1+act fused" : "g1+act";
    r.tokens = numel / sh.k;
    r.N = g.N;
    r.K = g.K;
    r.ws = true;
    r.ok = ok;
    r.check = ok ? buf : std::string("CHECK FAILED: ") + buf;
    if (ok) {
      auto launch = [&] { fz ? fused() : unfused(); };
      const double ms = MedianMs(launch, 15, 5, stream);
      r.us = ms * 1e3;
      r.tflops = 2.0 * numel * g.N * g.K / (ms * 1e-3) / 1e12;
    }
    std::printf("  gemm-only %-14s M=%-5lld %s ws %10.1f us %7.1f TFLOP/s  %s\n", sh.name,
                static_cast<long long>(r.tokens), r.which.c_str(), r.us, r.tflops, r.check.c_str());
    std::fflush(stdout);
    out->push_back(r);
  }
}

void GemmOnly(const ShapeDef& sh, const kplan::GpuExperts& gpu, int64_t M, const Args& args,
              double mm_tflops, cudaStream_t stream, std::vector<GemmRow>* out) {
  (void)mm_tflops;
  const int E = sh.E, k = sh.k;
  const int64_t H = sh.H, I = sh.I, numel = M * k, N13 = gpu.n13();
  DevBuf hidden(M * H * 2), logits(M * E * 4), tw(numel * 4), tid(numel * 4), inter(numel * I * 2);
  FillBf16(hidden.p, M * H, 77 + static_cast<uint32_t>(M));
  FillBf16(inter.p, numel * I, 99 + static_cast<uint32_t>(M));
  FillF32(logits.as<float>(), M * E, 5 + static_cast<uint32_t>(M), -3.0f, 3.0f);
  kc::MoeRoutingParams rp;
  rp.num_experts = E;
  rp.top_k = k;
  rp.renormalize = true;
  CHECK_OK(
      kc::LaunchMoeRouting(rp, logits.as<float>(), M, tw.as<float>(), tid.as<int32_t>(), stream));
  // bf16 weights: the layer's choices (gpu_layer.cc, LayoutFor), but never
  // the tall tiles, which no cp.async kernel takes: these tables compare the
  // two kernels on one block (the layer rows time the tall tiles, --variants).
  const bool ping_pong = kc::MoeGemmWsPingPongFor(kplan::kernels::DType::kBFloat16, numel, E);
  const int bm = kc::MoeGemmBlockMFor(numel, E, std::min(H, I), ping_pong, false);
  const int64_t max_padded = kc::MoeAlignMaxPadded(numel, E, bm, false);
  const int64_t max_blocks = kc::MoeAlignMaxBlocks(numel, E, bm, false);
  DevBuf sorted(max_padded * 4), eids(max_blocks * 4), post(4);
  CHECK_OK(kc::LaunchMoeAlignBlockSize(tid.as<int32_t>(), numel, bm, E, nullptr, false, false,
                                       sorted.as<int32_t>(), eids.as<int32_t>(), post.as<int32_t>(),
                                       nullptr, stream));
  auto args_for = [&](int which) {
    kc::MoeGroupedGemmArgs g;
    g.dtype = kplan::kernels::DType::kBFloat16;
    g.a = which == 0 ? hidden.p : inter.p;
    g.a_row_div = which == 0 ? k : 1;
    g.w = which == 0 ? gpu.w13() : gpu.w2();
    g.N = which == 0 ? N13 : H;
    g.K = which == 0 ? H : I;
    g.sorted_token_ids = sorted.as<int32_t>();
    g.expert_ids = eids.as<int32_t>();
    g.num_tokens_post_padded = post.as<int32_t>();
    g.numel = numel;
    g.num_blocks = max_blocks;
    g.num_local_experts = E;
    g.block_m = bm;
    g.ping_pong = ping_pong;
    return g;
  };
  for (int which = 0; which < 2; ++which) {
    kc::MoeGroupedGemmArgs g = args_for(which);
    DevBuf c(numel * g.N * 2);
    g.c = c.p;
    std::vector<uint16_t> first, got(static_cast<size_t>(numel * g.N));
    for (const bool ws : args.ws) {
      kc::SetMoeGemmWsMode(ws ? kc::MoeGemmWsMode::kOn : kc::MoeGemmWsMode::kOff);
      GemmRow r;
      r.shape = sh.name;
      r.which = which == 0 ? "gemm1" : "gemm2";
      r.tokens = M;
      r.N = g.N;
      r.K = g.K;
      r.ws = ws;
      CHECK_CUDA(cudaMemsetAsync(c.p, 0xff, numel * g.N * 2, stream));
      const absl::Status st = kc::LaunchMoeGroupedGemm(g, stream);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (!st.ok() || cudaGetLastError() != cudaSuccess) {
        r.check = "LAUNCH FAILED: " + st.ToString();
        out->push_back(r);
        continue;
      }
      CHECK_CUDA(cudaMemcpy(got.data(), c.p, got.size() * 2, cudaMemcpyDeviceToHost));
      int64_t nan = 0, differ = 0;
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float v = Bf16ToFloat(got[i]);
        if (!std::isfinite(v)) ++nan;
        if (!first.empty()) {
          const float w = Bf16ToFloat(first[i]);
          if (got[i] != first[i]) ++differ;
          num += (static_cast<double>(v) - w) * (static_cast<double>(v) - w);
          den += static_cast<double>(w) * w;
        }
      }
      char buf[160];
      const double rel = den > 0 ? std::sqrt(num / den) : 0.0;
      std::snprintf(buf, sizeof(buf), "%lld nan/unwritten%s", static_cast<long long>(nan),
                    first.empty() ? "" : "");
      r.check = buf;
      if (!first.empty()) {
        std::snprintf(buf, sizeof(buf), ", vs old: rel %.1e, %lld/%zu bf16 differ", rel,
                      static_cast<long long>(differ), got.size());
        r.check += buf;
      }
      r.ok = nan == 0 && (first.empty() || rel <= 1e-2);
      if (first.empty()) first = got;
      // KPLAN_MOE_WS_DEBUG variants (moe_gemm_ws_sm90.cu) may leave the output
      // unwritten: timed without the check.
      const bool debug = ws && WsDebugVariant();
      if (debug) r.check += " (KPLAN_MOE_WS_DEBUG variant: not checked)";
      if (r.ok || debug) {
        r.ok = true;
        auto launch = [&] { CHECK_OK(kc::LaunchMoeGroupedGemm(g, stream)); };
        const double ms = MedianMs(launch, 15, 5, stream);
        r.us = ms * 1e3;
        r.tflops = 2.0 * numel * g.N * g.K / (ms * 1e-3) / 1e12;
      } else {
        r.check = "CHECK FAILED: " + r.check;
      }
      std::printf("  gemm-only %-14s M=%-5lld %s %-3s %10.1f us %7.1f TFLOP/s  %s\n", sh.name,
                  static_cast<long long>(M), r.which.c_str(), ws ? "ws" : "old", r.us, r.tflops,
                  r.check.c_str());
      std::fflush(stdout);
      out->push_back(r);
    }
  }
  if (std::find(args.ws.begin(), args.ws.end(), true) != args.ws.end() &&
      std::find(args.fused.begin(), args.fused.end(), true) != args.fused.end()) {
    GemmOnlyFusedAct(sh, args_for(0), I, stream, out);
  }
  kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kFromEnv);
}

// Weights of one shape, random non-zero bf16 scaled to the fan-in, on device 0.
std::unique_ptr<kplan::GpuExperts> MakeExperts(const ShapeDef& sh) {
  kplan::ExpertsSpec spec;
  spec.experts_id = sh.key;
  spec.num_experts = sh.E;
  spec.hidden = sh.H;
  spec.intermediate = sh.I;
  spec.activation = "silu";
  spec.dtype = kplan::kernels::DType::kBFloat16;
  auto log2ceil = [](double x) { return static_cast<int>(std::ceil(std::log2(x))); };
  std::map<std::string, std::string> t;
  t["w13"] = RandomBf16(sh.E * 2 * sh.I * sh.H, -log2ceil(std::sqrt(double(sh.H))),
                        SplitMix(0x1234 + sh.E));
  t["w2"] =
      RandomBf16(sh.E * sh.H * sh.I, -log2ceil(std::sqrt(double(sh.I))), SplitMix(0x5678 + sh.E));
  kplan::ExpertSet set(std::move(spec), std::move(t));
  auto gpu = kplan::GpuExperts::Create(set, 0);
  if (!gpu.ok()) {
    std::fprintf(stderr, "GpuExperts::Create(%s): %s\n", sh.name, gpu.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*gpu);
}

}  // namespace

std::string JsonText(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The kernels that ran, with the --variants item where not the default.
std::string GemmName(const Row& r) {
  std::string name = r.decode != 0 ? (r.decode == 1 ? "dec1k" : "dec2k")
                     : !r.ws       ? "old"
                     : r.fused     ? "ws+act"
                                   : "ws";
  if (r.variant != "default") name += "/" + r.variant;
  return name;
}

// The layer rows as bench/moe_baseline.py writes them (bench/plot_moe.py
// reads both): {system, device, rooflines, rows}.
void WriteResults(const Args& args, const char* device, double copy_gbps, double mm_tflops,
                  const std::vector<Row>& rows) {
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    out << "{\"system\": \"kplan\", \"device\": " << JsonText(device)
        << ", \"rooflines\": {\"copy_gbps\": " << copy_gbps << ", \"matmul_tflops\": " << mm_tflops
        << "},\n \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? ",\n  " : "\n  ") << "{\"shape\": " << JsonText(r.shape)
          << ", \"quant\": " << JsonText(r.quant) << ", \"route\": " << JsonText(r.route)
          << ", \"tokens\": " << r.tokens << ", \"gemm\": \"" << GemmName(r)
          << "\", \"ok\": " << (r.ok ? "true" : "false") << ", \"us\": " << r.us
          << ", \"hit\": " << r.hit << ", \"gbps\": " << r.gbps << ", \"pct_copy\": " << r.pct_copy
          << ", \"tflops\": " << r.tflops << ", \"pct_mm\": " << r.pct_mm << ", \"bound\": \""
          << (r.compute_bound ? "mm" : "copy") << "\", \"floor_us\": " << r.floor_us
          << ", \"note\": " << JsonText(r.note) << "}";
    }
    out << "\n ]}\n";
  }
  if (!args.csv.empty()) {
    std::ofstream out(args.csv);
    out << "shape,quant,route,tokens,gemm,ok,us,hit,gbps,pct_copy,tflops,pct_mm,bound,floor_us\n";
    for (const Row& r : rows) {
      out << r.shape << "," << r.quant << "," << r.route << "," << r.tokens << "," << GemmName(r)
          << "," << (r.ok ? 1 : 0) << "," << r.us << "," << r.hit << "," << r.gbps << ","
          << r.pct_copy << "," << r.tflops << "," << r.pct_mm << ","
          << (r.compute_bound ? "mm" : "copy") << "," << r.floor_us << "\n";
    }
  }
}

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const auto t_start = Clock::now();
  CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB, %.1f GB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6, prop.totalGlobalMem / 1e9);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // --- Rooflines, after ~warmup_s of cuBLAS GEMMs.
  Matmul mm(stream);
  std::printf("warm-up: %d bf16 8192^3 GEMMs in %.1f s\n", mm.Warm(args.warmup_s), args.warmup_s);
  const double mm_ms = MedianMs([&] { mm.Run(); }, 30, 5, stream);
  const double mm_tflops = mm.Flops() / (mm_ms * 1e-3) / 1e12;
  std::printf("matmul  cublasGemmEx bf16 8192^3 (fp32 acc): %8.1f us  %6.1f TFLOP/s\n", mm_ms * 1e3,
              mm_tflops);

  const double copy_gbps =
      MeasureCopyRoofline(args.copy_mib << 20, prop.multiProcessorCount, stream);
  if (copy_gbps <= 0) {
    std::fprintf(stderr, "no copy kernel produced the right output\n");
    return 1;
  }
  std::printf("rooflines: copy %.0f GB/s, matmul %.1f TFLOP/s (ridge %.0f FLOP/byte)\n\n",
              copy_gbps, mm_tflops, mm_tflops * 1e12 / (copy_gbps * 1e9));

  // --- The layer.
  std::vector<Row> rows;
  std::vector<GemmRow> gemm_rows;
  for (const std::string& key : args.shapes) {
    const ShapeDef* sh = nullptr;
    for (const ShapeDef& d : kShapes) {
      if (key == d.key) sh = &d;
    }
    std::unique_ptr<kplan::GpuExperts> gpu;
    for (const std::string& quant : args.quant) {
      const auto t0 = Clock::now();
      gpu.reset();
      std::unique_ptr<kplan::ExpertSet> qset;
      if (quant == "bf16") {
        gpu = MakeExperts(*sh);
      } else {
        qset = MakeQuantSet(*sh, quant);
        auto g = kplan::GpuExperts::Create(*qset, 0);
        if (!g.ok()) {
          std::fprintf(stderr, "GpuExperts::Create(%s %s): %s\n", sh->name, quant.c_str(),
                       g.status().ToString().c_str());
          std::exit(1);
        }
        gpu = std::move(*g);
      }
      std::printf("%s %s: E=%d k=%d H=%lld I=%lld, experts %.2f GB on the device (setup %.1f s)\n",
                  sh->name, quant.c_str(), sh->E, sh->k, static_cast<long long>(sh->H),
                  static_cast<long long>(sh->I), gpu->bytes() / 1e9, Seconds(t0));
      mm.Warm(1.0);  // clocks back up after the host-side setup
      const std::vector<std::string> routes =
          quant == "bf16" ? std::vector<std::string>{"auto"} : args.route;
      for (int64_t M : args.layer ? args.tokens : std::vector<int64_t>{}) {
        for (const std::string& route : routes) {
          kc::SetMoeQuantRouteMode(route == "emulation" ? kc::MoeQuantRouteMode::kEmulation
                                   : route == "decode"  ? kc::MoeQuantRouteMode::kDecode
                                   : route == "dequant" ? kc::MoeQuantRouteMode::kDequant
                                   : route == "matvec"  ? kc::MoeQuantRouteMode::kMatvec
                                                        : kc::MoeQuantRouteMode::kAuto);
          // Decode-sized bf16 rows run no grouped GEMM: one row per decode
          // form; the others one per GEMM kernel.
          const bool decode_sized = DecodeSized(*sh, M, args, quant != "bf16");
          // (Other rows leave the decode form to the environment: the int
          // dequant route's small calls decode too.)
          const std::vector<bool> one = {args.ws.front()}, one_fused = {args.fused.front()};
          for (const bool ws : decode_sized ? one : args.ws) {
            for (const bool fused : decode_sized ? one_fused : args.fused) {
              for (const int layer1k : decode_sized ? std::vector<int>(args.decode_layer.begin(),
                                                                       args.decode_layer.end())
                                                    : std::vector<int>{-1}) {
                for (const std::string& vname :
                     decode_sized || quant != "bf16"
                         ? std::vector<std::string>{args.variants.front()}
                         : args.variants) {
                  if (fused && !ws && !decode_sized) continue;  // the fused epilogue is ws's
                  const Variant variant = ParseVariant(vname);
                  ApplyVariant(variant);
                  kc::SetMoeGemmWsMode(ws ? kc::MoeGemmWsMode::kOn : kc::MoeGemmWsMode::kOff);
                  kc::SetMoeFusedActMode(fused ? kc::MoeGemmWsMode::kOn : kc::MoeGemmWsMode::kOff);
                  kc::SetMoeGemmWsFp8ActQuantMode(
                      !fused || args.fp8_act_quant == "off" ? kc::MoeGemmWsMode::kOff
                      : args.fp8_act_quant == "on"          ? kc::MoeGemmWsMode::kOn
                                                            : kc::MoeGemmWsMode::kFromEnv);
                  kc::SetMoeDecodeLayerMode(layer1k < 0    ? kc::MoeKernelMode::kFromEnv
                                            : layer1k != 0 ? kc::MoeKernelMode::kOn
                                                           : kc::MoeKernelMode::kOff);
                  const auto tc = Clock::now();
                  Row r = RunConfig(*sh, *gpu, qset.get(), quant, M, args, variant, copy_gbps,
                                    mm_tflops, stream);
                  ApplyVariant(variant, /*reset=*/true);
                  r.variant = variant.name;
                  r.ws = ws;
                  r.fused = fused;
                  r.route = route;
                  if (r.ok) {
                    std::printf(
                        "  %-14s %-14s %-9s M=%-5lld %-6s %10.1f us  hit %6.1f  %7.0f GB/s  %6.1f "
                        "TFLOP/s  (%s, %.1f s)\n",
                        r.shape.c_str(), quant.c_str(), route.c_str(), static_cast<long long>(M),
                        GemmName(r).c_str(), r.us, r.hit, r.gbps, r.tflops, r.note.c_str(),
                        Seconds(tc));
                  } else {
                    std::printf("  %-14s %-14s %-9s M=%-5lld SKIPPED: %s\n", r.shape.c_str(),
                                quant.c_str(), route.c_str(), static_cast<long long>(M),
                                r.note.c_str());
                  }
                  std::fflush(stdout);
                  rows.push_back(r);
                }
              }
            }
          }
        }
      }
      kc::SetMoeQuantRouteMode(kc::MoeQuantRouteMode::kFromEnv);
      if (quant != "bf16") gpu.reset();
    }
    if (gpu == nullptr && args.gemm_only) gpu = MakeExperts(*sh);
    kc::SetMoeFusedActMode(kc::MoeGemmWsMode::kFromEnv);
    kc::SetMoeGemmWsFp8ActQuantMode(kc::MoeGemmWsMode::kFromEnv);
    kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kFromEnv);
    if (args.gemm_only) {
      for (int64_t M : args.tokens) GemmOnly(*sh, *gpu, M, args, mm_tflops, stream, &gemm_rows);
    }
  }

  // --- The table.
  std::printf(
      "\nkplan GPU MoE layer (routing -> combine, CUDA graph, %d routing sets rotating, "
      "median), bf16 silu, softmax top-k renormalize\n",
      args.sets);
  std::printf(
      "rooflines measured in this run: copy %.0f GB/s (SM copy kernel, read + write), "
      "matmul %.1f TFLOP/s (cuBLAS bf16 8192^3)\n",
      copy_gbps, mm_tflops);
  std::printf("%-14s %-14s %-9s %6s %6s %11s %7s %8s %7s %8s %7s %5s %10s %7s\n", "shape", "quant",
              "route", "tokens", "gemm", "us", "hit", "GB/s", "%copy", "TFLOP/s", "%mm", "bound",
              "floor_us", "%floor");
  for (const Row& r : rows) {
    if (!r.ok) {
      std::printf("%-14s %-14s %-9s %6lld  FAILED: %s\n", r.shape.c_str(), r.quant.c_str(),
                  r.route.c_str(), static_cast<long long>(r.tokens), r.note.c_str());
      continue;
    }
    std::printf(
        "%-14s %-14s %-9s %6lld %6s %11.1f %7.1f %8.0f %6.1f%% %8.1f %6.1f%% %5s %10.1f "
        "%6.1f%%\n",
        r.shape.c_str(), r.quant.c_str(), r.route.c_str(), static_cast<long long>(r.tokens),
        GemmName(r).c_str(), r.us, r.hit, r.gbps, r.pct_copy, r.tflops, r.pct_mm,
        r.compute_bound ? "mm" : "copy", r.floor_us, 100.0 * r.floor_us / r.us);
  }
  if (!gemm_rows.empty()) {
    std::printf(
        "\ngrouped GEMMs alone (routing + align once, median of event-timed batches); "
        "cuBLAS bf16 8192^3 in this run: %.1f TFLOP/s\n",
        mm_tflops);
    std::printf("%-14s %6s %-5s %6s %6s %4s %10s %8s %7s  %s\n", "shape", "tokens", "gemm", "N",
                "K", "kern", "us", "TFLOP/s", "%cublas", "check");
    for (const GemmRow& g : gemm_rows) {
      std::printf("%-14s %6lld %-5s %6lld %6lld %4s %10.1f %8.1f %6.1f%%  %s\n", g.shape.c_str(),
                  static_cast<long long>(g.tokens), g.which.c_str(), static_cast<long long>(g.N),
                  static_cast<long long>(g.K), g.ws ? "ws" : "old", g.us, g.tflops,
                  100.0 * g.tflops / mm_tflops, g.check.c_str());
    }
  }
  WriteResults(args, prop.name, copy_gbps, mm_tflops, rows);
  std::printf("total %.1f s\n", Seconds(t_start));
  CHECK_CUDA(cudaStreamDestroy(stream));
  bool all_ok = true;
  for (const Row& r : rows) all_ok = all_ok && r.ok;
  for (const GemmRow& g : gemm_rows) all_ok = all_ok && g.ok;
  return all_ok ? 0 : 1;
}
