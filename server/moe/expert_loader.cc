#include "server/moe/expert_loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "server/base/status.h"

namespace kplan {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

ExpertsLoader::ExpertsLoader(ExpertsSpec spec)
    : spec_(std::move(spec)), expected_(ExpectedTensors(spec_)) {
  for (const TensorSpec& t : expected_) bytes_expected_ += t.bytes();
}

absl::Status ExpertsLoader::AddChunk(const std::string& name, const std::string& wire_dtype,
                                     const std::vector<int64_t>& shape, int64_t offset,
                                     std::string data) {
  const std::string field = absl::StrCat("chunk[", name, "]");
  const TensorSpec* spec = nullptr;
  std::vector<std::string> names;
  for (const TensorSpec& t : expected_) {
    names.push_back(t.name);
    if (t.name == name) spec = &t;
  }
  if (spec == nullptr) {
    return InvalidField(field, absl::StrCat("tensor '", name, "' is not part of these experts; ",
                                            "expected ", absl::StrJoin(names, ", ")));
  }
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {  // the first chunk of this tensor
    if (wire_dtype != spec->wire_dtype) {
      return InvalidField(field + ".dtype", absl::StrCat("tensor '", name, "' must be ",
                                                         spec->wire_dtype, ", got ", wire_dtype));
    }
    if (shape != spec->shape) {
      return InvalidField(field + ".shape",
                          absl::StrCat("tensor '", name, "' must have shape ",
                                       ShapeString(spec->shape), ", got ", ShapeString(shape)));
    }
    it = tensors_.emplace(name, std::string()).first;
    it->second.reserve(spec->bytes());
  } else if ((!wire_dtype.empty() && wire_dtype != spec->wire_dtype) ||
             (!shape.empty() && shape != spec->shape)) {
    return InvalidField(field, absl::StrCat("a later chunk of '", name,
                                            "' changes its dtype or shape"));
  }
  std::string& buffer = it->second;
  if (offset != static_cast<int64_t>(buffer.size())) {
    return InvalidField(field + ".offset",
                        absl::StrCat("chunk of '", name, "' at offset ", offset, ", expected ",
                                     buffer.size(), " (chunks of a tensor arrive in order)"));
  }
  if (static_cast<int64_t>(buffer.size() + data.size()) > spec->bytes()) {
    return InvalidField(field, absl::StrCat("tensor '", name, "' would exceed its ", spec->bytes(),
                                            " bytes"));
  }
  bytes_received_ += static_cast<int64_t>(data.size());
  if (buffer.empty() && static_cast<int64_t>(data.size()) == spec->bytes()) {
    buffer = std::move(data);
  } else {
    buffer += data;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExpertSet>> ExpertsLoader::Finish() {
  for (const TensorSpec& t : expected_) {
    auto it = tensors_.find(t.name);
    const int64_t have = it == tensors_.end() ? 0 : static_cast<int64_t>(it->second.size());
    if (have != t.bytes()) {
      return InvalidField(absl::StrCat("chunk[", t.name, "]"),
                          absl::StrCat("tensor '", t.name, "' is incomplete: ", have, " of ",
                                       t.bytes(), " bytes received"));
    }
  }
  return std::make_unique<ExpertSet>(std::move(spec_), std::move(tensors_));
}

namespace {

// One tensor's entry in a safetensors header.
struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};

const char* SafetensorsDType(moe::MoeDType d) {
  switch (d) {
    case moe::MoeDType::kFloat32:
      return "F32";
    case moe::MoeDType::kFloat16:
      return "F16";
    case moe::MoeDType::kBFloat16:
      return "BF16";
    default:
      return "";
  }
}

class SafetensorsFile {
 public:
  ~SafetensorsFile() {
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Open(const std::string& path) {
    const std::string field = "safetensors.path";
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      return InvalidField(field, absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    struct stat st;
    fstat(fd_, &st);
    size_ = st.st_size;
    uint64_t header_len = 0;
    if (size_ < 8 || pread(fd_, &header_len, 8, 0) != 8 ||
        header_len > static_cast<uint64_t>(size_ - 8)) {
      return InvalidField(field, absl::StrCat(path, " is not a safetensors file or is truncated"));
    }
    std::string header(header_len, '\0');
    if (pread(fd_, header.data(), header_len, 8) != static_cast<ssize_t>(header_len)) {
      return InvalidField(field, absl::StrCat("cannot read the header of ", path));
    }
    data_start_ = 8 + static_cast<int64_t>(header_len);
    nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return InvalidField(field, absl::StrCat(path, ": header is not JSON"));
    for (auto& [name, v] : j.items()) {
      if (name == "__metadata__") continue;
      StEntry e;
      if (!v.is_object() || !v["dtype"].is_string() || !v["shape"].is_array() ||
          !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
        return InvalidField(field, absl::StrCat(path, ": bad header entry for ", name));
      }
      e.dtype = v["dtype"].get<std::string>();
      for (auto& d : v["shape"]) e.shape.push_back(d.get<int64_t>());
      e.begin = v["data_offsets"][0].get<int64_t>();
      e.end = v["data_offsets"][1].get<int64_t>();
      entries_[name] = e;
    }
    path_ = path;
    return absl::OkStatus();
  }

  // Reads tensor `name`, which must have `dtype` and `shape`, appending to `out`.
  absl::Status Read(const std::string& name, const char* dtype, const std::vector<int64_t>& shape,
                    std::string& out) {
    const std::string field = "safetensors";
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return InvalidField(field, absl::StrCat(path_, " has no tensor '", name, "'"));
    }
    const StEntry& e = it->second;
    if (e.dtype != dtype || e.shape != shape) {
      return InvalidField(field, absl::StrCat("tensor '", name, "' is ", e.dtype, " ",
                                              ShapeString(e.shape), ", expected ", dtype, " ",
                                              ShapeString(shape)));
    }
    const int64_t n = e.end - e.begin;
    if (e.begin < 0 || n < 0 || data_start_ + e.end > size_) {
      return InvalidField("safetensors.path",
                          absl::StrCat(path_, " is truncated: tensor '", name, "' ends at byte ",
                                       data_start_ + e.end, " of ", size_));
    }
    const size_t at = out.size();
    out.resize(at + n);
    if (pread(fd_, out.data() + at, n, data_start_ + e.begin) != n) {
      return absl::DataLossError(absl::StrCat("short read of '", name, "' from ", path_));
    }
    return absl::OkStatus();
  }

 private:
  int fd_ = -1;
  int64_t size_ = 0, data_start_ = 0;
  std::string path_;
  std::map<std::string, StEntry> entries_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertSet>> LoadSafetensors(const ExpertsSpec& spec,
                                                          const std::string& path,
                                                          const SafetensorsNames& names) {
  if (!spec.quant.scheme.empty() || spec.has_bias) {
    return InvalidField("safetensors", "safetensors loading takes plain float32/float16/bfloat16 "
                                       "weights without biases; send quantised experts inline");
  }
  const char* dtype = SafetensorsDType(spec.dtype);
  SafetensorsFile file;
  KPLAN_RETURN_IF_ERROR(file.Open(path));
  const int64_t e = spec.num_experts, h = spec.hidden, i = spec.intermediate;
  const bool gated = moe::IsGated(*moe::ParseMoeActivation(spec.activation));
  std::map<std::string, std::string> tensors;
  if (!names.w13.empty() || !names.w2.empty()) {
    if (names.w13.empty() || names.w2.empty()) {
      return InvalidField("safetensors.w13", "stacked weights need both w13 and w2 names");
    }
    KPLAN_RETURN_IF_ERROR(file.Read(names.w13, dtype, {e, gated ? 2 * i : i, h}, tensors["w13"]));
    KPLAN_RETURN_IF_ERROR(file.Read(names.w2, dtype, {e, h, i}, tensors["w2"]));
  } else {
    if (names.up_proj.empty() || names.down_proj.empty() || (gated && names.gate_proj.empty())) {
      return InvalidField("safetensors.gate_proj",
                          "per-expert weights need gate_proj (gated activations), up_proj and "
                          "down_proj names with {e} for the expert index");
    }
    auto expert_name = [](const std::string& pattern, int64_t index) {
      return absl::StrReplaceAll(pattern, {{"{e}", absl::StrCat(index)}});
    };
    for (int64_t x = 0; x < e; ++x) {
      if (gated) {  // w13[e] = [gate; up]
        KPLAN_RETURN_IF_ERROR(file.Read(expert_name(names.gate_proj, x), dtype, {i, h}, tensors["w13"]));
      }
      KPLAN_RETURN_IF_ERROR(file.Read(expert_name(names.up_proj, x), dtype, {i, h}, tensors["w13"]));
      KPLAN_RETURN_IF_ERROR(file.Read(expert_name(names.down_proj, x), dtype, {h, i}, tensors["w2"]));
    }
  }
  return std::make_unique<ExpertSet>(spec, std::move(tensors));
}

}  // namespace kplan
