#include "server/moe/shm_regions.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/moe/cuda_ipc.h"
#include "server/moe/shm_fault_guard.h"

namespace kplan {

ShmRegion::~ShmRegion() {
  if (device_ >= 0 && data_ != nullptr) CloseCudaIpcMemory(data_, device_, info_.cuda_ipc_handle);
  if (pinned_) UnpinHostMemory(map_);
  if (map_ != nullptr) {
    ShmUnguard(guard_);
    munmap(map_, map_bytes_);
  }
  if (fd_ >= 0) close(fd_);
}

absl::Status ShmRegion::CheckIntact() const {
  if (device_ >= 0) return absl::OkStatus();
  struct stat st;
  if (Lost() || fstat(fd_, &st) != 0 || st.st_size < info_.offset + info_.byte_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory region '", ClientText(info_.name), "' (", ClientText(info_.key),
                     ") was truncated below its window; register it again"));
  }
  return absl::OkStatus();
}

bool ShmRegion::Lost() const { return ShmMappingLost(guard_); }

absl::Status ShmView::CopyTo(void* dst) const {
  if (size == 0) return absl::OkStatus();
  if (device() >= 0) return CopyCudaToHost(dst, data, size, device());
  KPLAN_RETURN_IF_ERROR(region->CheckIntact());
  std::memcpy(dst, data, static_cast<size_t>(size));
  return absl::OkStatus();
}

bool ShmView::Overlaps(const ShmView& other) const {
  if (region == nullptr || other.region == nullptr || size == 0 || other.size == 0) return false;
  const ShmRegion& a = *region;
  const ShmRegion& b = *other.region;
  if (a.device() >= 0 || b.device() >= 0) return false;
  if (a.object_dev_ != b.object_dev_ || a.object_ino_ != b.object_ino_) return false;
  // Offsets in the object: the window's start plus the view's place in it.
  const int64_t at = a.info().offset + (data - a.data());
  const int64_t other_at = b.info().offset + (other.data - b.data());
  return at < other_at + other.size && other_at < at + size;
}

namespace {

absl::Status NotRegistered(const std::string& name, absl::string_view field) {
  return WithField(absl::NotFoundError(absl::StrCat("no shared-memory region '", ClientText(name),
                                                    "' is registered")),
                   field);
}

absl::Status AlreadyRegistered(const std::string& name) {
  return WithField(
      absl::AlreadyExistsError(absl::StrCat("a shared-memory region '", ClientText(name),
                                            "' is registered already; unregister it "
                                            "first")),
      "name");
}

}  // namespace

absl::Status ShmRegistry::CheckCudaRegion(const ShmRegionInfo& info) const {
  if (gpus_.empty()) {
    return WithField(absl::FailedPreconditionError(
                         "this server runs no GPU (built without CUDA, or started without "
                         "devices): CUDA IPC regions need one; register a POSIX region (key)"),
                     "cuda_ipc_handle");
  }
  if (std::find(gpus_.begin(), gpus_.end(), info.device_id) == gpus_.end()) {
    return WithField(absl::FailedPreconditionError(absl::StrCat(
                         "device_id ", info.device_id, " is not one of this server's GPUs (",
                         absl::StrJoin(gpus_, ", "), "); allocate the region on one of them")),
                     "device_id");
  }
  if (!info.key.empty()) {
    return InvalidField("key",
                        "a region is a POSIX object (key) or CUDA memory "
                        "(cuda_ipc_handle), not both");
  }
  if (info.offset != 0) {
    return InvalidField("offset",
                        "a CUDA region starts at its allocation; give offsets in the "
                        "tensor references");
  }
  if (info.byte_size <= 0) return InvalidField("byte_size", "byte_size must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ShmRegion>> ShmRegistry::OpenCudaRegion(
    const ShmRegionInfo& info) const {
  KPLAN_ASSIGN_OR_RETURN(const CudaIpcMemory mem,
                         OpenCudaIpcMemory(info.cuda_ipc_handle, info.device_id));
  std::shared_ptr<ShmRegion> region(new ShmRegion());
  region->info_ = info;
  region->data_ = static_cast<char*>(mem.base);
  region->device_ = info.device_id;  // closed with the region from here
  if (info.byte_size > mem.alloc_bytes) {
    return InvalidField("byte_size", absl::StrCat("byte_size ", info.byte_size,
                                                  " is past the end of the CUDA allocation (",
                                                  mem.alloc_bytes, " bytes)"));
  }
  return region;
}

absl::Status ShmRegistry::Insert(const std::string& name, std::shared_ptr<const ShmRegion> region) {
  std::lock_guard<std::mutex> lock(mu_);
  // Checked again: other calls may have registered meanwhile.
  if (regions_.size() >= max_regions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", max_regions_, " shared-memory regions, its most"));
  }
  if (!regions_.emplace(name, std::move(region)).second) return AlreadyRegistered(name);
  return absl::OkStatus();
}

absl::Status ShmRegistry::Register(const ShmRegionInfo& info) {
  if (info.name.empty()) return InvalidField("name", "the region needs a name");
  if (info.cuda()) {
    KPLAN_RETURN_IF_ERROR(CheckCudaRegion(info));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (regions_.count(info.name)) return AlreadyRegistered(info.name);
    }
    KPLAN_ASSIGN_OR_RETURN(std::shared_ptr<ShmRegion> region, OpenCudaRegion(info));
    return Insert(info.name, std::move(region));
  }
  const std::string& key = info.key;
  if (key.size() < 2 || key[0] != '/' || key.find('/', 1) != std::string::npos ||
      key.size() > 255) {
    return InvalidField("key", absl::StrCat("the shared-memory key must be '/name' (one leading "
                                            "slash, no other, at most 255 bytes), got '",
                                            ClientText(key), "'"));
  }
  if (!absl::StartsWith(key, kShmKeyPrefix)) {
    return InvalidField("key", absl::StrCat("this server maps only shared memory named '",
                                            kShmKeyPrefix, "...', got '", ClientText(key), "'"));
  }
  if (info.offset < 0) return InvalidField("offset", "offset must be >= 0");
  if (info.byte_size <= 0) return InvalidField("byte_size", "byte_size must be > 0");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.count(info.name)) return AlreadyRegistered(info.name);
    if (regions_.size() >= max_regions_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this server holds ", max_regions_, " shared-memory regions, its most"));
    }
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return WithField(
        absl::NotFoundError(absl::StrCat("cannot open shared memory '", ClientText(key),
                                         "': ", std::strerror(errno))),
        "key");
  }
  struct stat st;
  const bool sized = fstat(fd, &st) == 0;
  if (!sized || info.byte_size > st.st_size || info.offset > st.st_size - info.byte_size) {
    close(fd);
    return InvalidField(
        "byte_size", absl::StrCat("the window [", info.offset, ", ", info.offset, " + ",
                                  info.byte_size, ") is past the end of '", ClientText(key), "' (",
                                  sized ? st.st_size : 0, " bytes)"));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t start = info.offset / page * page;
  std::shared_ptr<ShmRegion> region(new ShmRegion());
  region->info_ = info;
  region->map_bytes_ = static_cast<size_t>(info.offset - start + info.byte_size);
  void* map = mmap(nullptr, region->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, start);
  const int mmap_errno = errno;
  region->fd_ = fd;  // closed with the region
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map shared memory '", ClientText(key),
                                                     "': ", std::strerror(mmap_errno)));
  }
  region->map_ = map;
  // A truncation that races a read or write faults harmlessly; a mapping
  // without a guard would take the server down with it, so none is kept.
  region->guard_ = ShmGuard(map, region->map_bytes_);
  if (region->guard_ < 0) {
    return absl::ResourceExhaustedError(
        "too many shared-memory mappings are alive (every fault guard is taken): unregister "
        "regions, and let the calls that still hold unregistered ones end");
  }
  region->data_ = static_cast<char*>(map) + (info.offset - start);
  region->object_dev_ = static_cast<uint64_t>(st.st_dev);
  region->object_ino_ = static_cast<uint64_t>(st.st_ino);
  // For the GPUs' copy engines; a refusal leaves the region unpinned (the
  // GPU path stages its bytes instead).
  if (!gpus_.empty()) region->pinned_ = PinHostMemory(map, region->map_bytes_);
  return Insert(info.name, std::move(region));
}

