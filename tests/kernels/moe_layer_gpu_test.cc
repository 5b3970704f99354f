// The GPU MoE layer (server/moe/gpu_runner.h: GpuExperts + RunMoeOnGpu over
// kernels/cuda/moe/moe_ops.h and moe_experts.h) against the CPU reference
// (moe::MoeReference) on fresh random data every run (the seed is printed;
// MOE_LAYER_GPU_TEST_SEED=<n> repeats one). Every value is non-zero: random
// sign, mantissa and a 4-octave exponent range scaled to the fan-in.
//  * Model shapes: Mixtral-8x7B (E=8, k=2, H=4096, I=14336), DeepSeek-V3
//    (E=256, k=8, H=7168, I=2048, DeepSeekV3 grouped routing with bias and
//    scale 2.5, plus RenormalizeNaive at M=64), Qwen3-30B-A3B (E=128, k=8,
//    H=2048, I=768) at M in {1, 7, 64, 512, 4096}, bf16, silu,
//    RenormalizeNaive unless said.
//  * Small shapes with tails (H, N not multiples of the tiles): every
//    activation family, biases, fp16, given top-k ids, weights on the input.
//  * What the GPU path refuses: fp32 / quantised experts, fp32 activations.
// The GPU workspace is poisoned with NaN before the checked run, so an
// element left unwritten anywhere on the way shows as NaN in the output.
// Checks: no NaN / inf; ‖gpu − ref‖/‖ref‖ ≤ 1e-2; every element within
// 2^-7·|ref| + 2^-6·rms(ref) (one bf16 ulp of itself plus a few ulps of the
// typical magnitude: intermediate roundings that flip with the GEMM order).
// Routing ids must match the reference's; where a near-tie makes them differ
// the reference is rerun with the GPU's routing (reported as id_rows).
// One line per case: shape, M, rel error, max abs error, GPU time (device
// part, events, best of 3 after a warm-up), OK/FAIL. Skips without a device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "server/moe/expert_set.h"
#include "server/moe/gpu_runner.h"
#include "server/moe/moe_runner.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/tolerance.h"

namespace kplan {
namespace {

using test_util::HaveCuda;
using test_util::SplitMix;

uint64_t Seed() { return test_util::TestSeed("moe_layer_gpu_test", "MOE_LAYER_GPU_TEST_SEED"); }

// n elements of `dtype` (bf16 / fp16 / fp32) into bytes: test_util's random
// values, stream `stream_id` of the run's seed.
std::string RandomTensor(kernels::DType dtype, int64_t n, int base, uint64_t stream_id) {
  const uint64_t key = SplitMix(Seed() ^ (stream_id * 0x100000001b3ull));
  if (dtype == kernels::DType::kBFloat16) return test_util::RandomBf16(n, base, key);
  if (dtype == kernels::DType::kFloat16) {
    return test_util::RandomElements(n, 2, key, [base](uint32_t bits, char* dst) {
      const uint16_t v = moe::FloatToHalf(test_util::RandomValueOf(bits, base));
      std::memcpy(dst, &v, 2);
    });
  }
  return test_util::RandomElements(n, 4, key, [base](uint32_t bits, char* dst) {
    const float v = test_util::RandomValueOf(bits, base);
    std::memcpy(dst, &v, 4);
  });
}

std::vector<float> RandomFloats(int64_t n, float lo, float hi, uint64_t stream_id) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix(SplitMix(Seed() ^ (stream_id << 40)) + i);
    v[i] = lo + (hi - lo) * static_cast<float>(r >> 40) / static_cast<float>(1ull << 24);
  }
  return v;
}

int Log2Ceil(double x) { return static_cast<int>(std::ceil(std::log2(x))); }

struct Shape {
  const char* name;
  int E, k;
  int64_t H, I;
};

