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
//
// A region may instead be CUDA device memory of the client's process
// (Triton's CUDA shared-memory extension): a cudaIpcMemHandle_t on one of
// the server's GPUs, opened once at registration (cuda_ipc.h) and closed
// when the last holder lets go; its views are device pointers, which the GPU
// path reads and writes device-to-device.
//
// RunMoE reads a POSIX view's hidden states in place and writes its output
// straight into the output window (server/moe/moe_runner.h, MoeRunInput). On
// a server with GPUs the mapping is also page-locked for them at
// registration (cudaHostRegister, when the driver allows it: pinned()), so
// the GPU path copies between it and the device by DMA, with no staging
// (calls small enough for a CUDA graph are staged still: gpu_graphs.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
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
  // CUDA device memory instead of key / offset: the client's
  // cudaIpcGetMemHandle bytes and the GPU the allocation is on.
  std::string cuda_ipc_handle;
  int device_id = 0;
  bool cuda() const { return !cuda_ipc_handle.empty(); }
};

// One mapped window; unmapped when the last holder lets go.
class ShmRegion {
 public:
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  const ShmRegionInfo& info() const { return info_; }
  char* data() const { return data_; }    // the window's first byte (device memory: device())
  int device() const { return device_; }  // the GPU of a CUDA region; -1 for host memory
  // A POSIX region whose mapping is page-locked for the server's GPUs
  // (cudaHostRegister succeeded at registration): they copy to and from it
  // by DMA. False for a CUDA region, on a server without GPUs, and where the
  // driver refused (the GPU path then stages the bytes).
  bool pinned() const { return pinned_; }
  // FAILED_PRECONDITION when the object no longer covers the window (its
  // owner truncated it): touching the pages past its end would raise
  // SIGBUS. Checked at every resolve, again before a path reads hidden
  // states in place and before the output is written. A client that
  // shrinks its object in between races it: the mapping is guarded
  // (shm_fault_guard.h), so the racing access sees zero pages instead of
  // ending the server, and the region is lost from then on. OK for a CUDA
  // region (its allocation stays while the server holds it open).
  absl::Status CheckIntact() const;
  // Whether the mapping faulted (truncated under a read) and now holds zero
  // pages: a cheap check for a thread that polls the region.
  bool Lost() const;

 private:
  friend class ShmRegistry;
  friend struct ShmView;  // Overlaps reads the object's identity
  ShmRegion() = default;
  ShmRegionInfo info_;
  int fd_ = -1;          // kept open for CheckIntact
  void* map_ = nullptr;  // the page-aligned mapping holding the window
  int guard_ = -1;       // its SIGBUS guard (shm_fault_guard.h)
  size_t map_bytes_ = 0;
  char* data_ = nullptr;
  int device_ = -1;  // CUDA region: data_ is the opened allocation on this GPU
  bool pinned_ = false;
  // The POSIX object (st_dev, st_ino): two registrations of one object, or
  // of two names of it, share it.
  uint64_t object_dev_ = 0, object_ino_ = 0;
};

// Bytes [offset, offset + size) of a region, which stays mapped while the
// view lives.
struct ShmView {
  std::shared_ptr<const ShmRegion> region;
  char* data = nullptr;
  int64_t size = 0;
  int device() const { return region->device(); }  // -1: host memory
  // Copies the view's bytes to host memory `dst` (CheckIntact first for a
  // POSIX region; a device-to-host copy for a CUDA one).
  absl::Status CopyTo(void* dst) const;
  // Whether the two views of POSIX regions share a byte of one object
  // (through the same registration or any other of that object). False for
  // CUDA regions and empty views.
  bool Overlaps(const ShmView& other) const;
};

class ShmRegistry {
 public:
  // `gpus`: the CUDA devices a CUDA region may be on (the server's).
  explicit ShmRegistry(size_t max_regions = 256, std::vector<int> gpus = {})
      : max_regions_(max_regions), gpus_(std::move(gpus)) {}

  // Opens and maps the window: INVALID_ARGUMENT naming the field for an
  // empty name, a key that is not "/name" or not under kShmKeyPrefix, a negative offset or size, a
  // window past the object's end; NOT_FOUND naming "key" for an object that
  // does not exist or cannot be opened; ALREADY_EXISTS naming "name" for a
  // name registered already; RESOURCE_EXHAUSTED past max_regions, or when no
  // SIGBUS guard is free (ShmGuard: 1024 mappings alive, unregistered ones
  // included while calls hold them).
  // A CUDA region (info.cuda()): FAILED_PRECONDITION naming
  // "cuda_ipc_handle" without GPUs, "device_id" for a GPU not the server's;
  // INVALID_ARGUMENT naming "key" / "offset" when they are set (the window
  // starts at the allocation; references give offsets), "cuda_ipc_handle"
  // for a handle the driver refuses, "byte_size" past the allocation;
  // ALREADY_EXISTS naming "cuda_ipc_handle" for an allocation open already;
  // UNIMPLEMENTED without CUDA in the build.
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
  // Region `name`'s whole window (a channel's, OpenShmChannel): NOT_FOUND
  // naming `field` for an unknown name.
  absl::StatusOr<ShmView> ResolveWindow(const std::string& name, absl::string_view field) const;

 private:
  absl::StatusOr<std::shared_ptr<const ShmRegion>> Find(const std::string& name,
                                                        absl::string_view field) const;
  absl::Status CheckCudaRegion(const ShmRegionInfo& info) const;
  absl::StatusOr<std::shared_ptr<ShmRegion>> OpenCudaRegion(const ShmRegionInfo& info) const;
  absl::Status Insert(const std::string& name, std::shared_ptr<const ShmRegion> region);

  const size_t max_regions_;
  const std::vector<int> gpus_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const ShmRegion>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kplan
