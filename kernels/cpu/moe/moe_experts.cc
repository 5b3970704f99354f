// Expert MLPs, combine and the MoeReference entry point (vllm-kernel-plan.md
// §6.2, §6.6). Work is split into units of up to kRowsPerUnit rows of one
// expert; each row's result depends only on its own inputs and a fixed
// summation order, so any split over threads gives identical bits.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "base/status.h"

namespace kplan::moe {
namespace {

constexpr int64_t kRowsPerUnit = 32;  // rows of one expert per work unit
constexpr int64_t kPanelRows = 8;     // weight rows decoded to fp32 at a time
constexpr float kFp8MinScale = 1.0f / (kFp8E4m3Max * 512.0f);  // per-token dynamic quant
constexpr float kGroupQuantEps = 1e-10f;                       // per_token_group_quant_fp8

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void ParallelFor(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  const int extra = static_cast<int>(std::min<int64_t>(threads, n)) - 1;
  pool.reserve(extra);
  for (int t = 0; t < extra; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

// Σ x[i]·w[i] with eight interleaved partial sums, combined pairwise in a
// fixed order: deterministic and vectorisable.
float Dot(const float* x, const float* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += x[i + u] * w[i + u];
  }
  for (int u = 0; i < n; ++i, ++u) acc[u] += x[i] * w[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// One GEMM's operands. Weight rows are [N, K] for one local expert.
struct GemmWeight {
  const MoeWeights* w;
  bool is_w13;
  int64_t N, K;
  kernels::DType act_dtype;

  bool fp8() const { return w->quant.scheme == MoeQuantScheme::kFp8W8A8; }
  bool block() const { return fp8() && w->quant.weight_scale == Fp8WeightScale::kBlock; }
  int64_t KTiles() const { return block() ? CeilDiv(K, w->quant.block_k) : 1; }
  const void* Data() const { return is_w13 ? w->w13 : w->w2; }
  const float* Scale() const { return is_w13 ? w->quant.w13_scale : w->quant.w2_scale; }
  const uint8_t* Zero() const { return is_w13 ? w->quant.w13_zero : w->quant.w2_zero; }

  // Direct fp32 pointer when no decoding is needed.
  const float* Direct(int64_t e) const {
    if (w->quant.scheme == MoeQuantScheme::kNone && w->dtype == kernels::DType::kFloat32) {
      return static_cast<const float*>(Data()) + e * N * K;
    }
    return nullptr;
  }

  // Rows [n0, n0 + nb) of expert e as fp32: float weights as stored; fp8
  // dequantised with the per-tensor / per-channel scale, or raw for block
  // scales (applied per k-tile by the GEMM); int8 / int4 dequantised with
  // group scale and zero point and rounded to the activation dtype.
  void Decode(int64_t e, int64_t n0, int64_t nb, float* dst) const {
    const MoeQuant& q = w->quant;
    const int64_t base = (e * N + n0) * K;
    switch (q.scheme) {
      case MoeQuantScheme::kNone:
        LoadFloats(Data(), w->dtype, base, nb * K, dst);
        return;
      case MoeQuantScheme::kFp8W8A8: {
        const uint8_t* src = static_cast<const uint8_t*>(Data()) + base;
        for (int64_t r = 0; r < nb; ++r) {
          float s = 1.0f;
          if (q.weight_scale == Fp8WeightScale::kPerTensor) s = Scale()[e];
          if (q.weight_scale == Fp8WeightScale::kPerChannel) s = Scale()[e * N + n0 + r];
          for (int64_t h = 0; h < K; ++h) {
            const float v = Fp8E4m3ToFloat(src[r * K + h]);
            dst[r * K + h] = q.weight_scale == Fp8WeightScale::kBlock ? v : v * s;
          }
        }
        return;
      }
      case MoeQuantScheme::kInt8WeightOnly:
      case MoeQuantScheme::kInt4WeightOnly: {
        const bool int4 = q.scheme == MoeQuantScheme::kInt4WeightOnly;
        const int64_t gs = q.group_size, groups = K / gs;
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t row = e * N + n0 + r;
          const float* scale = Scale() + row * groups;
          const uint8_t* zero = Zero() != nullptr ? Zero() + row * groups : nullptr;
          float* out = dst + r * K;
          for (int64_t g = 0; g < groups; ++g) {
            const float s = scale[g];
            const int64_t h0 = g * gs;
            if (int4) {
              const uint8_t* packed = static_cast<const uint8_t*>(Data()) + row * (K / 2);
              const float z = zero ? zero[g] : 8.0f;
              for (int64_t h = h0; h < h0 + gs; ++h) {
                out[h] = (static_cast<float>(Int4At(packed, h)) - z) * s;
              }
            } else if (zero) {
              const uint8_t* src = static_cast<const uint8_t*>(Data()) + row * K;
              const float z = static_cast<float>(zero[g]);
              for (int64_t h = h0; h < h0 + gs; ++h) out[h] = (static_cast<float>(src[h]) - z) * s;
            } else {
              const int8_t* src = static_cast<const int8_t*>(Data()) + row * K;
              for (int64_t h = h0; h < h0 + gs; ++h) out[h] = static_cast<float>(src[h]) * s;
            }
          }
          RoundToDTypeInPlace(out, K, act_dtype);
        }
        return;
      }
    }
  }

  // Block scale of weight row n for k-tile t.
  float BlockScale(int64_t e, int64_t n, int64_t t) const {
    const int64_t nbk = CeilDiv(N, w->quant.block_n);
    return Scale()[(e * nbk + n / w->quant.block_n) * KTiles() + t];
  }
};

// C[r, n] = Σ_t (Σ_{h in tile t} X[r, h]·W[n, h]) · xs[r, t] · ws(n, t) for
// block scales, else Σ_h X[r, h]·W[n, h]. X: [R, K]; C: [R, N].
void Gemm(const GemmWeight& gw, int64_t e, const float* X, const float* xs, int64_t R, float* C) {
  const int64_t N = gw.N, K = gw.K;
  const bool block = gw.block();
  const int64_t kt = gw.KTiles();
  const int64_t bk = block ? gw.w->quant.block_k : K;
  const float* direct = gw.Direct(e);
  std::vector<float> panel(direct ? 0 : kPanelRows * K);
  for (int64_t n0 = 0; n0 < N; n0 += kPanelRows) {
    const int64_t nb = std::min(kPanelRows, N - n0);
    const float* W;
    if (direct) {
      W = direct + n0 * K;
    } else {
      gw.Decode(e, n0, nb, panel.data());
      W = panel.data();
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* x = X + r * K;
      for (int64_t n = 0; n < nb; ++n) {
        const float* wr = W + n * K;
        float acc;
        if (!block) {
          acc = Dot(x, wr, K);
        } else {
          acc = 0.0f;
          for (int64_t t = 0; t < kt; ++t) {
            const int64_t h0 = t * bk, len = std::min(bk, K - h0);
            acc += Dot(x + h0, wr + h0, len) * (xs[r * kt + t] * gw.BlockScale(e, n0 + n, t));
          }
        }
        C[r * N + n0 + n] = acc;
      }
    }
  }
}

float AbsMax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

float QuantDequantFp8(float x, float scale) {
  return Fp8E4m3ToFloat(FloatToFp8E4m3(x / scale, /*saturate=*/true));
}

// Activation quantisation for fp8 (moe_kernel_quantize_input). Rows of `x`
// ([rows, K]) are replaced by their quantised values: dequantised (x_q·s)
// for per-tensor / per-token, raw x_q with scales [rows, ceil(K/bk)] in `xs`
// for block scales. `tensor_scale` is the per-tensor scale when used.
void QuantizeRows(const MoeQuant& q, float tensor_scale, float* x, int64_t rows, int64_t K,
                  float* xs) {
  if (q.weight_scale == Fp8WeightScale::kBlock) {
    const int64_t bk = q.block_k, kt = CeilDiv(K, bk);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < kt; ++t) {
        float* g = x + r * K + t * bk;
        const int64_t len = std::min(bk, K - t * bk);
        const float s = std::max(AbsMax(g, len), kGroupQuantEps) / kFp8E4m3Max;
        for (int64_t i = 0; i < len; ++i) g[i] = Fp8E4m3ToFloat(FloatToFp8E4m3(g[i] / s));
        xs[r * kt + t] = s;
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * K;
    float s = tensor_scale;
    if (q.act_scale == Fp8ActScale::kPerToken) {
      s = std::max(AbsMax(row, K) / kFp8E4m3Max, kFp8MinScale);
    }
    for (int64_t i = 0; i < K; ++i) row[i] = QuantDequantFp8(row[i], s) * s;
  }
}

// Per-tensor scale: static, or dynamic max|x|/448 over `rows` of x (1 for
// an all-zero tensor, where any scale quantises exactly).
float TensorScale(const absl::optional<float>& fixed, const float* x, int64_t K,
                  const std::vector<int64_t>& rows) {
  if (fixed.has_value()) return *fixed;
  float m = 0.0f;
  for (int64_t r : rows) m = std::max(m, AbsMax(x + r * K, K));
  return m > 0.0f ? m / kFp8E4m3Max : 1.0f;
}

int AutoThreads(const MoeProblem& p, int64_t units) {
  if (p.num_threads > 0) return p.num_threads;
  const double flops = 2.0 * p.num_tokens * p.top_k * p.hidden * p.intermediate * 3.0;
  if (flops < 2e7) return 1;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<int64_t>(hw, units));
}

int64_t N13(const MoeProblem& p) {
  return IsGated(p.activation) ? 2 * p.intermediate : p.intermediate;
}

}  // namespace

absl::Status ValidateMoeProblem(const MoeProblem& p, bool needs_routing) {
  if (p.num_tokens < 0) return InvalidField("num_tokens", "num_tokens must not be negative");
  if (p.hidden <= 0) return InvalidField("hidden", "hidden must be positive");
  if (p.intermediate <= 0) return InvalidField("intermediate", "intermediate must be positive");
  if (p.num_experts <= 0) return InvalidField("num_experts", "num_experts must be positive");
  if (p.top_k <= 0 || p.top_k > p.num_experts) {
    return InvalidField("top_k", absl::StrCat("top_k must be in [1, num_experts=", p.num_experts,
                                              "], got ", p.top_k));
  }
  if (!IsFloatDType(p.act_dtype)) {
    return InvalidField("act_dtype", absl::StrCat("activations must be float32, float16 or "
                                                  "bfloat16, got ",
                                                  kernels::DTypeName(p.act_dtype)));
  }
  if (p.num_tokens > 0 && p.hidden_states == nullptr) {
    return InvalidField("hidden_states", "hidden_states must not be null");
  }
  if (p.apply_router_weight_on_input && p.top_k != 1) {
    return InvalidField("apply_router_weight_on_input",
                        "apply_router_weight_on_input is only implemented for topk=1");
  }
  if (needs_routing) {
    if (p.router_logits == nullptr && p.num_tokens > 0) {
      return InvalidField("router_logits", "router_logits or topk_ids/topk_weights are required");
    }
  } else if (p.num_tokens > 0 && (p.topk_ids == nullptr || p.topk_weights == nullptr)) {
    return InvalidField(p.topk_ids == nullptr ? "topk_ids" : "topk_weights",
                        "topk_ids and topk_weights must both be given");
  }
  const MoeWeights& w = p.weights;
  const int64_t el = w.num_local_experts;
  if (el <= 0)
    return InvalidField("weights.num_local_experts", "num_local_experts must be positive");
  if (p.expert_map == nullptr && el != p.num_experts) {
    return InvalidField("weights.num_local_experts",
                        absl::StrCat("without expert_map num_local_experts (", el,
                                     ") must equal num_experts (", p.num_experts, ")"));
  }
  if (p.expert_map != nullptr) {
    for (int e = 0; e < p.num_experts; ++e) {
      if (p.expert_map[e] < -1 || p.expert_map[e] >= el) {
        return InvalidField("expert_map",
                            absl::StrCat("expert_map[", e, "] = ", p.expert_map[e],
                                         " is not -1 or a local expert in [0, ", el, ")"));
      }
    }
  }
  if (w.w13 == nullptr) return InvalidField("weights.w13", "w13 must not be null");
  if (w.w2 == nullptr) return InvalidField("weights.w2", "w2 must not be null");
  if (p.activation == MoeActivation::kSwigluOaiUninterleave && !p.act_params.clamp_limit) {
    return InvalidField("act_params.clamp_limit", "SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  }
  const MoeQuant& q = w.quant;
  auto want_dtype = [&](kernels::DType d) -> absl::Status {
    if (w.dtype != d) {
      return InvalidField("weights.dtype",
                          absl::StrCat("quantisation scheme needs ", kernels::DTypeName(d),
                                       " weights, got ", kernels::DTypeName(w.dtype)));
    }
    return absl::OkStatus();
  };
  auto need_scales = [&]() -> absl::Status {
    if (q.w13_scale == nullptr)
      return InvalidField("weights.quant.w13_scale", "w13_scale is required");
    if (q.w2_scale == nullptr)
      return InvalidField("weights.quant.w2_scale", "w2_scale is required");
    return absl::OkStatus();
  };
  switch (q.scheme) {
    case MoeQuantScheme::kNone:
      if (!IsFloatDType(w.dtype)) {
        return InvalidField("weights.dtype", absl::StrCat("unquantised weights must be float32, "
                                                          "float16 or bfloat16, got ",
                                                          kernels::DTypeName(w.dtype)));
      }
      break;
    case MoeQuantScheme::kFp8W8A8:
      KPLAN_RETURN_IF_ERROR(want_dtype(kernels::DType::kFp8E4m3));
      KPLAN_RETURN_IF_ERROR(need_scales());
      if (q.weight_scale == Fp8WeightScale::kBlock) {
        if (q.block_n <= 0 || q.block_k <= 0) {
          return InvalidField(q.block_n <= 0 ? "weights.quant.block_n" : "weights.quant.block_k",
                              "block sizes must be positive");
        }
        if (q.act_scale == Fp8ActScale::kPerToken) {
          return InvalidField("weights.quant.act_scale", "illegal quantization");
        }
        if (q.a1_scale || q.a2_scale) {
          return InvalidField(q.a1_scale ? "weights.quant.a1_scale" : "weights.quant.a2_scale",
                              "block-quantised activations use dynamic per-group scales");
        }
      } else if (q.act_scale == Fp8ActScale::kPerToken && (q.a1_scale || q.a2_scale)) {
        return InvalidField(q.a1_scale ? "weights.quant.a1_scale" : "weights.quant.a2_scale",
                            "per-token activation scales are dynamic");
      }
      for (const auto& [s, field] : {std::pair{q.a1_scale, "weights.quant.a1_scale"},
                                     std::pair{q.a2_scale, "weights.quant.a2_scale"}}) {
        if (s && !(*s > 0.0f && std::isfinite(*s))) {
          return InvalidField(field, "static activation scales must be positive and finite");
        }
      }
      break;
    case MoeQuantScheme::kInt8WeightOnly:
    case MoeQuantScheme::kInt4WeightOnly: {
      const bool int4 = q.scheme == MoeQuantScheme::kInt4WeightOnly;
      KPLAN_RETURN_IF_ERROR(want_dtype(int4 ? kernels::DType::kInt4Packed : kernels::DType::kInt8));
      KPLAN_RETURN_IF_ERROR(need_scales());
      if (q.group_size <= 0 || p.hidden % q.group_size != 0 || p.intermediate % q.group_size != 0) {
        return InvalidField("weights.quant.group_size",
                            absl::StrCat("group_size ", q.group_size, " must divide hidden ",
                                         p.hidden, " and intermediate ", p.intermediate));
      }
      if (int4 && (p.hidden % 2 != 0 || p.intermediate % 2 != 0)) {
        return InvalidField("weights.dtype", "int4 packing needs even hidden and intermediate");
      }
      if ((q.w13_zero == nullptr) != (q.w2_zero == nullptr)) {
        return InvalidField(
            q.w13_zero == nullptr ? "weights.quant.w13_zero" : "weights.quant.w2_zero",
            "zero points must be given for both w13 and w2 or neither");
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status RunExperts(const MoeProblem& p, const int32_t* topk_ids, const float* topk_weights,
                        float* per_slot_out) {
  MoeProblem checked = p;
  checked.topk_ids = topk_ids;
  checked.topk_weights = topk_weights;
  KPLAN_RETURN_IF_ERROR(ValidateMoeProblem(checked, /*needs_routing=*/false));
  const int64_t M = p.num_tokens, H = p.hidden, I = p.intermediate, n13 = N13(p);
  const int k = p.top_k;
  const int64_t slots = M * k;
  if (slots == 0) return absl::OkStatus();
  if (per_slot_out == nullptr) return InvalidField("per_slot_out", "output must not be null");
  const MoeWeights& w = p.weights;
  const MoeQuant& q = w.quant;
  const bool fp8 = q.scheme == MoeQuantScheme::kFp8W8A8;
  const bool block = fp8 && q.weight_scale == Fp8WeightScale::kBlock;

  // Local expert of every slot, and each local expert's slots in order.
  std::vector<std::vector<int64_t>> rows_of(w.num_local_experts);
  std::vector<int64_t> local_rows;
  for (int64_t t = 0; t < slots; ++t) {
    const int32_t id = topk_ids[t];
    if (id < 0 || id >= p.num_experts) {
      return InvalidField("topk_ids", absl::StrCat("topk_ids[", t / k, "][", t % k, "] = ", id,
                                                   " is not in [0, ", p.num_experts, ")"));
    }
    const int32_t local = p.expert_map != nullptr ? p.expert_map[id] : id;
    if (local >= 0) {
      rows_of[local].push_back(t);
      local_rows.push_back(t);
    }
  }

  // Input rows per token (the k slots of a token share them).
  std::vector<float> a(M * H);
  LoadFloats(p.hidden_states, p.act_dtype, 0, M * H, a.data());
  if (p.apply_router_weight_on_input) {  // a = a * w.to(a.dtype), k == 1
    for (int64_t m = 0; m < M; ++m) {
      const float wt = RoundToDType(topk_weights[m], p.act_dtype);
      for (int64_t h = 0; h < H; ++h) a[m * H + h] = RoundToDType(a[m * H + h] * wt, p.act_dtype);
    }
  }
  const int64_t kt1 = block ? CeilDiv(H, q.block_k) : 1;
  std::vector<float> a_scale;
  if (fp8) {
    std::vector<int64_t> all_tokens(M);
    for (int64_t m = 0; m < M; ++m) all_tokens[m] = m;
    const float s = block || q.act_scale == Fp8ActScale::kPerToken
                        ? 1.0f
                        : TensorScale(q.a1_scale, a.data(), H, all_tokens);
    a_scale.resize(M * kt1);
    QuantizeRows(q, s, a.data(), M, H, a_scale.data());
  }

  struct Unit {
    int64_t expert, begin, end;
  };
  std::vector<Unit> units;
  for (int64_t e = 0; e < w.num_local_experts; ++e) {
    for (int64_t b = 0; b < static_cast<int64_t>(rows_of[e].size()); b += kRowsPerUnit) {
      units.push_back({e, b, std::min<int64_t>(b + kRowsPerUnit, rows_of[e].size())});
    }
  }
  const int threads = AutoThreads(p, static_cast<int64_t>(units.size()));
  // One clock read per unit (32 rows of one expert's GEMM) is cheap next to
  // the unit; once the deadline passed, the remaining units are skipped.
  std::atomic<bool> expired{false};
  const bool bounded = p.deadline != absl::InfiniteFuture();
  auto past_deadline = [&] {
    if (!bounded) return false;
    if (expired.load(std::memory_order_relaxed)) return true;
    if (absl::Now() < p.deadline) return false;
    expired.store(true, std::memory_order_relaxed);
    return true;
  };
  auto deadline_error = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        "the deadline passed while the experts ran (", M, " tokens, top_k ", k, ", ", units.size(),
        " blocks of up to ", kRowsPerUnit, " rows); nothing was returned"));
  };
  const GemmWeight g13{&w, true, n13, H, p.act_dtype};
  const GemmWeight g2{&w, false, H, I, p.act_dtype};

  // GEMM1 -> bias -> activation, rounded to act_dtype at each step as
  // torch_experts computes in the activation dtype.
  std::vector<float> inter(slots * I, 0.0f);
  ParallelFor(static_cast<int64_t>(units.size()), threads, [&](int64_t ui) {
    if (past_deadline()) return;
    const Unit& u = units[ui];
    const int64_t R = u.end - u.begin;
    std::vector<float> x(R * H), xs(R * kt1), t1(R * n13);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t m = rows_of[u.expert][u.begin + r] / k;
      std::copy(a.begin() + m * H, a.begin() + (m + 1) * H, x.begin() + r * H);
      if (block) std::copy(&a_scale[m * kt1], &a_scale[m * kt1] + kt1, &xs[r * kt1]);
    }
    Gemm(g13, u.expert, x.data(), xs.data(), R, t1.data());
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t n = 0; n < n13; ++n) {
        float v = RoundToDType(t1[r * n13 + n], p.act_dtype);
        if (w.b13 != nullptr) {
          v = RoundToDType(v + RoundToDType(w.b13[u.expert * n13 + n], p.act_dtype), p.act_dtype);
        }
        t1[r * n13 + n] = v;
      }
    }
    std::vector<float> t2(R * I);
    (void)ApplyActivation(p.activation, p.act_params, t1.data(), R, n13, t2.data(), I);
    for (int64_t r = 0; r < R; ++r) {
      float* dst = &inter[rows_of[u.expert][u.begin + r] * I];
      for (int64_t i = 0; i < I; ++i) dst[i] = RoundToDType(t2[r * I + i], p.act_dtype);
    }
  });
  if (expired.load()) return deadline_error();

  // Re-quantise the intermediate for the second GEMM. A dynamic per-tensor
  // scale covers every locally computed row (the fused kernels quantise the
  // whole intermediate cache at once; torch_experts would take it per expert).
  const int64_t kt2 = block ? CeilDiv(I, q.block_k) : 1;
  std::vector<float> inter_scale;
  float tensor_scale2 = 1.0f;
  if (fp8) {
    if (!block && q.act_scale == Fp8ActScale::kPerTensor) {
      tensor_scale2 = TensorScale(q.a2_scale, inter.data(), I, local_rows);
    }
    inter_scale.resize(slots * kt2);
  }

  ParallelFor(static_cast<int64_t>(units.size()), threads, [&](int64_t ui) {
    if (past_deadline()) return;
    const Unit& u = units[ui];
    const int64_t R = u.end - u.begin;
    std::vector<float> x(R * I), xs(R * kt2), y(R * H);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = rows_of[u.expert][u.begin + r];
      std::copy(&inter[t * I], &inter[t * I] + I, &x[r * I]);
    }
    if (fp8) QuantizeRows(q, tensor_scale2, x.data(), R, I, xs.data());
    Gemm(g2, u.expert, x.data(), xs.data(), R, y.data());
    for (int64_t r = 0; r < R; ++r) {
      float* dst = per_slot_out + rows_of[u.expert][u.begin + r] * H;
      for (int64_t h = 0; h < H; ++h) {
        float v = RoundToDType(y[r * H + h], p.act_dtype);
        if (w.b2 != nullptr) {
          v = RoundToDType(v + RoundToDType(w.b2[u.expert * H + h], p.act_dtype), p.act_dtype);
        }
        dst[h] = v;
      }
    }
  });
  if (expired.load()) return deadline_error();
  // Slots of non-local experts contribute zeros.
  for (int64_t t = 0; t < slots; ++t) {
    const int32_t local = p.expert_map != nullptr ? p.expert_map[topk_ids[t]] : topk_ids[t];
    if (local < 0) std::fill(per_slot_out + t * H, per_slot_out + (t + 1) * H, 0.0f);
  }
  return absl::OkStatus();
}

absl::Status CombineTopK(const float* per_slot_out, const float* topk_weights, int64_t num_tokens,
                         int top_k, int64_t hidden, bool weights_applied_on_input,
                         kernels::DType out_dtype, void* out) {
  if (!IsFloatDType(out_dtype)) {
    return InvalidField("act_dtype", "the combined output must be float32, float16 or bfloat16");
  }
  if (top_k <= 0) return InvalidField("top_k", "top_k must be positive");
  if (weights_applied_on_input && top_k != 1) {
    return InvalidField("apply_router_weight_on_input",
                        "apply_router_weight_on_input is only implemented for topk=1");
  }
  for (int64_t m = 0; m < num_tokens; ++m) {
    for (int64_t h = 0; h < hidden; ++h) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const float y = per_slot_out[(m * top_k + j) * hidden + h];
        acc += weights_applied_on_input ? y : y * topk_weights[m * top_k + j];
      }
      StoreFloat(out, out_dtype, m * hidden + h, acc);
    }
  }
  return absl::OkStatus();
}