std::unique_ptr<ExpertSet> MakeExperts(const Shape& s, kernels::DType dtype,
                                       const std::string& activation, bool bias,
                                       uint64_t stream_id) {
  ExpertsSpec spec;
  spec.experts_id = s.name;
  spec.num_experts = s.E;
  spec.hidden = s.H;
  spec.intermediate = s.I;
  spec.activation = activation;
  spec.dtype = dtype;
  spec.has_bias = bias;
  const bool gated = moe::IsGated(*moe::ParseMoeActivation(activation));
  const int64_t n13 = gated ? 2 * s.I : s.I;
  std::map<std::string, std::string> t;
  // Entries ~ 2^base·[0.125, 2): rms about 2^base / 1.3; base = -log2 sqrt(fan-in).
  t["w13"] = RandomTensor(dtype, s.E * n13 * s.H, -Log2Ceil(std::sqrt(double(s.H))), stream_id + 1);
  t["w2"] = RandomTensor(dtype, s.E * s.H * s.I, -Log2Ceil(std::sqrt(double(s.I))), stream_id + 2);
  if (bias) {
    t["w13_bias"] = RandomTensor(kernels::DType::kFloat32, s.E * n13, -3, stream_id + 3);
    t["w2_bias"] = RandomTensor(kernels::DType::kFloat32, s.E * s.H, -3, stream_id + 4);
  }
  return std::make_unique<ExpertSet>(std::move(spec), std::move(t));
}

MoeRouting RenormalizeNaive(int k) {
  MoeRouting r;
  r.routing_method = "RenormalizeNaive";
  r.top_k = k;
  return r;
}

// The 16-bit values (2-byte pieces) in which two outputs of one size differ.
int64_t Differing16(const std::string& a, const std::string& b) {
  int64_t differ = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) differ += std::memcmp(&a[i], &b[i], 2) != 0;
  return differ;
}

