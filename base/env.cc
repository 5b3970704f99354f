#include "absl/strings/string_view.h"
#include "base/env.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/client_text.h"
#include "base/pyrepr.h"
#include "base/status.h"

namespace kplan {
namespace {

class ProcessEnv final : public Env {
 public:
  std::optional<std::string> Get(absl::string_view name) const override {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }
};

}  // namespace

const Env& Env::Process() {
  static const ProcessEnv* env = new ProcessEnv();
  return *env;
}

std::optional<std::string> EnvVars::Get(absl::string_view name) const {
  auto it = vars_.find(std::string(name));
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

bool EnvVars::Flag(absl::string_view name, bool fallback) const {
  std::optional<std::string> v = Get(name);
  return v ? ParseEnvBool(*v, VllmEnvBoolForm(name)) : fallback;
}

namespace {

// Python's str.isspace() over ASCII (what str.strip() and int() strip).
bool IsPySpace(char c) { return (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x20); }

absl::string_view PyStrip(absl::string_view v) {
  while (!v.empty() && IsPySpace(v.front())) v.remove_prefix(1);
  while (!v.empty() && IsPySpace(v.back())) v.remove_suffix(1);
  return v;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// int(v) != 0, or nullopt where int(v) raises: optional sign, digits with
// single underscores between them, surrounding whitespace.
std::optional<bool> PyIntNonZero(absl::string_view v) {
  v = PyStrip(v);
  if (!v.empty() && (v.front() == '+' || v.front() == '-')) v.remove_prefix(1);
  if (v.empty()) return std::nullopt;
  bool nonzero = false;
  for (size_t i = 0; i < v.size(); ++i) {
    if (IsDigit(v[i])) {
      nonzero |= v[i] != '0';
    } else if (v[i] != '_' || i == 0 || !IsDigit(v[i - 1]) || i + 1 == v.size() ||
               !IsDigit(v[i + 1])) {
      return std::nullopt;
    }
  }
  return nonzero;
}

struct BoolVar {
  absl::string_view name;
  EnvBoolForm form;
};

// vllm/envs.py's lambdas for the variables the resolver reads.
constexpr BoolVar kBoolVars[] = {
    {"VLLM_BATCH_INVARIANT", EnvBoolForm::kInt},
    {"VLLM_MOE_USE_DEEP_GEMM", EnvBoolForm::kInt},
    {"VLLM_ROCM_MOE_PADDING", EnvBoolForm::kInt},
    {"VLLM_ROCM_USE_AITER", EnvBoolForm::kTrueOrOne},
    {"VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS", EnvBoolForm::kTrueOrOne},
    {"VLLM_ROCM_USE_AITER_MOE", EnvBoolForm::kTrueOrOne},
    {"VLLM_ROCM_USE_AITER_RMSNORM", EnvBoolForm::kTrueOrOne},
    {"VLLM_TEST_FORCE_FP8_MARLIN", EnvBoolForm::kStrippedTrueOrOne},
    {"VLLM_USE_DEEP_GEMM", EnvBoolForm::kInt},
    {"VLLM_USE_OINK_OPS", EnvBoolForm::kTrueOrOne},
};

}  // namespace

EnvBoolForm VllmEnvBoolForm(absl::string_view name) {
  for (const BoolVar& v : kBoolVars) {
    if (v.name == name) return v.form;
  }
  return EnvBoolForm::kTrueOrOne;
}

bool ParseEnvBool(absl::string_view value, EnvBoolForm form) {
  switch (form) {
    case EnvBoolForm::kInt:
      return PyIntNonZero(value).value_or(false);
    case EnvBoolForm::kTrueOrOne:
    case EnvBoolForm::kStrippedTrueOrOne: {
      const std::string v =
          absl::AsciiStrToLower(form == EnvBoolForm::kStrippedTrueOrOne ? PyStrip(value) : value);
      return v == "true" || v == "1";
    }
  }
  return false;
}

absl::Status ValidateVllmEnv(const EnvVars& env) {
  for (const BoolVar& v : kBoolVars) {
    if (v.form != EnvBoolForm::kInt) continue;
    std::optional<std::string> value = env.Get(v.name);
    if (value && !PyIntNonZero(*value)) {
      // Python's repr of the value, cut to the client-text limit.
      const absl::string_view shown = absl::string_view(*value).substr(0, kMaxClientTextChars);
      return InvalidField(absl::StrCat("env.", v.name),
                          absl::StrCat("invalid literal for int() with base 10: ", PyRepr(shown),
                                       shown.size() < value->size() ? "..." : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace kplan
