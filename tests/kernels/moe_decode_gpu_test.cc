// The decode-sized MoE layer (kernels/cuda/moe/moe_experts.h,
// LaunchMoeDecodeExperts) in both forms on fresh random data every run (the
// seed is printed; MOE_DECODE_GPU_TEST_SEED=<n> repeats one):
//  * the one-kernel form (moe_decode_layer.cu) bit for bit against the
//    two-kernel form (moe_decode.cu): output, top-k ids and weights, with
//    every output and workspace buffer poisoned (NaN) before each run, and
//    the one-kernel launch counter showing which form ran;
//  * both against the CPU reference (moe::MoeReference, or moe::RunExperts
//    without combine) on the GPU's routing, within the layer tolerance
//    (tests/testing/tolerance.h), no NaN, a non-zero reference;
//  * the one-kernel form inside a CUDA graph, replayed on new inputs.
// Cases: one token on a Qwen3-like shape (16 down-row chunks per CTA for a
// ring of 13 stages on an H200: 3 are copied after the grid barrier), more
// down-row chunks than ring stages by far (16 rows of 16 KiB per CTA), many
// tokens with a tiny hidden size (a CTA's columns span several tokens), no
// combine with an expert map (half the experts remote), DeepSeek-style
// grouped routing with a correction bias on two tokens, given ids with some
// out of range, the two-kernel form's down-combine CTA for every top_k from
// 1 to 8 and with tiles cut short by H, every activation, fp16 and biases.
// KPLAN_MOE_DECODE_STAGES=2
// (the ring's most stages) runs the same cases through a ring that wraps
// around on every chunk. Skips without a device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/tolerance.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;
using kernels::MoeActivation;
using test_util::SplitMix;

uint64_t Seed() { return test_util::TestSeed("moe_decode_gpu_test", "MOE_DECODE_GPU_TEST_SEED"); }

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t _e = (expr);                                               \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)

class DevBuf {
 public:
  explicit DevBuf(size_t bytes) : bytes_(std::max<size_t>(bytes, 16)) {
    if (cudaMalloc(&p_, bytes_) != cudaSuccess) p_ = nullptr;
  }
  ~DevBuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* p_ = nullptr;
};

// Uniform in [lo, hi), stream `id` of the run's seed.
std::vector<float> Uniform(int64_t n, float lo, float hi, uint64_t id) {
  std::vector<float> v(n);
  const uint64_t key = SplitMix(Seed() ^ (id * 0x9e3779b97f4a7c15ull));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = lo + (hi - lo) * static_cast<float>(SplitMix(key + i) >> 40) / 16777216.0f;
  }
  return v;
}