// M tokens of bf16 hidden states and fp32 logits in [-3, 3) for shape s,
// RenormalizeNaive routing (streams stream_id and stream_id + 100).
MoeRunInput Bf16Input(const Shape& s, int64_t M, uint64_t stream_id) {
  MoeRunInput in;
  in.act_dtype = kernels::DType::kBFloat16;
  in.hidden_shape = {M, s.H};
  in.hidden_states = RandomTensor(in.act_dtype, M * s.H, -1, stream_id);
  const std::vector<float> logits = RandomFloats(M * s.E, -3.0f, 3.0f, stream_id + 100);
  in.logits_shape = {M, s.E};
  in.router_logits.assign(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  in.routing = RenormalizeNaive(s.k);
  return in;
}

MoeRouting DeepSeekV3Routing(int E, int k, uint64_t stream_id) {
  MoeRouting r;
  r.routing_method = "DeepSeekV3";
  r.top_k = k;
  r.num_expert_group = 8;
  r.topk_group = 4;
  r.routed_scaling_factor = 2.5f;
  r.e_score_correction_bias = RandomFloats(E, -0.1f, 0.1f, stream_id);
  return r;
}

struct CaseOptions {
  bool given_ids = false;         // route on the host and pass topk ids / weights
  bool weights_on_input = false;  // apply_router_weight_on_input (k = 1)
  int timed_runs = 3;
};

// Runs one case and prints its line; mismatches are gtest failures.
void RunCase(const std::string& label, const ExpertSet& set, const GpuExperts& gpu, int64_t M,
             const MoeRouting& routing, uint64_t stream_id, const CaseOptions& opt = {}) {
  const ExpertsSpec& spec = set.spec();
  const int64_t H = spec.hidden;
  const int E = spec.num_experts;
  const int k = routing.top_k;
  const kernels::DType dt = spec.dtype;
  MoeRunInput in;
  in.act_dtype = dt;
  in.hidden_shape = {M, H};
  in.hidden_states = RandomTensor(dt, M * H, -1, stream_id + 10);
  const std::vector<float> logits = RandomFloats(M * E, -3.0f, 3.0f, stream_id + 11);
  in.apply_router_weight_on_input = opt.weights_on_input;

  auto spec_or = RoutingSpecFor(routing, E);
  ASSERT_TRUE(spec_or.ok()) << spec_or.status();
  moe::MoeProblem p;
  p.num_tokens = M;
  p.hidden = H;
  p.intermediate = spec.intermediate;
  p.num_experts = E;
  p.top_k = k;
  p.act_dtype = dt;
  p.hidden_states = in.hidden_states.data();
  p.activation = set.activation();
  p.weights = set.Weights();
  p.apply_router_weight_on_input = opt.weights_on_input;
  p.num_threads = 16;
  std::vector<float> ref_w(M * k);
  std::vector<int32_t> ref_ids(M * k);
  if (opt.given_ids) {
    ASSERT_TRUE(moe::RouteTokens(*spec_or, logits.data(), M, ref_w.data(), ref_ids.data()).ok());
    in.topk_shape = {M, k};
    in.topk_ids.assign(reinterpret_cast<const char*>(ref_ids.data()), M * k * 4);
    in.topk_weights.assign(reinterpret_cast<const char*>(ref_w.data()), M * k * 4);
  } else {
    in.logits_shape = {M, E};
    in.router_logits.assign(reinterpret_cast<const char*>(logits.data()), M * E * 4);
    in.routing = routing;
  }

  // GPU: the checked run (poisoned workspace) doubles as the warm-up.
  GpuRunOptions poison;
  poison.poison_workspace = true;
  auto got = RunMoeOnGpu(gpu, in, nullptr, poison);
  ASSERT_TRUE(got.ok()) << got.status();
  float best_ms = 0.0f;
  GpuRunStats st;
  for (int r = 0; r < opt.timed_runs; ++r) {
    auto again = RunMoeOnGpu(gpu, in, nullptr, {}, &st);
    ASSERT_TRUE(again.ok()) << again.status();
    if (r == 0 || st.device_ms < best_ms) best_ms = st.device_ms;
    ASSERT_EQ(again->output, got->output) << label << ": the GPU result is not deterministic";
  }

  // CPU reference.
  std::string ref(M * H * 2, '\0');
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.given_ids) {
    p.topk_ids = ref_ids.data();
    p.topk_weights = ref_w.data();
    ASSERT_TRUE(moe::MoeReference(p, ref.data()).ok());
  } else {
    p.router_logits = logits.data();
    p.routing = *spec_or;
    ASSERT_TRUE(moe::MoeReference(p, ref.data(), ref_w.data(), ref_ids.data()).ok());
  }
  int id_rows = 0;
  for (int64_t m = 0; m < M; ++m) {
    if (!std::equal(&ref_ids[m * k], &ref_ids[m * k] + k, &got->topk_ids[m * k])) ++id_rows;
  }
  if (id_rows > 0) {  // near-ties: compare the experts on the GPU's routing
    ASSERT_LE(id_rows, std::max<int64_t>(1, M / 100)) << label << ": routing ids differ";
    moe::MoeProblem q = p;
    q.router_logits = nullptr;
    q.topk_ids = got->topk_ids.data();
    q.topk_weights = got->topk_weights.data();
    ASSERT_TRUE(moe::MoeReference(q, ref.data()).ok());
  } else {
    for (int64_t i = 0; i < M * k; ++i) {
      ASSERT_NEAR(got->topk_weights[i], ref_w[i], 1e-5f * std::fabs(ref_w[i]) + 1e-7f)
          << label << ": routing weight " << i;
    }
  }
  const double cpu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Compare.
  const int64_t n = M * H;
  std::vector<float> g(n), r(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = moe::LoadFloat(got->output.data(), dt, i);
    r[i] = moe::LoadFloat(ref.data(), dt, i);
  }
  double d2 = 0, r2 = 0, max_abs = 0;
  int64_t bad_nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(g[i])) ++bad_nan;
    const double d = static_cast<double>(g[i]) - r[i];
    d2 += d * d;
    r2 += static_cast<double>(r[i]) * r[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  const double rms = std::sqrt(r2 / std::max<int64_t>(n, 1));
  const double rel = std::sqrt(d2 / std::max(r2, 1e-30));
  int64_t bad_elem = 0, first_bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double tol = test_util::MoeLayerElementTolerance(r[i], rms);
    if (!(std::fabs(static_cast<double>(g[i]) - r[i]) <= tol)) {
      if (first_bad < 0) first_bad = i;
      ++bad_elem;
    }
  }
  const bool ok = bad_nan == 0 && rel <= 1e-2 && bad_elem == 0 && r2 > 0;
  // Useful work: 2·slots·(N13·H + I·H) flops; weights of the experts used.
  std::set<int32_t> used(got->topk_ids.begin(), got->topk_ids.end());
  const int64_t n13 = moe::IsGated(set.activation()) ? 2 * spec.intermediate : spec.intermediate;
  const double flops = 2.0 * M * k * (n13 + spec.intermediate) * H;
  const double wbytes = static_cast<double>(used.size()) * (n13 + spec.intermediate) * H * 2;
  std::printf(
      "%-34s M=%-5lld rel=%.2e max_abs=%.2e rms=%.2e gpu=%8.3f ms (%6.1f TFLOP/s, %6.0f GB/s "
      "weights) cpu_ref=%.1f s id_rows=%d %s\n",
      label.c_str(), static_cast<long long>(M), rel, max_abs, rms, best_ms,
      flops / (best_ms * 1e-3) / 1e12, wbytes / (best_ms * 1e-3) / 1e9, cpu_s, id_rows,
      ok ? "OK" : "FAIL");
  std::fflush(stdout);
  EXPECT_EQ(bad_nan, 0) << label << ": non-finite outputs (unwritten or NaN)";
  EXPECT_LE(rel, 1e-2) << label;
  EXPECT_GT(r2, 0.0) << label << ": reference is all zeros";
  EXPECT_EQ(bad_elem, 0) << label << ": first bad element " << first_bad << " gpu "
                         << (first_bad >= 0 ? g[first_bad] : 0) << " ref "
                         << (first_bad >= 0 ? r[first_bad] : 0);
}

