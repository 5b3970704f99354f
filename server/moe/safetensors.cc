#include "server/moe/safetensors.h"

#include <exception>
#include <new>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "base/checked_size.h"
#include "base/client_text.h"
#include "base/status.h"

namespace kplan {

std::optional<int64_t> SafetensorsElementBytes(absl::string_view dtype) {
  // The byte-sized dtypes of safetensors' Dtype enum.
  static const std::pair<absl::string_view, int64_t> kDTypes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},
  };
  for (const auto& [name, bytes] : kDTypes) {
    if (name == dtype) return bytes;
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view prefix, int64_t file_size) {
  if (prefix.size() < 8 || file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a safetensors file: ", file_size, " bytes, fewer than the 8 of the header length"));
  }
  uint64_t n = 0;  // little-endian whatever the host's order
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(prefix[b]);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("not a safetensors file: a header of ", n,
                                                   " bytes is over the format's limit of ",
                                                   kMaxSafetensorsHeaderBytes));
  }
  if (static_cast<int64_t>(n) > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated: its header of ", n, " bytes ends past the file's ", file_size));
  }
  return static_cast<int64_t>(n);
}

namespace {

// A SAX handler that checks the header's schema while it is parsed, so a
// hostile header never becomes a DOM (100 MB of "[[[[" or of small numbers
// would cost gigabytes as nlohmann::json values) and the first wrong value
// stops the parse. Each callback returns false to stop, with error_ set.
class HeaderSax {
 public:
  using json = nlohmann::json;

  explicit HeaderSax(int64_t data_bytes) : data_bytes_(data_bytes) {}

  absl::Status error() const { return absl::InvalidArgumentError(error_); }
  bool done() const { return state_ == State::kDone; }
  SafetensorsHeader Take() { return std::move(header_); }

