#include "server/moe/expert_loader.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/checked_size.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/moe/model_files.h"
#include "server/moe/safetensors.h"
#include "spdlog/spdlog.h"

namespace kplan {

namespace {

int64_t TotalBytes(const std::vector<TensorSpec>& tensors) {
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.bytes();
  return total;
}

std::string Mib(int64_t bytes) {
  return bytes >= (int64_t{1} << 30) ? absl::StrFormat("%.1f GiB", bytes / double(1 << 30))
                                     : absl::StrFormat("%.0f MiB", bytes / double(1 << 20));
}

}  // namespace

LoadProgress::LoadProgress(std::string experts_id, std::vector<TensorSpec> tensors, int num_experts)
    : id_(std::move(experts_id)),
      tensors_(std::move(tensors)),
      num_experts_(num_experts),
      start_(absl::Now()),
      total_(TotalBytes(tensors_)),
      done_(tensors_.size(), 0) {}

void LoadProgress::Add(const std::string& name, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (tensors_[t].name == name) done_[t] += bytes;
  }
  done_bytes_ += bytes;
  if (total_ < (int64_t{64} << 20)) return;
  const int tenths = static_cast<int>(std::min<int64_t>(10, done_bytes_ * 10 / total_));
  if (tenths <= logged_tenths_) return;
  logged_tenths_ = tenths;
  spdlog::info("LoadExperts '{}': {}% ({} of {}) in {}", ClientText(id_), tenths * 10,
               Mib(done_bytes_), Mib(total_),
               absl::FormatDuration(absl::Trunc(absl::Now() - start_, absl::Milliseconds(100))));
}

LoadProgress::Done LoadProgress::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  Done d;
  d.bytes = done_bytes_;
  d.bytes_total = total_;
  d.experts_total = num_experts_;
  d.experts = num_experts_;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const int64_t per_expert = num_experts_ > 0 ? tensors_[t].bytes() / num_experts_ : 0;
    if (per_expert > 0) {
      d.experts = static_cast<int>(std::min<int64_t>(d.experts, done_[t] / per_expert));
    }
  }
  return d;
}

ExpertsLoader::ExpertsLoader(ExpertsSpec spec, std::shared_ptr<LoadProgress> progress)
    : spec_(std::move(spec)),
      expected_(ExpectedTensors(spec_)),
      progress_(progress ? std::move(progress)
                         : std::make_shared<LoadProgress>(spec_.experts_id, expected_,
                                                          spec_.num_experts)) {}

absl::Status ExpertsLoader::AddChunk(const std::string& name, const std::string& wire_dtype,
                                     const std::vector<int64_t>& shape, int64_t offset,
                                     std::string data) {
  const std::string field = absl::StrCat("chunk[", ClientText(name), "]");
  // Every message must move the load forward: empty chunks would keep a
  // reservation alive past the idle timeout without ever completing it.
  if (data.empty()) return InvalidField(field + ".data", "a chunk must carry data");
  const TensorSpec* spec = nullptr;
  std::vector<std::string> names;
  for (const TensorSpec& t : expected_) {
    names.push_back(t.name);
    if (t.name == name) spec = &t;
  }
  if (spec == nullptr) {
    return InvalidField(field, absl::StrCat("tensor '", ClientText(name),
                                            "' is not part of these experts; expected ",
                                            absl::StrJoin(names, ", ")));
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
                                       ShapeText(spec->shape), ", got ", ShapeText(shape)));
    }
    it = tensors_.emplace(name, std::string()).first;
    it->second.reserve(spec->bytes());
  } else if ((!wire_dtype.empty() && wire_dtype != spec->wire_dtype) ||
             (!shape.empty() && shape != spec->shape)) {
    return InvalidField(field,
                        absl::StrCat("a later chunk of '", name, "' changes its dtype or shape"));
  }
  std::string& buffer = it->second;
  if (offset != static_cast<int64_t>(buffer.size())) {
    return InvalidField(field + ".offset",
                        absl::StrCat("chunk of '", name, "' at offset ", offset, ", expected ",
                                     buffer.size(), " (chunks of a tensor arrive in order)"));
  }
  if (static_cast<int64_t>(buffer.size() + data.size()) > spec->bytes()) {
    return InvalidField(
        field, absl::StrCat("tensor '", name, "' would exceed its ", spec->bytes(), " bytes"));
  }
  progress_->Add(name, static_cast<int64_t>(data.size()));
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