std::unique_ptr<GpuExperts> Upload(const ExpertSet& set) {
  auto g = GpuExperts::Create(set, 0);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : nullptr;
}

void RunModel(const Shape& s, const std::vector<int64_t>& tokens, bool deepseek_routing) {
  const auto t0 = std::chrono::steady_clock::now();
  auto set = MakeExperts(s, kernels::DType::kBFloat16, "silu", false, 1000);
  auto gpu = Upload(*set);
  ASSERT_NE(gpu, nullptr);
  std::printf("%s: experts %.2f GB, generated and uploaded in %.1f s\n", s.name, gpu->bytes() / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  for (int64_t M : tokens) {
    const MoeRouting r =
        deepseek_routing ? DeepSeekV3Routing(s.E, s.k, 77 + M) : RenormalizeNaive(s.k);
    RunCase(std::string(s.name) + (deepseek_routing ? " DeepSeekV3" : " RenormalizeNaive"), *set,
            *gpu, M, r, 100 * M + 1);
  }
  if (deepseek_routing) {
    RunCase(std::string(s.name) + " RenormalizeNaive", *set, *gpu, 64, RenormalizeNaive(s.k), 999);
  }
}

TEST(MoeLayerGpu, Mixtral8x7B) {
  SKIP_WITHOUT_CUDA();
  RunModel({"Mixtral-8x7B", 8, 2, 4096, 14336}, {1, 7, 64, 512, 4096}, false);
}

TEST(MoeLayerGpu, DeepSeekV3) {
  SKIP_WITHOUT_CUDA();
  RunModel({"DeepSeek-V3", 256, 8, 7168, 2048}, {1, 7, 64, 512, 4096}, true);
}

TEST(MoeLayerGpu, Qwen3_30B_A3B) {
  SKIP_WITHOUT_CUDA();
  RunModel({"Qwen3-30B-A3B", 128, 8, 2048, 768}, {1, 7, 64, 512, 4096}, false);
}

// Tails (H = 200: K not a multiple of 32; N13 = 144 / H = 200: partial N
// tiles), every activation family, biases, fp16, split-K with and without
// bias, given ids, weights on input; 1600 tokens take the 256-slot GEMM
// blocks.
TEST(MoeLayerGpu, SmallShapesActivationsBiasFp16) {
  SKIP_WITHOUT_CUDA();
  const Shape s{"small", 6, 2, 200, 72};
  struct Variant {
    const char* act;
    kernels::DType dtype;
    bool bias;
  };
  const Variant variants[] = {
      {"silu", kernels::DType::kBFloat16, false},
      {"gelu", kernels::DType::kBFloat16, true},
      {"gelu_tanh", kernels::DType::kFloat16, false},
      {"swigluoai", kernels::DType::kBFloat16, false},
      {"swiglustep", kernels::DType::kFloat16, true},
      {"relu2", kernels::DType::kBFloat16, false},
      {"silu_no_mul", kernels::DType::kBFloat16, false},
      {"silu", kernels::DType::kFloat16, true},
  };
  uint64_t id = 5000;
  for (const Variant& v : variants) {
    auto set = MakeExperts(s, v.dtype, v.act, v.bias, id += 10);
    auto gpu = Upload(*set);
    ASSERT_NE(gpu, nullptr);
    const std::string label =
        absl::StrCat("small ", v.act, " ", kernels::DTypeName(v.dtype), v.bias ? " bias" : "");
    for (int64_t M : {1, 33, 300, 1600}) RunCase(label, *set, *gpu, M, RenormalizeNaive(2), id + M);
  }
  // A long K: up to kMoeDecodeMaxSlots slots the decode kernels, beyond
  // them few CTAs, so the GEMMs split K, with a bias (the GEMM sums its
  // partials) and without (activation and combine sum them).
  const Shape deep{"deep-K", 4, 2, 2048, 1024};
  for (bool bias : {true, false}) {
    auto set = MakeExperts(deep, kernels::DType::kBFloat16, "silu", bias, 5900 + bias);
    auto gpu = Upload(*set);
    ASSERT_NE(gpu, nullptr);
    for (int64_t M : {1, 9, 12}) {
      const bool decode = kernels::cuda::MoeDecodeApplies(M, deep.k, deep.E, deep.H, deep.I);
      RunCase(absl::StrCat(decode ? "decode" : "split-K", " silu bfloat16", bias ? " bias" : ""),
              *set, *gpu, M, RenormalizeNaive(2), 5910 + M);
    }
  }
  // Several tokens on the decode kernels: few slots among many experts.
  const Shape wide{"decode-wide", 64, 2, 256, 128};
  for (bool bias : {false, true}) {
    const kernels::DType dt = bias ? kernels::DType::kFloat16 : kernels::DType::kBFloat16;
    auto set = MakeExperts(wide, dt, "silu", bias, 5950 + bias);
    auto gpu = Upload(*set);
    ASSERT_NE(gpu, nullptr);
    ASSERT_TRUE(kernels::cuda::MoeDecodeApplies(4, wide.k, wide.E, wide.H, wide.I));
    RunCase(absl::StrCat("decode 4 tokens silu ", kernels::DTypeName(dt), bias ? " bias" : ""),
            *set, *gpu, 4, RenormalizeNaive(2), 5960 + bias);
  }
  auto set = MakeExperts(s, kernels::DType::kBFloat16, "silu", false, 6000);
  auto gpu = Upload(*set);
  ASSERT_NE(gpu, nullptr);
  CaseOptions given;
  given.given_ids = true;
  RunCase("small silu given-ids", *set, *gpu, 129, RenormalizeNaive(2), 6001, given);
  CaseOptions on_input;
  on_input.weights_on_input = true;
  MoeRouting top1;
  top1.routing_method = "Default";
  top1.top_k = 1;
  RunCase("small silu weights-on-input k=1", *set, *gpu, 65, top1, 6002, on_input);
  RunCase(
      "small silu Renormalize", *set, *gpu, 40,
      [] {
        MoeRouting r;
        r.routing_method = "Renormalize";
        r.top_k = 2;
        return r;
      }(),
      6003);
}

// The activation in GEMM 1's epilogue (moe_gemm_ws.h) against GEMM 1 +
// the activation kernel: the layer's output bit for bit, silu in bf16 and
// fp16, with and without biases, a partial output tile (I = 72) and several
// (I = 384); gelu, gelu_tanh and relu2 on the cooperative tiles (one CTA a
// tile and, forced, clusters of two; M 8192: 384 work items, so deferred
// units of one tile finish in the next); swiglustep and swigluoai take the
// unfused path either way (moe_gemm_ws.h).
TEST(MoeLayerGpu, SmallFusedActivationBitIdentical) {
  SKIP_WITHOUT_CUDA();
  namespace kc = kernels::cuda;
  struct Variant {
    Shape shape;
    const char* act;
    kernels::DType dtype;
    bool bias;
    int64_t M;
    bool clusters = false;  // clusters of two forced on (both runs)
  };
  const Shape fused{"fused", 8, 2, 256, 384};
  const Variant variants[] = {
      {{"small", 6, 2, 200, 72}, "silu", kernels::DType::kBFloat16, false, 1600},
      {{"small", 6, 2, 200, 72}, "silu", kernels::DType::kFloat16, true, 1600},
      {fused, "silu", kernels::DType::kBFloat16, true, 1024},
      {fused, "silu", kernels::DType::kFloat16, false, 700},
      {fused, "gelu", kernels::DType::kBFloat16, false, 1024},
      {fused, "gelu_tanh", kernels::DType::kFloat16, true, 700},
      {fused, "relu2", kernels::DType::kBFloat16, true, 1024, true},
      {fused, "gelu", kernels::DType::kBFloat16, true, 8192},
      {fused, "gelu_tanh", kernels::DType::kFloat16, false, 1024, true},
      {fused, "swiglustep", kernels::DType::kFloat16, false, 1024},
      {fused, "swigluoai", kernels::DType::kBFloat16, false, 1024},
  };
  uint64_t id = 7000;
  for (const Variant& v : variants) {
    auto set = MakeExperts(v.shape, v.dtype, v.act, v.bias, id += 10);
    auto gpu = Upload(*set);
    ASSERT_NE(gpu, nullptr);
    const int64_t M = v.M, H = v.shape.H;
    MoeRunInput in;
    in.act_dtype = v.dtype;
    in.hidden_shape = {M, H};
    in.hidden_states = RandomTensor(v.dtype, M * H, -1, id + 1);
    const std::vector<float> logits = RandomFloats(M * v.shape.E, -3.0f, 3.0f, id + 2);
    in.logits_shape = {M, v.shape.E};
    in.router_logits.assign(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
    in.routing = RenormalizeNaive(v.shape.k);
    GpuRunOptions poison;
    poison.poison_workspace = true;
    if (v.clusters) kc::SetMoeGemmWsClusterMode(kc::MoeGemmWsMode::kOn);
    kc::SetMoeFusedActMode(kc::MoeGemmWsMode::kOff);
    auto unfused = RunMoeOnGpu(*gpu, in, nullptr, poison);
    kc::SetMoeFusedActMode(kc::MoeGemmWsMode::kOn);
    kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kOn);  // the fused epilogue is the ws kernel's
    const int64_t launches = kc::MoeFusedActLaunches();
    const int64_t clustered = kc::MoeGemmWsClusterLaunches();
    auto fused = RunMoeOnGpu(*gpu, in, nullptr, poison);
    // silu, gelu, gelu_tanh and relu2 take the fused kernel (else this test
    // compares the unfused path with itself); the others fall back.
    const std::string act = v.act;
    const bool want_fused = act != "swigluoai" && act != "swiglustep";
    EXPECT_EQ(kc::MoeFusedActLaunches() > launches, want_fused) << v.shape.name << " " << v.act;
    if (v.clusters) {  // GEMM 1 (fused) and GEMM 2 in clusters
      EXPECT_EQ(kc::MoeGemmWsClusterLaunches(), clustered + 2) << v.act;
    }
    kc::SetMoeGemmWsClusterMode(kc::MoeGemmWsMode::kFromEnv);
    kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kFromEnv);
    kc::SetMoeFusedActMode(kc::MoeGemmWsMode::kFromEnv);
    ASSERT_TRUE(unfused.ok()) << unfused.status();
    ASSERT_TRUE(fused.ok()) << fused.status();
    ASSERT_EQ(fused->output.size(), unfused->output.size());
    const int64_t differ = Differing16(fused->output, unfused->output);
    std::printf("fused activation %s %s %s%s M=%lld: %lld of %lld values differ %s\n", v.shape.name,
                v.act, std::string(kernels::DTypeName(v.dtype)).c_str(), v.bias ? " bias" : "",
                static_cast<long long>(M), static_cast<long long>(differ),
                static_cast<long long>(fused->output.size() / 2), differ == 0 ? "OK" : "FAIL");
    EXPECT_EQ(differ, 0) << v.shape.name << " " << v.act;
  }
}

