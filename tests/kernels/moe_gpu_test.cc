// GPU MoE routing and moe_align_block_size (kernels/cuda/moe/moe_ops.h) against
// the CPU reference (kernels/cpu/moe/moe_reference.h), on fresh random
// inputs every run (the seed is printed; MOE_GPU_TEST_SEED=<n> repeats one).
//  * Routing: every method (softmax / sigmoid / sqrtsoftplus top-k, with and
//    without renormalize, with e_score_correction_bias and
//    routed_scaling_factor, DeepSeek grouped top-k with and without bias,
//    top-k-then-softmax, Llama4) x E in {8, 128, 256} x k in {1, 2, 8} x
//    M in {1, 7, 4096}, plus edge shapes (E = 512 / k = 32, E not a multiple
//    of 32, E = 1) and inputs full of exact ties. Ids must be identical,
//    except where the two experts' selection scores are a near-tie (within
//    1e-6 relative, from fp32 rounding of exp/sigmoid/log1p) and their inputs
//    differ; such rows are counted and their weights not compared. Weights
//    within 1e-5 relative. Outputs are poisoned before every launch. Every
//    routing method also runs on rows with NaNs, infinities, signed zeros and
//    ties, E not a multiple of 32 included.
//  * Align: random ids, all tokens on one expert, empty experts, skewed,
//    out-of-range ids, expert_map with half the experts local (default and
//    ignore_invalid_experts), pad_sorted_ids, numel < E, numel = 0, E = 1024
//    x block_size in {16, 64, 128}: bit-exact with moe::MoeAlignBlockSize
//    over the whole buffers (tails included), and a poisoned guard region
//    past each buffer must stay untouched.
//  * The §6.5 worked example verbatim.
//  * The staging copies by the SMs (LaunchMoeStageCopy): every byte, at
//    sizes around the 16-byte words, aligned or not, and nothing past them.
//  * Activation and combine: the 16-byte vector forms byte for byte against
//    the scalar forms (the same launch on rows one element off alignment),
//    every activation, bf16 and fp16, with and without combine weights.
// One line per case: method, E, k, M, max weight error, id mismatches,
// OK/FAIL. GPU tests skip themselves without a CUDA device. Run: ./moe_gpu_test
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;

using test_util::HaveCuda;

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t _e = (expr);                                               \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)

std::mt19937& Rng() {
  static std::mt19937 rng = [] {
    unsigned seed = std::random_device{}();
    if (const char* s = std::getenv("MOE_GPU_TEST_SEED")) seed = std::strtoul(s, nullptr, 10);
    std::printf("moe_gpu_test: random seed %u (MOE_GPU_TEST_SEED=%u repeats it)\n", seed, seed);
    return std::mt19937(seed);
  }();
  return rng;
}

// A device buffer of n elements plus `guard` poisoned elements after it.
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n, size_t guard = 0) : n_(n), guard_(guard) {
    err_ = cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n + guard, 1) * sizeof(T));
  }
  ~DevBuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  cudaError_t status() const { return err_; }
  T* get() const { return n_ == 0 ? nullptr : p_; }
  T* raw() const { return p_; }
  cudaError_t Upload(const std::vector<T>& v) {
    return cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  // Fills data and guard with the byte pattern.
  cudaError_t Poison(int byte) { return cudaMemset(p_, byte, (n_ + guard_) * sizeof(T)); }
  cudaError_t Download(std::vector<T>* v) const {
    v->resize(n_ + guard_);
    if (v->empty()) return cudaSuccess;
    return cudaMemcpy(v->data(), p_, v->size() * sizeof(T), cudaMemcpyDeviceToHost);
  }

 private:
  T* p_ = nullptr;
  size_t n_, guard_;
  cudaError_t err_ = cudaSuccess;
};

constexpr int kPoisonByte = 0x7a;  // 0x7a7a7a7a: a large int / a large finite float
int32_t PoisonInt() {
  int32_t v;
  std::memset(&v, kPoisonByte, sizeof(v));
  return v;
}

// ---------------------------------------------------------------------------
// Routing.

struct Method {
  const char* name;
  moe::RoutingMethod method;
  moe::ScoringFunc scoring;
  bool renormalize;
  bool bias;
  float scale;
  bool grouped;
};

const std::vector<Method>& Methods() {
  using RM = moe::RoutingMethod;
  using SF = moe::ScoringFunc;
  static const std::vector<Method> m = {
      {"softmax", RM::kTopK, SF::kSoftmax, false, false, 1.0f, false},
      {"softmax_renorm", RM::kTopK, SF::kSoftmax, true, false, 1.0f, false},
      {"sigmoid", RM::kTopK, SF::kSigmoid, false, false, 1.0f, false},
      {"sigmoid_renorm", RM::kTopK, SF::kSigmoid, true, false, 1.0f, false},
      {"softmax_bias_scale", RM::kTopK, SF::kSoftmax, false, true, 2.5f, false},
      {"sigmoid_bias_renorm", RM::kTopK, SF::kSigmoid, true, true, 1.0f, false},
      {"sigmoid_bias_renorm_scale", RM::kTopK, SF::kSigmoid, true, true, 2.5f, false},
      {"sqrtsoftplus", RM::kTopK, SF::kSqrtSoftplus, false, false, 1.0f, false},
      {"sqrtsoftplus_bias_renorm", RM::kTopK, SF::kSqrtSoftplus, true, true, 1.5f, false},
      {"grouped_v3_sigmoid_bias", RM::kGroupedTopK, SF::kSigmoid, true, true, 2.5f, true},
      {"grouped_v2_softmax", RM::kGroupedTopK, SF::kSoftmax, false, false, 1.0f, true},
      {"grouped_softmax_renorm", RM::kGroupedTopK, SF::kSoftmax, true, false, 16.0f, true},
      {"topk_then_softmax", RM::kTopKThenSoftmax, SF::kSoftmax, false, false, 1.0f, false},
      {"llama4", RM::kLlama4, SF::kSoftmax, false, false, 1.0f, false},
  };
  return m;
}

// Groups for grouped methods: 8 groups (DeepSeek-V3: 256 = 8 x 32) when E
// allows, topk_group half of them.
void GroupsFor(int E, int* G, int* topk_group) {
  *G = 1;
  for (int g : {8, 4, 2}) {
    if (E % g == 0 && E / g >= 2) {
      *G = g;
      break;
    }
  }
  *topk_group = std::max(1, *G / 2);
}

float Score(moe::ScoringFunc f, const float* g, int E, int e) {
  switch (f) {
    case moe::ScoringFunc::kSoftmax: {
      double mx = -INFINITY, sum = 0;
      for (int i = 0; i < E; ++i) mx = std::max<double>(mx, g[i]);
      for (int i = 0; i < E; ++i) sum += std::exp(g[i] - mx);
      return static_cast<float>(std::exp(g[e] - mx) / sum);
    }
    case moe::ScoringFunc::kSigmoid:
      return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(g[e]))));
    case moe::ScoringFunc::kSqrtSoftplus:
      return static_cast<float>(
          std::sqrt(g[e] > 20.0f ? g[e] : std::log1p(std::exp(static_cast<double>(g[e])))));
  }
  return 0.0f;
}

bool Near(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return false;
  return std::fabs(a - b) <= 1e-6f * std::max(std::fabs(a), std::fabs(b)) + 1e-12f;
}

struct RouteOutcome {
  double max_rel_err = 0;
  int64_t id_mismatch_rows = 0;  // unexplained: failures
  int64_t near_tie_rows = 0;     // explained by a near-tie
  int64_t weight_fail = 0;
  bool launched_ok = true;
  std::string error;
};

