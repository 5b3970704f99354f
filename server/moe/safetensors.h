// The safetensors format (https://huggingface.co/docs/safetensors): 8 bytes
// of little-endian header length N, N bytes of JSON header, then the data
// section. This is the pure part of loading one: no file access, so it can be
// fuzzed (fuzz/safetensors_fuzz.cc). Everything in the header is hostile
// input: every value is type-checked before use, every offset and shape
// product is overflow-checked (checked_size.h), and an entry is accepted only
// when its data_offsets span exactly the bytes its dtype and shape need and
// lie inside the data section. Nothing throws; errors are INVALID_ARGUMENT
// without a field (the caller knows which request field named the file).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kplan {

// The format's own cap on the header (safetensors' MAX_HEADER_SIZE); checked
// before the header is read or allocated.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor of the file. begin/end are offsets into the data section (the
// bytes after the header), begin <= end <= data_bytes, and
// end - begin == element_bytes * product(shape).
struct SafetensorsEntry {
  std::string dtype;  // the format's name: "F32", "BF16", ...
  int64_t element_bytes = 0;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", string to string
};

// Bytes per element of a safetensors dtype name; nullopt for names the format
// does not define and for the sub-byte ones (F4, F6_*), which are not loaded.
std::optional<int64_t> SafetensorsElementBytes(absl::string_view dtype);

// The header length N from the first bytes of a file of `file_size` bytes:
// `prefix` must hold at least 8 bytes (fewer: the file is too small), N must
// be at most kMaxSafetensorsHeaderBytes and 8 + N at most file_size.
absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view prefix, int64_t file_size);

// Parses and checks the JSON header of a file whose data section holds
// `data_bytes` bytes. Strict: a top-level object whose keys are tensor names
// (each once) and optionally "__metadata__" (an object of strings); each
// tensor an object with exactly "dtype" (a known name), "shape" (at most
// kMaxTensorDims integers >= 0) and "data_offsets" (two integers). Tensors may
// appear in any order in the data section and may overlap; nothing requires
// the data section to be covered.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header_json,
                                                         int64_t data_bytes);

// A sharded checkpoint's index (Hugging Face's model.safetensors.index.json):
// which shard file holds each tensor. Shards are plain file names in the
// index's directory.
inline constexpr int64_t kMaxSafetensorsIndexBytes = 64 << 20;
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
};

// Parses and checks an index, as strictly as the header: a top-level object
// with "weight_map" (an object of strings, at least one tensor), any other
// top-level value (e.g. "metadata") skipped unread up to a nesting depth of
// 64. Every shard must be a plain file name: not empty, no '/', not "." or
// "..", at most 255 bytes. Nothing throws; errors are INVALID_ARGUMENT.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view index_json);

}  // namespace kplan
