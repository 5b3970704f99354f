// Client-registered POSIX shared-memory regions, after Triton server's
// system shared-memory extension (issue #15, item 4): a sidecar or a
// co-located engine creates a shm object (shm_open), registers a window of
// it {key, offset, byte_size} under a name, and RunMoE tensors may then be
// {region, offset, byte_size} references into that window instead of inline
// bytes. This is the registry alone, without gRPC: the object is opened and
// mapped once at registration (never per call), every reference is
// bounds-checked against its region's window, and a region unregistered
// while a call still reads or writes it stays mapped until that call lets go
// (views hold it). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kplan {

// The server maps only objects named "/kplan...": never NCCL's segments or
// another program's memory, whatever a client names.
inline constexpr absl::string_view kShmKeyPrefix = "/kplan";

struct ShmRegionInfo {
  std::string name;       // the client's name of the region
  std::string key;        // the POSIX shm object: "/name" (one leading slash, no other)
  int64_t offset = 0;     // where the window starts in the object
  int64_t byte_size = 0;  // the window's length
};

// One mapped window; unmapped when the last holder lets go.
class ShmRegion {
 public:
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  const ShmRegionInfo& info() const { return info_; }
  char* data() const { return data_; }  // the window's first byte
  // FAILED_PRECONDITION when the object no longer covers the window (its
  // owner truncated it): touching the pages past its end would raise
  // SIGBUS. Checked before every copy in or out; a client that shrinks its
  // object during a copy still races it, which the API forbids.
  absl::Status CheckIntact() const;

 private:
  friend class ShmRegistry;
  ShmRegion() = default;
  ShmRegionInfo info_;
  int fd_ = -1;          // kept open for CheckIntact
  void* map_ = nullptr;  // the page-aligned mapping holding the window
  size_t map_bytes_ = 0;
  char* data_ = nullptr;
};

// Bytes [offset, offset + size) of a region, which stays mapped while the
// view lives.
struct ShmView {
  std::shared_ptr<const ShmRegion> region;
  char* data = nullptr;
  int64_t size = 0;
};

class ShmRegistry {
 public:
  explicit ShmRegistry(size_t max_regions = 256) : max_regions_(max_regions) {}

  // Opens and maps the window: INVALID_ARGUMENT naming the field for an
  // empty name, a key that is not "/name" or not under kShmKeyPrefix, a negative offset or size, a
  // window past the object's end; NOT_FOUND naming "key" for an object that
  // does not exist or cannot be opened; ALREADY_EXISTS naming "name" for a
  // name registered already; RESOURCE_EXHAUSTED past max_regions.
  absl::Status Register(const ShmRegionInfo& info);
  // NOT_FOUND naming "name" for an unknown name. Views already resolved
  // keep the window mapped.
  absl::Status Unregister(const std::string& name);
  // Every region gone (shutdown); views already resolved keep theirs.
  void UnregisterAll();
  std::vector<ShmRegionInfo> List() const;

  // The bounds-checked view [offset, offset + byte_size) of region `name`,
  // errors naming `<field>.region` (NOT_FOUND) or `<field>.offset` /
  // `<field>.byte_size` (INVALID_ARGUMENT: negative, or past the window).
  absl::StatusOr<ShmView> Resolve(const std::string& name, int64_t offset, int64_t byte_size,
                                  absl::string_view field) const;

 private:
  const size_t max_regions_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const ShmRegion>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kplan