  bool null() { return Value("null"); }
  bool boolean(bool) { return Value("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return Integer(static_cast<uint64_t>(v));
    return Number(absl::StrCat("negative (", v, ")"));
  }
  bool number_unsigned(json::number_unsigned_t v) { return Integer(v); }
  bool number_float(json::number_float_t, const json::string_t&) {
    return Number("not an integer");
  }
  bool binary(json::binary_t&) { return Value("binary"); }

  bool string(json::string_t& s) {
    switch (state_) {
      case State::kMetadataValue:
        header_.metadata[key_] = std::move(s);
        state_ = State::kMetadataKey;
        return true;
      case State::kEntryValue:
        if (field_ == Field::kDType) {
          entry_.dtype = std::move(s);
          state_ = State::kEntryKey;
          return true;
        }
        break;
      default:
        break;
    }
    return Value("a string");
  }

  bool start_object(std::size_t) {
    switch (state_) {
      case State::kStart:
        state_ = State::kTopKey;
        return true;
      case State::kTopValue:
        if (key_ == "__metadata__") {
          state_ = State::kMetadataKey;
        } else {
          entry_ = SafetensorsEntry();
          seen_ = 0;
          offsets_seen_ = 0;
          state_ = State::kEntryKey;
        }
        return true;
      default:
        return Value("an object");
    }
  }

  bool key(json::string_t& k) {
    switch (state_) {
      case State::kTopKey:
        if (!names_.insert(k).second) {
          return Fail(absl::StrCat("tensor '", ClientText(k), "' appears twice"));
        }
        tensor_ = k;
        key_ = std::move(k);
        state_ = State::kTopValue;
        return true;
      case State::kMetadataKey:
        key_ = std::move(k);
        state_ = State::kMetadataValue;
        return true;
      case State::kEntryKey: {
        Field f;
        if (k == "dtype") {
          f = Field::kDType;
        } else if (k == "shape") {
          f = Field::kShape;
        } else if (k == "data_offsets") {
          f = Field::kOffsets;
        } else {
          return Fail(absl::StrCat(Where(), "unknown key '", ClientText(k),
                                   "' (expected dtype, shape, data_offsets)"));
        }
        if (seen_ & Bit(f)) return Fail(absl::StrCat(Where(), "'", k, "' appears twice"));
        seen_ |= Bit(f);
        field_ = f;
        state_ = State::kEntryValue;
        return true;
      }
      default:
        return Fail("unexpected key");  // unreachable: keys only come inside objects
    }
  }

  bool end_object() {
    switch (state_) {
      case State::kTopKey:
        state_ = State::kDone;
        return true;
      case State::kMetadataKey:
        state_ = State::kTopKey;
        return true;
      case State::kEntryKey:
        if (!FinishEntry()) return false;
        state_ = State::kTopKey;
        return true;
      default:
        return Fail("unexpected end of object");
    }
  }

  bool start_array(std::size_t) {
    if (state_ == State::kEntryValue && (field_ == Field::kShape || field_ == Field::kOffsets)) {
      state_ = field_ == Field::kShape ? State::kShape : State::kOffsets;
      return true;
    }
    return Value("an array");
  }

  bool end_array() {
    if (state_ == State::kShape) {
      state_ = State::kEntryKey;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (offsets_seen_ != 2) {
        return Fail(absl::StrCat(Where(), "data_offsets has ", offsets_seen_,
                                 " values, expected [begin, end]"));
      }
      state_ = State::kEntryKey;
      return true;
    }
    return Fail("unexpected end of array");
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    // The token and the library's text would echo file bytes: give the byte.
    return Fail(absl::StrCat("header is not valid JSON (UTF-8) at byte ", position));
  }

 private:
  enum class State {
    kStart,          // expects the top-level object
    kTopKey,         // in the top object: a key or its end
    kTopValue,       // after a top key: an object (entry or metadata)
    kMetadataKey,    // in __metadata__: a key or its end
    kMetadataValue,  // a metadata string
    kEntryKey,       // in a tensor entry: dtype, shape, data_offsets or its end
    kEntryValue,     // the value of field_
    kShape,          // in "shape": integers
    kOffsets,        // in "data_offsets": integers
    kDone,
  };
  enum class Field { kDType, kShape, kOffsets };
  static int Bit(Field f) { return 1 << static_cast<int>(f); }

  std::string Where() const { return absl::StrCat("tensor '", ClientText(tensor_), "': "); }

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  // A value of the wrong JSON type at the current position.
  bool Value(absl::string_view what) {
    switch (state_) {
      case State::kStart:
        return Fail(absl::StrCat("header is ", what, ", not a JSON object"));
      case State::kTopValue:
        if (key_ == "__metadata__")
          return Fail(absl::StrCat("__metadata__ is ", what, ", not an object of strings"));
        return Fail(absl::StrCat(Where(), "its entry is ", what, ", not an object"));
      case State::kMetadataValue:
        return Fail(
            absl::StrCat("__metadata__ '", ClientText(key_), "' is ", what, ", not a string"));
      case State::kEntryValue:
        switch (field_) {
          case Field::kDType:
            return Fail(absl::StrCat(Where(), "dtype is ", what, ", not a string"));
          case Field::kShape:
            return Fail(absl::StrCat(Where(), "shape is ", what, ", not an array of integers"));
          case Field::kOffsets:
            return Fail(
                absl::StrCat(Where(), "data_offsets is ", what, ", not an array of two integers"));
        }
        break;
      case State::kShape:
        return Fail(absl::StrCat(Where(), "a shape dim is ", what, ", not an integer"));
      case State::kOffsets:
        return Fail(absl::StrCat(Where(), "a data offset is ", what, ", not an integer"));
      default:
        break;
    }
    return Fail(absl::StrCat("unexpected ", what));
  }

  // A number that is not an integer >= 0 (the only numbers the format has).
  bool Number(const std::string& why) {
    if (state_ == State::kShape) return Fail(absl::StrCat(Where(), "a shape dim is ", why));
    if (state_ == State::kOffsets) return Fail(absl::StrCat(Where(), "a data offset is ", why));
    return Value("a number");
  }

  bool Integer(uint64_t v) {
    if (state_ != State::kShape && state_ != State::kOffsets) return Value("a number");
    if (v > static_cast<uint64_t>(INT64_MAX)) return Number(absl::StrCat("too large (", v, ")"));
    if (state_ == State::kShape) {
      if (entry_.shape.size() >= static_cast<size_t>(kMaxTensorDims)) {
        return Fail(absl::StrCat(Where(), "shape has more than ", kMaxTensorDims, " dims"));
      }
      entry_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (offsets_seen_ >= 2) {
      return Fail(absl::StrCat(Where(), "data_offsets has more than 2 values"));
    }
    (offsets_seen_ == 0 ? entry_.begin : entry_.end) = static_cast<int64_t>(v);
    ++offsets_seen_;
    return true;
  }

  // All three fields are in: the entry must describe exactly its bytes.
  bool FinishEntry() {
    static constexpr std::pair<Field, absl::string_view> kRequired[] = {
        {Field::kDType, "dtype"}, {Field::kShape, "shape"}, {Field::kOffsets, "data_offsets"}};
    for (const auto& [f, name] : kRequired) {
      if (!(seen_ & Bit(f))) return Fail(absl::StrCat(Where(), "has no ", name));
    }
    std::optional<int64_t> element = SafetensorsElementBytes(entry_.dtype);
    if (!element) {
      return Fail(absl::StrCat(Where(), "dtype '", ClientText(entry_.dtype),
                               "' is not a byte-sized safetensors dtype"));
    }
    entry_.element_bytes = *element;
    // Only overflow bounds the shape here: the span checks below bound it by
    // the data section, with a text that says "truncated" when it is.
    ShapeLimits limits;
    limits.max_elements = INT64_MAX;
    limits.max_bytes = INT64_MAX;
    absl::StatusOr<int64_t> bytes = ShapeBytes(
        entry_.shape, *element, absl::StrCat("tensor '", ClientText(tensor_), "'"), limits);
    if (!bytes.ok()) return Fail(std::string(bytes.status().message()));
    const std::string offsets = absl::StrCat("data_offsets [", entry_.begin, ", ", entry_.end, "]");
    if (entry_.begin > entry_.end) {
      return Fail(absl::StrCat(Where(), offsets, " end before they begin"));
    }
    if (entry_.end > data_bytes_) {
      return Fail(absl::StrCat(Where(), offsets, " end past the data section's ", data_bytes_,
                               " bytes (the file is truncated or the header is wrong)"));
    }
    if (entry_.end - entry_.begin != *bytes) {
      return Fail(absl::StrCat(Where(), offsets, " span ", entry_.end - entry_.begin, " bytes; ",
                               entry_.dtype, " [", absl::StrJoin(entry_.shape, ", "), "] needs ",
                               *bytes));
    }
    header_.tensors.emplace(tensor_, std::move(entry_));
    return true;
  }

  const int64_t data_bytes_;
  State state_ = State::kStart;
  Field field_ = Field::kDType;
  std::string key_;     // the current key of the top object or of __metadata__
  std::string tensor_;  // the tensor whose entry is being read
  SafetensorsEntry entry_;
  int seen_ = 0;  // Bits of the entry's fields seen
  int offsets_seen_ = 0;
  std::set<std::string> names_;
  std::string error_;
  SafetensorsHeader header_;
};

// Runs a schema-checking SAX handler over `text` (`what` names it in
// errors). strict: nothing but whitespace after the object. The handler
// reports every error itself; the library only throws std::bad_alloc.
template <typename Sax>
absl::Status RunSax(absl::string_view text, Sax& sax, absl::string_view what) {
  try {
    if (!nlohmann::json::sax_parse(text.begin(), text.end(), &sax,
                                   nlohmann::json::input_format_t::json,
                                   /*strict=*/true, /*ignore_comments=*/false)) {
      return sax.error();
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory parsing the ", what));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  }
  if (!sax.done()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a complete JSON object"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header_json,
                                                         int64_t data_bytes) {
  if (static_cast<int64_t>(header_json.size()) > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a header of ", header_json.size(),
                                                   " bytes is over the format's limit of ",
                                                   kMaxSafetensorsHeaderBytes));
  }
  if (data_bytes < 0) return absl::InvalidArgumentError("the data section has a negative size");
  HeaderSax sax(data_bytes);
  KPLAN_RETURN_IF_ERROR(RunSax(header_json, sax, "header"));
  return sax.Take();
}

namespace {

// The index's schema, checked while parsing (HeaderSax's reasons apply:
// no DOM for hostile input, the first wrong value stops the parse).
class IndexSax {
 public:
  using json = nlohmann::json;
  static constexpr int kMaxSkipDepth = 64;

  absl::Status error() const { return absl::InvalidArgumentError(error_); }
  bool done() const { return state_ == State::kDone; }
  SafetensorsIndex Take() { return std::move(index_); }

  bool null() { return Scalar("null"); }
  bool boolean(bool) { return Scalar("a boolean"); }
  bool number_integer(json::number_integer_t) { return Scalar("a number"); }
  bool number_unsigned(json::number_unsigned_t) { return Scalar("a number"); }
  bool number_float(json::number_float_t, const json::string_t&) { return Scalar("a number"); }
  bool binary(json::binary_t&) { return Scalar("binary"); }
  bool string(json::string_t& s) {
    if (state_ != State::kMapValue) return Scalar("a string");
    if (s.empty() || s.size() > 255 || s == "." || s == ".." ||
        s.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
      return Fail(absl::StrCat("weight_map: tensor '", ClientText(key_), "' names shard '",
                               ClientText(s), "', not a plain file name"));
    }
    index_.weight_map[key_] = std::move(s);
    state_ = State::kMapKey;
    return true;
  }

  bool start_object(std::size_t) { return Open(); }
  bool start_array(std::size_t) {
    if (state_ == State::kStart) return Fail("index is an array, not a JSON object");
    if (state_ == State::kTopValue && key_ == "weight_map") {
      return Fail("weight_map is an array, not an object of strings");
    }
    return Open();
  }
  bool key(json::string_t& k) {
    switch (state_) {
      case State::kTopKey:
        key_ = std::move(k);
        if (key_ == "weight_map" && seen_map_) return Fail("weight_map appears twice");
        state_ = State::kTopValue;
        return true;
      case State::kMapKey:
        if (index_.weight_map.count(k) != 0) {
          return Fail(absl::StrCat("weight_map: tensor '", ClientText(k), "' appears twice"));
        }
        key_ = std::move(k);
        state_ = State::kMapValue;
        return true;
      default:
        return true;  // inside a skipped value
    }
  }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    return Fail(absl::StrCat("index is not valid JSON (UTF-8) at byte ", position));
  }

 private:
  enum class State { kStart, kTopKey, kTopValue, kMapKey, kMapValue, kSkip, kDone };

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  bool Scalar(absl::string_view what) {
    switch (state_) {
      case State::kStart:
        return Fail(absl::StrCat("index is ", what, ", not a JSON object"));
      case State::kTopValue:
        if (key_ == "weight_map") {
          return Fail(absl::StrCat("weight_map is ", what, ", not an object of strings"));
        }
        state_ = State::kTopKey;  // another top-level value, skipped
        return true;
      case State::kMapValue:
        return Fail(absl::StrCat("weight_map: tensor '", ClientText(key_), "' maps to ", what,
                                 ", not a shard file name"));
      default:
        return true;  // inside a skipped value
    }
  }

  bool Open() {
    switch (state_) {
      case State::kStart:
        state_ = State::kTopKey;
        return true;
      case State::kTopValue:
        if (key_ == "weight_map") {
          seen_map_ = true;
          state_ = State::kMapKey;
          return true;
        }
        state_ = State::kSkip;
        depth_ = 1;
        return true;
      case State::kSkip:
        if (++depth_ > kMaxSkipDepth) {
          return Fail(absl::StrCat("'", ClientText(key_), "' nests deeper than ", kMaxSkipDepth));
        }
        return true;
      case State::kMapValue:
        return Fail(absl::StrCat("weight_map: tensor '", ClientText(key_),
                                 "' maps to a container, not a shard file name"));
      default:
        return Fail("unexpected container");
    }
  }

  bool Close() {
    switch (state_) {
      case State::kSkip:
        if (--depth_ == 0) state_ = State::kTopKey;
        return true;
      case State::kMapKey:
        state_ = State::kTopKey;
        return true;
      case State::kTopKey:
        if (!seen_map_) return Fail("index has no weight_map");
        if (index_.weight_map.empty()) return Fail("weight_map names no tensor");
        state_ = State::kDone;
        return true;
      default:
        return Fail("unexpected end of a container");
    }
  }

  State state_ = State::kStart;
  std::string key_;
  bool seen_map_ = false;
  int depth_ = 0;
  SafetensorsIndex index_;
  std::string error_;
};

}  // namespace

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view index_json) {
  if (static_cast<int64_t>(index_json.size()) > kMaxSafetensorsIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an index of ", index_json.size(),
                                                   " bytes is over the limit of ",
                                                   kMaxSafetensorsIndexBytes));
  }
  IndexSax sax;
  KPLAN_RETURN_IF_ERROR(RunSax(index_json, sax, "index"));
  return sax.Take();
}

}  // namespace kplan
