#include "server/moe/model_files.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/client_text.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kplan {
namespace {

std::optional<std::string> RealPath(const std::string& path) {
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return std::nullopt;
  std::string out(resolved);
  std::free(resolved);
  return out;
}

// Component-wise: /models/a is under /models, /models2/a is not.
bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path.size() > root.size() && absl::StartsWith(path, root) && path[root.size()] == '/';
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CanonicalModelRoots(absl::Span<const std::string> roots) {
  std::vector<std::string> out;
  for (const std::string& root : roots) {
    if (root.empty()) return InvalidField("model_root", "a --model_root is empty");
    std::optional<std::string> canonical = RealPath(root);
    if (!canonical) {
      return InvalidField("model_root", absl::StrCat("--model_root '", ClientText(root),
                                                     "': ", std::strerror(errno)));
    }
    struct stat st;
    if (stat(canonical->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidField("model_root",
                          absl::StrCat("--model_root '", ClientText(root), "' is not a directory"));
    }
    out.push_back(*std::move(canonical));
  }
  return out;
}

ModelFile::ModelFile(ModelFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), path_(std::move(other.path_)) {}

ModelFile& ModelFile::operator=(ModelFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
  }
  return *this;
}

ModelFile::~ModelFile() {
  if (fd_ >= 0) close(fd_);
}

absl::Status ModelFile::ReadAt(int64_t offset, int64_t n, char* out) const {
  while (n > 0) {
    const ssize_t got = pread(fd_, out, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)),
                              static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(absl::StrCat("short read at byte ", offset, " of ", size_, ": ",
                                              got < 0 ? std::strerror(errno) : "end of file"));
    }
    out += got;
    offset += got;
    n -= got;
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelFile> OpenModelFile(absl::string_view path, absl::Span<const std::string> roots,
                                        absl::string_view field) {
  if (roots.empty()) return WithField(absl::PermissionDeniedError(kServerSideLoadsOff), field);
  // One answer for every refusal, so the client learns nothing about paths
  // outside the roots; the reason is for the operator.
  auto refuse = [&](absl::string_view why) {
    spdlog::warn("server-side file '{}' refused: {}", ClientText(path), std::string(why));
    return WithField(absl::PermissionDeniedError(kNotUnderModelRoots), field);
  };
  std::vector<std::string> canonical_roots;
  for (const std::string& root : roots) {
    if (std::optional<std::string> r = RealPath(root)) canonical_roots.push_back(*std::move(r));
  }
  if (canonical_roots.empty()) return refuse("no --model_root resolves any more");
  if (path.empty()) return refuse("the path is empty");
  if (path.find('\0') != absl::string_view::npos) return refuse("the path holds a NUL byte");
  if (path.size() >= PATH_MAX) return refuse("the path is longer than PATH_MAX");
  const std::string given =
      path.front() == '/' ? std::string(path) : absl::StrCat(canonical_roots.front(), "/", path);

  // Resolve first (realpath opens nothing), so nothing outside the roots and
  // nothing but a regular file is ever opened: opening some devices has side
  // effects, and a FIFO would block.
  std::optional<std::string> canonical = RealPath(given);
  if (!canonical) return refuse(std::strerror(errno));
  if (std::none_of(canonical_roots.begin(), canonical_roots.end(),
                   [&](const std::string& root) { return IsUnder(*canonical, root); })) {
    return refuse(
        absl::StrCat("it resolves to '", ClientText(*canonical), "', outside the model roots"));
  }
  struct stat before;
  if (stat(canonical->c_str(), &before) != 0) return refuse(std::strerror(errno));
  if (!S_ISREG(before.st_mode)) return refuse("not a regular file");

  // A component may be swapped for a symlink between the check and the
  // open: O_NOFOLLOW covers the last one, the (dev, ino) match the others.
  // O_NONBLOCK keeps a FIFO swapped in from blocking open(); O_NOCTTY keeps
  // a terminal from becoming ours.
  ModelFile file;
  file.fd_ = open(canonical->c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
  if (file.fd_ < 0) return refuse(std::strerror(errno));
  struct stat st;
  if (fstat(file.fd_, &st) != 0) return refuse(std::strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_dev != before.st_dev || st.st_ino != before.st_ino) {
    return refuse("the file changed while it was opened");
  }
  // What was opened, as the kernel resolved it: a directory on the path
  // swapped for a symlink after the check would show here.
  std::optional<std::string> opened = RealPath(absl::StrCat("/proc/self/fd/", file.fd_));
  if (opened && std::none_of(canonical_roots.begin(), canonical_roots.end(),
                             [&](const std::string& root) { return IsUnder(*opened, root); })) {
    return refuse(
        absl::StrCat("the opened file is '", ClientText(*opened), "', outside the model roots"));
  }
  file.size_ = static_cast<int64_t>(st.st_size);
  file.path_ = *std::move(canonical);
  return file;
}

}  // namespace kplan
