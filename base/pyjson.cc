#include "absl/strings/string_view.h"
#include "base/pyjson.h"

#include <openssl/evp.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace kplan {
namespace {

// Appends a JSON string literal with ensure_ascii=True escaping.
void DumpString(absl::string_view s, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0x80) {  // decode one UTF-8 sequence; invalid bytes pass as U+FFFD
      if ((c & 0xE0) == 0xC0) {
        cp = c & 0x1F;
        len = 2;
      } else if ((c & 0xF0) == 0xE0) {
        cp = c & 0x0F;
        len = 3;
      } else if ((c & 0xF8) == 0xF0) {
        cp = c & 0x07;
        len = 4;
      } else {
        cp = 0xFFFD;
        len = 1;
      }
      if (i + len > s.size()) {
        cp = 0xFFFD;
        len = 1;
      } else {
        for (size_t k = 1; k < len; ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
    }
    i += len;
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp >= 0x20 && cp < 0x7f) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      out += absl::StrFormat("\\u%04x", cp);
    } else {
      uint32_t v = cp - 0x10000;
      out += absl::StrFormat("\\u%04x\\u%04x", 0xD800 | (v >> 10), 0xDC00 | (v & 0x3FF));
    }
  }
  out += '"';
}

}  // namespace

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then CPython's layout rule:
  // fixed notation when -4 < exponent10 + 1 <= 16, else "d.ddde+XX".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp10 = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += absl::StrFormat("e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  }
  return sign + out;
}

PyJson PyJson::StringList(const std::vector<std::string>& items) {
  Array a;
  a.reserve(items.size());
  for (const auto& s : items) a.emplace_back(s);
  return PyJson(std::move(a));
}

std::string PyJson::Dumps() const {
  std::string out;
  DumpTo(out);
  return out;
}

void PyJson::DumpTo(std::string& out) const {
  struct Visitor {
    std::string& out;
    void operator()(std::nullptr_t) { out += "null"; }
    void operator()(bool b) { out += b ? "true" : "false"; }
    void operator()(int64_t i) { out += std::to_string(i); }
    void operator()(double d) { out += PyFloatRepr(d); }
    void operator()(const std::string& s) { DumpString(s, out); }
    void operator()(const Array& a) {
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += ", ";
        a[i].DumpTo(out);
      }
      out += ']';
    }
    void operator()(const Object& o) {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : o) {
        if (!first) out += ", ";
        first = false;
        DumpString(k, out);
        out += ": ";
        v.DumpTo(out);
      }
      out += '}';
    }
  };
  std::visit(Visitor{out}, v_);
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  hex.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) hex += absl::StrFormat("%02x", md[i]);
  return hex;
}

std::string HashFactors(const PyJson& factors) { return Sha256Hex(factors.Dumps()); }

}  // namespace kplan