// n non-zero 16-bit values ±[1, 2)·2^(base - 0..3) in `dtype`, drawn by
// threads (test_util::RandomElements).
std::vector<uint16_t> Random16(DType dtype, int64_t n, int base, uint64_t id) {
  const std::string bytes = test_util::RandomElements(
      n, 2, SplitMix(Seed() ^ (id * 0xbf58476d1ce4e5b9ull)), [&](uint32_t bits, char* dst) {
        const float f = test_util::RandomValueOf(bits, base);
        const uint16_t v = dtype == DType::kBFloat16 ? moe::FloatToBf16(f) : moe::FloatToHalf(f);
        std::memcpy(dst, &v, 2);
      });
  std::vector<uint16_t> v(n);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

int Log2Ceil(double x) { return static_cast<int>(std::ceil(std::log2(x))); }

struct Case {
  std::string name;
  int E, k;
  int64_t H, I, M;
  MoeActivation act = MoeActivation::kSilu;
  DType dtype = DType::kBFloat16;
  bool bias = false;
  bool logits = true;    // route on the GPU; else given ids
  bool grouped = false;  // DeepSeek grouped top-k with a correction bias
  bool combine = true;
  bool map = false;      // experts with odd ids are remote (expert map -1)
  bool bad_ids = false;  // given ids: some out of range
};

// What one run of the layer produced.
struct Result {
  std::vector<uint16_t> out;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Holds one case's device data; Run launches the layer in the current mode.
class DecodeLayer {
 public:
  explicit DecodeLayer(const Case& c, uint64_t id) : c_(c) {
    const bool gated = c.act < MoeActivation::kSiluNoMul;
    n13_ = gated ? 2 * c.I : c.I;
    local_ = c.map ? (c.E + 1) / 2 : c.E;
    numel_ = c.M * c.k;
    x_ = Random16(c.dtype, c.M * c.H, -1, id + 1);
    w13_ = Random16(c.dtype, local_ * n13_ * c.H, -Log2Ceil(std::sqrt(double(c.H))), id + 2);
    w2_ = Random16(c.dtype, local_ * c.H * c.I, -Log2Ceil(std::sqrt(double(c.I))), id + 3);
    if (c.bias) {
      b13_ = Uniform(local_ * n13_, -0.25f, 0.25f, id + 4);
      b2_ = Uniform(local_ * c.H, -0.25f, 0.25f, id + 5);
    }
    logits_ = Uniform(c.M * c.E, -3.0f, 3.0f, id + 6);
    corr_ = Uniform(c.E, -0.1f, 0.1f, id + 7);
    if (c.map) {
      map_.resize(c.E);
      for (int e = 0; e < c.E; ++e) map_[e] = e % 2 == 0 ? e / 2 : -1;
    }
    routing_.num_experts = c.E;
    routing_.top_k = c.k;
    if (c.grouped) {
      routing_.method = kernels::RoutingMethod::kGroupedTopK;
      routing_.scoring = kernels::ScoringFunc::kSigmoid;
      routing_.num_expert_group = 8;
      routing_.topk_group = 4;
      routing_.routed_scaling_factor = 2.5f;
      routing_.e_score_correction_bias = corr_.data();
    }
    routing_.renormalize = true;
    if (!c.logits) {  // given ids: the CPU router's, some made out of range
      given_ids_.resize(numel_);
      given_w_.resize(numel_);
      EXPECT_TRUE(
          moe::RouteTokens(routing_, logits_.data(), c.M, given_w_.data(), given_ids_.data()).ok());
      if (c.bad_ids) {
        for (int64_t s = 1; s < numel_; s += 3) given_ids_[s] = s % 2 ? -1 : c.E + 3;
      }
    }
  }

  const Case& spec() const { return c_; }
  int64_t numel() const { return numel_; }
  int64_t out_elems() const { return (c_.combine ? c_.M : numel_) * c_.H; }

  // Uploads everything (gtest failures on CUDA errors).
  void Upload() {
    auto up = [](std::unique_ptr<DevBuf>& d, const void* src, size_t bytes) {
      d = std::make_unique<DevBuf>(bytes);
      ASSERT_NE(d->get(), nullptr);
      if (bytes > 0) CUDA_OK(cudaMemcpy(d->get(), src, bytes, cudaMemcpyHostToDevice));
    };
    up(dx_, x_.data(), x_.size() * 2);
    up(dw13_, w13_.data(), w13_.size() * 2);
    up(dw2_, w2_.data(), w2_.size() * 2);
    if (c_.bias) {
      up(db13_, b13_.data(), b13_.size() * 4);
      up(db2_, b2_.data(), b2_.size() * 4);
    }
    up(dlogits_, logits_.data(), logits_.size() * 4);
    up(dcorr_, corr_.data(), corr_.size() * 4);
    if (c_.map) up(dmap_, map_.data(), map_.size() * 4);
    dids_ = std::make_unique<DevBuf>(numel_ * 4);
    dw_ = std::make_unique<DevBuf>(numel_ * 4);
    dh_ = std::make_unique<DevBuf>(numel_ * c_.I * 2);
    dout_ = std::make_unique<DevBuf>(out_elems() * 2);
  }

  kc::MoeDecodeArgs Args() const {
    kc::MoeDecodeArgs d;
    d.dtype = c_.dtype;
    d.hidden = dx_->get();
    if (c_.logits) {
      d.router_logits = dlogits_->get<float>();
      d.routing = kc::MoeRoutingParamsOf(routing_);
      if (c_.grouped) d.routing.e_score_correction_bias = dcorr_->get<float>();
    }
    d.topk_ids = dids_->get<int32_t>();
    d.topk_weights = dw_->get<float>();
    d.expert_map = c_.map ? dmap_->get<int32_t>() : nullptr;
    d.num_experts = c_.E;
    d.num_local_experts = static_cast<int>(local_);
    d.num_tokens = c_.M;
    d.top_k = c_.k;
    d.hidden_size = c_.H;
    d.intermediate_size = c_.I;
    d.w13 = dw13_->get();
    d.w2 = dw2_->get();
    d.b13 = c_.bias ? db13_->get<float>() : nullptr;
    d.b2 = c_.bias ? db2_->get<float>() : nullptr;
    d.act = c_.act;
    if (c_.act == MoeActivation::kSwigluOaiUninterleave) d.act_params.has_clamp_limit = true;
    d.h = dh_->get();
    d.combine = c_.combine;
    d.out = dout_->get();
    return d;
  }

  // Poisons the outputs and the workspace, sets the given ids, enqueues.
  void Enqueue(cudaStream_t stream) {
    CUDA_OK(cudaMemsetAsync(dout_->get(), 0xff, dout_->bytes(), stream));
    CUDA_OK(cudaMemsetAsync(dh_->get(), 0xff, dh_->bytes(), stream));
    if (c_.logits) {
      CUDA_OK(cudaMemsetAsync(dids_->get(), 0xff, dids_->bytes(), stream));
      CUDA_OK(cudaMemsetAsync(dw_->get(), 0xff, dw_->bytes(), stream));
    } else {
      CUDA_OK(cudaMemcpyAsync(dids_->get(), given_ids_.data(), numel_ * 4, cudaMemcpyHostToDevice,
                              stream));
      CUDA_OK(
          cudaMemcpyAsync(dw_->get(), given_w_.data(), numel_ * 4, cudaMemcpyHostToDevice, stream));
    }
    const absl::Status st = kc::LaunchMoeDecodeExperts(Args(), stream);
    ASSERT_TRUE(st.ok()) << st;
  }

  void Download(Result* r) {
    r->out.resize(out_elems());
    r->ids.resize(numel_);
    r->weights.resize(numel_);
    CUDA_OK(cudaMemcpy(r->out.data(), dout_->get(), r->out.size() * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r->ids.data(), dids_->get(), numel_ * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r->weights.data(), dw_->get(), numel_ * 4, cudaMemcpyDeviceToHost));
  }

  // New hidden rows and logits (the graph test's second replay).
  void Redraw(uint64_t id) {
    x_ = Random16(c_.dtype, c_.M * c_.H, -1, id + 1);
    logits_ = Uniform(c_.M * c_.E, -3.0f, 3.0f, id + 6);
    CUDA_OK(cudaMemcpy(dx_->get(), x_.data(), x_.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(
        cudaMemcpy(dlogits_->get(), logits_.data(), logits_.size() * 4, cudaMemcpyHostToDevice));
  }

  // The CPU reference on the GPU's routing against r.out; returns a report.
  void CheckAgainstCpu(const Result& r, const std::string& label) {
    moe::MoeProblem p;
    p.num_tokens = c_.M;
    p.hidden = c_.H;
    p.intermediate = c_.I;
    p.num_experts = c_.E;
    p.top_k = c_.k;
    p.act_dtype = c_.dtype;
    p.hidden_states = x_.data();
    p.activation = c_.act;
    if (c_.act == MoeActivation::kSwigluOaiUninterleave) p.act_params.clamp_limit = 7.0f;
    p.weights.dtype = c_.dtype;
    p.weights.num_local_experts = static_cast<int>(local_);
    p.weights.w13 = w13_.data();
    p.weights.w2 = w2_.data();
    p.weights.b13 = c_.bias ? b13_.data() : nullptr;
    p.weights.b2 = c_.bias ? b2_.data() : nullptr;
    p.expert_map = c_.map ? map_.data() : nullptr;
    // Out-of-range ids are zero rows on the GPU; for the reference they are
    // expert 0 with weight 0 (fadd(acc, fmul(y, 0)) == acc).
    std::vector<int32_t> ids = r.ids;
    std::vector<float> w = r.weights;
    for (int64_t s = 0; s < numel_; ++s) {
      if (ids[s] < 0 || ids[s] >= c_.E) {
        ASSERT_TRUE(c_.bad_ids && c_.combine) << label << ": GPU routing gave id " << ids[s];
        ids[s] = 0;
        w[s] = 0.0f;
      }
    }
    std::vector<double> ref(out_elems());
    if (c_.combine) {
      std::vector<uint16_t> out(out_elems());
      moe::MoeProblem q = p;
      q.topk_ids = ids.data();
      q.topk_weights = w.data();
      ASSERT_TRUE(moe::MoeReference(q, out.data()).ok());
      for (int64_t i = 0; i < out_elems(); ++i) ref[i] = moe::LoadFloat(out.data(), c_.dtype, i);
    } else {
      std::vector<float> y(numel_ * c_.H);
      ASSERT_TRUE(moe::RunExperts(p, ids.data(), w.data(), y.data()).ok());
      for (int64_t i = 0; i < out_elems(); ++i) ref[i] = y[i];
    }
    double d2 = 0, r2 = 0;
    int64_t nan = 0, bad = 0, first_bad = -1;
    for (int64_t i = 0; i < out_elems(); ++i) r2 += ref[i] * ref[i];
    const double rms = std::sqrt(r2 / out_elems());
    for (int64_t i = 0; i < out_elems(); ++i) {
      const double g = moe::LoadFloat(r.out.data(), c_.dtype, i);
      if (!std::isfinite(g)) ++nan;
      d2 += (g - ref[i]) * (g - ref[i]);
      if (!(std::fabs(g - ref[i]) <= test_util::MoeLayerElementTolerance(ref[i], rms))) {
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
    }
    const double rel = std::sqrt(d2 / std::max(r2, 1e-30));
    std::printf("  %-44s vs CPU: rel %.2e, %lld bad, %lld nan\n", label.c_str(), rel,
                static_cast<long long>(bad), static_cast<long long>(nan));
    EXPECT_GT(r2, 0.0) << label << ": reference is all zeros";
    EXPECT_EQ(nan, 0) << label;
    EXPECT_LE(rel, 1e-2) << label;
    EXPECT_EQ(bad, 0) << label << ": first bad element " << first_bad;
  }

 private:
  Case c_;
  int64_t n13_ = 0, local_ = 0, numel_ = 0;
  std::vector<uint16_t> x_, w13_, w2_;
  std::vector<float> b13_, b2_, logits_, corr_;
  std::vector<int32_t> map_;
  moe::RoutingSpec routing_;
  std::vector<int32_t> given_ids_;
  std::vector<float> given_w_;
  std::unique_ptr<DevBuf> dx_, dw13_, dw2_, db13_, db2_, dlogits_, dcorr_, dmap_, dids_, dw_, dh_,
      dout_;
};

// The decode form back to the environment's when a case ends, however it
// ends (a failed ASSERT returns early).
struct DecodeModeReset {
  ~DecodeModeReset() { kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kFromEnv); }
};

// Runs `c` in both forms; the one-kernel form must have run and match.
void RunBoth(const Case& c, uint64_t id) {
  SCOPED_TRACE(c.name);
  const DecodeModeReset reset;
  DecodeLayer layer(c, id);
  layer.Upload();
  if (::testing::Test::HasFatalFailure()) return;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  Result two, one;
  kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kOff);
  const int64_t before = kc::MoeDecodeLayerLaunches();
  layer.Enqueue(stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(kc::MoeDecodeLayerLaunches(), before) << "the one-kernel form ran while off";
  layer.Download(&two);
  kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kOn);
  layer.Enqueue(stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  EXPECT_EQ(kc::MoeDecodeLayerLaunches(), before + 1) << "the one-kernel form did not run";
  layer.Download(&one);
  CUDA_OK(cudaStreamDestroy(stream));

  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < one.out.size(); ++i) {
    if (one.out[i] != two.out[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differ;
    }
  }
  std::printf("%-46s M=%-3lld one vs two kernels: %lld/%zu differ\n", c.name.c_str(),
              static_cast<long long>(c.M), static_cast<long long>(differ), one.out.size());
  EXPECT_EQ(differ, 0) << "first at " << first;
  if (c.logits) {  // routed by each form (given ids are inputs)
    EXPECT_EQ(one.ids, two.ids);
    EXPECT_EQ(0, std::memcmp(one.weights.data(), two.weights.data(), one.weights.size() * 4))
        << "routing weights differ";
  }
  layer.CheckAgainstCpu(one, c.name);
}

TEST(MoeDecodeGpu, OneKernelMatchesTwoKernelsAndCpu) {
  SKIP_WITHOUT_CUDA();
  std::vector<Case> cases;
  cases.push_back({"qwen3-like, 1 token", 128, 8, 2048, 768, 1});
  cases.push_back({"more down chunks than stages", 4, 2, 1024, 8192, 1});
  {
    Case c{"tiny H, 16 tokens, gelu, given ids", 64, 1, 16, 64, 16, MoeActivation::kGelu};
    c.logits = false;
    cases.push_back(c);
  }
  {
    Case c{"no combine, expert map, fp16 bias", 32, 2, 200, 72, 3};
    c.dtype = DType::kFloat16;
    c.bias = true;
    c.logits = false;
    c.combine = false;
    c.map = true;
    cases.push_back(c);
  }
  {
    Case c{"expert map, combine, routed", 64, 4, 256, 128, 4, MoeActivation::kSilu};
    c.map = true;
    cases.push_back(c);
  }
  {
    Case c{"grouped routing + bias, 2 tokens, swigluoai",
           256,
           8,
           512,
           256,
           2,
           MoeActivation::kSwigluOai};
    c.grouped = true;
    cases.push_back(c);
  }
  {
    Case c{
        "given ids out of range, swiglustep fp16", 16, 4, 256, 128, 4, MoeActivation::kSwigluStep};
    c.dtype = DType::kFloat16;
    c.bias = true;
    c.logits = false;
    c.bad_ids = true;
    cases.push_back(c);
  }
  // The down-combine CTA's shapes: k * G warps, 4 * G columns (G = max(1, 8 / k)), every k
  // from 1 to 8, and tiles cut by H (k = 1: 32 columns, H = 40; k = 2: 16 columns, H = 24).
  for (int k : {1, 2, 3, 5, 6, 7}) {
    const int64_t H = k == 1 ? 40 : k == 2 ? 24 : 8 * (k + 3);
    cases.push_back({"combine, k = " + std::to_string(k) + ", H = " + std::to_string(H), 16, k, H,
                     32, k == 3 ? 2 : 1});
  }
  const MoeActivation acts[] = {MoeActivation::kSilu,       MoeActivation::kGelu,
                                MoeActivation::kGeluTanh,   MoeActivation::kRelu2,
                                MoeActivation::kSwigluOai,  MoeActivation::kSwigluOaiUninterleave,
                                MoeActivation::kSwigluStep, MoeActivation::kSiluNoMul,
                                MoeActivation::kGeluNoMul,  MoeActivation::kGeluTanhNoMul,
                                MoeActivation::kRelu2NoMul};
  int i = 0;
  for (MoeActivation a : acts) {
    Case c{"activation " + std::to_string(static_cast<int>(a)), 8, 2, 64, 32, 1, a};
    c.dtype = i % 2 ? DType::kFloat16 : DType::kBFloat16;
    c.bias = i % 3 == 0;
    ++i;
    cases.push_back(c);
  }
  uint64_t id = 100;
  for (const Case& c : cases) {
    RunBoth(c, id += 10);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Captured in a CUDA graph (cooperative kernel node), replayed on the inputs
// of capture time and on new ones: each replay equals an eager launch.
TEST(MoeDecodeGpu, OneKernelInCudaGraph) {
  SKIP_WITHOUT_CUDA();
  const Case c{"qwen3-like graph", 32, 8, 2048, 768, 1};
  DecodeLayer layer(c, 900);
  layer.Upload();
  if (::testing::Test::HasFatalFailure()) return;
  const DecodeModeReset reset;
  kc::SetMoeDecodeLayerMode(kc::MoeKernelMode::kOn);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const int64_t before = kc::MoeDecodeLayerLaunches();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  const absl::Status st = kc::LaunchMoeDecodeExperts(layer.Args(), stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(kc::MoeDecodeLayerLaunches(), before + 1) << "not the one-kernel form";
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    if (round == 1) layer.Redraw(901);
    Result eager, replay;
    layer.Enqueue(stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    layer.Download(&eager);
    CUDA_OK(cudaMemset(layer.Args().out, 0xff, layer.out_elems() * 2));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    layer.Download(&replay);
    EXPECT_EQ(replay.out, eager.out) << "round " << round;
    EXPECT_EQ(replay.ids, eager.ids) << "round " << round;
    layer.CheckAgainstCpu(replay, "graph replay " + std::to_string(round));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace kplan
