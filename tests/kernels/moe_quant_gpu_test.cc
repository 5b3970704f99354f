// The GPU MoE layer's emulation route (server/moe/gpu_layer_emulation.h over
// kernels/cuda/moe/moe_quant_gemm.h) against the CPU reference (moe::MoeReference)
// for every weight / activation combination the reference supports: fp8 e4m3
// weights with per-tensor (activations quantised per token, or per tensor
// dynamically / statically), per-channel and 128x128 block scales (1x128
// activation groups); int8 and int4 weight-only with group scales, with and
// without zero points; unquantised weights in another dtype than the
// activations; fp32, fp16 and bf16 activations. Fresh random data every run
// (seed printed; MOE_QUANT_GPU_TEST_SEED=<n> repeats one): fp8 bytes with
// random sign, mantissa and exponent (never 0 or NaN), int values over their
// whole range, scales around 1/(rms(q)·sqrt(fan-in)) (int: about half of
// the groups' scales exact in bf16, the kernels' packed dequantisation, the
// others arbitrary fp32), activations ±(1 + m/128)·2^(-1 - 0..3). The int
// dequantiser is also checked bit for bit against the reference's rounding
// (IntDequantIsTheReferencesRounding).
//  * Shapes: Qwen3-30B-A3B (E=128, k=8, H=2048, I=768) for every scheme at M
//    in {1, 64, 512} and 4096 for fp8 per-tensor and int4; Mixtral-8x7B
//    (E=8, k=2, H=4096, I=14336) int4 / fp8 at M in {1, 64, 512};
//    DeepSeek-V3 (E=256, k=8, H=7168, I=2048, DeepSeekV3 routing) fp8 block at
//    M in {1, 64, 256}. The CPU reference runs on every core (results do not
//    depend on the thread count); M stays <= 512 on the two large shapes to
//    keep it to seconds.
//  * Small shapes with tails (H = 200, I = 72: partial k-blocks and tiles),
//    odd block / group sizes (SIMT fold and per-element scale paths), biases,
//    given ids, weights on the input; the run under compute-sanitizer.
// The workspace is poisoned with NaN first: an unwritten element shows.
// Tolerances by activation dtype: bf16 / fp16 ‖d‖/‖ref‖ <= 1e-2 and each
// element within 2^-7·|ref| + 2^-6·rms(ref); fp32 1e-4 and 2^-13·|ref| +
// 2^-12·rms. fp8 schemes (activations re-quantised after GEMM 1, where one
// summation-order flip of a rounding moves a value by an fp8 step) get
// 2^-6·|ref| + 2^-5·rms per element, and up to max(2, n/10^5) outputs within
// 2^-3·rms (the flips, counted per line). Skips without a device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/float16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_gemm_ws_fp8.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/moe/expert_set.h"
#include "server/moe/gpu_runner.h"
#include "server/moe/moe_runner.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/tolerance.h"

namespace kplan {
namespace {

using kernels::DType;

using test_util::HaveCuda;

uint64_t Seed() { return test_util::TestSeed("moe_quant_gpu_test", "MOE_QUANT_GPU_TEST_SEED"); }

uint64_t Mix(uint64_t x) { return test_util::SplitMix(x); }

int Threads() { return std::max(1u, std::min(32u, std::thread::hardware_concurrency())); }

// fn(i, r) for i in [0, n) with r = 64 random bits of (stream, i), in parallel.
template <typename Fn>
void Fill(int64_t n, uint64_t stream, Fn fn) {
  const uint64_t key = Mix(Seed() ^ (stream * 0x100000001b3ull));
  const int threads = Threads();
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      for (int64_t i = t * chunk; i < std::min(n, (t + 1) * chunk); ++i) fn(i, Mix(key + i));
    });
  }
  for (std::thread& th : pool) th.join();
}

// Non-zero float-dtype values ±(1 + m/128)·2^(base - 0..3).
std::string RandomFloats(kernels::DType dtype, int64_t n, int base, uint64_t stream) {
  const int64_t es = kernels::DTypeSize(dtype);
  std::string out(static_cast<size_t>(n * es), '\0');
  char* dst = out.data();
  Fill(n, stream, [&](int64_t i, uint64_t r) {
    float v = std::ldexp(1.0f + static_cast<float>((r >> 2) & 127) / 128.0f,
                         base - static_cast<int>(r & 3));
    if (r & 0x8000) v = -v;
    moe::StoreFloat(dst, dtype, i, v);
  });
  return out;
}

// Positive fp32 values base·[0.5, 1.5), rounded to bf16 (exact in bf16 and,
// at these magnitudes, fp16: the int kernels' packed dequantisation) where
// `exact` says: none, about half (the others arbitrary fp32, the per-weight
// dequantisation, so each int case runs both, group by group) or all (the
// packed form for whole warps of the int4 GEMMs, which take it only when
// every lane's group is exact).
enum class ExactScales { kNone, kHalf, kAll };
std::string RandomScales(int64_t n, double base, uint64_t stream, ExactScales exact) {
  std::string out(static_cast<size_t>(n * 4), '\0');
  float* dst = reinterpret_cast<float*>(out.data());
  Fill(n, stream, [&](int64_t i, uint64_t r) {
    dst[i] = static_cast<float>(base * (0.5 + static_cast<double>(r >> 40) / (1ull << 24)));
    if (exact == ExactScales::kAll || (exact == ExactScales::kHalf && (r & 1))) {
      dst[i] = moe::RoundToDType(dst[i], DType::kBFloat16);
    }
  });
  return out;
}

std::string RandomBytes(int64_t n, uint64_t stream, uint8_t (*pick)(uint64_t)) {
  std::string out(static_cast<size_t>(n), '\0');
  char* dst = out.data();
  Fill(n, stream, [&](int64_t i, uint64_t r) { dst[i] = static_cast<char>(pick(r)); });
  return out;
}

struct Shape {
  const char* name;
  int E, k;
  int64_t H, I;
};

// A weight / activation combination.
struct Combo {
  std::string quant;                                  // "" or an ExpertsQuantSpec scheme
  kernels::DType wdtype = kernels::DType::kBFloat16;  // unquantised weights
  kernels::DType act = kernels::DType::kBFloat16;
  std::string act_scale = "per_token";         // fp8 non-block: per_token | per_tensor
  std::string block_act_scale = "per_tensor";  // fp8_block: per_token is illegal
  bool static_scales = false;                  // fp8 per_tensor: a1 / a2 given
  bool zero_points = false;                    // int8 / int4
  int block_n = 128, block_k = 128, group = 128;
  std::string activation = "silu";
  bool bias = false;
  bool exact_scales = false;  // int: every group scale exact in bf16 (else about half)

  std::string Label() const {
    std::string s = quant.empty() ? absl::StrCat(kernels::DTypeName(wdtype), " weights") : quant;
    if (quant.rfind("fp8", 0) == 0) {
      s += quant == "fp8_block" ? absl::StrCat(" ", block_n, "x", block_k)
                                : absl::StrCat(" act ", act_scale, static_scales ? " static" : "");
    }
    if (quant == "int8_group" || quant == "int4_group") {
      s += absl::StrCat(" g", group, zero_points ? " zp" : "", exact_scales ? " exact" : "");
    }
    s += absl::StrCat(" / ", kernels::DTypeName(act));
    if (activation != "silu") s += " " + activation;
    if (bias) s += " bias";
    return s;
  }
  bool fp8() const { return quant.rfind("fp8", 0) == 0; }
};

std::unique_ptr<ExpertSet> MakeSet(const Shape& sh, const Combo& c, uint64_t stream) {
  ExpertsSpec spec;
  spec.experts_id = sh.name;
  spec.num_experts = sh.E;
  spec.hidden = sh.H;
  spec.intermediate = sh.I;
  spec.activation = c.activation;
  spec.has_bias = c.bias;
  spec.quant.scheme = c.quant;
  spec.quant.block_n = c.block_n;
  spec.quant.block_k = c.block_k;
  spec.quant.group_size = c.group;
  spec.quant.has_zero_points = c.zero_points;
  spec.quant.activation_scale = c.quant == "fp8_block" ? c.block_act_scale : c.act_scale;
  if (c.static_scales) {
    spec.quant.a1_scale = 1.0f / 448.0f;  // hidden states stay below 1
    spec.quant.a2_scale = 1.0f / 64.0f;
  }
  spec.dtype = c.quant.empty()           ? c.wdtype
               : c.fp8()                 ? kernels::DType::kFp8E4m3
               : c.quant == "int8_group" ? kernels::DType::kInt8
                                         : kernels::DType::kInt4Packed;
  std::map<std::string, std::string> t;
  for (const TensorSpec& ts : ExpectedTensors(spec)) {
    int64_t n = 1;
    for (int64_t d : ts.shape) n *= d;
    const double fan_in = ts.name.rfind("w13", 0) == 0 ? sh.H : sh.I;
    const double inv = 1.0 / std::sqrt(fan_in);
    const uint64_t id = stream * 16 + t.size();
    const bool weight = ts.name == "w13" || ts.name == "w2";
    if (ts.name.find("bias") != std::string::npos) {
      t[ts.name] = RandomFloats(kernels::DType::kFloat32, n, -3, id);
    } else if (weight && c.quant.empty()) {
      t[ts.name] =
          RandomFloats(c.wdtype, n, -static_cast<int>(std::ceil(std::log2(fan_in) / 2)), id);
    } else if (weight && c.fp8()) {  // exponent field 4..9: 0.125 .. 7.5, never 0 / NaN
      t[ts.name] = RandomBytes(n, id, [](uint64_t r) {
        return static_cast<uint8_t>((r & 0x80) | ((4 + (r >> 8) % 6) << 3) | ((r >> 16) & 7));
      });
    } else if (weight && c.quant == "int8_group") {
      t[ts.name] = c.zero_points
                       ? RandomBytes(n, id, [](uint64_t r) { return static_cast<uint8_t>(r); })
                       : RandomBytes(n, id, [](uint64_t r) {
                           const int v = static_cast<int>(r % 254) - 127;
                           return static_cast<uint8_t>(static_cast<int8_t>(v ? v : 1));
                         });
    } else if (weight) {  // int4: every nibble
      t[ts.name] = RandomBytes(n, id, [](uint64_t r) { return static_cast<uint8_t>(r); });
    } else if (ts.name.find("zero") != std::string::npos) {
      t[ts.name] = c.quant == "int8_group"
                       ? RandomBytes(n, id, [](uint64_t r) { return uint8_t(112 + r % 33); })
                       : RandomBytes(n, id, [](uint64_t r) { return uint8_t(6 + r % 4); });
    } else {  // scales: dequantised weights of rms about 1/sqrt(fan-in)
      const double rms_q = c.fp8() ? 2.5 : c.quant == "int8_group" ? 73.0 : 4.6;
      t[ts.name] = RandomScales(n, inv / rms_q, id,
                                c.fp8()          ? ExactScales::kNone
                                : c.exact_scales ? ExactScales::kAll
                                                 : ExactScales::kHalf);
    }
  }
  return std::make_unique<ExpertSet>(std::move(spec), std::move(t));
}

