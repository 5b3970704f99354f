// Python's repr() of strings and string lists, so that error texts copied
// from vLLM (which format values with !r) come out byte for byte.
#pragma once

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

namespace kplan {

// repr(str): 'text' (or "text" when it holds a ' and no "), escaping as CPython.
std::string PyRepr(absl::string_view s);

// repr(list[str]): ['a', 'b'].
std::string PyRepr(const std::vector<std::string>& items);

// repr(sorted(items)).
std::string PyReprSorted(std::vector<std::string> items);

// pydantic v2's literal_error text: "Input should be 'a', 'b' or 'c'".
std::string PydanticLiteralError(const std::vector<absl::string_view>& allowed);

// pydantic-core's "input_value=..." of an error line: repr(value), and when
// that repr is over 50 bytes its first 25 and last 24 bytes (on UTF-8
// character boundaries) joined by "...". A client can never make the text long.
std::string PydanticInputValue(absl::string_view value);

}  // namespace kplan
