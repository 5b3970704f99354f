#include "base/client_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kplan {

std::string ClientText(absl::string_view s, size_t max_chars) {
  std::string out;
  const size_t n = s.size() < max_chars ? s.size() : max_chars;
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  if (n < s.size()) absl::StrAppend(&out, "...(+", s.size() - n, " bytes)");
  return out;
}

}  // namespace kplan