// The forms with a switch (moe_bench --variants), in the whole layer: the
// align spread over blocks (from 4096 ids: the layer's workspace holds its
// scratch) and the warp-specialised GEMM's ping-pong consumers (blocks of
// 128: 20, 75 and 256 slots per expert, fused GEMM 1), each on alone and
// both, bit for bit against the layer with both off (at 20 slots that one
// runs blocks of 64 on the cp.async kernel); and the defaults,
// where the ping-pong form runs by its rule (MoeGemmWsPingPongFor: at 20
// slots, not at 75 or 256) in both GEMMs.
TEST(MoeLayerGpu, SwitchedFormsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  namespace kc = kernels::cuda;
  const Shape shape{"forms", 64, 8, 256, 384};
  auto set = MakeExperts(shape, kernels::DType::kBFloat16, "silu", true, 7100);
  auto gpu = Upload(*set);
  ASSERT_NE(gpu, nullptr);
  for (const int64_t M : {160, 600, 2048}) {
    const MoeRunInput in = Bf16Input(shape, M, 7200 + M);
    GpuRunOptions poison;
    poison.poison_workspace = true;
    // The rule's choice at this M, and whether the environment turned it off.
    const bool rule = kc::MoeGemmWsPingPongFor(kernels::DType::kBFloat16, M * shape.k, shape.E);
    const char* env = std::getenv("KPLAN_MOE_WS_PINGPONG");  // "0": off
    const bool allowed = env == nullptr || *env == '\0' || std::strcmp(env, "0") != 0;
    EXPECT_EQ(rule, allowed && M == 160) << "M " << M;  // 20 slots per expert
    // modes: 0 off, 1 on, 2 the default (kFromEnv).
    auto run = [&](int spread, int ping_pong) {
      auto mode = [](int m) {
        return m == 2   ? kc::MoeKernelMode::kFromEnv
               : m == 1 ? kc::MoeKernelMode::kOn
                        : kc::MoeKernelMode::kOff;
      };
      kc::SetMoeAlignSpreadMode(mode(spread));
      kc::SetMoeGemmWsPingPongMode(mode(ping_pong));
      const int64_t pp = kc::MoeGemmWsPingPongLaunches();
      auto out = RunMoeOnGpu(*gpu, in, nullptr, poison);
      // Both GEMMs take the form where it is on (blocks of 128), and by
      // default where the rule says so.
      const bool want = ping_pong == 1 || (ping_pong == 2 && rule);
      EXPECT_EQ(kc::MoeGemmWsPingPongLaunches() - pp, want ? 2 : 0) << "M " << M;
      kc::SetMoeAlignSpreadMode(kc::MoeKernelMode::kFromEnv);
      kc::SetMoeGemmWsPingPongMode(kc::MoeGemmWsMode::kFromEnv);
      return out;
    };
    auto base = run(0, 0);
    ASSERT_TRUE(base.ok()) << base.status();
    for (const auto& [spread, ping_pong] : {std::pair{1, 0}, {0, 1}, {1, 1}, {2, 2}}) {
      auto got = run(spread, ping_pong);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->output.size(), base->output.size());
      const int64_t differ = Differing16(got->output, base->output);
      std::printf("forms M=%lld spread=%d ping_pong=%d: %lld of %lld values differ %s\n",
                  static_cast<long long>(M), spread, ping_pong, static_cast<long long>(differ),
                  static_cast<long long>(got->output.size() / 2), differ == 0 ? "OK" : "FAIL");
      EXPECT_EQ(differ, 0) << "M " << M << " spread " << spread << " ping_pong " << ping_pong;
      EXPECT_EQ(got->topk_ids, base->topk_ids);
    }
  }
}