MoeRouting Routing(const Shape& sh, bool deepseek, uint64_t stream) {
  MoeRouting r;
  r.top_k = sh.k;
  if (!deepseek) {
    r.routing_method = "RenormalizeNaive";
    return r;
  }
  r.routing_method = "DeepSeekV3";
  r.num_expert_group = 8;
  r.topk_group = 4;
  r.routed_scaling_factor = 2.5f;
  r.e_score_correction_bias.resize(sh.E);
  for (int e = 0; e < sh.E; ++e) {
    r.e_score_correction_bias[e] =
        0.1f * (static_cast<float>(Mix(Seed() + stream + e) >> 40) / (1 << 23) - 1.0f);
  }
  return r;
}

std::vector<float> Logits(int64_t n, uint64_t stream) {
  std::vector<float> v(n);
  Fill(n, stream, [&](int64_t i, uint64_t r) {
    v[i] = -3.0f + 6.0f * static_cast<float>(r >> 40) / (1 << 24);
  });
  return v;
}

struct RunOptions {
  // The route (moe_quant_route.h) for the run; auto picks by batch size.
  kernels::cuda::MoeQuantRouteMode route = kernels::cuda::MoeQuantRouteMode::kAuto;
  bool deepseek_routing = false;
  // A routing method other than the shape's (Routing): e.g. "Default", whose
  // top-1 weight is a softmax probability, not 1.
  const char* routing_method = nullptr;
  bool given_ids = false;
  bool weights_on_input = false;  // k must be 1
  int k_override = 0;
  bool expect_matvec = false;  // auto must pick the matvec kernels
  // From this M on (0: never) the int route must run its GEMMs on the int4
  // weights (MoeGemmIntLaunches grows), and its output must equal, byte for
  // byte, the dequantised copy's (the int4 GEMMs switched off,
  // SetMoeGemmIntMode, and the dequant route forced: same blocks and splits).
  int64_t int_gemm_from = 0;
  // From this M on (0: never) the fp8 GEMM 1 must apply the activation and
  // quantise GEMM 2's activation in its epilogue (MoeGemmWsFp8ActQuantLaunches
  // grows), and the output must equal, byte for byte, the three steps' (the
  // fused GEMM 1 switched off, SetMoeGemmWsFp8ActQuantMode).
  int64_t fp8_act_quant_from = 0;
};

void RunCase(const Shape& sh, const Combo& c, const ExpertSet& set, const GpuExperts& gpu,
             int64_t M, uint64_t stream, const RunOptions& opt = {}) {
  const char* const kRouteNames[] = {"auto", "emulation", "decode", "dequant", "matvec"};
  const std::string label =
      absl::StrCat(sh.name, " ", c.Label(),
                   opt.route == kernels::cuda::MoeQuantRouteMode::kAuto
                       ? ""
                       : absl::StrCat(" [", kRouteNames[static_cast<int>(opt.route)], "]"));
  // The route for this case only (also on an early ASSERT return).
  struct RouteGuard {
    explicit RouteGuard(kernels::cuda::MoeQuantRouteMode m) {
      // auto leaves KPLAN_MOE_QUANT_ROUTE in charge.
      if (m != kernels::cuda::MoeQuantRouteMode::kAuto) kernels::cuda::SetMoeQuantRouteMode(m);
    }
    ~RouteGuard() {
      kernels::cuda::SetMoeQuantRouteMode(kernels::cuda::MoeQuantRouteMode::kFromEnv);
    }
  } route_guard(opt.route);
  const int64_t H = sh.H;
  const int E = sh.E;
  MoeRouting routing = Routing(sh, opt.deepseek_routing, stream);
  if (opt.k_override > 0) routing.top_k = opt.k_override;
  if (opt.routing_method != nullptr) routing.routing_method = opt.routing_method;
  const int k = routing.top_k;
  MoeRunInput in;
  in.act_dtype = c.act;
  in.hidden_shape = {M, H};
  in.hidden_states = RandomFloats(c.act, M * H, -1, stream + 1);
  in.apply_router_weight_on_input = opt.weights_on_input;
  const std::vector<float> logits = Logits(M * E, stream + 2);
  auto rspec = RoutingSpecFor(routing, E);
  ASSERT_TRUE(rspec.ok()) << rspec.status();
  std::vector<float> ref_w(M * k);
  std::vector<int32_t> ref_ids(M * k);
  if (opt.given_ids) {
    ASSERT_TRUE(moe::RouteTokens(*rspec, logits.data(), M, ref_w.data(), ref_ids.data()).ok());
    in.topk_shape = {M, k};
    in.topk_ids.assign(reinterpret_cast<const char*>(ref_ids.data()), M * k * 4);
    in.topk_weights.assign(reinterpret_cast<const char*>(ref_w.data()), M * k * 4);
  } else {
    in.logits_shape = {M, E};
    in.router_logits.assign(reinterpret_cast<const char*>(logits.data()), M * E * 4);
    in.routing = routing;
  }

  GpuRunOptions poison;
  poison.poison_workspace = true;
  const int64_t int_launches = kernels::cuda::MoeGemmIntLaunches();
  const int64_t act_quant_launches = kernels::cuda::MoeGemmWsFp8ActQuantLaunches();
  auto got = RunMoeOnGpu(gpu, in, nullptr, poison);
  ASSERT_TRUE(got.ok()) << label << ": " << got.status();
  GpuRunStats st;
  auto again = RunMoeOnGpu(gpu, in, nullptr, {}, &st);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->output, got->output) << label << ": not deterministic";
  // From `from` on (0: never) the form whose launches `launches` counts
  // must have run (more than `before`), and the layer with it switched off
  // (off(), then on() to restore) must give got's output byte for byte.
  auto same_without = [&](int64_t from, int64_t (*launches)(), int64_t before, auto off, auto on,
                          const char* not_run, const char* differs) {
    if (from <= 0 || M < from) return;
    EXPECT_GT(launches(), before) << label << " M=" << M << ": " << not_run;
    off();
    const int64_t off_launches = launches();
    auto other = RunMoeOnGpu(gpu, in, nullptr, poison);
    on();
    ASSERT_TRUE(other.ok()) << label << ": " << other.status();
    EXPECT_EQ(launches(), off_launches) << label;
    EXPECT_TRUE(other->output == got->output) << label << " M=" << M << ": " << differs;
  };
  same_without(
      opt.int_gemm_from, kernels::cuda::MoeGemmIntLaunches, int_launches,
      [] {
        kernels::cuda::SetMoeGemmIntMode(kernels::cuda::MoeKernelMode::kOff);
        kernels::cuda::SetMoeQuantRouteMode(kernels::cuda::MoeQuantRouteMode::kDequant);
      },
      [&] {
        kernels::cuda::SetMoeGemmIntMode(kernels::cuda::MoeKernelMode::kFromEnv);
        kernels::cuda::SetMoeQuantRouteMode(opt.route == kernels::cuda::MoeQuantRouteMode::kAuto
                                                ? kernels::cuda::MoeQuantRouteMode::kFromEnv
                                                : opt.route);
      },
      "the int4 GEMMs did not run", "the int4 kernels' output is not the dequantised copy's");
  same_without(
      opt.fp8_act_quant_from, kernels::cuda::MoeGemmWsFp8ActQuantLaunches, act_quant_launches,
      [] { kernels::cuda::SetMoeGemmWsFp8ActQuantMode(kernels::cuda::MoeKernelMode::kOff); },
      [] { kernels::cuda::SetMoeGemmWsFp8ActQuantMode(kernels::cuda::MoeKernelMode::kOn); },
      "GEMM 1 did not quantise GEMM 2's activation",
      "the fused GEMM 1's output is not the three steps'");
  // The answer names the route that ran (RunMoE's plan, GpuLayerExpertsKernel):
  // the forced emulation is the dequantising or the fp8 tensor-core GEMM.
  if (M > 0) {
    EXPECT_THAT(got->experts_kernel, ::testing::StartsWith("Kplan")) << label;
    if (opt.route == kernels::cuda::MoeQuantRouteMode::kEmulation) {
      EXPECT_THAT(got->experts_kernel, ::testing::AnyOf("KplanEmulationExperts", "KplanFp8Experts"))
          << label;
    }
    if (opt.route == kernels::cuda::MoeQuantRouteMode::kMatvec || opt.expect_matvec) {
      EXPECT_EQ(got->experts_kernel, "KplanQuantDecodeExperts") << label;
      EXPECT_EQ(st.layer.quant_route, kernels::cuda::MoeQuantRoute::kMatvec) << label;
    }
  }

  // CPU reference on the GPU's routing (routing itself is moe_gpu_test's).
  moe::MoeProblem p;
  p.num_tokens = M;
  p.hidden = H;
  p.intermediate = sh.I;
  p.num_experts = E;
  p.top_k = k;
  p.act_dtype = c.act;
  p.hidden_states = in.hidden_states.data();
  p.activation = set.activation();
  p.weights = set.Weights();
  p.apply_router_weight_on_input = opt.weights_on_input;
  p.topk_ids = got->topk_ids.data();
  p.topk_weights = got->topk_weights.data();
  p.num_threads = Threads();
  const int64_t es = kernels::DTypeSize(c.act);
  std::string ref(M * H * es, '\0');
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status rs = moe::MoeReference(p, ref.data());
  ASSERT_TRUE(rs.ok()) << rs;
  const double cpu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const int64_t n = M * H;
  double d2 = 0, r2 = 0, max_abs = 0;
  int64_t nonfinite = 0;
  std::vector<float> g(n), r(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = moe::LoadFloat(got->output.data(), c.act, i);
    r[i] = moe::LoadFloat(ref.data(), c.act, i);
    if (!std::isfinite(g[i])) ++nonfinite;
    const double d = static_cast<double>(g[i]) - r[i];
    d2 += d * d;
    r2 += static_cast<double>(r[i]) * r[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  const bool f32 = c.act == kernels::DType::kFloat32;
  // fp8 on tensor cores: test_util::MoeFp8TensorCoreElementTolerance.
  const bool tc8 = c.fp8() && !f32 && gpu.Fp8OnTensorCores();
  const int rel_e = c.fp8() ? -6 : f32 ? -13 : -7;  // when !tc8
  const int rms_e = c.fp8() ? -5 : f32 ? -12 : -6;
  const double rel_max = tc8 ? 3e-2 : f32 && !c.fp8() ? 1e-4 : 1e-2;
  const double rms = std::sqrt(r2 / std::max<int64_t>(n, 1));
  const double rel = std::sqrt(d2 / std::max(r2, 1e-30));
  // fp8 re-quantisation flips (test_util::MoeFp8FlipTolerance) and 16-bit
  // rounding flips (Moe16BitFlipExcess), a few of either.
  int64_t bad = 0, flips = 0, first_bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(g[i]) - r[i]);
    const double tol = tc8 ? test_util::MoeFp8TensorCoreElementTolerance(r[i], rms)
                           : std::ldexp(std::fabs(r[i]), rel_e) + std::ldexp(rms, rms_e);
    if (d <= tol) continue;
    if (c.fp8() && d <= test_util::MoeFp8FlipTolerance(r[i], rms, tc8)) {
      ++flips;
      continue;
    }
    if (!c.fp8() && !f32 &&
        d <= tol + test_util::Moe16BitFlipExcess(rms, c.act == kernels::DType::kFloat16 ? 10 : 7)) {
      ++flips;  // a rounding flip of an expert's output (test_util::Moe16BitFlipExcess)
      continue;
    }
    if (first_bad < 0) first_bad = i;
    ++bad;
  }
  const int64_t max_flips = c.fp8() || !f32 ? test_util::MoeMaxRoundingFlips(n) : 0;
  const bool ok = nonfinite == 0 && rel <= rel_max && bad == 0 && flips <= max_flips && r2 > 0;
  // gpu= is one call's device time (events after the upload, before the
  // download; the second call of the case, not warmed up, not a benchmark:
  // bench/moe_bench times the layer). hit= the distinct experts it routed to:
  // this test's routing is not uniform (DeepSeekV3's correction bias, ±0.1,
  // outweighs the spread of the sigmoid scores near their top, so a few
  // experts take most slots), so its bytes are hit x the per-expert bytes,
  // not those of uniform routing.
  const std::set<int32_t> distinct(got->topk_ids.begin(), got->topk_ids.end());
  const double hit_gb = static_cast<double>(distinct.size()) * gpu.bytes() / E / 1e9;
  std::printf(
      "%-66s M=%-5lld rel=%.2e max_abs=%.2e rms=%.2e flips=%lld gpu=%8.3f ms (one call; hit %zu "
      "experts, %.3f GB, %.0f GB/s) cpu_ref=%5.1f s %s\n",
      label.c_str(), static_cast<long long>(M), rel, max_abs, rms, static_cast<long long>(flips),
      st.device_ms, distinct.size(), hit_gb, hit_gb / (st.device_ms * 1e-3), cpu_s,
      ok ? "OK" : "FAIL");
  std::fflush(stdout);
  EXPECT_EQ(nonfinite, 0) << label << ": non-finite outputs (unwritten or NaN)";
  EXPECT_LE(rel, rel_max) << label;
  EXPECT_GT(r2, 0.0) << label << ": reference is all zeros";
  EXPECT_LE(flips, max_flips) << label << " M=" << M << ": rounding-flip outliers";
  EXPECT_EQ(bad, 0) << label << " M=" << M << ": " << bad << " elements off, first " << first_bad
                    << " gpu " << (first_bad >= 0 ? g[first_bad] : 0) << " ref "
                    << (first_bad >= 0 ? r[first_bad] : 0);
}

