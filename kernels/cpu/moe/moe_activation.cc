// MoE activations (vllm-kernel-plan.md §6.3, §2.3), computed in fp32.
#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "base/status.h"

namespace kplan::moe {
namespace {

struct ActName {
  MoeActivation act;
  absl::string_view name;
};
// MoEActivation's values in vLLM's declaration order.
constexpr std::array<ActName, 11> kActivations = {{
    {MoeActivation::kSilu, "silu"},
    {MoeActivation::kGelu, "gelu"},
    {MoeActivation::kGeluTanh, "gelu_tanh"},
    {MoeActivation::kRelu2, "relu2"},
    {MoeActivation::kSwigluOai, "swigluoai"},
    {MoeActivation::kSwigluOaiUninterleave, "swigluoai_uninterleave"},
    {MoeActivation::kSwigluStep, "swiglustep"},
    {MoeActivation::kSiluNoMul, "silu_no_mul"},
    {MoeActivation::kGeluNoMul, "gelu_no_mul"},
    {MoeActivation::kGeluTanhNoMul, "gelu_tanh_no_mul"},
    {MoeActivation::kRelu2NoMul, "relu2_no_mul"},
}};

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float GeluErf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float GeluTanh(float x) {
  const float kBeta = 0.79788456080286536f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(kBeta * (x + 0.044715f * x * x * x)));
}
inline float Relu2(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return r * r;
}
inline float Clamp(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

template <typename F>
void GatedRows(const float* in, int64_t rows, int64_t d, float* out, F f) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x1 = in + r * 2 * d;
    const float* x2 = x1 + d;
    float* o = out + r * d;
    for (int64_t i = 0; i < d; ++i) o[i] = f(x1[i], x2[i]);
  }
}

template <typename F>
void PlainRows(const float* in, int64_t n, float* out, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]);
}

}  // namespace

absl::string_view MoeActivationName(MoeActivation act) {
  for (const ActName& a : kActivations) {
    if (a.act == act) return a.name;
  }
  return "unknown";
}

absl::StatusOr<MoeActivation> ParseMoeActivation(absl::string_view name) {
  if (name == "gelu_pytorch_tanh") return MoeActivation::kGeluTanh;
  std::vector<std::string> valid;
  for (const ActName& a : kActivations) {
    if (a.name == name) return a.act;
    valid.push_back(absl::StrCat("'", a.name, "'"));
  }
  return InvalidField("activation",
                      absl::StrCat("Unknown MoE activation: '", name, "'. Valid activations: [",
                                   absl::StrJoin(valid, ", "), "]"));
}

bool IsGated(MoeActivation act) {
  switch (act) {
    case MoeActivation::kSiluNoMul:
    case MoeActivation::kGeluNoMul:
    case MoeActivation::kGeluTanhNoMul:
    case MoeActivation::kRelu2NoMul:
      return false;
    default:
      return true;
  }
}

absl::Status ApplyActivation(MoeActivation act, const ActivationParams& p, const float* in,
                             int64_t rows, int64_t in_width, float* out, int64_t out_width) {
  if (rows < 0 || in_width < 0 || out_width < 0) {
    return InvalidField("activation", "activation shapes must not be negative");
  }
  if (IsGated(act)) {
    if (out_width * 2 != in_width) {
      return InvalidField("activation",
                          absl::StrCat(MoeActivationName(act), " expects 2x ratio: input width ",
                                       in_width, ", output width ", out_width));
    }
  } else if (out_width != in_width) {
    return InvalidField("activation",
                        absl::StrCat(MoeActivationName(act), " expects equal sizes: input width ",
                                     in_width, ", output width ", out_width));
  }
  if (act == MoeActivation::kSwigluOaiUninterleave && !p.clamp_limit.has_value()) {
    return InvalidField("clamp_limit", "SWIGLUOAI_UNINTERLEAVE requires clamp_limit");
  }
  const int64_t d = out_width;
  const float alpha = p.alpha, beta = p.beta;
  const float limit = p.clamp_limit.value_or(7.0f);
  switch (act) {
    case MoeActivation::kSilu:
      if (p.clamp_limit.has_value()) {
        GatedRows(in, rows, d, out, [limit](float a, float b) {
          return Silu(std::min(a, limit)) * Clamp(b, -limit, limit);
        });
      } else {
        GatedRows(in, rows, d, out, [](float a, float b) { return Silu(a) * b; });
      }
      break;
    case MoeActivation::kGelu:
      GatedRows(in, rows, d, out, [](float a, float b) { return GeluErf(a) * b; });
      break;
    case MoeActivation::kGeluTanh:
      GatedRows(in, rows, d, out, [](float a, float b) { return GeluTanh(a) * b; });
      break;
    case MoeActivation::kRelu2:
      GatedRows(in, rows, d, out, [](float a, float b) { return Relu2(a) * b; });
      break;
    case MoeActivation::kSwigluOai:
      for (int64_t r = 0; r < rows; ++r) {
        const float* x = in + r * 2 * d;
        for (int64_t i = 0; i < d; ++i) {
          const float g = std::min(x[2 * i], limit);
          const float u = Clamp(x[2 * i + 1], -limit, limit);
          out[r * d + i] = (u + 1.0f) * (g * Sigmoid(alpha * g));
        }
      }
      break;
    case MoeActivation::kSwigluOaiUninterleave:
      GatedRows(in, rows, d, out, [=](float a, float b) {
        const float g = std::min(a, limit);
        const float u = Clamp(b, -limit, limit);
        return g * Sigmoid(alpha * g) * (u + beta);
      });
      break;
    case MoeActivation::kSwigluStep:
      GatedRows(in, rows, d, out, [limit](float a, float b) {
        return std::min(Silu(a), limit) * Clamp(b, -limit, limit);
      });
      break;
    case MoeActivation::kSiluNoMul:
      PlainRows(in, rows * d, out, Silu);
      break;
    case MoeActivation::kGeluNoMul:
      PlainRows(in, rows * d, out, GeluErf);
      break;
    case MoeActivation::kGeluTanhNoMul:
      PlainRows(in, rows * d, out, GeluTanh);
      break;
    case MoeActivation::kRelu2NoMul:
      PlainRows(in, rows * d, out, Relu2);
      break;
  }
  return absl::OkStatus();
}

}  // namespace kplan::moe
