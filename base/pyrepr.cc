#include "absl/strings/string_view.h"
#include "base/pyrepr.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kplan {

std::string PyRepr(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);  // UTF-8 bytes of printable text pass through
    }
  }
  out += quote;
  return out;
}

std::string PyRepr(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += PyRepr(items[i]);
  }
  return out + "]";
}

std::string PyReprSorted(std::vector<std::string> items) {
  std::sort(items.begin(), items.end());
  return PyRepr(items);
}

std::string PydanticLiteralError(const std::vector<absl::string_view>& allowed) {
  std::string out = "Input should be ";
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) out += (i + 1 == allowed.size()) ? " or " : ", ";
    absl::StrAppend(&out, "'", allowed[i], "'");
  }
  return out;
}

namespace {

bool IsUtf8Boundary(unsigned char b) { return (b & 0xc0) != 0x80; }

}  // namespace

std::string PydanticInputValue(absl::string_view value) {
  const std::string repr = PyRepr(value);
  if (repr.size() <= 50) return repr;
  size_t head = 25;  // floor_char_boundary(repr, 25)
  while (head > 0 && !IsUtf8Boundary(static_cast<unsigned char>(repr[head]))) --head;
  size_t tail = repr.size() - 24;  // ceil_char_boundary(repr, len - 24)
  while (tail < repr.size() && !IsUtf8Boundary(static_cast<unsigned char>(repr[tail]))) ++tail;
  return absl::StrCat(repr.substr(0, head), "...", repr.substr(tail));
}

}  // namespace kplan