std::unique_ptr<GpuExperts> Upload(const ExpertSet& set) {
  auto g = GpuExperts::Create(set, 0);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : nullptr;
}

// Token counts run with one set of options, on a set uploaded once.
struct Runs {
  std::vector<int64_t> tokens;
  RunOptions opt;
};

void RunComboEach(const Shape& sh, const Combo& c, uint64_t stream, const std::vector<Runs>& runs) {
  const auto t0 = std::chrono::steady_clock::now();
  auto set = MakeSet(sh, c, stream);
  auto gpu = Upload(*set);
  ASSERT_NE(gpu, nullptr);
  std::printf("%s %s: experts %.2f GB on the GPU (host set %.2f GB), made in %.1f s\n", sh.name,
              c.Label().c_str(), gpu->bytes() / 1e9, set->bytes() / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  for (const Runs& r : runs) {
    for (int64_t M : r.tokens) RunCase(sh, c, *set, *gpu, M, stream * 100 + M, r.opt);
  }
}

void RunCombo(const Shape& sh, const Combo& c, const std::vector<int64_t>& tokens, uint64_t stream,
              const RunOptions& opt = {}) {
  RunComboEach(sh, c, stream, {{tokens, opt}});
}

const Shape kQwen3{"Qwen3-30B-A3B", 128, 8, 2048, 768};
const Shape kMixtral{"Mixtral-8x7B", 8, 2, 4096, 14336};
const Shape kDeepSeek{"DeepSeek-V3", 256, 8, 7168, 2048};

Combo Fp8(const std::string& scheme, kernels::DType act,
          const std::string& act_scale = "per_token") {
  Combo c;
  c.quant = scheme;
  c.act = act;
  c.act_scale = act_scale;
  return c;
}
Combo IntW(const std::string& scheme, kernels::DType act, bool zp, int group = 128) {
  Combo c;
  c.quant = scheme;
  c.act = act;
  c.zero_points = zp;
  c.group = group;
  return c;
}
Combo Plain(kernels::DType w, kernels::DType act) {
  Combo c;
  c.wdtype = w;
  c.act = act;
  return c;
}

// The fp8 GEMM 1 that quantises GEMM 2's activation (moe_gemm_ws_fp8.h)
// switched on whatever the environment says, for a scope; both switches
// go back to kFromEnv at its end (not to what they were before).
struct Fp8FusedGemm1On {
  Fp8FusedGemm1On() {
    kernels::cuda::SetMoeGemmWsFp8ActQuantMode(kernels::cuda::MoeKernelMode::kOn);
    kernels::cuda::SetMoeGemmWsFp8Mode(kernels::cuda::MoeKernelMode::kOn);
  }
  ~Fp8FusedGemm1On() {
    kernels::cuda::SetMoeGemmWsFp8ActQuantMode(kernels::cuda::MoeKernelMode::kFromEnv);
    kernels::cuda::SetMoeGemmWsFp8Mode(kernels::cuda::MoeKernelMode::kFromEnv);
  }
};

TEST(MoeQuantGpu, Qwen3Fp8) {
  SKIP_WITHOUT_CUDA();
  RunCombo(kQwen3, Fp8("fp8_per_tensor", kernels::DType::kBFloat16), {1, 64, 512, 4096}, 1);
  {
    // 4096 tokens (256 slots an expert, blocks of 128): GEMM 1 on the
    // warp-specialised kernel applies the activation and quantises GEMM 2's
    // activation in its epilogue (moe_gemm_ws_fp8.h).
    Fp8FusedGemm1On on;
    RunOptions aq;
    aq.fp8_act_quant_from = 4096;
    RunCombo(kQwen3, Fp8("fp8_block", kernels::DType::kBFloat16), {1, 64, 512, 4096}, 2, aq);
  }
  RunCombo(kQwen3, Fp8("fp8_per_tensor", kernels::DType::kFloat16, "per_tensor"), {64}, 3);
  Combo st = Fp8("fp8_per_tensor", kernels::DType::kBFloat16, "per_tensor");
  st.static_scales = true;
  RunCombo(kQwen3, st, {64}, 4);
  RunCombo(kQwen3, Fp8("fp8_per_channel", kernels::DType::kFloat32), {64}, 5);
  RunCombo(kQwen3, Fp8("fp8_block", kernels::DType::kFloat32), {64}, 6);
  RunCombo(kQwen3, Fp8("fp8_per_tensor", kernels::DType::kFloat32, "per_tensor"), {64}, 7);
}

TEST(MoeQuantGpu, Qwen3IntWeightOnly) {
  SKIP_WITHOUT_CUDA();
  RunOptions ws;
  // 512: the cp.async kernel; 3072 (192 slots a hit expert, MoeIntWeightsInGemms' limit)
  // the warp-specialised one.
  ws.int_gemm_from = 512;
  RunCombo(kQwen3, IntW("int4_group", kernels::DType::kBFloat16, false), {1, 64, 512, 3072}, 11,
           ws);
  RunCombo(kQwen3, IntW("int8_group", kernels::DType::kBFloat16, false), {1, 64, 512}, 12);
  RunCombo(kQwen3, IntW("int8_group", kernels::DType::kFloat16, true), {64}, 13);
  RunCombo(kQwen3, IntW("int4_group", kernels::DType::kFloat16, true), {64, 3072}, 14, ws);
  RunCombo(kQwen3, IntW("int8_group", kernels::DType::kFloat32, false), {64}, 15);
  RunCombo(kQwen3, IntW("int4_group", kernels::DType::kFloat32, true), {1, 64}, 16);
}

TEST(MoeQuantGpu, Qwen3UnquantisedMixedDtypes) {
  SKIP_WITHOUT_CUDA();
  RunCombo(kQwen3, Plain(kernels::DType::kBFloat16, kernels::DType::kFloat32), {1, 64}, 21);
  RunCombo(kQwen3, Plain(kernels::DType::kFloat32, kernels::DType::kFloat32), {64}, 22);
  RunCombo(kQwen3, Plain(kernels::DType::kFloat32, kernels::DType::kBFloat16), {64}, 23);
  RunCombo(kQwen3, Plain(kernels::DType::kFloat16, kernels::DType::kBFloat16), {64}, 24);
}

TEST(MoeQuantGpu, Mixtral8x7B) {
  SKIP_WITHOUT_CUDA();
  // 1 token the matvec pairs, 16 and 64 (16 per expert) the decode tiles,
  // 512 the warp-specialised int4 GEMMs; forced, the cp.async int4 GEMM at 64.
  RunOptions ws;
  ws.int_gemm_from = 512;
  const Combo i4 = IntW("int4_group", kernels::DType::kBFloat16, false);
  RunOptions deq64;
  deq64.route = kernels::cuda::MoeQuantRouteMode::kDequant;
  deq64.int_gemm_from = 64;
  RunComboEach(kMixtral, i4, 31, {{{1, 16, 64, 512}, ws}, {{64}, deq64}});
  RunCombo(kMixtral, Fp8("fp8_per_tensor", kernels::DType::kFloat16), {64}, 32);
}

TEST(MoeQuantGpu, DeepSeekV3) {
  SKIP_WITHOUT_CUDA();
  RunOptions ds;
  ds.deepseek_routing = true;
  RunCombo(kDeepSeek, Fp8("fp8_block", kernels::DType::kBFloat16), {1, 64, 256}, 41, ds);
}

// The fp8 GEMM 1 with the activation and GEMM 2's quantisation in its
// epilogue on a small shape: fp16, bias, I = 384 (three groups of 128); 512
// tokens give 128 slots an expert (blocks of 128, the warp-specialised
// kernel), 37 tokens the cp.async kernel and the three steps.
TEST(MoeQuantGpu, Fp8BlockGemm1QuantisesGemm2sActivation) {
  SKIP_WITHOUT_CUDA();
  Fp8FusedGemm1On on;
  const Shape s{"act-quant", 8, 2, 256, 384};
  Combo c = Fp8("fp8_block", kernels::DType::kFloat16);
  c.bias = true;
  RunOptions aq;
  aq.fp8_act_quant_from = 512;
  RunCombo(s, c, {37, 512}, 150, aq);
}

// Tails and odd sizes: H = 200 (k-blocks of 128 and k steps of 32 end
// mid-way), I = 72, N13 = 144 (partial column tiles); block 64x48 (k-block
// not a multiple of the k step: SIMT fold with bf16 activations); group 4
// (per-element group scales) and 8; biases, other activations, given ids,
// weights applied on the input. Small enough for compute-sanitizer.
TEST(MoeQuantGpu, SmallShapesTails) {
  SKIP_WITHOUT_CUDA();
  const Shape s{"small", 6, 2, 200, 72};
  Combo block = Fp8("fp8_block", kernels::DType::kBFloat16);
  block.activation = "gelu";
  block.bias = true;
  RunCombo(s, block, {1, 37, 300}, 51);
  Combo odd = Fp8("fp8_block", kernels::DType::kFloat16);
  odd.block_n = 64;
  odd.block_k = 48;
  odd.activation = "swigluoai";
  RunCombo(s, odd, {33}, 52);
  Combo pt = Fp8("fp8_per_tensor", kernels::DType::kFloat32, "per_tensor");
  pt.activation = "silu_no_mul";
  RunCombo(s, pt, {65}, 53);
  Combo i4 = IntW("int4_group", kernels::DType::kBFloat16, true, 4);
  i4.bias = true;
  RunCombo(s, i4, {1, 70}, 54);
  Combo i8 = IntW("int8_group", kernels::DType::kFloat32, false, 8);
  i8.activation = "gelu_tanh";
  RunCombo(s, i8, {70}, 55);
  RunOptions given;
  given.given_ids = true;
  RunCombo(s, IntW("int8_group", kernels::DType::kFloat16, true, 8), {129}, 56, given);
  RunOptions on_input;
  on_input.weights_on_input = true;
  on_input.k_override = 1;
  RunCombo(s, Fp8("fp8_per_channel", kernels::DType::kBFloat16), {65}, 57, on_input);
  RunCombo(s, Plain(kernels::DType::kBFloat16, kernels::DType::kFloat32), {65}, 58, on_input);
}

// The decode kernels (moe_quant_decode.cu) and the int prefill route
// (dequantised weights + the bf16 / fp16 grouped GEMMs) on shapes with
// tails: fp8 H = 336 (k steps of 64 and k-blocks of 128 end mid-way; GEMM 2's
// 336 rows end inside a 32-row warp tile), I = 80 (5 gated column groups,
// N13 = 160 inside a 128-row scale block); int4 H = 352, I = 96 with group 32
// (a partial 128-wide k step); int8 H = 336, I = 80 with group 16. Slot
// counts from 1 to past one tile per expert (tiles of 8, 16 and, at 57
// tokens, 19 slots per expert, 32; forced decode at 300 tokens: several
// tiles per expert, the last partial), zero points on and off,
// biases, gelu / swigluoai (interleaved gate/up rows) / silu_no_mul (no
// gating), bf16 and fp16 activations, the routes forced against each other
// (fp8 decode is opt-in where the fp8 tensor cores apply, so it is forced).
TEST(MoeQuantGpu, DecodeAndDequantRoutes) {
  SKIP_WITHOUT_CUDA();
  using kernels::cuda::MoeQuantRouteMode;
  RunOptions dec, deq, emu;
  dec.route = MoeQuantRouteMode::kDecode;
  deq.route = MoeQuantRouteMode::kDequant;
  emu.route = MoeQuantRouteMode::kEmulation;
  const Shape f8{"tail-fp8", 6, 2, 336, 80};
  Combo blk = Fp8("fp8_block", kernels::DType::kBFloat16);
  blk.bias = true;
  // fp8 sets on the tensor cores take the grouped GEMMs unless forced
  // (moe_quant_route.h): decode forced at decode sizes, auto past them.
  RunCombo(f8, blk, {1, 5, 33}, 71, dec);
  RunCombo(f8, blk, {80}, 71);
  RunCombo(f8, blk, {300}, 72, dec);
  Combo pc = Fp8("fp8_per_channel", kernels::DType::kFloat16);
  pc.activation = "swigluoai";
  RunCombo(f8, pc, {1, 33, 57}, 73, dec);
  Combo pt = Fp8("fp8_per_tensor", kernels::DType::kBFloat16);
  pt.activation = "silu_no_mul";
  RunCombo(f8, pt, {7, 300}, 74, dec);
  Combo pts = Fp8("fp8_per_tensor", kernels::DType::kBFloat16, "per_tensor");
  RunCombo(f8, pts, {17}, 75, dec);
  const Shape i4s{"tail-int4", 6, 2, 352, 96};
  Combo i4 = IntW("int4_group", kernels::DType::kBFloat16, false, 32);
  // The int4 GEMMs below 21 slots per expert (the decode tiles' sizes)
  // only when forced: the cp.async kernel dequantising in its consumer
  // threads, blocks of 16 (9 tokens) and 64 (40).
  RunCombo(i4s, i4, {1, 9, 40}, 76);
  RunOptions igemm = deq;
  igemm.int_gemm_from = 9;
  RunCombo(i4s, i4, {9, 40}, 76, igemm);
  RunCombo(i4s, i4, {300}, 77, dec);
  RunOptions deq_gemm = deq;
  deq_gemm.int_gemm_from = 3;
  RunCombo(i4s, i4, {3, 300}, 78, deq_gemm);
  // Every scale exact: whole warps take the packed dequantisation (with
  // half the groups exact, a warp's 16 rows almost never all are).
  Combo i4e = i4;
  i4e.exact_scales = true;
  RunCombo(i4s, i4e, {3, 40}, 140, deq_gemm);
  // Split K on the int4 cp.async kernel: GEMM 2 (K = 1024 over 2 row tiles
  // of a few blocks) takes 4 splits; with a bias the GEMM reduces them,
  // without it the combine does.
  const Shape sk{"splitk-int4", 6, 2, 256, 1024};
  for (bool bias : {false, true}) {
    Combo ik = IntW("int4_group", kernels::DType::kBFloat16, bias);
    ik.bias = bias;
    RunCombo(sk, ik, {40}, 141 + bias, igemm);
  }
  // The int4 GEMMs past the decode sizes: from 64 slots per expert (blocks
  // of 128) the warp-specialised ones (500 and 560 tokens: 167 and 187 per
  // expert). GEMM 1's K ends half-way through a 64-wide k-tile and its 192
  // rows inside a 256-row tile, GEMM 2's 352 rows in a second one; silu
  // takes the fused form.
  RunOptions ws;
  ws.int_gemm_from = 500;
  Combo i4b = i4;
  i4b.bias = true;
  RunCombo(i4s, i4b, {560}, 70, ws);
  Combo i4z = IntW("int4_group", kernels::DType::kFloat16, true, 32);
  i4z.bias = true;
  i4z.activation = "gelu";
  // fp16 with zero points: the int4 GEMMs past the decode sizes, forced at 40
  // (the cp.async kernel), and the decode tiles at 40 (16-slot tiles) and 57
  // (32-slot tiles).
  RunComboEach(i4s, i4z, 79, {{{1, 40, 500}, ws}, {{40}, igemm}, {{57}, dec}});
  RunCombo(i4s, i4z, {40}, 80, emu);
  const Shape i8s{"tail-int8", 6, 2, 336, 80};
  Combo i8 = IntW("int8_group", kernels::DType::kBFloat16, false, 16);
  i8.activation = "swigluoai";
  RunCombo(i8s, i8, {1, 33, 57, 400}, 81);
  Combo i8z = IntW("int8_group", kernels::DType::kFloat16, true, 16);
  RunCombo(i8s, i8z, {2, 41, 57}, 82, dec);
  RunCombo(i8s, i8z, {2, 400}, 83, deq);
  // Group sizes that are not powers of two (the kernels divide where they
  // otherwise shift, GroupDiv): int4 group 96 and int8 group 48, decode
  // tiles and matvec.
  const Shape g96{"group96", 6, 2, 288, 192};
  RunOptions mv;
  mv.route = MoeQuantRouteMode::kMatvec;
  const Combo i4g = IntW("int4_group", kernels::DType::kBFloat16, true, 96);
  RunCombo(g96, i4g, {5, 40, 57}, 84, dec);
  RunCombo(g96, i4g, {1, 3}, 85, mv);
  RunOptions g96_gemm = deq;
  g96_gemm.int_gemm_from = 5;
  RunCombo(g96, i4g, {5, 40, 560}, 88, g96_gemm);
  const Combo i8g = IntW("int8_group", kernels::DType::kFloat16, false, 48);
  RunCombo(g96, i8g, {5}, 86, dec);
  RunCombo(g96, i8g, {1, 3}, 87, mv);
  // Top-1 with the router weight on the input (scaled rows feed GEMM 1).
  RunOptions on_input = dec;
  on_input.weights_on_input = true;
  on_input.k_override = 1;
  RunCombo(i4s, IntW("int4_group", kernels::DType::kBFloat16, true, 32), {19}, 84, on_input);
  RunCombo(f8, Fp8("fp8_per_channel", kernels::DType::kBFloat16), {19}, 85, on_input);
}

// The fp8 cases of MatvecRoute (seeds seed .. seed + 8): fp8 H = 336 ends
// in a partial 128-wide k-block, and GEMM 1's and GEMM 2's rows (336 and 80
// bytes) end inside a warp's 512-byte span with a lane group partly past K
// (its diagonal lane past K at 336, its first lanes at 80); block,
// per-channel and per-tensor scales; stacked, interleaved and ungated
// gate/up rows; GEMM 2 with the combine at top-2, top-3 and top-6 (idle
// warps in its CTAs), top-8, and top-1 with the router weight (a softmax
// probability) on the input, the combine a plain sum; top-10, past the
// combine's 8 slots: GEMM 2 alone, then the combine kernel.
void MatvecFp8Cases(uint64_t seed) {
  using kernels::cuda::MoeQuantRouteMode;
  RunOptions mv, one;
  mv.route = MoeQuantRouteMode::kMatvec;
  one.expect_matvec = true;  // auto at one token
  const Shape f8{"tail-fp8", 6, 2, 336, 80};
  Combo blk = Fp8("fp8_block", kernels::DType::kBFloat16);
  blk.bias = true;
  RunCombo(f8, blk, {1}, seed, one);
  RunCombo(f8, blk, {2, 33}, seed + 1, mv);
  Combo pc = Fp8("fp8_per_channel", kernels::DType::kFloat16);
  pc.activation = "swigluoai";
  RunCombo(f8, pc, {1, 9}, seed + 2, mv);
  Combo pt = Fp8("fp8_per_tensor", kernels::DType::kBFloat16, "per_tensor");
  pt.activation = "silu_no_mul";
  RunCombo(f8, pt, {1, 17}, seed + 3, mv);
  RunOptions on_input = mv;
  on_input.weights_on_input = true;
  on_input.k_override = 1;
  on_input.routing_method = "Default";
  RunCombo(f8, Fp8("fp8_block", kernels::DType::kBFloat16), {1, 19}, seed + 4, on_input);
  const Shape k8{"top8-fp8", 16, 8, 256, 128};
  RunCombo(k8, Fp8("fp8_block", kernels::DType::kFloat16), {1}, seed + 5, one);
  RunCombo(Shape{"top3-fp8", 12, 3, 256, 128}, Fp8("fp8_block", kernels::DType::kBFloat16), {1, 2},
           seed + 6, mv);
  RunCombo(Shape{"top6-fp8", 12, 6, 128, 256}, Fp8("fp8_per_channel", kernels::DType::kFloat16),
           {1}, seed + 7, one);
  RunCombo(Shape{"top10-fp8", 16, 10, 256, 128}, Fp8("fp8_block", kernels::DType::kBFloat16), {1},
           seed + 8, one);
}

// The matvec kernels (moe_quant_matvec.cu) on the same tail shapes: one
// token (auto picks them), slots that share experts (forced: still right,
// only slower), each scheme, biases, zero points, every activation form
// (stacked and interleaved gate/up rows, no gating), bf16 and fp16, the
// router weight on the input: fp8 as MatvecFp8Cases says; int4 group 32 and
// int8 group 16 give one scale per 16-byte vector; int4 on the tiles (K
// below 4096, MoeQuantMatvecInt4Pairs) and on the row pairs (K 4224 and
// 4160: four spans and part of a fifth; fp16 with zero points, bias and
// gelu; groups of 96), the pairs' GEMM 2 with the combine at top-3 and 8,
// without it at top-10; Mixtral-8x7B per-tensor fp8 one token for long rows
// (GEMM 2's 14336 bytes).
TEST(MoeQuantGpu, MatvecRoute) {
  SKIP_WITHOUT_CUDA();
  using kernels::cuda::MoeQuantRouteMode;
  RunOptions mv, one;
  mv.route = MoeQuantRouteMode::kMatvec;
  one.expect_matvec = true;  // auto at one token
  MatvecFp8Cases(103);
  const Shape i4s{"tail-int4", 6, 2, 352, 96};
  Combo i4z = IntW("int4_group", kernels::DType::kFloat16, true, 32);
  i4z.bias = true;
  i4z.activation = "gelu";
  RunCombo(i4s, i4z, {1}, 95, one);
  RunCombo(i4s, i4z, {3, 40}, 96, mv);
  RunCombo(i4s, IntW("int4_group", kernels::DType::kBFloat16, false, 32), {1, 7}, 97, mv);
  const Shape i8s{"tail-int8", 6, 2, 336, 80};
  Combo i8 = IntW("int8_group", kernels::DType::kBFloat16, false, 16);
  i8.activation = "swigluoai";
  RunCombo(i8s, i8, {1, 5}, 98, mv);
  RunCombo(i8s, IntW("int8_group", kernels::DType::kFloat16, true, 16), {1, 21}, 99, mv);
  RunOptions on_input = mv;
  on_input.weights_on_input = true;
  on_input.k_override = 1;
  RunCombo(i4s, IntW("int4_group", kernels::DType::kBFloat16, true, 32), {1, 19}, 100, on_input);
  // int4 GEMM 2 with the combine at top-3 (idle warps; every scale exact:
  // whole warps take the packed dequantisation) and top-8, past the
  // combine's 8 slots at top-10.
  Combo i4e = IntW("int4_group", kernels::DType::kBFloat16, true, 32);
  i4e.exact_scales = true;
  RunCombo(Shape{"top3-int4", 12, 3, 4224, 4160}, i4e, {1, 2}, 104, mv);
  RunCombo(Shape{"top8-int4", 16, 8, 256, 4224},
           IntW("int4_group", kernels::DType::kFloat16, false), {1}, 105, one);
  RunCombo(Shape{"top10-int4", 16, 10, 256, 4224},
           IntW("int4_group", kernels::DType::kBFloat16, false), {1}, 106, one);
  // The int4 pairs with fp16, zero points, bias and gelu, and with groups of
  // 96 (the division path of GroupDiv).
  RunCombo(Shape{"pairs-int4", 6, 2, 4160, 4224}, i4z, {1}, 107, one);
  RunCombo(Shape{"pairs-g96-int4", 6, 2, 4128, 4224},
           IntW("int4_group", kernels::DType::kBFloat16, false, 96), {1}, 108, one);
  RunCombo(kMixtral, Fp8("fp8_per_tensor", kernels::DType::kBFloat16, "per_tensor"), {1}, 102, one);
}

// What the matvec and decode kernels accept (host code: runs without a
// GPU; the pointers are only checked for null). The matvec kernels take what
// the decode ones take, within their 32-bit index limits.
TEST(MoeQuantKernels, MatvecTakesTheDecodeWeightsWithinItsLimits) {
  using kernels::cuda::MoeQuantDecodeSupports;
  using kernels::cuda::MoeQuantMatvecSupports;
  using kernels::cuda::MoeQuantWeights;
  using kernels::cuda::MoeWeightScale;
  static const uint8_t kByte = 0;
  static const float kScale = 1.0f;
  auto weights = [](kernels::DType kind, MoeWeightScale sk) {
    MoeQuantWeights w;
    w.kind = kind;
    w.scale_kind = sk;
    w.data = &kByte;
    w.scale = &kScale;
    return w;
  };
  const auto bf16 = kernels::DType::kBFloat16;
  auto both = [&](const MoeQuantWeights& w, kernels::DType act, int64_t N, int64_t K) {
    const bool m = MoeQuantMatvecSupports(w, act, N, K);
    EXPECT_EQ(m, MoeQuantDecodeSupports(w, act, N, K)) << N << " x " << K;
    return m;
  };
  MoeQuantWeights blk = weights(kernels::DType::kFp8E4m3, MoeWeightScale::kBlock);
  EXPECT_TRUE(both(blk, bf16, 4096, 7168));
  EXPECT_TRUE(both(blk, kernels::DType::kFloat16, 336, 336));  // K ends inside a k-block
  EXPECT_FALSE(both(blk, kernels::DType::kFloat32, 4096, 7168));
  EXPECT_FALSE(both(blk, bf16, 4096, 7160));  // K % 16
  blk.block_k = 96;                           // a 64-wide chunk would straddle two k-blocks
  EXPECT_FALSE(both(blk, bf16, 4096, 7168));
  blk.block_k = 64;
  EXPECT_TRUE(both(blk, bf16, 4096, 7168));
  EXPECT_TRUE(both(weights(kernels::DType::kFp8E4m3, MoeWeightScale::kPerTensor), bf16, 64, 32));
  EXPECT_FALSE(both(weights(kernels::DType::kFp8E4m3, MoeWeightScale::kGroup), bf16, 64, 32));
  MoeQuantWeights i4 = weights(kernels::DType::kInt4Packed, MoeWeightScale::kGroup);
  i4.group_size = 32;
  EXPECT_TRUE(both(i4, bf16, 352, 352));
  i4.group_size = 16;  // not a 16-byte vector of int4
  EXPECT_FALSE(both(i4, bf16, 352, 352));
  MoeQuantWeights i8 = weights(kernels::DType::kInt8, MoeWeightScale::kGroup);
  i8.group_size = 16;
  EXPECT_TRUE(both(i8, bf16, 336, 336));
  EXPECT_FALSE(both(i8, bf16, 336, 344));  // group does not divide K
  MoeQuantWeights none = i8;
  none.scale = nullptr;
  EXPECT_FALSE(both(none, bf16, 336, 336));
  // Past the 32-bit indices: the decode kernels take it, the matvec ones not.
  i8.group_size = 128;
  const int64_t N = 1100000, K = int64_t{1} << 15;  // N x K / 16 > 2^31 - 1
  EXPECT_TRUE(MoeQuantDecodeSupports(i8, bf16, N, K));
  EXPECT_FALSE(MoeQuantMatvecSupports(i8, bf16, N, K));
  EXPECT_TRUE(MoeQuantMatvecSupports(i8, bf16, 1000000, K));
}

// Which GEMM 2s of the fp8 and int4 matvec take the combine, and what the
// launcher refuses before launching anything (host code: runs without a GPU).
TEST(MoeQuantKernels, MatvecCombinesFp8AndInt4UpToEightSlots) {
  using kernels::cuda::MoeQuantMatvecCombines;
  using kernels::cuda::MoeQuantWeights;
  using kernels::cuda::MoeWeightScale;
  MoeQuantWeights w;
  w.kind = kernels::DType::kFp8E4m3;
  w.scale_kind = MoeWeightScale::kBlock;
  EXPECT_TRUE(MoeQuantMatvecCombines(w, 1, 768));
  EXPECT_TRUE(MoeQuantMatvecCombines(w, 3, 768));
  EXPECT_TRUE(MoeQuantMatvecCombines(w, 8, 768));
  EXPECT_FALSE(MoeQuantMatvecCombines(w, 0, 768));
  EXPECT_FALSE(MoeQuantMatvecCombines(w, 9, 768));
  // int4: where its GEMM takes the row pairs (MoeQuantMatvecInt4Pairs).
  MoeQuantWeights i4 = w;
  i4.kind = kernels::DType::kInt4Packed;
  i4.scale_kind = MoeWeightScale::kGroup;
  EXPECT_TRUE(MoeQuantMatvecCombines(i4, 2, 14336));
  EXPECT_TRUE(MoeQuantMatvecCombines(i4, 2, 4096));
  EXPECT_FALSE(MoeQuantMatvecCombines(i4, 2, 4064));
  EXPECT_FALSE(MoeQuantMatvecCombines(i4, 2, 768));
  EXPECT_FALSE(MoeQuantMatvecCombines(i4, 9, 14336));
  MoeQuantWeights i8 = i4;
  i8.kind = kernels::DType::kInt8;
  EXPECT_FALSE(MoeQuantMatvecCombines(i8, 2, 14336));
  static const uint8_t kByte = 0;
  static const float kScale = 1.0f;
  static int32_t ids[4] = {0, 1, 2, 3};
  kernels::cuda::MoeQuantMatvecArgs a;
  a.gemm.act_type = kernels::DType::kBFloat16;
  a.gemm.w = w;
  a.gemm.w.data = &kByte;
  a.gemm.w.scale = &kScale;
  a.gemm.w.block_n = a.gemm.w.block_k = 128;
  a.gemm.a = &kByte;
  a.gemm.a_scale = &kScale;
  a.gemm.a_row_div = 1;
  a.gemm.c = &ids;
  a.gemm.numel = 4;
  a.gemm.N = 256;
  a.gemm.K = 256;
  a.gemm.num_local_experts = 4;
  a.topk_ids = ids;
  a.num_experts = 4;
  a.combine = true;
  auto refused = [&](const char* what) {
    const absl::Status st = kernels::cuda::LaunchMoeQuantMatvec(a, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
    EXPECT_THAT(st.message(), ::testing::HasSubstr("combine")) << what;
  };
  a.top_k = 3;  // 4 slots are not whole tokens of 3
  refused("numel % top_k");
  a.top_k = 9;
  a.gemm.numel = 9;
  refused("top_k 9");
  a.top_k = 2;
  a.gemm.numel = 4;
  a.gemm.apply_act = true;
  refused("an activation");
  a.gemm.apply_act = false;
  a.gemm.a_row_div = 2;
  refused("shared activation rows");
  // int4 rows shorter than 4096 run the tiles, which take no combine.
  a.gemm.a_row_div = 1;
  a.gemm.w.kind = kernels::DType::kInt4Packed;
  a.gemm.w.scale_kind = MoeWeightScale::kGroup;
  a.gemm.w.group_size = 32;
  refused("int4 tiles");
}

// One output width and weight kind of MatvecCombineIsGemm2ThenCombine.
void MatvecCombineCase(int64_t N, bool int4) {
  using kernels::cuda::DeviceBuffer;
  constexpr int E = 8;
  // fp8: rows of 208 bytes, 128 x 128 blocks; int4: 4320 k (the row pairs,
  // MoeQuantMatvecInt4Pairs: four 512-byte spans and 112 bytes, lanes 0-6
  // of the last span, the lane group of lanes 4-7 partly past K), groups of
  // 32, zero points.
  const int64_t K = int4 ? 4320 : 208, kb = (K + 127) / 128, group = 32;
  const int64_t nb = (N + 127) / 128, row_bytes = int4 ? K / 2 : K;
  std::mt19937 rng(static_cast<uint32_t>(Seed() + 7 + N + (int4 ? 1000 : 0)));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<uint8_t> w(E * N * row_bytes);
  for (uint8_t& b : w) {
    b = static_cast<uint8_t>(rng());
    if (!int4 && (b & 0x7f) == 0x7f) b ^= 1;  // no NaN bytes
  }
  // int4: the scales of even experts exact in bf16 (the packed
  // dequantisation), of odd ones not (the per-weight one).
  std::vector<float> ws(int4 ? E * N * (K / group) : E * nb * kb), bias(E * N);
  for (size_t i = 0; i < ws.size(); ++i) {
    ws[i] = int4 ? 0.01f + 0.1f * unit(rng) : 0.001f + 0.01f * unit(rng);
    if (int4 && (i / (N * (K / group))) % 2 == 0) ws[i] = Bf16ToFloat(FloatToBf16(ws[i]));
  }
  std::vector<uint8_t> zp(int4 ? ws.size() : 0);
  for (uint8_t& z : zp) z = static_cast<uint8_t>(rng() % 16);
  for (float& v : bias) v = unit(rng) - 0.5f;
  const std::vector<int32_t> map = {0, 1, 2, 3, 4, 5, -1, 7};  // expert 6 is not local
  DeviceBuffer d_w, d_ws, d_zp, d_bias, d_map;
  ASSERT_TRUE(d_w.Reserve(w.size()).ok());
  ASSERT_TRUE(d_ws.Reserve(ws.size() * 4).ok());
  ASSERT_TRUE(d_zp.Reserve(std::max<size_t>(zp.size(), 1)).ok());
  ASSERT_TRUE(d_bias.Reserve(bias.size() * 4).ok());
  ASSERT_TRUE(d_map.Reserve(map.size() * 4).ok());
  ASSERT_EQ(cudaMemcpy(d_w.data(), w.data(), w.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_ws.data(), ws.data(), ws.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_zp.data(), zp.data(), zp.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_bias.data(), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_map.data(), map.data(), map.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  for (const int k : {2, 3, 8}) {
    for (const int64_t M : {int64_t{1}, int64_t{2}}) {
      for (const bool weighted : {true, false}) {
        const std::string label = absl::StrCat(int4 ? "int4" : "fp8", " N=", N, " top-", k,
                                               " M=", M, weighted ? "" : " unweighted");
        const int64_t numel = M * k;
        // fp8: the quantised activation's bytes and block scales; int4: bf16
        // activations in [-1, 1).
        std::vector<uint8_t> a(numel * K * (int4 ? 2 : 1));
        for (size_t i = 0; i < a.size(); ++i) {
          if (int4) {
            if (i % 2 == 0) {
              const uint16_t v = FloatToBf16(2.0f * unit(rng) - 1.0f);
              std::memcpy(&a[i], &v, 2);
            }
            continue;
          }
          a[i] = static_cast<uint8_t>(rng());
          if ((a[i] & 0x7f) == 0x7f) a[i] ^= 1;
        }
        std::vector<float> as(numel * kb), tw(numel);
        for (float& v : as) v = 0.01f + 0.1f * unit(rng);
        for (float& v : tw) v = unit(rng);
        std::vector<int32_t> ids(numel);
        for (int64_t m = 0; m < M; ++m) {  // each token's slots on distinct experts
          std::vector<int32_t> perm(E);
          for (int e = 0; e < E; ++e) perm[e] = e;
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int j = 0; j < k; ++j) ids[m * k + j] = perm[j];
        }
        DeviceBuffer d_a, d_as, d_tw, d_ids, d_y, d_out1, d_out2;
        ASSERT_TRUE(d_a.Reserve(a.size()).ok());
        ASSERT_TRUE(d_as.Reserve(as.size() * 4).ok());
        ASSERT_TRUE(d_tw.Reserve(tw.size() * 4).ok());
        ASSERT_TRUE(d_ids.Reserve(ids.size() * 4).ok());
        ASSERT_TRUE(d_y.Reserve(numel * N * 2).ok());
        ASSERT_TRUE(d_out1.Reserve(M * N * 2).ok());
        ASSERT_TRUE(d_out2.Reserve(M * N * 2).ok());
        ASSERT_EQ(cudaMemcpy(d_a.data(), a.data(), a.size(), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_as.data(), as.data(), as.size() * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_tw.data(), tw.data(), tw.size() * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_ids.data(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
        for (DeviceBuffer* b : {&d_y, &d_out1, &d_out2}) {  // 0xffff: a bf16 NaN
          ASSERT_EQ(cudaMemset(b->data(), 0xff, b->capacity()), cudaSuccess);
        }
        kernels::cuda::MoeQuantMatvecArgs g;
        g.gemm.act_type = kernels::DType::kBFloat16;
        g.gemm.a = d_a.data();
        g.gemm.a_scale = int4 ? nullptr : d_as.As<float>();
        g.gemm.w.kind = int4 ? kernels::DType::kInt4Packed : kernels::DType::kFp8E4m3;
        g.gemm.w.scale_kind =
            int4 ? kernels::cuda::MoeWeightScale::kGroup : kernels::cuda::MoeWeightScale::kBlock;
        g.gemm.w.data = d_w.data();
        g.gemm.w.scale = d_ws.As<float>();
        g.gemm.w.zero = int4 ? d_zp.As<uint8_t>() : nullptr;
        g.gemm.w.group_size = static_cast<int>(group);
        g.gemm.bias = d_bias.As<float>();
        g.gemm.numel = numel;
        g.gemm.N = N;
        g.gemm.K = K;
        g.gemm.num_local_experts = E;
        g.gemm.c = d_y.data();
        g.topk_ids = d_ids.As<int32_t>();
        g.expert_map = d_map.As<int32_t>();
        g.num_experts = E;
        const float* weights = weighted ? d_tw.As<float>() : nullptr;
        ASSERT_TRUE(kernels::cuda::LaunchMoeQuantMatvec(g, nullptr).ok()) << label;
        ASSERT_TRUE(kernels::cuda::LaunchMoeCombine(kernels::DType::kBFloat16, d_y.data(), weights,
                                                    M, k, N, d_out1.data(), nullptr)
                        .ok())
            << label;
        g.combine = true;
        g.top_k = k;
        g.topk_weights = weights;
        g.gemm.c = d_out2.data();
        ASSERT_TRUE(kernels::cuda::LaunchMoeQuantMatvec(g, nullptr).ok()) << label;
        std::vector<uint16_t> want(M * N), got(M * N);
        ASSERT_EQ(cudaMemcpy(want.data(), d_out1.data(), M * N * 2, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got.data(), d_out2.data(), M * N * 2, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        const int64_t nonzero =
            std::count_if(want.begin(), want.end(), [](uint16_t v) { return (v & 0x7fff) != 0; });
        EXPECT_GT(nonzero, M * N / 2) << label << ": the output is mostly zeros";
        int64_t differ = 0, first = -1;
        for (int64_t i = 0; i < M * N; ++i) {
          if (want[i] != got[i] && differ++ == 0) first = i;
        }
        EXPECT_EQ(differ, 0) << label << ": first at " << first;
      }
    }
  }
}

// The matvec's GEMM 2 with the combine (PairCombineKernel) byte for byte
// against the same GEMM 2 without it (PairKernel, which pairs the same rows)
// followed by LaunchMoeCombine, on fresh random weights and scales, fp8 and
// int4 (int4: zero points; scales exact in bf16 on even experts, not on odd
// ones, so both dequantisations run): rows of 208 / 2160 bytes (a span's lane
// group partly past K); 336 output columns (whole CTAs; the combine's
// 8-column vector kernel) and 330 (a last CTA partly past N at every k; its
// scalar kernel); top-k 2, 3 (idle warps) and 8; one and two tokens; bias; a
// non-local expert (expert map -1); the router weights or none (a plain
// sum). The outputs start as NaNs, so an unwritten column cannot match.
TEST(MoeQuantGpu, MatvecCombineIsGemm2ThenCombine) {
  SKIP_WITHOUT_CUDA();
  for (const bool int4 : {false, true}) {
    for (const int64_t N : {int64_t{336}, int64_t{330}}) MatvecCombineCase(N, int4);
  }
}

// The fp8 activation quantiser (LaunchMoeFp8Quantize) byte for byte and
// scale for scale against the reference's formulas (moe_quant_gemm.h, the
// CPU's QuantizeRows / TensorScale), on every path the launcher picks: the
// 2-byte vector kernels (K % 8 for per token; K and group % 4, group <= 256
// per group), the scalar ones (fp32, the other sizes, and pointers too
// misaligned for vector loads); decode rows of 14336, partial last groups,
// an all-zero group and row, values past the saturation of a static scale,
// values in e4m3's subnormal range, full-width mantissas. Rows with an
// infinity or a NaN: every byte the reference makes NaN is a NaN byte here
// too, of either sign (a NaN's sign after x / s is the host's and the GPU's
// own: x86 gives inf / inf a negative NaN, the GPU a positive one).
TEST(MoeQuantGpu, Fp8ActivationQuantiserIsTheReferences) {
  SKIP_WITHOUT_CUDA();
  using kernels::cuda::MoeFp8ActQuant;
  struct Size {
    int64_t rows, K;
  };
  const Size sizes[] = {{1, 14336}, {2, 14336}, {3, 2048}, {5, 200}, {4, 100}, {2, 98}};
  const kernels::DType dtypes[] = {kernels::DType::kBFloat16, kernels::DType::kFloat16,
                                   kernels::DType::kFloat32};
  struct Mode {
    MoeFp8ActQuant mode;
    int group;
    float static_scale;
  };
  const Mode modes[] = {
      {MoeFp8ActQuant::kPerGroup, 128, 0}, {MoeFp8ActQuant::kPerGroup, 64, 0},
      {MoeFp8ActQuant::kPerGroup, 256, 0}, {MoeFp8ActQuant::kPerGroup, 96, 0},
      {MoeFp8ActQuant::kPerGroup, 512, 0}, {MoeFp8ActQuant::kPerToken, 0, 0},
      {MoeFp8ActQuant::kPerTensor, 0, 0},  {MoeFp8ActQuant::kPerTensor, 0, 2e-3f}};
  auto is_nan_byte = [](uint8_t b) { return (b & 0x7f) == 0x7f; };
  std::mt19937_64 rng(Mix(Seed() ^ 0xf8));
  int cases = 0;
  for (const Size& sz : sizes) {
    for (kernels::DType dt : dtypes) {
      for (int variant = 0; variant < 5; ++variant) {
        // 0: plain; 1: ±inf and NaN in row 0; 2: input one element and output
        // one byte past 16-byte alignment (the scalar kernels); 3: all zero
        // (per tensor 1, per token its floor); 4: every |x| below 1 / 512
        // (the per-token floor above max / 448, the per-tensor scale not).
        const int64_t n = sz.rows * sz.K, es = kernels::DTypeSize(dt);
        const int64_t in_off = variant == 2 ? es : 0, q_off = variant == 2 ? 1 : 0;
        std::string x(n * es, '\0');
        std::uniform_real_distribution<float> mant(1.0f, 2.0f);
        for (int64_t i = 0; i < n; ++i) {
          float v = std::ldexp(mant(rng), -static_cast<int>(rng() % 4));
          if (rng() & 1) v = -v;
          if (i % 37 == 5) v /= 4096.0f;  // e4m3 subnormals after scaling
          if (variant == 3) v = 0.0f;
          if (variant == 4) v = std::ldexp(v, -12);
          moe::StoreFloat(x.data(), dt, i, v);
        }
        // Row 0's first 64 elements zero (a zero group at group 64), the last
        // row all zero when there are three or more rows.
        for (int64_t i = 0; i < std::min<int64_t>(64, sz.K); ++i)
          moe::StoreFloat(x.data(), dt, i, 0);
        if (sz.rows >= 3) {
          for (int64_t i = (sz.rows - 1) * sz.K; i < n; ++i) moe::StoreFloat(x.data(), dt, i, 0);
        }
        if (variant == 1) {
          moe::StoreFloat(x.data(), dt, sz.K - 1, std::numeric_limits<float>::infinity());
          moe::StoreFloat(x.data(), dt, sz.K / 2, -std::numeric_limits<float>::infinity());
          moe::StoreFloat(x.data(), dt, sz.K / 3, -std::numeric_limits<float>::quiet_NaN());
        }
        std::vector<float> xf(n);
        for (int64_t i = 0; i < n; ++i) xf[i] = moe::LoadFloat(x.data(), dt, i);
        auto abs_max = [&](int64_t from, int64_t len) {  // std::max: a NaN never wins
          float m = 0.0f;
          for (int64_t i = from; i < from + len; ++i) m = std::max(m, std::fabs(xf[i]));
          return m;
        };
        kernels::cuda::DeviceBuffer d_in, d_q, d_s, d_scratch;
        ASSERT_TRUE(d_in.Reserve(n * es + 16).ok());
        ASSERT_TRUE(d_q.Reserve(n + 16).ok());
        ASSERT_TRUE(d_s.Reserve(n * 4).ok());
        ASSERT_TRUE(d_scratch.Reserve(4 * kernels::cuda::kMoeFp8QuantScratchFloats).ok());
        ASSERT_EQ(cudaMemcpy(d_in.As<uint8_t>(in_off), x.data(), n * es, cudaMemcpyHostToDevice),
                  cudaSuccess);
        for (const Mode& m : modes) {
          const std::string label = absl::StrCat(
              kernels::DTypeName(dt), " ", sz.rows, "x", sz.K, " variant ", variant, " mode ",
              static_cast<int>(m.mode), " group ", m.group, " static ", m.static_scale);
          // The reference: scales, then q = e4m3(x / s) saturated.
          const int64_t groups = m.group > 0 ? (sz.K + m.group - 1) / m.group : 1;
          std::vector<float> want_s(sz.rows * groups);
          std::vector<uint8_t> want_q(n);
          float tensor_s = m.static_scale;
          if (m.mode == MoeFp8ActQuant::kPerTensor && !(m.static_scale > 0)) {
            const float mx = abs_max(0, n);
            tensor_s = mx > 0.0f ? mx / 448.0f : 1.0f;
          }
          for (int64_t r = 0; r < sz.rows; ++r) {
            for (int64_t g = 0; g < groups; ++g) {
              const int64_t k0 = m.group > 0 ? g * m.group : 0;
              const int64_t len = m.group > 0 ? std::min<int64_t>(m.group, sz.K - k0) : sz.K;
              float sc = tensor_s;
              if (m.mode == MoeFp8ActQuant::kPerGroup) {
                sc = std::max(abs_max(r * sz.K + k0, len), 1e-10f) / 448.0f;
              } else if (m.mode == MoeFp8ActQuant::kPerToken) {
                sc = std::max(abs_max(r * sz.K, sz.K) / 448.0f, 1.0f / (448.0f * 512.0f));
              }
              want_s[r * groups + g] = sc;
              for (int64_t k = k0; k < k0 + len; ++k) {
                want_q[r * sz.K + k] = moe::FloatToFp8E4m3(xf[r * sz.K + k] / sc, true);
              }
            }
          }
          ASSERT_EQ(cudaMemset(d_q.data(), 0xAB, n + 16), cudaSuccess);
          ASSERT_EQ(cudaMemset(d_s.data(), 0xFF, n * 4), cudaSuccess);  // NaN: every cell written
          ASSERT_TRUE(kernels::cuda::LaunchMoeFp8Quantize(
                          m.mode, dt, d_in.As<uint8_t>(in_off), sz.rows, sz.K, m.group,
                          m.static_scale, d_scratch.As<float>(), d_q.As<uint8_t>(q_off),
                          d_s.As<float>(), nullptr)
                          .ok())
              << label;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << label;
          std::vector<uint8_t> got_q(n);
          std::vector<float> got_s(want_s.size());
          ASSERT_EQ(cudaMemcpy(got_q.data(), d_q.As<uint8_t>(q_off), n, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpy(got_s.data(), d_s.data(), got_s.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          int64_t bad_q = 0, first = -1;
          for (int64_t i = 0; i < n; ++i) {
            const bool same =
                got_q[i] == want_q[i] || (is_nan_byte(want_q[i]) && is_nan_byte(got_q[i]));
            if (!same && bad_q++ == 0) first = i;
          }
          EXPECT_EQ(bad_q, 0) << label << ": first byte " << first << " got "
                              << (first >= 0 ? int{got_q[first]} : 0) << " want "
                              << (first >= 0 ? int{want_q[first]} : 0);
          int64_t bad_s = 0;
          for (size_t i = 0; i < want_s.size(); ++i) {
            if (std::memcmp(&got_s[i], &want_s[i], 4) != 0) ++bad_s;
          }
          EXPECT_EQ(bad_s, 0) << label << ": scales differ";
          ++cases;
        }
      }
    }
  }
  std::printf("fp8 activation quantiser: %d cases byte for byte\n", cases);
}

// LaunchMoeRoutingAndFp8Quantize against its two steps run apart
// (LaunchMoeRouting, then LaunchMoeFp8Quantize), byte for byte: the picks,
// their weights, the quantised bytes and the scales, every output poisoned
// first. The one-kernel form (per group on bf16 / fp16, group <= 128) with
// the routing kernel's per-lane counts 1, 4 and 8 (E 8, 128, 256 grouped),
// tokens filling a routing block or not (1, 3, 4, 9; at 3 ±inf and NaN in
// the last row), rows of several blocks of groups and a partial last group
// (K 200); the two apart otherwise (fp32, group 256, per tensor with a
// dynamic or a static scale, per token). A bad routing parameter fails with
// its field named.
TEST(MoeQuantGpu, RoutingWithTheActivationQuantiserIsTheTwoApart) {
  SKIP_WITHOUT_CUDA();
  using kernels::cuda::MoeFp8ActQuant;
  using kernels::cuda::MoeRoutingParams;
  struct Route {
    int E, k;
    kernels::RoutingMethod method;
    kernels::ScoringFunc scoring;
    int groups, topk_group;
  };
  const Route routes[] = {
      {8, 2, kernels::RoutingMethod::kTopK, kernels::ScoringFunc::kSoftmax, 0, 0},
      {128, 8, kernels::RoutingMethod::kTopK, kernels::ScoringFunc::kSoftmax, 0, 0},
      {256, 8, kernels::RoutingMethod::kGroupedTopK, kernels::ScoringFunc::kSigmoid, 8, 4}};
  struct Quant {
    MoeFp8ActQuant mode;
    kernels::DType dt;
    int64_t K;
    int group;
    float static_scale;
  };
  constexpr auto kGroup = MoeFp8ActQuant::kPerGroup, kTensor = MoeFp8ActQuant::kPerTensor;
  const Quant quants[] = {{kGroup, kernels::DType::kBFloat16, 7168, 128, 0},
                          {kGroup, kernels::DType::kFloat16, 2048, 128, 0},
                          {kGroup, kernels::DType::kBFloat16, 200, 128, 0},
                          {kGroup, kernels::DType::kBFloat16, 2048, 64, 0},
                          {kGroup, kernels::DType::kFloat32, 2048, 128, 0},
                          {kGroup, kernels::DType::kBFloat16, 2048, 256, 0},
                          {kTensor, kernels::DType::kBFloat16, 2048, 0, 0},
                          {kTensor, kernels::DType::kBFloat16, 2048, 0, 0.02f},
                          {MoeFp8ActQuant::kPerToken, kernels::DType::kBFloat16, 2048, 0, 0}};
  std::mt19937_64 rng(Mix(Seed() ^ 0x5e));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int cases = 0;
  for (const Route& rt : routes) {
    for (const Quant& qt : quants) {
      for (int64_t M : {1, 3, 4, 9}) {
        const std::string label =
            absl::StrCat("E ", rt.E, " k ", rt.k, " mode ", static_cast<int>(qt.mode), " ",
                         kernels::DTypeName(qt.dt), " K ", qt.K, " group ", qt.group, " static ",
                         qt.static_scale, " tokens ", M);
        MoeRoutingParams p;
        p.num_experts = rt.E;
        p.top_k = rt.k;
        p.method = rt.method;
        p.scoring = rt.scoring;
        p.renormalize = true;
        p.num_expert_group = rt.groups;
        p.topk_group = rt.topk_group;
        std::vector<float> logits(M * rt.E);
        for (float& v : logits) v = nd(rng);
        const int64_t es = kernels::DTypeSize(qt.dt), n = M * qt.K;
        const int64_t groups = qt.group > 0 ? (qt.K + qt.group - 1) / qt.group : 1;
        std::string x(n * es, '\0');
        for (int64_t i = 0; i < n; ++i) moe::StoreFloat(x.data(), qt.dt, i, 3.0f * nd(rng));
        if (M == 3) {  // ±inf and NaN in the last row
          moe::StoreFloat(x.data(), qt.dt, n - 1, std::numeric_limits<float>::infinity());
          moe::StoreFloat(x.data(), qt.dt, n - 5, -std::numeric_limits<float>::infinity());
          moe::StoreFloat(x.data(), qt.dt, n - qt.K / 2, std::numeric_limits<float>::quiet_NaN());
        }
        kernels::cuda::DeviceBuffer d_logits, d_x;
        ASSERT_TRUE(d_logits.Reserve(logits.size() * 4).ok());
        ASSERT_TRUE(d_x.Reserve(n * es).ok());
        ASSERT_EQ(
            cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_x.data(), x.data(), n * es, cudaMemcpyHostToDevice), cudaSuccess);
        struct Out {
          std::vector<float> w;
          std::vector<int32_t> ids;
          std::vector<uint8_t> q;
          std::vector<float> s;
        };
        auto run = [&](bool together, Out& o) {
          kernels::cuda::DeviceBuffer w, ids, q, sc, scratch;
          ASSERT_TRUE(scratch.Reserve(4 * kernels::cuda::kMoeFp8QuantScratchFloats).ok());
          ASSERT_TRUE(w.Reserve(M * rt.k * 4).ok());
          ASSERT_TRUE(ids.Reserve(M * rt.k * 4).ok());
          ASSERT_TRUE(q.Reserve(n).ok());
          ASSERT_TRUE(sc.Reserve(M * groups * 4).ok());
          for (auto* b : {&w, &ids, &sc})
            ASSERT_EQ(cudaMemset(b->data(), 0xFF, b->capacity()), cudaSuccess);
          ASSERT_EQ(cudaMemset(q.data(), 0xAB, n), cudaSuccess);
          if (together) {
            ASSERT_TRUE(kernels::cuda::LaunchMoeRoutingAndFp8Quantize(
                            p, d_logits.As<float>(), M, w.As<float>(), ids.As<int32_t>(), qt.mode,
                            qt.dt, d_x.data(), M, qt.K, qt.group, qt.static_scale,
                            scratch.As<float>(), q.As<uint8_t>(), sc.As<float>(), nullptr)
                            .ok())
                << label;
          } else {
            ASSERT_TRUE(kernels::cuda::LaunchMoeRouting(p, d_logits.As<float>(), M, w.As<float>(),
                                                        ids.As<int32_t>(), nullptr)
                            .ok())
                << label;
            ASSERT_TRUE(kernels::cuda::LaunchMoeFp8Quantize(
                            qt.mode, qt.dt, d_x.data(), M, qt.K, qt.group, qt.static_scale,
                            scratch.As<float>(), q.As<uint8_t>(), sc.As<float>(), nullptr)
                            .ok())
                << label;
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << label;
          o.w.resize(M * rt.k);
          o.ids.resize(M * rt.k);
          o.q.resize(n);
          o.s.resize(M * groups);
          ASSERT_EQ(cudaMemcpy(o.w.data(), w.data(), o.w.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpy(o.ids.data(), ids.data(), o.ids.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          ASSERT_EQ(cudaMemcpy(o.q.data(), q.data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(o.s.data(), sc.data(), o.s.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
        };
        Out apart, together;
        ASSERT_NO_FATAL_FAILURE(run(false, apart));
        ASSERT_NO_FATAL_FAILURE(run(true, together));
        // Routed and quantised at all (not the poison).
        for (int32_t id : apart.ids) ASSERT_TRUE(id >= 0 && id < rt.E) << label;
        for (float v : apart.s) ASSERT_TRUE(v > 0.0f) << label;
        EXPECT_EQ(apart.ids, together.ids) << label;
        EXPECT_EQ(std::memcmp(apart.w.data(), together.w.data(), apart.w.size() * 4), 0) << label;
        EXPECT_EQ(apart.q, together.q) << label;
        EXPECT_EQ(std::memcmp(apart.s.data(), together.s.data(), apart.s.size() * 4), 0) << label;
        ++cases;
      }
    }
  }
  MoeRoutingParams bad;
  bad.num_experts = 8;
  bad.top_k = 0;
  kernels::cuda::DeviceBuffer d_any;
  ASSERT_TRUE(d_any.Reserve(1 << 16).ok());
  const absl::Status st = kernels::cuda::LaunchMoeRoutingAndFp8Quantize(
      bad, d_any.As<float>(), 1, d_any.As<float>(), d_any.As<int32_t>(), MoeFp8ActQuant::kPerGroup,
      kernels::DType::kBFloat16, d_any.data(), 1, 2048, 128, 0.0f, nullptr, d_any.As<uint8_t>(),
      d_any.As<float>(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("routing.top_k"));
  std::printf("routing with the activation quantiser: %d cases byte for byte\n", cases);
}

// The int dequantisation (IntGroupDequant, through the int prefill route's
// LaunchMoeDequantWeights) bit for bit against the reference's
// round_T((q - zp)·s) in fp32: every stored byte, zero points over 0..255
// (int4 with zp >= 128 cannot take the packed bf16 form) and none, scales
// exact in bf16, exact in fp16 only, arbitrary fp32, subnormal, ±0,
// negative, infinite and large enough to overflow T; bf16 and fp16. Three
// experts, the middle one not hit (its rows must stay as they were); rows of
// 140 (int4) / 280 (int8) 32-bit words, more than a warp's pass of 128 and
// not a multiple of 32.
TEST(MoeQuantGpu, IntDequantIsTheReferencesRounding) {
  SKIP_WITHOUT_CUDA();
  using kernels::cuda::MoeQuantWeights;
  constexpr int64_t kExperts = 3, N = 64, K = 1120, kGroup = 32;
  constexpr int64_t kElems = kExperts * N * K, kGroups = kElems / kGroup;
  const uint8_t hit[kExperts] = {1, 0, 1};
  constexpr uint16_t kPoison = 0x7fc1;  // a NaN no dequantised weight has
  const float kSpecial[] = {
      0.0f,
      moe::RoundToDType(-0.0037f, DType::kBFloat16),
      moe::RoundToDType(0.0012345f, DType::kFloat16),  // exact in fp16, not in bf16
      std::ldexp(1.0f, -130),                          // bf16, an fp32 subnormal
      std::ldexp(1.0f, -20),                           // an fp16 subnormal
      6.0e4f,                                          // fp16: (q - zp)·s overflows
      std::ldexp(1.0f, 127),                           // bf16: overflows fp32 and bf16
      -1.5f,
      -0.0f,
      std::numeric_limits<float>::infinity()};  // (q - zp)·s: ±inf, or NaN where q == zp
  for (const bool int4 : {true, false}) {
    for (const bool zero_points : {false, true}) {
      for (const DType act : {DType::kBFloat16, DType::kFloat16}) {
        const std::string label = absl::StrCat(int4 ? "int4" : "int8", zero_points ? " zp" : "",
                                               " / ", kernels::DTypeName(act));
        const int64_t bytes = int4 ? kElems / 2 : kElems;
        std::vector<uint8_t> w(bytes), zp(kGroups);
        std::vector<float> scale(kGroups);
        for (int64_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>(Mix(Seed() + i) >> 11);
        for (int64_t i = 0; i < 256 && i < bytes; ++i) w[i] = static_cast<uint8_t>(i);
        for (int64_t gi = 0; gi < kGroups; ++gi) {
          const uint64_t r = Mix(Seed() ^ (0x5eed0000 + gi));
          zp[gi] = static_cast<uint8_t>(r >> 8);
          const float any = static_cast<float>(1e-3 * (0.5 + static_cast<double>(r >> 40) / 1e7));
          switch (r % 4) {
            case 0:
              scale[gi] = kSpecial[(r >> 2) % std::size(kSpecial)];
              break;
            case 1:
              scale[gi] = moe::RoundToDType(any, DType::kBFloat16);
              break;
            case 2:
              scale[gi] = moe::RoundToDType(any, DType::kFloat16);
              break;
            default:
              scale[gi] = any;
          }
        }
        void *dw, *dz, *ds, *dhit, *dout;
        ASSERT_EQ(cudaMalloc(&dw, bytes), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dz, kGroups), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&ds, kGroups * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dhit, kExperts), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dout, kElems * 2), cudaSuccess);
        std::vector<uint16_t> got(kElems, kPoison), want(kElems);
        ASSERT_EQ(cudaMemcpy(dout, got.data(), kElems * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dw, w.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dz, zp.data(), kGroups, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(ds, scale.data(), kGroups * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dhit, hit, kExperts, cudaMemcpyHostToDevice), cudaSuccess);
        MoeQuantWeights qw;
        qw.kind = int4 ? DType::kInt4Packed : DType::kInt8;
        qw.scale_kind = kernels::cuda::MoeWeightScale::kGroup;
        qw.data = dw;
        qw.scale = static_cast<const float*>(ds);
        qw.zero = zero_points ? static_cast<const uint8_t*>(dz) : nullptr;
        qw.group_size = kGroup;
        ASSERT_TRUE(kernels::cuda::LaunchMoeDequantWeights(
                        qw, kExperts, N, K, static_cast<const uint8_t*>(dhit), act, dout, nullptr)
                        .ok());
        ASSERT_EQ(cudaMemcpy(got.data(), dout, kElems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        for (void* ptr : {dw, dz, ds, dhit, dout}) cudaFree(ptr);
        int64_t bad = 0;
        for (int64_t i = 0; i < kElems; ++i) {
          if (!hit[i / (N * K)]) {  // left as it was
            if (got[i] != kPoison && ++bad <= 5) {
              ADD_FAILURE() << label << ": element " << i << " of an expert not hit was written";
            }
            continue;
          }
          const int64_t gi = i / kGroup;
          float v;
          if (int4) {
            v = static_cast<float>(moe::Int4At(w.data(), i)) -
                (zero_points ? static_cast<float>(zp[gi]) : 8.0f);
          } else {
            v = zero_points ? static_cast<float>(w[i]) - static_cast<float>(zp[gi])
                            : static_cast<float>(static_cast<int8_t>(w[i]));
          }
          moe::StoreFloat(want.data(), act, i, v * scale[gi]);
          if (got[i] == kPoison) {  // never a value: the GPU's NaN is canonical (0x7fff)
            if (++bad <= 5) ADD_FAILURE() << label << ": element " << i << " was not written";
            continue;
          }
          // Any NaN is NaN (the GPU's is canonical, the CPU's keeps a payload).
          const bool nan_both = std::isnan(moe::LoadFloat(got.data(), act, i)) &&
                                std::isnan(moe::LoadFloat(want.data(), act, i));
          if (got[i] != want[i] && !nan_both && ++bad <= 5) {
            ADD_FAILURE() << label << ": element " << i << " (q - zp " << v << ", scale "
                          << scale[gi] << "): got 0x" << std::hex << got[i] << ", want 0x"
                          << want[i] << std::dec;
          }
        }
        EXPECT_EQ(bad, 0) << label;
      }
    }
  }
}

TEST(MoeQuantGpu, RefusesWhatTheReferenceRejects) {
  SKIP_WITHOUT_CUDA();
  const Shape s{"refuse", 4, 2, 64, 32};
  Combo bad = Fp8("fp8_block", kernels::DType::kBFloat16);
  bad.block_act_scale = "per_token";  // "illegal quantization" in the reference
  auto set = MakeSet(s, bad, 61);
  auto g = GpuExperts::Create(*set, 0);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  Combo odd = IntW("int8_group", kernels::DType::kBFloat16, false, 4);
  const Shape not8{"not8", 4, 2, 68, 32};  // hidden not a multiple of 8
  auto set2 = MakeSet(not8, odd, 62);
  auto g2 = GpuExperts::Create(*set2, 0);
  EXPECT_EQ(g2.status().code(), absl::StatusCode::kFailedPrecondition) << g2.status();
}

}  // namespace
}  // namespace kplan
