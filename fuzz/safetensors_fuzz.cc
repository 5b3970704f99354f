// libFuzzer target for the safetensors header parser (server/moe/safetensors.h).
// The input is a file prefix: 8 bytes of little-endian header length, then
// the header and data; it is parsed as the loader would (length checked
// against the input's size). The rest after the first 8 bytes is also parsed
// as a header with the 8 bytes as the data section's size, which puts the
// offset checks near INT64_MAX. Whatever the parser accepts must describe
// tensors inside the data section exactly; anything else aborts. The whole
// input is also parsed as a sharded checkpoint's index: whatever it accepts
// must name only plain shard file names.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "base/checked_size.h"
#include "server/moe/safetensors.h"

namespace {

void CheckHeader(const kplan::SafetensorsHeader& header, int64_t data_bytes) {
  for (const auto& [name, e] : header.tensors) {
    if (e.begin < 0 || e.begin > e.end || e.end > data_bytes) std::abort();
    if (e.shape.size() > static_cast<size_t>(kplan::kMaxTensorDims)) std::abort();
    std::optional<int64_t> element = kplan::SafetensorsElementBytes(e.dtype);
    if (!element || *element != e.element_bytes) std::abort();
    // The span must be dtype x shape. The product only grows, so stopping
    // once it passes the span keeps it inside __int128.
    bool zero = false;
    for (int64_t d : e.shape) {
      if (d < 0) std::abort();
      zero |= d == 0;
    }
    __int128 bytes = zero ? 0 : e.element_bytes;
    for (int64_t d : e.shape) {
      if (zero) break;
      bytes *= d;
      if (bytes > e.end - e.begin) std::abort();
    }
    if (bytes != e.end - e.begin) std::abort();
  }
}

void Parse(absl::string_view header, int64_t data_bytes) {
  absl::StatusOr<kplan::SafetensorsHeader> parsed =
      kplan::ParseSafetensorsHeader(header, data_bytes);
  if (parsed.ok()) CheckHeader(*parsed, data_bytes);
}

void ParseIndex(absl::string_view text) {
  absl::StatusOr<kplan::SafetensorsIndex> index = kplan::ParseSafetensorsIndex(text);
  if (!index.ok()) return;
  if (index->weight_map.empty()) std::abort();
  for (const auto& [tensor, shard] : index->weight_map) {
    if (shard.empty() || shard.size() > 255 || shard == "." || shard == ".." ||
        shard.find('/') != std::string::npos || shard.find('\0') != std::string::npos) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const int64_t file_size = static_cast<int64_t>(size);
  absl::StatusOr<int64_t> header_bytes = kplan::SafetensorsHeaderLength(input, file_size);
  if (header_bytes.ok()) {
    Parse(input.substr(8, static_cast<size_t>(*header_bytes)), file_size - 8 - *header_bytes);
  }
  if (size >= 8) {
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | data[b];
    Parse(input.substr(8), static_cast<int64_t>(n & INT64_MAX));
  }
  ParseIndex(input);
  return 0;
}