const char* SafetensorsDType(kernels::DType d) {
  switch (d) {
    case kernels::DType::kFloat32:
      return "F32";
    case kernels::DType::kFloat16:
      return "F16";
    case kernels::DType::kBFloat16:
      return "BF16";
    default:
      return "";
  }
}

// A safetensors file under a model root with its header parsed and checked
// (safetensors.h): every entry read below lies inside the file and spans
// exactly its dtype and shape.
class SafetensorsFile {
 public:
  // `name` is how errors call the file (the client's path, escaped).
  absl::Status Open(const std::string& path, absl::Span<const std::string> model_roots,
                    std::string name) {
    KPLAN_ASSIGN_OR_RETURN(file_, OpenModelFile(path, model_roots, "safetensors.path"));
    name_ = std::move(name);
    char prefix[8] = {};
    const size_t have = file_.size() >= 8 ? 8 : 0;
    if (have > 0) KPLAN_RETURN_IF_ERROR(Content(file_.ReadAt(0, 8, prefix)));
    // The length is capped and checked against the file before the header
    // is allocated.
    absl::StatusOr<int64_t> header_bytes =
        SafetensorsHeaderLength(absl::string_view(prefix, have), file_.size());
    if (!header_bytes.ok()) return Content(header_bytes.status());
    std::string header(static_cast<size_t>(*header_bytes), '\0');
    KPLAN_RETURN_IF_ERROR(Content(file_.ReadAt(8, *header_bytes, header.data())));
    data_start_ = 8 + *header_bytes;
    absl::StatusOr<SafetensorsHeader> parsed =
        ParseSafetensorsHeader(header, file_.size() - data_start_);
    if (!parsed.ok()) return Content(parsed.status());
    header_ = *std::move(parsed);
    return absl::OkStatus();
  }

  // Appends tensor `name`, which must have `dtype` and `shape`, to `out`.
  absl::Status Read(const std::string& name, const char* dtype, const std::vector<int64_t>& shape,
                    std::string& out) {
    auto it = header_.tensors.find(name);
    if (it == header_.tensors.end()) {
      return InvalidField("safetensors",
                          absl::StrCat(name_, " has no tensor '", ClientText(name), "'"));
    }
    const SafetensorsEntry& e = it->second;
    if (e.dtype != dtype || e.shape != shape) {
      return InvalidField("safetensors", absl::StrCat("tensor '", ClientText(name), "' is ",
                                                      e.dtype, " ", ShapeText(e.shape),
                                                      ", expected ", dtype, " ", ShapeText(shape)));
    }
    const int64_t n = e.end - e.begin;  // the bytes of dtype x shape, checked by the parser
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n));
    return Content(file_.ReadAt(data_start_ + e.begin, n, out.data() + at));
  }

 private:
  // An error about the file's content: it names the request's path field
  // and the path as the client gave it.
  absl::Status Content(const absl::Status& status) const {
    if (status.ok()) return status;
    return WithField(absl::Status(status.code(), absl::StrCat(name_, ": ", status.message())),
                     "safetensors.path");
  }

  ModelFile file_;
  std::string name_;  // the client's path, escaped and shortened
  int64_t data_start_ = 0;
  SafetensorsHeader header_;
};

// What `safetensors.path` names: one file, or a sharded checkpoint's index
// (a path ending in ".index.json", e.g. model.safetensors.index.json) whose
// shards sit beside it, each opened under the model roots when a tensor of
// it is first read.
class SafetensorsCheckpoint {
 public:
  absl::Status Open(const std::string& path, absl::Span<const std::string> model_roots) {
    roots_.assign(model_roots.begin(), model_roots.end());
    name_ = ClientText(path);
    if (!absl::EndsWith(path, ".index.json")) return single_.Open(path, roots_, name_);
    KPLAN_ASSIGN_OR_RETURN(ModelFile file, OpenModelFile(path, roots_, "safetensors.path"));
    if (file.size() > kMaxSafetensorsIndexBytes) {
      return InvalidField("safetensors.path",
                          absl::StrCat(name_, ": an index of ", file.size(),
                                       " bytes is over the limit of ", kMaxSafetensorsIndexBytes));
    }
    std::string text(static_cast<size_t>(file.size()), '\0');
    absl::StatusOr<SafetensorsIndex> index = [&]() -> absl::StatusOr<SafetensorsIndex> {
      KPLAN_RETURN_IF_ERROR(file.ReadAt(0, file.size(), text.data()));
      return ParseSafetensorsIndex(text);
    }();
    if (!index.ok()) {
      return WithField(
          absl::Status(index.status().code(), absl::StrCat(name_, ": ", index.status().message())),
          "safetensors.path");
    }
    index_ = *std::move(index);
    // The canonical path's directory: the shards resolve beside the index
    // file itself, and OpenModelFile checks each against the roots again.
    directory_ = file.path().substr(0, file.path().rfind('/'));
    sharded_ = true;
    return absl::OkStatus();
  }

