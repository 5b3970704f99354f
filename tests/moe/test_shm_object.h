// A POSIX shared-memory object as a test's client makes one: created under
// "/kplan-<tag>-<pid>-<n>" (the server maps only /kplan... objects), of
// `bytes` bytes filled with `fill`, mapped for the test (the client's view),
// unmapped and unlinked with the object (mappings the server made stay).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kplan {

class TestShmObject {
 public:
  TestShmObject(const std::string& tag, int64_t bytes, char fill = 0) : bytes_(bytes) {
    static int counter = 0;
    key_ = absl::StrCat("/kplan-", tag, "-", getpid(), "-", counter++);
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    if (fd < 0) return;
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(p, MAP_FAILED);
    if (p == MAP_FAILED) return;
    data_ = static_cast<char*>(p);
    std::memset(data_, fill, bytes);
  }
  ~TestShmObject() {
    if (data_ != nullptr) munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  TestShmObject(const TestShmObject&) = delete;
  TestShmObject& operator=(const TestShmObject&) = delete;

  const std::string& key() const { return key_; }
  char* data() const { return data_; }  // null when creating it failed (the test failed too)
  // What its owner may do to it meanwhile; the test's mapping reads only
  // below the new size from here.
  void Truncate(int64_t bytes) const {
    const int fd = shm_open(key_.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    close(fd);
  }

 private:
  std::string key_;
  int64_t bytes_;
  char* data_ = nullptr;
};

}  // namespace kplan
