// Server-side files a request may name (LoadExperts from a safetensors path)
// are opened only under the --model_root directories, only when they are
// regular files, and without ever blocking: a client must not read
// /etc/shadow, /proc/self/mem or a device through the server, nor park a
// worker in open() on a FIFO, nor learn whether a path outside the roots
// exists. Every such refusal gives the client one text (kNotUnderModelRoots)
// and the server log the reason.
//
// Paths: an absolute path must resolve (symlinks and ".." followed) to a file
// under one of the roots; a relative path is taken relative to the first root
// and must resolve under a root too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kplan {

// What the client reads for every path refused below (outside the roots,
// missing, unreadable, not a regular file).
inline constexpr absl::string_view kNotUnderModelRoots =
    "not a readable regular file under the model roots";
// What the client reads when the server has no --model_root.
inline constexpr absl::string_view kServerSideLoadsOff =
    "server-side loads are off: start the server with --model_root";

// The roots as canonical absolute paths (realpath), each an existing
// directory: INVALID_ARGUMENT naming "model_root" otherwise. For startup.
absl::StatusOr<std::vector<std::string>> CanonicalModelRoots(absl::Span<const std::string> roots);

// An open regular file under a model root; closes on destruction.
class ModelFile {
 public:
  ModelFile() = default;
  ModelFile(ModelFile&& other) noexcept;
  ModelFile& operator=(ModelFile&& other) noexcept;
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;
  ~ModelFile();

  int64_t size() const { return size_; }
  // The canonical path that was opened (under a root).
  const std::string& path() const { return path_; }
  // Reads exactly `n` bytes at `offset` into `out` (looping over short reads
  // and EINTR; pread returns at most ~2 GiB per call). DATA_LOSS if the file
  // ends first, e.g. because it was truncated since it was opened. pread,
  // not mmap: the bytes are copied into the ExpertSet either way (one copy
  // each), and touching a mapping of a file truncated meanwhile raises
  // SIGBUS, which would take the server down instead of failing the load.
  absl::Status ReadAt(int64_t offset, int64_t n, char* out) const;

 private:
  friend absl::StatusOr<ModelFile> OpenModelFile(absl::string_view, absl::Span<const std::string>,
                                                 absl::string_view);
  int fd_ = -1;
  int64_t size_ = 0;
  std::string path_;
};

// Opens `path` read-only under `roots` (as given to the server; they are
// canonicalised here, a root that no longer resolves is skipped). Errors name
// `field`: PERMISSION_DENIED kServerSideLoadsOff without roots,
// PERMISSION_DENIED kNotUnderModelRoots for every refused path.
absl::StatusOr<ModelFile> OpenModelFile(absl::string_view path, absl::Span<const std::string> roots,
                                        absl::string_view field);

}  // namespace kplan