// Runs one routing case; logits/bias on the host.
RouteOutcome RunRouting(const Method& m, int E, int k, int64_t M, const std::vector<float>& logits,
                        const std::vector<float>& bias, cudaStream_t stream) {
  RouteOutcome out;
  moe::RoutingSpec spec;
  spec.num_experts = E;
  spec.top_k = k;
  spec.method = m.method;
  spec.scoring = m.scoring;
  spec.renormalize = m.renormalize;
  spec.e_score_correction_bias = m.bias ? bias.data() : nullptr;
  spec.routed_scaling_factor = m.scale;
  if (m.grouped) GroupsFor(E, &spec.num_expert_group, &spec.topk_group);
  std::vector<float> cw(M * k);
  std::vector<int32_t> cid(M * k);
  if (absl::Status s = moe::RouteTokens(spec, logits.data(), M, cw.data(), cid.data()); !s.ok()) {
    out.launched_ok = false;
    out.error = "cpu: " + std::string(s.message());
    return out;
  }

  DevBuf<float> d_logits(M * E), d_bias(E), d_w(M * k, 32);
  DevBuf<int32_t> d_ids(M * k, 32);
  auto fail = [&](const char* what, cudaError_t e) {
    out.launched_ok = false;
    out.error = std::string(what) + ": " + cudaGetErrorString(e);
    return out;
  };
  for (cudaError_t e : {d_logits.status(), d_bias.status(), d_w.status(), d_ids.status()}) {
    if (e != cudaSuccess) return fail("cudaMalloc", e);
  }
  if (cudaError_t e = d_logits.Upload(logits); e != cudaSuccess) return fail("upload", e);
  if (cudaError_t e = d_bias.Upload(bias); e != cudaSuccess) return fail("upload", e);
  if (cudaError_t e = d_w.Poison(kPoisonByte); e != cudaSuccess) return fail("poison", e);
  if (cudaError_t e = d_ids.Poison(kPoisonByte); e != cudaSuccess) return fail("poison", e);

  // The uploads and memsets above ran on the legacy default stream, which a
  // non-blocking stream does not wait for.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return fail("sync", e);
  kc::MoeRoutingParams p = kc::MoeRoutingParamsOf(spec);
  p.e_score_correction_bias = m.bias ? d_bias.get() : nullptr;
  if (absl::Status s = kc::LaunchMoeRouting(p, d_logits.get(), M, d_w.get(), d_ids.get(), stream);
      !s.ok()) {
    out.launched_ok = false;
    out.error = std::string(s.message());
    return out;
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return fail("sync", e);
  std::vector<float> gw;
  std::vector<int32_t> gid;
  if (cudaError_t e = d_w.Download(&gw); e != cudaSuccess) return fail("download", e);
  if (cudaError_t e = d_ids.Download(&gid); e != cudaSuccess) return fail("download", e);

  // Guards past the outputs must be untouched.
  const int32_t poison_i = PoisonInt();
  float poison_f;
  std::memcpy(&poison_f, &poison_i, sizeof(poison_f));
  for (size_t i = M * k; i < gid.size(); ++i) {
    if (gid[i] != poison_i) ++out.id_mismatch_rows;
    int32_t wb;
    std::memcpy(&wb, &gw[i], sizeof(wb));
    if (wb != poison_i) ++out.weight_fail;
  }

  const bool scored = m.method == moe::RoutingMethod::kTopK || m.grouped;
  std::vector<float> key(E);
  for (int64_t r = 0; r < M; ++r) {
    const float* g = logits.data() + r * E;
    bool same = true;
    for (int j = 0; j < k; ++j) same = same && gid[r * k + j] == cid[r * k + j];
    if (!same) {
      // Explained only by a near-tie of selection keys of two experts with
      // different, finite inputs (never for raw-logit methods, whose keys
      // are exact, nor for an infinite or NaN logit, whose score is exact).
      bool explained = scored;
      if (scored) {
        for (int e = 0; e < E; ++e) key[e] = Score(m.scoring, g, E, e) + (m.bias ? bias[e] : 0.f);
        bool tie_found = false;
        for (int j = 0; j < k; ++j) {
          const int a = gid[r * k + j], b = cid[r * k + j];
          if (a == b) continue;
          if (a < 0 || a >= E) {
            explained = false;
            break;
          }
          const bool same_inputs = g[a] == g[b] && (!m.bias || bias[a] == bias[b]);
          const bool finite = std::isfinite(g[a]) && std::isfinite(g[b]);
          if (finite && Near(key[a], key[b]) && !same_inputs) tie_found = true;
        }
        if (m.grouped && !tie_found) {
          // A near-tie between group scores changes the selected groups.
          const int G = spec.num_expert_group, per = E / G;
          std::vector<float> gs(G);
          for (int gi = 0; gi < G; ++gi) {
            std::vector<float> c(key.begin() + gi * per, key.begin() + (gi + 1) * per);
            std::sort(c.begin(), c.end(), std::greater<float>());
            gs[gi] = m.bias ? c[0] + c[1] : c[0];
          }
          for (int a = 0; a < G; ++a) {
            for (int b = a + 1; b < G; ++b) {
              if (Near(gs[a], gs[b]) && gs[a] != gs[b]) tie_found = true;
            }
          }
        }
        explained = explained && tie_found;
      }
      if (explained) {
        ++out.near_tie_rows;
      } else {
        ++out.id_mismatch_rows;
      }
      continue;
    }
    for (int j = 0; j < k; ++j) {
      const float c = cw[r * k + j], gv = gw[r * k + j];
      const double err = std::fabs(static_cast<double>(gv) - c) /
                         std::max(std::fabs(static_cast<double>(c)), 1e-30);
      if (!std::isfinite(gv) || !std::isfinite(c)) {  // NaN for NaN, inf for the same inf
        if (!(gv == c || (std::isnan(gv) && std::isnan(c)))) ++out.weight_fail;
        continue;
      }
      out.max_rel_err = std::max(out.max_rel_err, err);
      if (err > 1e-5) ++out.weight_fail;
    }
  }
  return out;
}

class MoeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// Logits N(0, sigma), never exactly zero; bias N(0, 0.05) (DeepSeek-V3's
// correction bias is of that order relative to sigmoid scores).
std::vector<float> RandomNonZero(size_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) {
    do {
      x = d(Rng());
    } while (x == 0.0f);
  }
  return v;
}

// A routing case's logits: random, few distinct values (many exact ties,
// which must go to the lowest index), or random with special values in
// every other row (infinities, signed zeros, ties, a NaN in every eighth:
// under softmax such a row scores all-NaN, so the other rows and the sigmoid
// / raw methods are where the order is tested).
enum class Inputs { kRandom, kTies, kSpecials };

