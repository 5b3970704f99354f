// Builds an ExpertSet from LoadExperts input: inline chunks (ExpertsLoader)
// or a safetensors file on the server host (LoadSafetensors). Everything is
// checked before anything is kept: unknown or missing tensors, wrong dtypes or
// shapes, chunks out of order or past the end, truncated or hostile files,
// files outside the server's model roots.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/moe/expert_set.h"

namespace kplan {

// Logs a large load's progress on the server, every tenth of its bytes
// (loads from 64 MiB): "LoadExperts 'id': 40% (410 MiB of 1.0 GiB) in 3.2s".
class LoadProgress {
 public:
  LoadProgress(std::string experts_id, int64_t total_bytes);
  void Add(int64_t bytes);

 private:
  std::string id_;
  int64_t total_ = 0, done_ = 0;
  int logged_tenths_ = 0;
  absl::Time start_;
};

class ExpertsLoader {
 public:
  // `spec` must have passed ValidateExpertsSpec.
  explicit ExpertsLoader(ExpertsSpec spec);

  // One chunk of tensor `name`: the first chunk of a tensor carries its dtype
  // (wire name) and shape; later chunks leave them empty. Chunks of a tensor
  // arrive in order (`offset` = bytes received so far).
  absl::Status AddChunk(const std::string& name, const std::string& wire_dtype,
                        const std::vector<int64_t>& shape, int64_t offset, std::string data);
  int64_t bytes_received() const { return bytes_received_; }
  int64_t bytes_expected() const { return bytes_expected_; }
  // All tensors complete: the set. Otherwise INVALID_ARGUMENT naming the first
  // missing or short tensor.
  absl::StatusOr<std::unique_ptr<ExpertSet>> Finish();

 private:
  ExpertsSpec spec_;
  std::vector<TensorSpec> expected_;
  std::map<std::string, std::string> tensors_;
  int64_t bytes_received_ = 0;
  int64_t bytes_expected_ = 0;
  LoadProgress progress_;
};

// Where the tensors are in a safetensors file: stacked names, or per-expert
// names with "{e}" for the expert index.
struct SafetensorsNames {
  std::string w13, w2;                        // stacked
  std::string gate_proj, up_proj, down_proj;  // per expert
};

// Reads the weights of `spec` (plain float32/float16/bfloat16 weights) from
// the safetensors file at `path`, which must be a regular file under one of
// `model_roots` (model_files.h: relative paths are relative to the first
// root; no roots: PERMISSION_DENIED, server-side loads are off). Errors name
// "safetensors.path" (or the tensor-name fields); the file's header is
// checked as a whole before any tensor is read (safetensors.h).
absl::StatusOr<std::unique_ptr<ExpertSet>> LoadSafetensors(
    const ExpertsSpec& spec, const std::string& path, const SafetensorsNames& names,
    absl::Span<const std::string> model_roots);

}  // namespace kplan
