// Client-supplied strings as they may appear in an error text or a log line:
// shortened and escaped, so a client can neither forge log lines (newlines,
// ANSI escapes) nor push the error past gRPC's metadata limit.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace kplan {

inline constexpr size_t kMaxClientTextChars = 128;

// At most `max_chars` bytes of `s` (then "...(+N bytes)"); bytes outside
// printable ASCII, backslashes included, as \xNN.
std::string ClientText(absl::string_view s, size_t max_chars = kMaxClientTextChars);

}  // namespace kplan
