// A JSON value and a writer that reproduces CPython's
// json.dumps(value, sort_keys=True) byte for byte: ", " and ": " separators,
// ensure_ascii escapes, float repr, NaN/Infinity. vLLM's config hashes are the
// SHA-256 of that text, so hash compatibility rests on this writer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <variant>
#include <vector>

namespace kplan {

class PyJson {
 public:
  using Array = std::vector<PyJson>;
  using Object = std::map<std::string, PyJson>;  // byte order == code-point order for UTF-8

  PyJson() : v_(nullptr) {}
  PyJson(std::nullptr_t) : v_(nullptr) {}
  PyJson(bool b) : v_(b) {}
  PyJson(int i) : v_(static_cast<int64_t>(i)) {}
  PyJson(int64_t i) : v_(i) {}
  PyJson(double d) : v_(d) {}
  PyJson(const char* s) : v_(std::string(s)) {}
  PyJson(std::string s) : v_(std::move(s)) {}
  PyJson(absl::string_view s) : v_(std::string(s)) {}
  PyJson(Array a) : v_(std::move(a)) {}
  PyJson(Object o) : v_(std::move(o)) {}

  // A JSON array of strings (how vLLM's normalize_value renders a list[str]).
  static PyJson StringList(const std::vector<std::string>& items);

  // json.dumps(self, sort_keys=True).
  std::string Dumps() const;

 private:
  void DumpTo(std::string& out) const;
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, Array, Object> v_;
};

// Python's repr(float): shortest round-trip digits, "1.0", "1e-05", "1e+20".
std::string PyFloatRepr(double d);

// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// vLLM's hash_factors(): sha256(json.dumps(factors, sort_keys=True)).
std::string HashFactors(const PyJson& factors);

}  // namespace kplan