// Runs and prints one case; returns whether it passed.
bool RouteCase(const Method& m, int E, int k, int64_t M, Inputs inputs, cudaStream_t stream) {
  std::vector<float> logits, bias;
  if (inputs == Inputs::kTies) {
    static const float kVals[] = {-2.0f, -1.0f, 0.5f, 1.0f, 2.0f};
    std::uniform_int_distribution<int> pick(0, 4);
    logits.resize(M * E);
    for (float& x : logits) x = kVals[pick(Rng())];
    bias.resize(E);
    for (float& x : bias) x = pick(Rng()) < 3 ? 0.125f : 0.25f;
  } else {
    logits = RandomNonZero(M * E, 2.0f);
    bias = RandomNonZero(E, 0.05f);
  }
  if (inputs == Inputs::kSpecials) {
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {inf, -inf, 0.0f, -0.0f, 1.0f, -1.0f, 2.0f, 0.5f};
    std::uniform_int_distribution<int> percent(0, 99), special(0, 7), expert(0, E - 1);
    for (int64_t r = 0; r < M; r += 2) {
      float* row = &logits[r * E];
      for (int e = 0; e < E; ++e) {
        if (percent(Rng()) < 30) row[e] = specials[special(Rng())];
      }
      if (r % 8 == 0) row[expert(Rng())] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const RouteOutcome o = RunRouting(m, E, k, M, logits, bias, stream);
  const bool ok = o.launched_ok && o.id_mismatch_rows == 0 && o.weight_fail == 0;
  std::printf(
      "route %-26s %-4s E=%3d k=%2d M=%4lld  max_w_rel_err=%.2e  id_mismatch_rows=%lld  "
      "near_tie_rows=%lld  bad_w=%lld  %s%s%s\n",
      m.name,
      inputs == Inputs::kTies       ? "ties"
      : inputs == Inputs::kSpecials ? "spec"
                                    : "rand",
      E, k, static_cast<long long>(M), o.max_rel_err, static_cast<long long>(o.id_mismatch_rows),
      static_cast<long long>(o.near_tie_rows), static_cast<long long>(o.weight_fail),
      ok ? "OK" : "FAIL", o.error.empty() ? "" : "  ", o.error.c_str());
  return ok;
}

bool ValidCombo(const Method& m, int E, int k) {
  if (k > E || k > kc::kMoeRoutingMaxTopK) return false;
  if (m.grouped) {
    int G, tg;
    GroupsFor(E, &G, &tg);
    if (k > tg * (E / G)) return false;
    if (m.bias && E / G < 2) return false;
  }
  return true;
}

// LaunchMoeStageCopy (the call's upload and download by the SMs): every
// byte, host to device and back through pinned host memory, at sizes around
// the 16-byte words and past one round of the grid (132 CTAs x 1024
// words, with and without a tail), from aligned, unaligned and mixed
// addresses; nothing before or past the copy is written.
TEST_F(MoeGpuTest, StageCopyMovesEveryByte) {
  constexpr int64_t kGuard = 64;
  const int64_t round = int64_t{132} * 1024 * 16;  // one grid round of 16-byte words
  struct Pinned {
    void* p = nullptr;
    ~Pinned() { cudaFreeHost(p); }
  };
  struct Device {
    void* p = nullptr;
    ~Device() { cudaFree(p); }
  };
  for (int64_t bytes :
       {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{4099}, round + 48, round + 53}) {
    // Offsets of the source and destination past a 16-byte boundary.
    for (auto [src_skew, dst_skew] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {0, 8}}) {
      SCOPED_TRACE(::testing::Message()
                   << bytes << " bytes, skews " << src_skew << " / " << dst_skew);
      const size_t total = static_cast<size_t>(kGuard + bytes + 16 + kGuard);
      Pinned host, back;
      Device dev;
      ASSERT_EQ(cudaHostAlloc(&host.p, total, cudaHostAllocMapped), cudaSuccess);
      ASSERT_EQ(cudaHostAlloc(&back.p, total, cudaHostAllocMapped), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dev.p, total), cudaSuccess);
      char* h = static_cast<char*>(host.p) + kGuard + src_skew;
      char* b = static_cast<char*>(back.p) + kGuard + dst_skew;
      char* d = static_cast<char*>(dev.p) + kGuard + dst_skew;
      std::uniform_int_distribution<int> byte(0, 255);
      for (size_t i = 0; i < total; ++i)
        static_cast<char*>(host.p)[i] = static_cast<char>(byte(Rng()));
      std::memset(back.p, 0x5a, total);
      // On the copies' stream: the legacy stream's memset would not be ordered before them.
      ASSERT_EQ(cudaMemsetAsync(dev.p, 0xa5, total, stream_), cudaSuccess);
      ASSERT_TRUE(kc::LaunchMoeStageCopy(d, h, bytes, stream_).ok());
      ASSERT_TRUE(kc::LaunchMoeStageCopy(b, d, bytes, stream_).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      EXPECT_EQ(std::memcmp(b, h, static_cast<size_t>(bytes)), 0);
      // Nothing written before or after, on the device or the host.
      EXPECT_EQ(std::string(b - kGuard, kGuard), std::string(kGuard, '\x5a'));
      EXPECT_EQ(std::string(b + bytes, kGuard), std::string(kGuard, '\x5a'));
      std::string dev_guard(2 * kGuard, '\0');
      ASSERT_EQ(cudaMemcpy(dev_guard.data(), d - kGuard, kGuard, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dev_guard.data() + kGuard, d + bytes, kGuard, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(dev_guard, std::string(2 * kGuard, '\xa5'));
    }
  }
  EXPECT_FALSE(kc::LaunchMoeStageCopy(nullptr, nullptr, 16, stream_).ok());
  EXPECT_TRUE(kc::LaunchMoeStageCopy(nullptr, nullptr, 0, stream_).ok());
}

TEST_F(MoeGpuTest, RoutingMatchesCpuReference) {
  int cases = 0, failed = 0;
  for (const Method& m : Methods()) {
    for (int E : {8, 128, 256}) {
      for (int k : {1, 2, 8}) {
        if (!ValidCombo(m, E, k)) continue;
        for (int64_t M : {1, 7, 4096}) {
          ++cases;
          if (!RouteCase(m, E, k, M, Inputs::kRandom, stream_)) ++failed;
        }
      }
    }
  }
  std::printf("routing: %d cases, %d failed\n", cases, failed);
  EXPECT_EQ(failed, 0);
}

TEST_F(MoeGpuTest, RoutingEdgeShapes) {
  // E = 512 (the kernel's maximum) with k = 32, E not a multiple of 32, E = 1,
  // odd M.
  struct Shape {
    int E, k;
    int64_t M;
  };
  // E at and past each candidates-per-lane boundary (32, 128, 256: PerLaneFor).
  const Shape shapes[] = {{512, 32, 333}, {512, 8, 1000}, {72, 6, 513}, {60, 4, 129},
                          {33, 3, 65},    {1, 1, 17},     {2, 2, 5},    {256, 32, 100},
                          {32, 8, 77},    {160, 8, 129},  {384, 8, 99}, {129, 4, 33}};
  int cases = 0, failed = 0;
  for (const Method& m : Methods()) {
    for (const Shape& s : shapes) {
      if (!ValidCombo(m, s.E, s.k)) continue;
      ++cases;
      if (!RouteCase(m, s.E, s.k, s.M, Inputs::kRandom, stream_)) ++failed;
    }
  }
  std::printf("routing edge shapes: %d cases, %d failed\n", cases, failed);
  EXPECT_EQ(failed, 0);
}

TEST_F(MoeGpuTest, RoutingExactTiesGoToLowestIndex) {
  int cases = 0, failed = 0;
  for (const Method& m : Methods()) {
    for (int E : {8, 128, 256}) {
      for (int k : {1, 2, 8}) {
        if (!ValidCombo(m, E, k)) continue;
        ++cases;
        if (!RouteCase(m, E, k, 512, Inputs::kTies, stream_)) ++failed;
      }
    }
  }
  std::printf("routing ties: %d cases, %d failed\n", cases, failed);
  EXPECT_EQ(failed, 0);
}

// Rows with special values against the CPU reference (Inputs::kSpecials),
// E not a multiple of 32 and up to the kernel's maximum included.
TEST_F(MoeGpuTest, RoutingSpecialValues) {
  int cases = 0, failed = 0;
  for (const Method& m : Methods()) {
    for (int E : {8, 32, 33, 72, 128, 160, 256, 384, 512}) {
      for (int k : {1, 2, 8, 32}) {
        if (!ValidCombo(m, E, k)) continue;
        ++cases;
        if (!RouteCase(m, E, k, 257, Inputs::kSpecials, stream_)) ++failed;
      }
    }
  }
  std::printf("routing special values: %d cases, %d failed\n", cases, failed);
  EXPECT_EQ(failed, 0);
}

// The grouped GEMM's block (host code): a 16-slot block only where, on
// random top-k routings, at least 98% of the hit experts fit one (an
// expert past it takes a second block, which streams its weights again);
// and the sizes measured in docs/PERF.md, session 15 (Mixtral-8x7B: 16
// tokens ran faster on blocks of 16, 64 tokens 1.1-1.4x faster on 64).
TEST(MoeGpuValidationTest, GemmBlockOf16HoldsNearlyEveryHitExpert) {
  std::mt19937_64 rng(20261202);
  for (int E : {8, 64, 128, 256}) {
    for (int k : {1, 2, 8}) {
      if (k > E) continue;
      for (int64_t tokens : {1, 4, 16, 32, 64, 128, 256, 512}) {
        const int64_t numel = tokens * k;
        if (kc::MoeGemmBlockMFor(numel, E, 0, false) != 16) continue;
        // Per routing: the share of hit experts with more than 16 slots.
        int over = 0, hit = 0;
        for (int trial = 0; trial < 50; ++trial) {
          std::vector<int> count(E, 0);
          std::vector<int> ids(E);
          std::iota(ids.begin(), ids.end(), 0);
          for (int64_t t = 0; t < tokens; ++t) {
            std::shuffle(ids.begin(), ids.end(), rng);  // k distinct experts
            for (int j = 0; j < k; ++j) ++count[ids[j]];
          }
          for (int c : count) {
            hit += c > 0;
            over += c > 16;
          }
        }
        EXPECT_LE(over, hit / 50) << "E " << E << " k " << k << " tokens " << tokens;
      }
    }
  }
}

// The block sizes by slots per hit expert and reduction length: blocks of
// 128 (the warp-specialised kernel) from 64 slots per expert, from 16 where
// both GEMMs' K are long (ws_k) or they take the ping-pong form; blocks of
// 16 up to 8 either way. With the tall tiles 192 in place of 128 and 256,
// unless the ping-pong form is taken or the weights are quantised (ws_k 0).
TEST(MoeGpuValidationTest, GemmBlockBySlotsAndReduction) {
  for (int64_t ws_k :
       {int64_t{0}, int64_t{768}, kc::kMoeGemmWsLongK - 1, kc::kMoeGemmWsLongK, int64_t{4096}}) {
    const bool long_k = ws_k >= kc::kMoeGemmWsLongK;
    for (bool ping_pong : {false, true}) {
      const int64_t from = long_k || ping_pong ? 16 : 64;
      for (bool tall : {false, true}) {
        for (int E : {8, 128, 256}) {
          for (int64_t per :
               {1, 8, 9, 15, 16, 17, 23, 24, 48, 63, 64, 65, 127, 128, 511, 512, 4096}) {
            const int64_t numel = per * E;  // every expert hit (numel >= E)
            int want = per <= 8 ? 16 : per < from ? 64 : per < 512 ? 128 : 256;
            if (tall && want >= 128 && !ping_pong && ws_k > 0) want = 192;
            EXPECT_EQ(kc::MoeGemmBlockMFor(numel, E, ws_k, ping_pong, tall), want)
                << "E " << E << " slots/expert " << per << " ws_k " << ws_k << " pp " << ping_pong
                << " tall " << tall;
          }
        }
      }
    }
  }
  // Fewer slots than experts: the average over the slots' experts.
  EXPECT_EQ(kc::MoeSlotsPerExpert(100, 256), 1);
  EXPECT_EQ(kc::MoeSlotsPerExpert(1000, 256), 4);
  EXPECT_EQ(kc::MoeGemmBlockMFor(100, 256, 0, false), 16);
  // The shapes of docs/PERF.md: Mixtral-8x7B (K 4096 / 14336) 64 tokens
  // top-2, Qwen3-30B-A3B (2048 / 768) 256, 512 and 1024 tokens top-8.
  EXPECT_EQ(kc::MoeGemmBlockMFor(64 * 2, 8, 4096, false), 128);
  EXPECT_EQ(kc::MoeGemmBlockMFor(512 * 8, 128, 768, false), 64);
  EXPECT_EQ(kc::MoeGemmBlockMFor(192 * 8, 128, 768, true), 64);
  EXPECT_EQ(kc::MoeGemmBlockMFor(256 * 8, 128, 768, true), 128);
  EXPECT_EQ(kc::MoeGemmBlockMFor(512 * 8, 128, 768, true), 128);
  EXPECT_EQ(kc::MoeGemmBlockMFor(1024 * 8, 128, 768, false), 128);
}

// The ping-pong form's rule (host logic): bf16 below kMoeWsPingPongMaxSlots
// slots per expert, every slot count when forced, never when switched off
// or for fp16.
TEST(MoeGpuValidationTest, WsPingPongBySlots) {
  using kc::MoeGemmWsMode;
  using kernels::DType;
  const char* env = std::getenv("KPLAN_MOE_WS_PINGPONG");  // "0": off
  const bool allowed = env == nullptr || *env == '\0' || std::strcmp(env, "0") != 0;
  for (MoeGemmWsMode mode : {MoeGemmWsMode::kFromEnv, MoeGemmWsMode::kOn, MoeGemmWsMode::kOff}) {
    kc::SetMoeGemmWsPingPongMode(mode);
    for (int E : {8, 128, 256}) {
      for (int64_t per : {int64_t{1}, int64_t{16}, int64_t{48}, kc::kMoeWsPingPongMaxSlots - 1,
                          kc::kMoeWsPingPongMaxSlots, int64_t{60}, int64_t{64}, int64_t{512}}) {
        const bool rule = allowed && per < kc::kMoeWsPingPongMaxSlots;
        const bool want = mode == MoeGemmWsMode::kOn    ? true
                          : mode == MoeGemmWsMode::kOff ? false
                                                        : rule;
        EXPECT_EQ(kc::MoeGemmWsPingPongFor(DType::kBFloat16, per * E, E), want)
            << "mode " << static_cast<int>(mode) << " E " << E << " per " << per;
        EXPECT_FALSE(kc::MoeGemmWsPingPongFor(DType::kFloat16, per * E, E));
      }
    }
  }
  kc::SetMoeGemmWsPingPongMode(MoeGemmWsMode::kFromEnv);
  // The measured points the bound sits between (docs/PERF.md, session 39,
  // call 8): at 60 slots the form without ping-pong ran Mixtral-8x7B 27%
  // faster; at 32-48 ping-pong was even or faster (16-48 on an H200,
  // session 26).
  if (allowed) {
    EXPECT_FALSE(kc::MoeGemmWsPingPongFor(DType::kBFloat16, 60 * 8, 8));
    EXPECT_TRUE(kc::MoeGemmWsPingPongFor(DType::kBFloat16, 48 * 8, 8));
  }
}

// The tall tiles' rule (host logic): bf16 from kMoeWsTallTilesMinSlots to
// below kMoeWsTallTilesMaxSlots slots per expert where both GEMMs' K are at
// least kMoeWsTallTilesMinK (unless KPLAN_MOE_WS_TALL=0), every slot
// count when forced, never when switched off, for fp16 or without the
// warp-specialised kernel.
TEST(MoeGpuValidationTest, WsTallTilesBySlots) {
  using kc::MoeGemmWsMode;
  using kernels::DType;
  const char* env = std::getenv("KPLAN_MOE_WS_TALL");
  const bool allowed =
      env == nullptr || *env == '\0' ? kc::kMoeWsTallTilesDefault : std::strcmp(env, "0") != 0;
  for (MoeGemmWsMode ws : {MoeGemmWsMode::kOn, MoeGemmWsMode::kOff}) {
    kc::SetMoeGemmWsMode(ws);
    for (MoeGemmWsMode mode : {MoeGemmWsMode::kFromEnv, MoeGemmWsMode::kOn, MoeGemmWsMode::kOff}) {
      kc::SetMoeGemmWsTallTilesMode(mode);
      for (int E : {8, 128, 256}) {
        for (int64_t per :
             {int64_t{1}, int64_t{64}, kc::kMoeWsTallTilesMinSlots - 1, kc::kMoeWsTallTilesMinSlots,
              int64_t{128}, kc::kMoeWsTallTilesMaxSlots - 1, kc::kMoeWsTallTilesMaxSlots,
              int64_t{4096}}) {
          for (int64_t min_k : {int64_t{0}, int64_t{768}, kc::kMoeWsTallTilesMinK - 8,
                                kc::kMoeWsTallTilesMinK, int64_t{7168}}) {
            const bool rule = allowed && per >= kc::kMoeWsTallTilesMinSlots &&
                              per < kc::kMoeWsTallTilesMaxSlots && min_k >= kc::kMoeWsTallTilesMinK;
            const bool want = ws == MoeGemmWsMode::kOn && (mode == MoeGemmWsMode::kOn    ? true
                                                           : mode == MoeGemmWsMode::kOff ? false
                                                                                         : rule);
            EXPECT_EQ(kc::MoeGemmWsTallTilesFor(DType::kBFloat16, per * E, E, min_k), want)
                << "ws " << static_cast<int>(ws) << " mode " << static_cast<int>(mode) << " E " << E
                << " per " << per << " min_k " << min_k;
            EXPECT_FALSE(kc::MoeGemmWsTallTilesFor(DType::kFloat16, per * E, E, min_k));
          }
        }
      }
    }
  }
  kc::SetMoeGemmWsTallTilesMode(MoeGemmWsMode::kFromEnv);
  kc::SetMoeGemmWsMode(MoeGemmWsMode::kFromEnv);
  // The measured points the lower edge sits between (docs/PERF.md, session
  // 39, calls 6-7): tiles of 128 ran Mixtral-8x7B 2.5-9% faster at 96-112
  // slots an expert, the tall tiles 2.5-4.5% faster at 124-128.
  if (allowed && kc::MoeGemmWsEnabled()) {
    EXPECT_FALSE(kc::MoeGemmWsTallTilesFor(DType::kBFloat16, 112 * 8, 8, 4096));
    EXPECT_TRUE(kc::MoeGemmWsTallTilesFor(DType::kBFloat16, 128 * 8, 8, 4096));
  }
}

// Which int4 weights and GEMMs the int4 GEMMs take (host logic: the
// pointers are never read, so this runs without a device too).
TEST(MoeGpuValidationTest, IntWeightsTheInt4GemmsTake) {
  uint8_t bytes[64];
  float scale = 1.0f;
  const uint8_t* aligned =
      reinterpret_cast<const uint8_t*>((reinterpret_cast<uintptr_t>(bytes) + 15) & ~uintptr_t{15});
  kc::MoeQuantWeights w;
  w.kind = kernels::DType::kInt4Packed;
  w.scale_kind = kc::MoeWeightScale::kGroup;
  w.data = aligned;
  w.scale = &scale;
  w.group_size = 128;
  EXPECT_TRUE(kc::MoeIntWeightsApply(w, 4096));
  EXPECT_TRUE(kc::MoeIntWeightsApply(w, 128));
  EXPECT_FALSE(kc::MoeIntWeightsApply(w, 4000));  // K % 32 == 0 but not a multiple of the group
  EXPECT_FALSE(kc::MoeIntWeightsApply(w, 0));
  EXPECT_FALSE(kc::MoeIntWeightsApply(w, int64_t{1} << 31));  // k is 32-bit in the kernels
  kc::MoeQuantWeights v = w;
  v.group_size = 96;
  EXPECT_TRUE(kc::MoeIntWeightsApply(v, 288));
  v.group_size = 16;
  EXPECT_FALSE(kc::MoeIntWeightsApply(v, 4096));  // a 32-k half would span two groups
  v = w;
  v.data = aligned + 8;
  EXPECT_FALSE(kc::MoeIntWeightsApply(v, 4096));
  v = w;
  v.scale = nullptr;
  EXPECT_FALSE(kc::MoeIntWeightsApply(v, 4096));
  v = w;
  v.kind = kernels::DType::kInt8;
  EXPECT_FALSE(kc::MoeIntWeightsApply(v, 4096));
  v = w;
  v.scale_kind = kc::MoeWeightScale::kPerChannel;
  EXPECT_FALSE(kc::MoeIntWeightsApply(v, 4096));

  kc::MoeGroupedGemmArgs g;
  g.numel = 512;
  g.num_blocks = 64;
  g.num_local_experts = 8;
  g.N = 1024;
  g.K = 4096;
  EXPECT_FALSE(kc::MoeGemmIntApplies(g));  // no int_w
  g.int_w = &w;
  for (int bm : {16, 64, 128}) {
    g.block_m = bm;
    g.splits = 3;
    EXPECT_TRUE(kc::MoeGemmIntApplies(g)) << bm;  // the cp.async kernel, split K too
  }
  g.block_m = 256;  // the warp-specialised kernel only: no split K
  EXPECT_FALSE(kc::MoeGemmIntApplies(g));
  g.block_m = 64;
  g.fp8 = true;
  EXPECT_FALSE(kc::MoeGemmIntApplies(g));
  g.fp8 = false;
  g.K = 4000;
  EXPECT_FALSE(kc::MoeGemmIntApplies(g));
}

// The align's spread form: from 4096 ids, a scratch of (chunks of 1024 + 1)
// x E ints, none where a device index would leave int32 or E is out of the
// kernel's range; never shrinking as numel grows (the layer sizes the
// workspace for its largest call).
TEST(MoeGpuValidationTest, AlignScratchSizes) {
  EXPECT_EQ(kc::MoeAlignScratchInts(4095, 128), 0);
  EXPECT_EQ(kc::MoeAlignScratchInts(4096, 128), (4 + 1) * 128);
  EXPECT_EQ(kc::MoeAlignScratchInts(4097, 128), (5 + 1) * 128);
  EXPECT_EQ(kc::MoeAlignScratchInts(32768, 256), (32 + 1) * 256);
  EXPECT_EQ(kc::MoeAlignScratchInts(8192, 0), 0);
  EXPECT_EQ(kc::MoeAlignScratchInts(8192, kc::kMoeAlignMaxExperts + 1), 0);
  EXPECT_EQ(kc::MoeAlignScratchInts(int64_t{0x7fffffff} - 1023, 8), 0);
  for (int E : {1, 8, 128, 1024}) {
    int64_t prev = 0;
    for (int64_t numel = 0; numel < 70000; numel += 97) {
      const int64_t ints = kc::MoeAlignScratchInts(numel, E);
      EXPECT_GE(ints, prev) << "E " << E << " numel " << numel;
      prev = ints;
    }
  }
}

TEST(MoeGpuValidationTest, RejectsUnsupportedParams) {
  // Checked before anything is launched: runs without a device too.
  kc::MoeRoutingParams p;
  p.num_experts = 513;
  p.top_k = 2;
  EXPECT_EQ(kc::LaunchMoeRouting(p, nullptr, 4, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  p.num_experts = 256;
  p.top_k = 33;
  EXPECT_EQ(kc::ValidateMoeRoutingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.top_k = 8;
  p.method = kernels::RoutingMethod::kGroupedTopK;
  p.num_expert_group = 64;
  p.topk_group = 4;
  EXPECT_EQ(kc::ValidateMoeRoutingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.num_expert_group = 8;
  EXPECT_TRUE(kc::ValidateMoeRoutingParams(p).ok());
  p.topk_group = 0;
  EXPECT_EQ(kc::ValidateMoeRoutingParams(p).code(), absl::StatusCode::kInvalidArgument);
  int32_t dummy = 0;
  EXPECT_EQ(kc::LaunchMoeAlignBlockSize(&dummy, 1, 0, 8, nullptr, false, false, &dummy, &dummy,
                                        &dummy, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kc::LaunchMoeAlignBlockSize(&dummy, 1, 16, 1025, nullptr, false, false, &dummy, &dummy,
                                        &dummy, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Sizes agree with the CPU reference's buffers.
  for (int64_t numel : {0, 1, 7, 28, 100, 32768}) {
    for (int E : {4, 8, 128, 256}) {
      for (int bs : {1, 4, 16, 64, 128, 192}) {
        for (bool pad : {false, true}) {
          std::vector<int32_t> ids(numel, 0);
          auto r = moe::MoeAlignBlockSize(ids.data(), numel, bs, E, nullptr, pad);
          ASSERT_TRUE(r.ok());
          EXPECT_EQ(kc::MoeAlignMaxPadded(numel, E, bs, pad),
                    static_cast<int64_t>(r->sorted_token_ids.size()));
          EXPECT_EQ(kc::MoeAlignMaxBlocks(numel, E, bs, pad),
                    static_cast<int64_t>(r->expert_ids.size()));
        }
      }
    }
  }
}

// Grouped GEMM arguments on host buffers that pass the launchers' checks
// (one slot, one block, N = K = 256, one local expert): for the rules and
// refusals that run before anything reaches a device.
struct HostGemmArgs {
  int32_t ids = 0;
  alignas(16) uint16_t buf[8] = {};
  kc::MoeGroupedGemmArgs g;
  HostGemmArgs() {
    g.a = g.w = g.c = buf;
    g.sorted_token_ids = g.expert_ids = g.num_tokens_post_padded = &ids;
    g.numel = 1;
    g.num_blocks = 1;
    g.N = g.K = 256;
    g.num_local_experts = 1;
  }
  HostGemmArgs(const HostGemmArgs&) = delete;
  HostGemmArgs& operator=(const HostGemmArgs&) = delete;
};

// Blocks of 192 (the tall tiles) run only on the warp-specialised kernel,
// bf16 weights without split K: anything else is refused before a launch
// (runs without a device too).
TEST(MoeGpuValidationTest, BlocksOf192TakeBf16OnTheWsKernel) {
  HostGemmArgs host;
  kc::MoeGroupedGemmArgs& g = host.g;
  g.block_m = kc::kMoeGemmTallBlockM;
  g.partials = reinterpret_cast<float*>(host.buf);
  // Refused by the block's own check (its message), before anything else.
  auto refused = [&g] {
    const absl::Status st = kc::LaunchMoeGroupedGemm(g, nullptr);
    return st.code() == absl::StatusCode::kInvalidArgument &&
           absl::StrContains(st.message(), "block_m 192 takes bf16 weights");
  };
  g.dtype = kernels::DType::kFloat16;
  EXPECT_TRUE(refused());
  g.dtype = kernels::DType::kBFloat16;
  g.splits = 2;
  EXPECT_TRUE(refused());
  g.splits = 1;
  kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kOff);
  EXPECT_TRUE(refused());
  kc::SetMoeGemmWsMode(kc::MoeGemmWsMode::kFromEnv);
  g.block_m = 96;
  EXPECT_EQ(kc::LaunchMoeGroupedGemm(g, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // What the warp-specialised kernel takes.
  g.block_m = kc::kMoeGemmTallBlockM;
  EXPECT_TRUE(kc::MoeGemmWsApplies(g));
  g.dtype = kernels::DType::kFloat16;
  EXPECT_FALSE(kc::MoeGemmWsApplies(g));
}

// Which activations GEMM 1's fused epilogue takes (moe_gemm_ws.h): SiLU in
// every form; gelu, gelu_tanh and relu2 on the cooperative tiles of 128
// with 16-bit weights only; the others never.
TEST(MoeGpuValidationTest, FusedEpilogueActivationsByForm) {
  using kernels::MoeActivation;
  HostGemmArgs host;
  kc::MoeGroupedGemmArgs& g = host.g;
  g.a_row_div = 1;
  g.dtype = kernels::DType::kBFloat16;
  const MoeActivation stacked[] = {MoeActivation::kGelu, MoeActivation::kGeluTanh,
                                   MoeActivation::kRelu2};
  const MoeActivation never[] = {MoeActivation::kSwigluOai,  MoeActivation::kSwigluOaiUninterleave,
                                 MoeActivation::kSwigluStep, MoeActivation::kSiluNoMul,
                                 MoeActivation::kGeluNoMul,  MoeActivation::kGeluTanhNoMul,
                                 MoeActivation::kRelu2NoMul};
  auto applies = [&g](MoeActivation act) { return kc::MoeGemmWsActApplies(g, act, {}); };
  kc::SetMoeGemmWsPingPongMode(kc::MoeGemmWsMode::kOff);  // whatever the environment says
  for (int block_m : {128, 256}) {                        // the cooperative tiles
    g.block_m = block_m;
    for (kernels::DType dt : {kernels::DType::kBFloat16, kernels::DType::kFloat16}) {
      g.dtype = dt;
      EXPECT_TRUE(applies(MoeActivation::kSilu)) << block_m;
      for (MoeActivation a : stacked) EXPECT_TRUE(applies(a)) << static_cast<int>(a) << block_m;
      for (MoeActivation a : never) EXPECT_FALSE(applies(a)) << static_cast<int>(a) << block_m;
    }
  }
  g.dtype = kernels::DType::kBFloat16;
  g.block_m = 128;
  g.ping_pong = true;  // the ping-pong form (bf16): SiLU only
  kc::SetMoeGemmWsPingPongMode(kc::MoeGemmWsMode::kOn);
  EXPECT_TRUE(applies(MoeActivation::kSilu));
  for (MoeActivation a : stacked) EXPECT_FALSE(applies(a)) << static_cast<int>(a);
  g.dtype = kernels::DType::kFloat16;  // fp16 has no ping-pong form: cooperative
  for (MoeActivation a : stacked) EXPECT_TRUE(applies(a)) << static_cast<int>(a);
  g.dtype = kernels::DType::kBFloat16;
  kc::SetMoeGemmWsPingPongMode(kc::MoeGemmWsMode::kOff);  // its switch off: cooperative again
  for (MoeActivation a : stacked) EXPECT_TRUE(applies(a)) << static_cast<int>(a);
  kc::SetMoeGemmWsPingPongMode(kc::MoeGemmWsMode::kFromEnv);
  g.ping_pong = false;
  g.block_m = kc::kMoeGemmTallBlockM;  // the tall tiles: SiLU only
  EXPECT_TRUE(applies(MoeActivation::kSilu));
  for (MoeActivation a : stacked) EXPECT_FALSE(applies(a)) << static_cast<int>(a);
}

// ---------------------------------------------------------------------------
// moe_align_block_size.

enum class MapMode { kNone, kHalf, kHalfIgnore };

const char* MapName(MapMode m) {
  return m == MapMode::kNone ? "none" : m == MapMode::kHalf ? "half" : "half_ignore";
}

struct AlignOutcome {
  bool ok = false;
  int64_t sorted_bad = 0, expert_bad = 0, guard_bad = 0;
  bool form_ok = true;  // the form asked for ran (the scratch written or not)
  int32_t post_gpu = -1, post_cpu = -1;
  std::string error;
};

constexpr size_t kGuard = 64;

// spread: the spread switch on (the kernels spread over blocks from
// MoeAlignScratchInts' threshold up), else off (one block at every size);
// the scratch it asks for either way, its guard untouched.
AlignOutcome RunAlign(const std::vector<int32_t>& ids, int E, int bs, MapMode map, bool pad,
                      bool spread, cudaStream_t stream) {
  AlignOutcome o;
  const int64_t numel = static_cast<int64_t>(ids.size());
  std::vector<int32_t> emap;
  if (map != MapMode::kNone) {
    // Half the experts local (a random half), numbered in order.
    std::vector<int> perm(E);
    for (int e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), Rng());
    std::vector<bool> local(E, false);
    for (int i = 0; i < (E + 1) / 2; ++i) local[perm[i]] = true;
    emap.assign(E, -1);
    int next = 0;
    for (int e = 0; e < E; ++e) {
      if (local[e]) emap[e] = next++;
    }
  }
  const bool ignore = map == MapMode::kHalfIgnore;
  auto cpu = moe::MoeAlignBlockSize(ids.data(), numel, bs, E, emap.empty() ? nullptr : emap.data(),
                                    pad, ignore);
  if (!cpu.ok()) {
    o.error = "cpu: " + std::string(cpu.status().message());
    return o;
  }
  const int64_t max_padded = kc::MoeAlignMaxPadded(numel, E, bs, pad);
  const int64_t max_blocks = kc::MoeAlignMaxBlocks(numel, E, bs, pad);
  if (max_padded != static_cast<int64_t>(cpu->sorted_token_ids.size()) ||
      max_blocks != static_cast<int64_t>(cpu->expert_ids.size())) {
    o.error = "buffer sizes differ from the CPU reference";
    return o;
  }
  const int64_t scratch_ints = kc::MoeAlignScratchInts(numel, E);
  DevBuf<int32_t> d_ids(numel), d_map(E), d_sorted(max_padded, kGuard),
      d_experts(max_blocks, kGuard), d_post(1, kGuard), d_scratch(scratch_ints, kGuard);
  auto fail = [&](const char* what, cudaError_t e) {
    o.error = std::string(what) + ": " + cudaGetErrorString(e);
    return o;
  };
  for (cudaError_t e : {d_ids.status(), d_map.status(), d_sorted.status(), d_experts.status(),
                        d_post.status(), d_scratch.status()}) {
    if (e != cudaSuccess) return fail("cudaMalloc", e);
  }
  if (numel > 0) {
    if (cudaError_t e = d_ids.Upload(ids); e != cudaSuccess) return fail("upload", e);
  }
  if (!emap.empty()) {
    if (cudaError_t e = d_map.Upload(emap); e != cudaSuccess) return fail("upload", e);
  }
  for (DevBuf<int32_t>* b : {&d_sorted, &d_experts, &d_post, &d_scratch}) {
    if (cudaError_t e = b->Poison(kPoisonByte); e != cudaSuccess) return fail("poison", e);
  }
  // The stream is non-blocking: wait for the legacy-stream uploads and memsets.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return fail("sync", e);
  kc::SetMoeAlignSpreadMode(spread ? kc::MoeKernelMode::kOn : kc::MoeKernelMode::kOff);
  absl::Status s = kc::LaunchMoeAlignBlockSize(
      d_ids.get(), numel, bs, E, emap.empty() ? nullptr : d_map.get(), pad, ignore,
      max_padded > 0 ? d_sorted.get() : d_sorted.raw(),
      max_blocks > 0 ? d_experts.get() : d_experts.raw(), d_post.get(), d_scratch.get(), stream);
  kc::SetMoeAlignSpreadMode(kc::MoeKernelMode::kFromEnv);
  if (!s.ok()) {
    o.error = std::string(s.message());
    return o;
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return fail("sync", e);
  std::vector<int32_t> sorted, experts, post, scratch;
  if (cudaError_t e = d_sorted.Download(&sorted); e != cudaSuccess) return fail("download", e);
  if (cudaError_t e = d_experts.Download(&experts); e != cudaSuccess) return fail("download", e);
  if (cudaError_t e = d_post.Download(&post); e != cudaSuccess) return fail("download", e);
  if (cudaError_t e = d_scratch.Download(&scratch); e != cudaSuccess) return fail("download", e);
  const int32_t poison = PoisonInt();
  for (int64_t i = 0; i < max_padded; ++i) o.sorted_bad += sorted[i] != cpu->sorted_token_ids[i];
  for (int64_t i = 0; i < max_blocks; ++i) o.expert_bad += experts[i] != cpu->expert_ids[i];
  for (size_t i = max_padded; i < sorted.size(); ++i) o.guard_bad += sorted[i] != poison;
  for (size_t i = max_blocks; i < experts.size(); ++i) o.guard_bad += experts[i] != poison;
  for (size_t i = 1; i < post.size(); ++i) o.guard_bad += post[i] != poison;
  for (size_t i = scratch_ints; i < scratch.size(); ++i) o.guard_bad += scratch[i] != poison;
  // The spread form writes every expert's start (the scratch's last E
  // ints); the one-block form never touches the scratch.
  for (int64_t i = 0; i < scratch_ints; ++i) {
    const bool start = i >= scratch_ints - E;
    if (spread ? start && scratch[i] == poison : scratch[i] != poison) o.form_ok = false;
  }
  o.post_gpu = post[0];
  o.post_cpu = cpu->num_tokens_post_padded;
  o.ok = o.sorted_bad == 0 && o.expert_bad == 0 && o.guard_bad == 0 && o.post_gpu == o.post_cpu &&
         o.form_ok;
  return o;
}

enum class Dist { kRandom, kOneExpert, kSparse, kSkewed, kInvalid };

const char* DistName(Dist d) {
  switch (d) {
    case Dist::kRandom:
      return "random";
    case Dist::kOneExpert:
      return "one_expert";
    case Dist::kSparse:
      return "empty_experts";
    case Dist::kSkewed:
      return "skewed";
    case Dist::kInvalid:
      return "out_of_range";
  }
  return "?";
}

// Token-major ids [M, k]; rows hold distinct experts where E allows (as
// top-k does), except for the one-expert and skewed distributions.
std::vector<int32_t> MakeIds(Dist d, int E, int64_t M, int k) {
  std::vector<int32_t> ids(M * k);
  std::uniform_int_distribution<int> any(0, E - 1);
  const int one = any(Rng());
  const int stride = std::max(1, E >= 8 ? 4 : 2);  // kSparse: every stride-th expert only
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t r = 0; r < M; ++r) {
    for (int j = 0; j < k; ++j) {
      int32_t e = 0;
      switch (d) {
        case Dist::kRandom:
          e = any(Rng());
          break;
        case Dist::kOneExpert:
          e = one;
          break;
        case Dist::kSparse:
          e = (any(Rng()) / stride) * stride;
          break;
        case Dist::kSkewed:
          e = u(Rng()) < 0.6f ? one : any(Rng());
          break;
        case Dist::kInvalid: {
          const float x = u(Rng());
          e = x < 0.05f ? -1 : x < 0.1f ? E : x < 0.12f ? E + 100 : any(Rng());
          break;
        }
      }
      ids[r * k + j] = e;
    }
  }
  return ids;
}

// Both forms of the kernel on the same ids: one block, and spread over
// blocks where the size takes it.
bool AlignCase(Dist d, int E, int64_t M, int k, int bs, MapMode map, bool pad,
               cudaStream_t stream) {
  const std::vector<int32_t> ids = MakeIds(d, E, M, k);
  const bool spreads = kc::MoeAlignScratchInts(static_cast<int64_t>(ids.size()), E) > 0;
  bool ok = true;
  for (bool spread : {false, true}) {
    if (spread && !spreads) break;
    const AlignOutcome o = RunAlign(ids, E, bs, map, pad, spread, stream);
    std::printf(
        "align %-13s map=%-11s E=%4d M=%5lld k=%d numel=%7lld bs=%3d pad=%d %-6s post=%d/%d  "
        "sorted_mismatch=%lld expert_ids_mismatch=%lld guard_bad=%lld%s  %s%s%s\n",
        DistName(d), MapName(map), E, static_cast<long long>(M), k,
        static_cast<long long>(ids.size()), bs, pad ? 1 : 0, spread ? "spread" : "block",
        o.post_gpu, o.post_cpu, static_cast<long long>(o.sorted_bad),
        static_cast<long long>(o.expert_bad), static_cast<long long>(o.guard_bad),
        o.form_ok ? "" : " (the other form ran)", o.ok ? "OK" : "FAIL", o.error.empty() ? "" : "  ",
        o.error.c_str());
    ok &= o.ok;
  }
  return ok;
}

TEST_F(MoeGpuTest, AlignMatchesCpuReferenceBitExact) {
  struct Mk {
    int64_t M;
    int k;
  };
  const Mk mks[] = {{1, 2}, {7, 4}, {1000, 6}, {4096, 8}};  // 1000 x 6: warp ranges of 375 ids
  int cases = 0, failed = 0;
  for (int E : {8, 128, 256}) {
    for (const Mk& mk : mks) {
      for (int bs : {16, 64, 128}) {
        for (MapMode map : {MapMode::kNone, MapMode::kHalf, MapMode::kHalfIgnore}) {
          for (bool pad : {false, true}) {
            ++cases;
            failed += !AlignCase(Dist::kRandom, E, mk.M, mk.k, bs, map, pad, stream_);
          }
          ++cases;
          failed += !AlignCase(Dist::kSparse, E, mk.M, mk.k, bs, map, false, stream_);
        }
        for (Dist d : {Dist::kOneExpert, Dist::kSkewed, Dist::kInvalid}) {
          ++cases;
          failed += !AlignCase(d, E, mk.M, mk.k, bs, MapMode::kNone, false, stream_);
        }
        ++cases;
        failed +=
            !AlignCase(Dist::kInvalid, E, mk.M, mk.k, bs, MapMode::kHalfIgnore, true, stream_);
      }
    }
  }
  std::printf("align: %d cases, %d failed\n", cases, failed);
  EXPECT_EQ(failed, 0);
}

TEST_F(MoeGpuTest, AlignLargeAndEdgeCases) {
  int cases = 0, failed = 0;
  auto run = [&](Dist d, int E, int64_t M, int k, int bs, MapMode map, bool pad) {
    ++cases;
    failed += !AlignCase(d, E, M, k, bs, map, pad, stream_);
  };
  for (int bs : {16, 64, 128}) {
    run(Dist::kRandom, 256, 65536, 8, bs, MapMode::kNone, false);  // 524288 ids
    run(Dist::kSkewed, 256, 65536, 8, bs, MapMode::kHalf, false);
    run(Dist::kOneExpert, 256, 65536, 8, bs, MapMode::kNone, true);
    run(Dist::kRandom, 1024, 4096, 8, bs, MapMode::kNone, false);  // 68 KiB shared memory
    run(Dist::kRandom, 1024, 4096, 8, bs, MapMode::kHalfIgnore, true);
    run(Dist::kRandom, 512, 3, 8, bs, MapMode::kHalf, false);  // numel < E
    run(Dist::kRandom, 8, 0, 2, bs, MapMode::kNone, false);    // numel = 0
    run(Dist::kRandom, 1, 100, 1, bs, MapMode::kNone, false);  // E = 1
    run(Dist::kRandom, 60, 33, 3, bs, MapMode::kHalf, true);   // E not a power of 2
    // The spread form's edges: its first size, a last block of one id,
    // one expert, a chunk's warps partly empty.
    run(Dist::kRandom, 128, 512, 8, bs, MapMode::kNone, false);  // 4096 ids
    run(Dist::kRandom, 8, 4097, 1, bs, MapMode::kHalf, true);
    run(Dist::kRandom, 1, 5000, 1, bs, MapMode::kNone, false);
    run(Dist::kInvalid, 60, 1043, 5, bs, MapMode::kHalfIgnore, false);  // 5215 ids
  }
  run(Dist::kRandom, 4, 5, 3, 1, MapMode::kNone, false);  // block_size 1
  std::printf("align large/edge: %d cases, %d failed\n", cases, failed);
  EXPECT_EQ(failed, 0);
}

TEST_F(MoeGpuTest, AlignWorkedExampleFromPlan) {
  // vllm-kernel-plan.md §6.5, verbatim.
  const std::vector<int32_t> ids = {1, 2, 3, 0, 1, 3, 0, 2, 3, 0, 1, 2};
  const int bs = 4, E = 4;
  const std::vector<int32_t> want_sorted = {3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12};
  const std::vector<int32_t> want_experts = {0, 1, 2, 3};
  const int64_t max_padded = kc::MoeAlignMaxPadded(12, E, bs, false);
  const int64_t max_blocks = kc::MoeAlignMaxBlocks(12, E, bs, false);
  ASSERT_EQ(max_padded, 24);
  ASSERT_EQ(max_blocks, 6);
  DevBuf<int32_t> d_ids(12), d_sorted(max_padded), d_experts(max_blocks), d_post(1);
  CUDA_OK(d_ids.Upload(ids));
  CUDA_OK(d_sorted.Poison(kPoisonByte));
  CUDA_OK(d_experts.Poison(kPoisonByte));
  CUDA_OK(d_post.Poison(kPoisonByte));
  CUDA_OK(cudaDeviceSynchronize());  // the stream is non-blocking
  ASSERT_TRUE(kc::LaunchMoeAlignBlockSize(d_ids.get(), 12, bs, E, nullptr, false, false,
                                          d_sorted.get(), d_experts.get(), d_post.get(), nullptr,
                                          stream_)
                  .ok());
  CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<int32_t> sorted, experts, post;
  CUDA_OK(d_sorted.Download(&sorted));
  CUDA_OK(d_experts.Download(&experts));
  CUDA_OK(d_post.Download(&post));
  EXPECT_EQ(post[0], 16);
  EXPECT_EQ(std::vector<int32_t>(sorted.begin(), sorted.begin() + 16), want_sorted);
  for (int64_t i = 16; i < max_padded; ++i) EXPECT_EQ(sorted[i], 12) << i;  // sentinel numel
  EXPECT_EQ(std::vector<int32_t>(experts.begin(), experts.begin() + 4), want_experts);
  EXPECT_EQ(experts[4], -1);
  EXPECT_EQ(experts[5], -1);
  auto cpu = moe::MoeAlignBlockSize(ids.data(), 12, bs, E);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(sorted, cpu->sorted_token_ids);
  EXPECT_EQ(experts, cpu->expert_ids);
  std::printf("align worked example (§6.5): post=%d sorted[0:16]=", post[0]);
  for (int i = 0; i < 16; ++i) std::printf("%d%s", sorted[i], i < 15 ? "," : "");
  std::printf(" expert_ids=%d,%d,%d,%d,%d,%d  %s\n", experts[0], experts[1], experts[2], experts[3],
              experts[4], experts[5],
              (post[0] == 16 && sorted == cpu->sorted_token_ids && experts == cpu->expert_ids)
                  ? "OK"
                  : "FAIL");
}

// ---------------------------------------------------------------------------
// Activation and combine: vector forms against scalar forms.

// n random 16-bit values of `dtype` in [-lim, lim] (past the clamps of 7).
std::vector<uint16_t> Random16(kernels::DType dtype, size_t n, float lim) {
  std::uniform_real_distribution<float> u(-lim, lim);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    const float f = u(Rng());
    x = dtype == kernels::DType::kBFloat16 ? FloatToBf16(f) : FloatToHalf(f);
  }
  return v;
}

// Runs `launch(in, out)` on 16-byte aligned buffers (the vector form) and on
// buffers one element past alignment (the scalar form) and expects the
// `out_n` outputs byte-identical.
template <typename Launch>
void ExpectVectorFormIsScalar(const std::string& label, const std::vector<uint16_t>& in,
                              size_t out_n, cudaStream_t stream, Launch launch) {
  DevBuf<uint16_t> in_a(in.size()), in_u(in.size() + 1), out_a(out_n), out_u(out_n + 1);
  CUDA_OK(in_a.Upload(in));
  CUDA_OK(cudaMemcpy(in_u.raw() + 1, in.data(), in.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(out_a.Poison(kPoisonByte));
  CUDA_OK(out_u.Poison(kPoisonByte));
  // The memsets run on the legacy stream, which a non-blocking stream does
  // not wait for: without this the poison could land after the launches.
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(launch(in_a.get(), out_a.get()).ok()) << label;
  ASSERT_TRUE(launch(in_u.raw() + 1, out_u.raw() + 1).ok()) << label;
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> a, u;
  CUDA_OK(out_a.Download(&a));
  CUDA_OK(out_u.Download(&u));
  int64_t diff = 0, first = -1;
  for (size_t i = 0; i < out_n; ++i) {
    if (a[i] != u[i + 1] && diff++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(diff, 0) << label << ": first difference at " << first << " vector 0x" << std::hex
                     << a[first] << " scalar 0x" << u[first + 1];
}

TEST_F(MoeGpuTest, ActivationAndCombineVectorFormsAreTheScalarForms) {
  using kernels::DType;
  using kernels::MoeActivation;
  int cases = 0;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int a = 0; a <= static_cast<int>(MoeActivation::kRelu2NoMul); ++a) {
      const auto act = static_cast<MoeActivation>(a);
      const bool gated = act < MoeActivation::kSiluNoMul;
      kc::MoeActParams ap;
      ap.has_clamp_limit = act == MoeActivation::kSwigluOaiUninterleave || a % 2 == 0;
      for (int64_t rows : {1, 37}) {
        for (int64_t d : {8, 200, 1544}) {
          const int64_t in_w = gated ? 2 * d : d;
          const auto in = Random16(dt, rows * in_w, 10.0f);
          ExpectVectorFormIsScalar(
              absl::StrCat("activation ", a, " ", kernels::DTypeName(dt), " rows ", rows, " d ", d),
              in, rows * d, stream_, [&](const void* x, void* y) {
                return kc::LaunchMoeActivation(act, ap, dt, x, rows, in_w, y, d, stream_);
              });
          ++cases;
        }
      }
    }
    for (int k : {1, 2, 8}) {
      for (int64_t M : {1, 45}) {
        for (int64_t H : {8, 2048}) {
          for (bool weighted : {true, false}) {
            const auto y = Random16(dt, M * k * H, 4.0f);
            std::vector<float> w(M * k);
            std::uniform_real_distribution<float> u(0.0f, 1.0f);
            for (float& x : w) x = u(Rng());
            DevBuf<float> d_w(w.size());
            CUDA_OK(d_w.Upload(w));
            ExpectVectorFormIsScalar(absl::StrCat("combine ", kernels::DTypeName(dt), " k ", k,
                                                  " M ", M, " H ", H, weighted ? " weighted" : ""),
                                     y, M * H, stream_, [&](const void* x, void* out) {
                                       return kc::LaunchMoeCombine(dt, x,
                                                                   weighted ? d_w.get() : nullptr,
                                                                   M, k, H, out, stream_);
                                     });
            ++cases;
          }
        }
      }
    }
  }
  std::printf("activation / combine vector forms against scalar: %d cases\n", cases);
}

}  // namespace
}  // namespace kplan
