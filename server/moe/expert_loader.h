// Builds an ExpertSet from LoadExperts input: inline chunks (ExpertsLoader)
// or a safetensors file on the server host (LoadSafetensors). Everything is
// checked before anything is kept: unknown or missing tensors, wrong dtypes or
// shapes, chunks out of order or past the end, truncated or hostile files,
// files outside the server's model roots.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/moe/expert_set.h"

namespace kplan {

// How far one load has come: the bytes of each expected tensor received
// (streamed) or read (a safetensors file on the server), so that another
// thread (ListExperts) can ask for the bytes and the experts done while the
// loader adds to it. Also logs a large load (from 64 MiB) every tenth of its
// bytes: "LoadExperts 'id': 40% (410 MiB of 1.0 GiB) in 3.2s". Thread-safe.
class LoadProgress {
 public:
  // `tensors` are the set's (ExpectedTensors), each [num_experts, ...].
  LoadProgress(std::string experts_id, std::vector<TensorSpec> tensors, int num_experts);
  // `bytes` more of tensor `name`.
  void Add(const std::string& name, int64_t bytes);

  struct Done {
    int64_t bytes = 0, bytes_total = 0;
    // Experts whose rows of every tensor are complete (tensors fill in
    // expert order, whatever the source's layout).
    int experts = 0, experts_total = 0;
  };
  Done done() const;

 private:
  const std::string id_;
  const std::vector<TensorSpec> tensors_;
  const int num_experts_;
  const absl::Time start_;
  int64_t total_ = 0;
  mutable std::mutex mu_;
  std::vector<int64_t> done_ ABSL_GUARDED_BY(mu_);  // per tensor
  int64_t done_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int logged_tenths_ ABSL_GUARDED_BY(mu_) = 0;
};

class ExpertsLoader {
 public:
  // `spec` must have passed ValidateExpertsSpec. `progress` (null: the
  // loader's own) counts what arrives.
  explicit ExpertsLoader(ExpertsSpec spec, std::shared_ptr<LoadProgress> progress = nullptr);

  // One chunk of tensor `name`: the first chunk of a tensor carries its dtype
  // (wire name) and shape; later chunks leave them empty. Chunks of a tensor
  // arrive in order (`offset` = bytes received so far).
  absl::Status AddChunk(const std::string& name, const std::string& wire_dtype,
                        const std::vector<int64_t>& shape, int64_t offset, std::string data);
  // All tensors complete: the set. Otherwise INVALID_ARGUMENT naming the first
  // missing or short tensor.
  absl::StatusOr<std::unique_ptr<ExpertSet>> Finish();

 private:
  ExpertsSpec spec_;
  std::vector<TensorSpec> expected_;
  std::map<std::string, std::string> tensors_;
  std::shared_ptr<LoadProgress> progress_;
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
// checked as a whole before any tensor is read (safetensors.h). `progress`
// (may be null) counts the bytes read.
absl::StatusOr<std::unique_ptr<ExpertSet>> LoadSafetensors(
    const ExpertsSpec& spec, const std::string& path, const SafetensorsNames& names,
    absl::Span<const std::string> model_roots, LoadProgress* progress = nullptr);

}  // namespace kplan
