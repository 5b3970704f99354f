#include "absl/strings/string_view.h"
#include "base/env.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

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
  return v ? ParseEnvBool(*v) : fallback;
}

bool ParseEnvBool(absl::string_view value) {
  std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "true" || v == "yes" || v == "on") return true;
  int64_t n = 0;
  return absl::SimpleAtoi(v, &n) && n != 0;
}

}  // namespace kplan
