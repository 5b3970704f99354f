// Environment access behind an interface (as LevelDB's Env), so tests inject
// variables and faults instead of mutating the process environment. vLLM's
// selection logic distinguishes a variable that is set (even to "0") from one
// that is absent (`envs.is_set`), and EnvVars keeps that distinction.
#pragma once

#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

namespace kplan {

class Env {
 public:
  virtual ~Env() = default;
  virtual std::optional<std::string> Get(absl::string_view name) const = 0;
  // The process environment.
  static const Env& Process();
};

// A snapshot of variables: a request's env map, or a test's.
class EnvVars final : public Env {
 public:
  EnvVars() = default;
  explicit EnvVars(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  EnvVars(std::initializer_list<std::pair<const std::string, std::string>> vars) : vars_(vars) {}

  std::optional<std::string> Get(absl::string_view name) const override;
  bool IsSet(absl::string_view name) const { return Get(name).has_value(); }
  // vLLM's boolean reading: "1"/"true"/"yes"/"on" (any case) or a non-zero
  // integer is true; absent gives `fallback`.
  bool Flag(absl::string_view name, bool fallback) const;
  void Set(std::string name, std::string value) { vars_[std::move(name)] = std::move(value); }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

// Parses a vLLM boolean environment value.
bool ParseEnvBool(absl::string_view value);

}  // namespace kplan