// The tall tiles (blocks of 192), forced on, in the whole layer: both GEMMs
// (the fused GEMM 1 and GEMM 2) take them wherever the cooperative
// consumers would run (75, 128 and 256 slots per expert), not where the
// ping-pong form runs by its rule (20 slots); bit for bit against the
// layer with them off, on a workspace poisoned with NaN.
TEST(MoeLayerGpu, TallTilesBitIdentical) {
  SKIP_WITHOUT_CUDA();
  namespace kc = kernels::cuda;
  const Shape shape{"tall", 64, 8, 256, 384};
  auto set = MakeExperts(shape, kernels::DType::kBFloat16, "silu", true, 7400);
  auto gpu = Upload(*set);
  ASSERT_NE(gpu, nullptr);
  for (const int64_t M : {160, 600, 1024, 2048}) {
    const MoeRunInput in = Bf16Input(shape, M, 7500 + M);
    GpuRunOptions poison;
    poison.poison_workspace = true;
    // Where the cooperative consumers run (blocks of 128 or 256 without the
    // ping-pong form), whatever the environment sets.
    const bool ping_pong =
        kc::MoeGemmWsPingPongFor(kernels::DType::kBFloat16, M * shape.k, shape.E);
    const bool cooperative =
        kc::MoeGemmWsEnabled() && !ping_pong &&
        kc::MoeGemmBlockMFor(M * shape.k, shape.E, std::min(shape.H, shape.I), false) >= 128;
    auto run = [&](kc::MoeKernelMode mode) {
      kc::SetMoeGemmWsTallTilesMode(mode);
      const int64_t tall = kc::MoeGemmWsTallTilesLaunches();
      auto out = RunMoeOnGpu(*gpu, in, nullptr, poison);
      const bool want = mode == kc::MoeKernelMode::kOn && cooperative;
      EXPECT_EQ(kc::MoeGemmWsTallTilesLaunches() - tall, want ? 2 : 0) << "M " << M;
      kc::SetMoeGemmWsTallTilesMode(kc::MoeKernelMode::kFromEnv);
      return out;
    };
    auto base = run(kc::MoeKernelMode::kOff);
    ASSERT_TRUE(base.ok()) << base.status();
    auto got = run(kc::MoeKernelMode::kOn);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->output.size(), base->output.size());
    const int64_t differ = Differing16(got->output, base->output);
    std::printf("tall M=%lld ping_pong=%d: %lld of %lld values differ %s\n",
                static_cast<long long>(M), ping_pong, static_cast<long long>(differ),
                static_cast<long long>(got->output.size() / 2), differ == 0 ? "OK" : "FAIL");
    EXPECT_EQ(differ, 0) << "M " << M;
    EXPECT_EQ(got->topk_ids, base->topk_ids);
  }
}