absl::Status MoeReference(const MoeProblem& p, void* output, float* topk_weights_out,
                          int32_t* topk_ids_out) {
  const bool route = p.topk_ids == nullptr;
  KPLAN_RETURN_IF_ERROR(ValidateMoeProblem(p, route));
  const int64_t M = p.num_tokens;
  const int k = p.top_k;
  if (M > 0 && output == nullptr) return InvalidField("output", "output must not be null");
  std::vector<float> weights(M * k);
  std::vector<int32_t> ids(M * k);
  if (route) {
    RoutingSpec spec = p.routing;
    if (spec.num_experts == 0) spec.num_experts = p.num_experts;
    if (spec.top_k == 0) spec.top_k = k;
    if (spec.num_experts != p.num_experts || spec.top_k != k) {
      return InvalidField(
          spec.num_experts != p.num_experts ? "routing.num_experts" : "routing.top_k",
          "routing spec disagrees with the problem's num_experts / top_k");
    }
    KPLAN_RETURN_IF_ERROR(RouteTokens(spec, p.router_logits, M, weights.data(), ids.data()));
  } else {
    std::copy(p.topk_ids, p.topk_ids + M * k, ids.begin());
    std::copy(p.topk_weights, p.topk_weights + M * k, weights.begin());
  }
  if (topk_weights_out != nullptr) std::copy(weights.begin(), weights.end(), topk_weights_out);
  if (topk_ids_out != nullptr) std::copy(ids.begin(), ids.end(), topk_ids_out);
  std::vector<float> per_slot(M * k * p.hidden);
  KPLAN_RETURN_IF_ERROR(RunExperts(p, ids.data(), weights.data(), per_slot.data()));
  return CombineTopK(per_slot.data(), weights.data(), M, k, p.hidden,
                     p.apply_router_weight_on_input, p.act_dtype, output);
}

}  // namespace kplan::moe
