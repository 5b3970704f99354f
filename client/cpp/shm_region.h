// A POSIX shared-memory region this process creates and registers with a
// server started with --allow_shared_memory, so RunMoE tensors travel by
// reference (Tensor.shm, RunMoERequest.output_shm) instead of in the
// messages: the CLI's `run-moe --shm` and kplan_perf's --shm. The object is
// "/kplan-<tag>-<pid>-<n>" (the server maps only "/kplan..." names) and the
// region's name its key without the slash. The destructor unregisters it
// (errors ignored: the server may be gone), unmaps and unlinks it, so every
// exit path that unwinds leaves nothing behind.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cpp/client.h"

namespace kplan {

class ClientShmRegion {
 public:
  // Creates, sizes and maps the object (`bytes` > 0), then registers it with
  // `client`'s server; on any failure nothing is left behind. `mode`: the
  // object's permissions, set whatever the umask (0600: this user only;
  // 0660 lets a server of another user in the object's group open it, as
  // in the sidecar pod, whose containers share the pod's fsGroup).
  static absl::StatusOr<std::unique_ptr<ClientShmRegion>> Create(Client& client, int64_t bytes,
                                                                 absl::string_view tag,
                                                                 mode_t mode = 0600);
  ~ClientShmRegion();
  ClientShmRegion(const ClientShmRegion&) = delete;
  ClientShmRegion& operator=(const ClientShmRegion&) = delete;

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  v1::SharedMemoryRef Ref(int64_t offset, int64_t bytes) const;
  // Copies `t`'s data to `offset` of the region and makes `t` a reference to
  // it (its data cleared); returns the offset past it, rounded up to 64.
  // OUT_OF_RANGE when the data does not fit the region at `offset`.
  absl::StatusOr<int64_t> Place(v1::Tensor* t, int64_t offset) const;

 private:
  ClientShmRegion() = default;
  Client* client_ = nullptr;  // null until registered
  std::string key_, name_;
  char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace kplan