// The registry lets go of a region under its lock and the region goes
// (cudaHostUnregister, munmap: milliseconds for a large one) outside it, so
// that calls resolving other regions do not wait for it.
absl::Status ShmRegistry::Unregister(const std::string& name) {
  decltype(regions_)::mapped_type gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return NotRegistered(name, "name");
    }
    gone = std::move(it->second);
    regions_.erase(it);
  }
  return absl::OkStatus();
}

void ShmRegistry::UnregisterAll() {
  decltype(regions_) gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(regions_);
  }
}

std::vector<ShmRegionInfo> ShmRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ShmRegionInfo> out;
  for (const auto& [name, region] : regions_) out.push_back(region->info());
  return out;
}

absl::StatusOr<std::shared_ptr<const ShmRegion>> ShmRegistry::Find(const std::string& name,
                                                                   absl::string_view field) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) return NotRegistered(name, field);
  return it->second;
}

absl::StatusOr<ShmView> ShmRegistry::ResolveWindow(const std::string& name,
                                                   absl::string_view field) const {
  KPLAN_ASSIGN_OR_RETURN(std::shared_ptr<const ShmRegion> region, Find(name, field));
  KPLAN_RETURN_IF_ERROR(WithField(region->CheckIntact(), field));
  ShmView view;
  view.data = region->data();
  view.size = region->info().byte_size;
  view.region = std::move(region);
  return view;
}

absl::StatusOr<ShmView> ShmRegistry::Resolve(const std::string& name, int64_t offset,
                                             int64_t byte_size, absl::string_view field) const {
  KPLAN_ASSIGN_OR_RETURN(std::shared_ptr<const ShmRegion> region,
                         Find(name, absl::StrCat(field, ".region")));
  const int64_t window = region->info().byte_size;
  if (offset < 0 || offset > window) {
    return InvalidField(absl::StrCat(field, ".offset"),
                        absl::StrCat("offset ", offset, " is outside region '", ClientText(name),
                                     "' of ", window, " bytes"));
  }
  if (byte_size < 0 || byte_size > window - offset) {
    return InvalidField(
        absl::StrCat(field, ".byte_size"),
        absl::StrCat("[", offset, ", ", offset, " + ", byte_size, ") is past the end of region '",
                     ClientText(name), "' (", window, " bytes)"));
  }
  KPLAN_RETURN_IF_ERROR(WithField(region->CheckIntact(), absl::StrCat(field, ".region")));
  ShmView view;
  view.data = region->data() + offset;
  view.size = byte_size;
  view.region = std::move(region);
  return view;
}

}  // namespace kplan
