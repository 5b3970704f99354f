// Environment access behind an interface (as LevelDB's Env), so tests inject
// variables and faults instead of mutating the process environment. vLLM's
// selection logic distinguishes a variable that is set (even to "0") from one
// that is absent (`envs.is_set`), and EnvVars keeps that distinction.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
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
  // Boolean variable `name` read as vLLM's envs.py reads it (its
  // EnvBoolForm, VllmEnvBoolForm); absent gives `fallback`. A kInt value that
  // Python's int() refuses reads false here: ValidateVllmEnv rejects it first.
  bool Flag(absl::string_view name, bool fallback) const;
  void Set(std::string name, std::string value) { vars_[std::move(name)] = std::move(value); }
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

// The three ways vLLM's envs.py turns a boolean variable's string into a
// bool (each variable has one, in its lambda there).
enum class EnvBoolForm {
  kInt,                // bool(int(v)): Python int() syntax, else ValueError
  kTrueOrOne,          // v.lower() in ("true", "1")
  kStrippedTrueOrOne,  // v.strip().lower() in ("1", "true")
};

// The form of the vLLM boolean variables the resolver reads (kTrueOrOne for
// any other name).
EnvBoolForm VllmEnvBoolForm(absl::string_view name);

// Value `value` read in form `form` (false where kInt's int() would raise).
bool ParseEnvBool(absl::string_view value, EnvBoolForm form);

// INVALID_ARGUMENT naming env.<NAME> with Python's ValueError text for a
// kInt variable whose value int() refuses ("invalid literal for int() with
// base 10: 'true'"), where vLLM would raise on reading it.
absl::Status ValidateVllmEnv(const EnvVars& env);

}  // namespace kplan
