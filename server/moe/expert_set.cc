#include "server/moe/expert_set.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/checked_size.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/moe/moe_runner.h"

namespace kplan {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool IsPlainFloat(kernels::DType d) {
  return d == kernels::DType::kFloat32 || d == kernels::DType::kFloat16 ||
         d == kernels::DType::kBFloat16;
}

}  // namespace

std::string WireDTypeName(kernels::DType d) {
  switch (d) {
    case kernels::DType::kFloat32:
      return "float32";
    case kernels::DType::kFloat16:
      return "float16";
    case kernels::DType::kBFloat16:
      return "bfloat16";
    case kernels::DType::kFp8E4m3:
      return "float8_e4m3";
    case kernels::DType::kInt8:
      return "int8";
    case kernels::DType::kInt4Packed:
      return "uint8";
    default:  // not an expert weight type
      break;
  }
  return "unknown";
}

int64_t TensorSpec::bytes() const {
  int64_t n = kernels::DTypeSize(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<int64_t> ExpectedBytes(const ExpertsSpec& spec) {
  // Every tensor's bytes and their sum without wrapping: E = H = I = 2^21
  // made w13 2^65 bytes, 0 after the wrap, and an "OK" load of nothing.
  ShapeLimits limits;
  limits.max_elements = limits.max_bytes = kMaxExpertSetBytes;
  int64_t total = 0;
  for (const TensorSpec& t : ExpectedTensors(spec)) {
    absl::StatusOr<int64_t> bytes =
        ShapeBytes(t.shape, kernels::DTypeSize(t.dtype), t.name, limits);
    std::optional<int64_t> sum = bytes.ok() ? CheckedAdd(total, *bytes) : std::nullopt;
    if (!sum || *sum > kMaxExpertSetBytes) {
      return InvalidField("num_experts",
                          absl::StrCat(spec.num_experts, " experts of hidden_size ", spec.hidden,
                                       " and intermediate_size ", spec.intermediate,
                                       " need more than ", kMaxExpertSetBytes, " bytes"));
    }
    total = *sum;
  }
  return total;
}

absl::Status ValidateExpertsSpec(const ExpertsSpec& s) {
  if (s.experts_id.empty()) return InvalidField("experts_id", "experts_id must not be empty");
  // Ids appear in logs, metrics and error texts: short and printable only.
  if (s.experts_id.size() > kMaxExpertsIdBytes ||
      !std::all_of(s.experts_id.begin(), s.experts_id.end(),
                   [](char c) { return c > 0x20 && c < 0x7f; })) {
    return InvalidField("experts_id",
                        absl::StrCat("experts_id must be 1 to ", kMaxExpertsIdBytes,
                                     " printable ASCII characters without spaces, got '",
                                     ClientText(s.experts_id), "'"));
  }
  if (s.num_experts < 1) {
    return InvalidField("num_experts",
                        absl::StrCat("num_experts must be at least 1, got ", s.num_experts));
  }
  if (s.hidden < 1 || s.intermediate < 1) {
    return InvalidField(s.hidden < 1 ? "hidden_size" : "intermediate_size",
                        "hidden_size and intermediate_size must be positive");
  }
  absl::StatusOr<moe::MoeActivation> act = moe::ParseMoeActivation(s.activation);
  if (!act.ok()) return WithField(act.status(), "activation");
  const std::string& q = s.quant.scheme;
  const bool fp8 = q == "fp8_per_tensor" || q == "fp8_per_channel" || q == "fp8_block";
  if (!(q.empty() || fp8 || q == "int8_group" || q == "int4_group")) {
    return InvalidField("quantization.scheme",
                        absl::StrCat("unknown quantization scheme '", q,
                                     "'; expected fp8_per_tensor, fp8_per_channel, fp8_block, "
                                     "int8_group or int4_group (or empty)"));
  }
  const bool dtype_ok = q.empty()           ? IsPlainFloat(s.dtype)
                        : fp8               ? s.dtype == kernels::DType::kFp8E4m3
                        : q == "int8_group" ? s.dtype == kernels::DType::kInt8
                                            : s.dtype == kernels::DType::kInt4Packed;
  if (!dtype_ok) {
    return InvalidField("dtype", absl::StrCat("dtype does not fit quantization '", q,
                                              "': unquantized weights are float32, float16 or "
                                              "bfloat16; fp8 is float8_e4m3; int8_group is int8; "
                                              "int4_group is uint8 (two int4 per byte)"));
  }
  if (q == "fp8_block" && (s.quant.block_n < 1 || s.quant.block_k < 1)) {
    return InvalidField("quantization.block_n", "fp8_block needs positive block_n and block_k");
  }
  if (q == "int8_group" || q == "int4_group") {
    const int g = s.quant.group_size;
    if (g < 1 || s.hidden % g != 0 || s.intermediate % g != 0) {
      return InvalidField("quantization.group_size",
                          absl::StrCat("group_size ", g, " must divide hidden_size ", s.hidden,
                                       " and intermediate_size ", s.intermediate));
    }
    if (q == "int4_group" && (s.hidden % 2 != 0 || s.intermediate % 2 != 0)) {
      return InvalidField("hidden_size", "int4 packs two values per byte: sizes must be even");
    }
  }
  if (fp8 && s.quant.activation_scale != "per_token" && s.quant.activation_scale != "per_tensor") {
    return InvalidField("quantization.activation_scale",
                        "activation_scale must be per_token or per_tensor");
  }
  return ExpectedBytes(s).status();  // every tensor and their sum within kMaxExpertSetBytes
}

std::vector<TensorSpec> ExpectedTensors(const ExpertsSpec& s) {
  const int64_t e = s.num_experts, h = s.hidden, i = s.intermediate;
  const bool gated = moe::IsGated(*moe::ParseMoeActivation(s.activation));
  const int64_t n13 = gated ? 2 * i : i;
  const bool int4 = s.quant.scheme == "int4_group";
  const std::string w = WireDTypeName(s.dtype), f = "float32";
  std::vector<TensorSpec> out = {
      {"w13", s.dtype, {e, n13, int4 ? h / 2 : h}, w},
      {"w2", s.dtype, {e, h, int4 ? i / 2 : i}, w},
  };
  const kernels::DType f32 = kernels::DType::kFloat32;
  const std::string& q = s.quant.scheme;
  if (q == "fp8_per_tensor") {
    out.push_back({"w13_scale", f32, {e}, f});
    out.push_back({"w2_scale", f32, {e}, f});
  } else if (q == "fp8_per_channel") {
    out.push_back({"w13_scale", f32, {e, n13}, f});
    out.push_back({"w2_scale", f32, {e, h}, f});
  } else if (q == "fp8_block") {
    const int64_t bn = s.quant.block_n, bk = s.quant.block_k;
    out.push_back({"w13_scale", f32, {e, CeilDiv(n13, bn), CeilDiv(h, bk)}, f});
    out.push_back({"w2_scale", f32, {e, CeilDiv(h, bn), CeilDiv(i, bk)}, f});
  } else if (q == "int8_group" || q == "int4_group") {
    const int64_t g = s.quant.group_size;
    out.push_back({"w13_scale", f32, {e, n13, h / g}, f});
    out.push_back({"w2_scale", f32, {e, h, i / g}, f});
    if (s.quant.has_zero_points) {
      out.push_back({"w13_zero", kernels::DType::kInt8, {e, n13, h / g}, "uint8"});
      out.push_back({"w2_zero", kernels::DType::kInt8, {e, h, i / g}, "uint8"});
    }
  }
  if (s.has_bias) {
    out.push_back({"w13_bias", f32, {e, n13}, f});
    out.push_back({"w2_bias", f32, {e, h}, f});
  }
  return out;
}

ExpertSet::ExpertSet(ExpertsSpec spec, std::map<std::string, std::string> tensors)
    : spec_(std::move(spec)),
      tensors_(std::move(tensors)),
      activation_(*moe::ParseMoeActivation(spec_.activation)) {
  for (const auto& [name, bytes] : tensors_) bytes_ += static_cast<int64_t>(bytes.size());
  placement_.push_back(ExpertsPlacement{"cpu", 0, spec_.num_experts, bytes_});
}

void ExpertSet::AttachDeviceCopy(std::unique_ptr<DeviceExperts> copy) {
  placement_.push_back(
      ExpertsPlacement{copy->device_name(), 0, spec_.num_experts, copy->device_bytes()});
  device_copy_ = std::move(copy);
}

moe::MoeWeights ExpertSet::Weights() const {
  auto ptr = [this](const char* name) -> const void* {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second.data();
  };
  moe::MoeWeights w;
  w.dtype = spec_.dtype;
  w.num_local_experts = spec_.num_experts;
  w.w13 = ptr("w13");
  w.w2 = ptr("w2");
  w.b13 = static_cast<const float*>(ptr("w13_bias"));
  w.b2 = static_cast<const float*>(ptr("w2_bias"));
  const std::string& q = spec_.quant.scheme;
  if (q.rfind("fp8", 0) == 0) {
    w.quant.scheme = moe::MoeQuantScheme::kFp8W8A8;
    w.quant.weight_scale = q == "fp8_per_tensor"    ? moe::Fp8WeightScale::kPerTensor
                           : q == "fp8_per_channel" ? moe::Fp8WeightScale::kPerChannel
                                                    : moe::Fp8WeightScale::kBlock;
    w.quant.act_scale = spec_.quant.activation_scale == "per_tensor" ? moe::Fp8ActScale::kPerTensor
                                                                     : moe::Fp8ActScale::kPerToken;
    w.quant.block_n = spec_.quant.block_n;
    w.quant.block_k = spec_.quant.block_k;
    if (spec_.quant.a1_scale) w.quant.a1_scale = *spec_.quant.a1_scale;
    if (spec_.quant.a2_scale) w.quant.a2_scale = *spec_.quant.a2_scale;
  } else if (q == "int8_group" || q == "int4_group") {
    w.quant.scheme = q == "int8_group" ? moe::MoeQuantScheme::kInt8WeightOnly
                                       : moe::MoeQuantScheme::kInt4WeightOnly;
    w.quant.group_size = spec_.quant.group_size;
    w.quant.w13_zero = static_cast<const uint8_t*>(ptr("w13_zero"));
    w.quant.w2_zero = static_cast<const uint8_t*>(ptr("w2_zero"));
  }
  w.quant.w13_scale = static_cast<const float*>(ptr("w13_scale"));
  w.quant.w2_scale = static_cast<const float*>(ptr("w2_scale"));
  return w;
}

bool DeviceExperts::FastPathFor(kernels::DType /*act_dtype*/) const { return false; }

absl::StatusOr<MoeRunOutput> DeviceExperts::Run(const MoeRunInput& /*input*/,
                                                void* /*stream*/) const {
  return absl::FailedPreconditionError(absl::StrCat("the copy of the experts on ", device_name(),
                                                    " runs only through its own group"));
}

}  // namespace kplan
