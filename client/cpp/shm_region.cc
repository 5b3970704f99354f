#include "client/cpp/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kplan {

absl::StatusOr<std::unique_ptr<ClientShmRegion>> ClientShmRegion::Create(Client& client,
                                                                         int64_t bytes,
                                                                         absl::string_view tag,
                                                                         mode_t mode) {
  if (bytes <= 0) return absl::InvalidArgumentError("a shared-memory region needs bytes > 0");
  static std::atomic<int> counter{0};
  std::unique_ptr<ClientShmRegion> r(new ClientShmRegion());
  r->name_ = absl::StrCat("kplan-", tag, "-", getpid(), "-", counter++);
  const std::string key = absl::StrCat("/", r->name_);
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("shm_open ", key, ": ", std::strerror(errno)));
  }
  r->key_ = key;  // ours from here: unlinked with the region
  void* map = MAP_FAILED;
  if (fchmod(fd, mode) == 0 && ftruncate(fd, bytes) == 0) {
    map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  close(fd);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size or map ", r->key_, " (", bytes, " bytes): ", std::strerror(err)));
  }
  r->data_ = static_cast<char*>(map);
  r->size_ = bytes;
  v1::SharedMemoryRegion region;
  region.set_name(r->name_);
  region.set_key(r->key_);
  region.set_byte_size(bytes);
  KPLAN_RETURN_IF_ERROR(client.RegisterSharedMemory(region));  // ~ClientShmRegion unlinks
  r->client_ = &client;
  return r;
}

ClientShmRegion::~ClientShmRegion() {
  if (client_ != nullptr) (void)client_->UnregisterSharedMemory(name_);
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  if (!key_.empty()) shm_unlink(key_.c_str());
}

v1::SharedMemoryRef ClientShmRegion::Ref(int64_t offset, int64_t bytes) const {
  v1::SharedMemoryRef ref;
  ref.set_region(name_);
  ref.set_offset(offset);
  ref.set_byte_size(bytes);
  return ref;
}

absl::StatusOr<int64_t> ClientShmRegion::Place(v1::Tensor* t, int64_t offset) const {
  const int64_t n = static_cast<int64_t>(t->data().size());
  if (offset < 0 || offset > size_ || n > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(n, " bytes at offset ", offset,
                                              " do not fit the shared-memory region '", name_,
                                              "' of ", size_, " bytes"));
  }
  if (n > 0) std::memcpy(data_ + offset, t->data().data(), static_cast<size_t>(n));
  *t->mutable_shm() = Ref(offset, n);
  t->clear_data();
  return (offset + n + 63) / 64 * 64;
}

}  // namespace kplan