TEST(MoeLayerGpu, RoutesAndRefuses) {
  SKIP_WITHOUT_CUDA();
  const Shape s{"refuse", 4, 2, 64, 32};
  // fp32 weights run (through the emulation route, not the fast kernels);
  // a hidden size that is not a multiple of 8 does not.
  auto f32 = MakeExperts(s, kernels::DType::kFloat32, "silu", false, 7000);
  auto g32 = GpuExperts::Create(*f32, 0);
  ASSERT_TRUE(g32.ok()) << g32.status();
  EXPECT_FALSE((*g32)->FastPathFor(kernels::DType::kFloat32));
  auto odd =
      MakeExperts({"refuse-odd", 4, 2, 60, 32}, kernels::DType::kBFloat16, "silu", false, 7001);
  auto godd = GpuExperts::Create(*odd, 0);
  EXPECT_EQ(godd.status().code(), absl::StatusCode::kFailedPrecondition) << godd.status();

  auto set = MakeExperts(s, kernels::DType::kBFloat16, "silu", false, 7010);
  auto gpu = Upload(*set);
  ASSERT_NE(gpu, nullptr);
  MoeRunInput in;
  in.act_dtype = kernels::DType::kFloat32;
  in.hidden_shape = {3, 64};
  in.hidden_states = RandomTensor(kernels::DType::kFloat32, 3 * 64, -1, 7020);
  in.logits_shape = {3, 4};
  in.router_logits = std::string(3 * 4 * 4, '\0');
  in.routing = RenormalizeNaive(2);
  auto r = RunMoeOnGpu(*gpu, in, nullptr);  // fp32 activations on bf16 weights: emulation
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(gpu->FastPathFor(kernels::DType::kFloat32));
  EXPECT_TRUE(gpu->FastPathFor(kernels::DType::kBFloat16));

  in.act_dtype = kernels::DType::kBFloat16;
  in.hidden_states = RandomTensor(kernels::DType::kBFloat16, 3 * 64, -1, 7021);
  in.routing.top_k = 9;
  r = RunMoeOnGpu(*gpu, in, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  in.routing.top_k = 2;
  in.hidden_shape = {3, 65};
  r = RunMoeOnGpu(*gpu, in, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  in.hidden_shape = {0, 64};
  in.hidden_states.clear();
  in.logits_shape = {0, 4};
  in.router_logits.clear();
  r = RunMoeOnGpu(*gpu, in, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->output.empty());
}

}  // namespace
}  // namespace kplan