  // Appends tensor `name` of the file, which must have `dtype` and
  // `shape`, to the set's tensor `into` of `tensors`.
  absl::Status Read(const std::string& name, const char* dtype, const std::vector<int64_t>& shape,
                    const std::string& into, std::map<std::string, std::string>& tensors,
                    LoadProgress* progress) {
    std::string& out = tensors[into];
    const size_t before = out.size();
    KPLAN_RETURN_IF_ERROR(ReadFromFile(name, dtype, shape, out));
    if (progress != nullptr) progress->Add(into, static_cast<int64_t>(out.size() - before));
    return absl::OkStatus();
  }

 private:
  absl::Status ReadFromFile(const std::string& name, const char* dtype,
                            const std::vector<int64_t>& shape, std::string& out) {
    if (!sharded_) return single_.Read(name, dtype, shape, out);
    auto it = index_.weight_map.find(name);
    if (it == index_.weight_map.end()) {
      return InvalidField("safetensors",
                          absl::StrCat(name_, " has no tensor '", ClientText(name), "'"));
    }
    std::unique_ptr<SafetensorsFile>& shard = shards_[it->second];
    if (shard == nullptr) {
      auto opened = std::make_unique<SafetensorsFile>();
      KPLAN_RETURN_IF_ERROR(opened->Open(absl::StrCat(directory_, "/", it->second), roots_,
                                         absl::StrCat(name_, " shard ", ClientText(it->second))));
      shard = std::move(opened);
    }
    return shard->Read(name, dtype, shape, out);
  }

  std::vector<std::string> roots_;
  std::string name_;
  bool sharded_ = false;
  SafetensorsFile single_;
  SafetensorsIndex index_;
  std::string directory_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertSet>> LoadSafetensors(
    const ExpertsSpec& spec, const std::string& path, const SafetensorsNames& names,
    absl::Span<const std::string> model_roots, LoadProgress* progress) {
  if (!spec.quant.scheme.empty() || spec.has_bias) {
    return InvalidField("safetensors",
                        "safetensors loading takes plain float32/float16/bfloat16 "
                        "weights without biases; send quantised experts inline");
  }
  const char* dtype = SafetensorsDType(spec.dtype);
  SafetensorsCheckpoint file;
  KPLAN_RETURN_IF_ERROR(file.Open(path, model_roots));
  const int64_t e = spec.num_experts, h = spec.hidden, i = spec.intermediate;
  const bool gated = moe::IsGated(*moe::ParseMoeActivation(spec.activation));
  std::map<std::string, std::string> tensors;
  const std::vector<TensorSpec> expected = ExpectedTensors(spec);
  for (const TensorSpec& t : expected) tensors[t.name].reserve(t.bytes());
  LoadProgress own(spec.experts_id, expected, spec.num_experts);
  if (progress == nullptr) progress = &own;
  auto read = [&](const std::string& name, std::vector<int64_t> shape, const char* into) {
    return file.Read(name, dtype, shape, into, tensors, progress);
  };
  if (!names.w13.empty() || !names.w2.empty()) {
    if (names.w13.empty() || names.w2.empty()) {
      return InvalidField("safetensors.w13", "stacked weights need both w13 and w2 names");
    }
    KPLAN_RETURN_IF_ERROR(read(names.w13, {e, gated ? 2 * i : i, h}, "w13"));
    KPLAN_RETURN_IF_ERROR(read(names.w2, {e, h, i}, "w2"));
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
        KPLAN_RETURN_IF_ERROR(read(expert_name(names.gate_proj, x), {i, h}, "w13"));
      }
      KPLAN_RETURN_IF_ERROR(read(expert_name(names.up_proj, x), {i, h}, "w13"));
      KPLAN_RETURN_IF_ERROR(read(expert_name(names.down_proj, x), {h, i}, "w2"));
    }
  }
  return std::make_unique<ExpertSet>(spec, std::move(tensors));
}

}  // namespace kplan
