// ShmRegistry on real POSIX shared memory: registration checks, bounds-
// checked views, unregistering while a view is held, shutdown.
#include "server/moe/shm_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/moe/cuda_ipc.h"
#include "server/moe/shm_fault_guard.h"

namespace kplan {
namespace {

// A shm object of `bytes` bytes filled with 0, 1, 2, ... (mod 256), removed
// (shm_unlink) with the fixture; mappings made meanwhile stay valid.
class ShmRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = absl::StrCat("/kplan-shm-test-", getpid(), "-", counter_++);
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(ftruncate(fd, kBytes), 0);
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    for (int64_t i = 0; i < kBytes; ++i) static_cast<unsigned char*>(p)[i] = i % 256;
    client_ = static_cast<unsigned char*>(p);
    close(fd);
  }
  void TearDown() override {
    if (client_ != nullptr) munmap(client_, kBytes);
    shm_unlink(key_.c_str());
  }
  ShmRegionInfo Info(const std::string& name, int64_t offset, int64_t size) const {
    return ShmRegionInfo{name, key_, offset, size, "", 0};
  }

  static constexpr int64_t kBytes = 3 * 4096 + 100;
  static inline int counter_ = 0;
  std::string key_;
  unsigned char* client_ = nullptr;
};

// Only "/kplan..." objects are mapped: never NCCL's segments or another
// program's, whatever the client names.
TEST_F(ShmRegistryTest, OnlyKplanNamedObjectsAreMapped) {
  ShmRegistry shm;
  for (const char* key : {"/nccl-shm-0", "/dev-shm", "/kpla"}) {
    SCOPED_TRACE(key);
    const absl::Status s = shm.Register(ShmRegionInfo{"r", key, 0, 16, "", 0});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(FieldOf(s).value_or(""), "key");
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("/kplan..."));
  }
  EXPECT_TRUE(shm.List().empty());
}

// Every mapping the server keeps has a fault guard: with all of them taken
// (1024, process-wide; a client could keep that many alive by unregistering
// regions that queued calls still hold) a registration is refused,
// RESOURCE_EXHAUSTED, instead of mapping a window whose truncation would
// raise SIGBUS unguarded. Once a guard is free it registers again.
TEST_F(ShmRegistryTest, NoMappingWithoutAFaultGuard) {
  char page[64];
  std::vector<int> taken;
  for (int slot = ShmGuard(page, sizeof(page)); slot >= 0; slot = ShmGuard(page, sizeof(page))) {
    taken.push_back(slot);
  }
  ShmRegistry shm;
  const absl::Status refused = shm.Register(Info("r", 0, 4096));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(shm.List().empty());
  ASSERT_FALSE(taken.empty());
  ShmUnguard(taken.back());
  taken.pop_back();
  EXPECT_TRUE(shm.Register(Info("r", 0, 4096)).ok());
  for (int slot : taken) ShmUnguard(slot);
}

// An object its owner truncates below the window is refused before any copy
// (touching the pages past its end would raise SIGBUS in the server).
TEST_F(ShmRegistryTest, TruncatedObjectIsRefusedNotTouched) {
  ShmRegistry shm;
  ASSERT_TRUE(shm.Register(Info("in", 4096, 8000)).ok());
  ASSERT_TRUE(shm.Resolve("in", 0, 8000, "x").ok());
  const int fd = shm_open(key_.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096 + 100), 0);
  close(fd);
  absl::StatusOr<ShmView> v = shm.Resolve("in", 0, 10, "x");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition) << v.status();
  EXPECT_EQ(FieldOf(v.status()).value_or(""), "x.region");
  EXPECT_THAT(std::string(v.status().message()), ::testing::HasSubstr("truncated"));
}

// A truncation that races a read past the checks (a view already
// resolved) faults harmlessly: the server's mapping turns into zero pages,
// the region is lost, and nothing else of the process is touched.
TEST_F(ShmRegistryTest, TruncationUnderAReadIsNoCrash) {
  ShmRegistry shm;
  ASSERT_TRUE(shm.Register(Info("in", 4096, 8000)).ok());
  absl::StatusOr<ShmView> v = shm.Resolve("in", 0, 8000, "x");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(static_cast<unsigned char>(v->data[7000]), (4096 + 7000) % 256);
  EXPECT_FALSE(v->region->Lost());
  munmap(client_, kBytes);  // the test's own mapping is not guarded
  client_ = nullptr;
  const int fd = shm_open(key_.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  volatile char* p = v->data;
  EXPECT_EQ(p[7000], 0);  // SIGBUS without the guard
  p[10] = 42;             // a write lands in the private zero page
  EXPECT_TRUE(v->region->Lost());
  EXPECT_EQ(v->region->CheckIntact().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v->CopyTo(std::string(8000, 'x').data()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shm.Unregister("in").ok());
}

TEST_F(ShmRegistryTest, ViewsAreBoundsCheckedAgainstTheWindow) {
  ShmRegistry shm;
  // A window that starts inside a page: the server maps the page around it.
  ASSERT_TRUE(shm.Register(Info("in", 5000, 2000)).ok());
  absl::StatusOr<ShmView> v = shm.Resolve("in", 10, 100, "hidden_states");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->size, 100);
  EXPECT_EQ(static_cast<unsigned char>(v->data[0]), (5000 + 10) % 256);
  // The whole window, and an empty view at its end.
  EXPECT_TRUE(shm.Resolve("in", 0, 2000, "x").ok());
  EXPECT_TRUE(shm.Resolve("in", 2000, 0, "x").ok());
  struct Case {
    int64_t offset, size;
    std::string field;
  };
  for (const Case& c :
       {Case{2001, 0, "x.offset"}, Case{-1, 1, "x.offset"}, Case{1000, 1001, "x.byte_size"},
        Case{0, -5, "x.byte_size"}, Case{1, INT64_MAX, "x.byte_size"}}) {
    SCOPED_TRACE(absl::StrCat(c.offset, "+", c.size));
    absl::StatusOr<ShmView> bad = shm.Resolve("in", c.offset, c.size, "x");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_EQ(FieldOf(bad.status()).value_or(""), c.field);
  }
  absl::StatusOr<ShmView> unknown = shm.Resolve("out", 0, 1, "output");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FieldOf(unknown.status()).value_or(""), "output.region");
  // Writes through a view reach the client's mapping.
  v->data[0] = 42;
  EXPECT_EQ(client_[5010], 42);
}

TEST_F(ShmRegistryTest, RegistrationIsChecked) {
  ShmRegistry shm(/*max_regions=*/2);
  struct Case {
    ShmRegionInfo info;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {Info("", 0, 10), absl::StatusCode::kInvalidArgument, "name"},
      {ShmRegionInfo{"a", "no-slash", 0, 10, "", 0}, absl::StatusCode::kInvalidArgument, "key"},
      {ShmRegionInfo{"a", "/a/b", 0, 10, "", 0}, absl::StatusCode::kInvalidArgument, "key"},
      {ShmRegionInfo{"a", key_ + "-missing", 0, 10, "", 0}, absl::StatusCode::kNotFound, "key"},
      {Info("a", -1, 10), absl::StatusCode::kInvalidArgument, "offset"},
      {Info("a", 0, 0), absl::StatusCode::kInvalidArgument, "byte_size"},
      {Info("a", 100, kBytes), absl::StatusCode::kInvalidArgument, "byte_size"},
      {Info("a", INT64_MAX, 1), absl::StatusCode::kInvalidArgument, "byte_size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.info.key + " " + c.info.name);
    absl::Status s = shm.Register(c.info);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(FieldOf(s).value_or(""), c.field) << s;
  }
  EXPECT_TRUE(shm.List().empty());
  ASSERT_TRUE(shm.Register(Info("a", 0, kBytes)).ok());
  EXPECT_EQ(shm.Register(Info("a", 0, 10)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(shm.Register(Info("b", 4096, 10)).ok());
  EXPECT_EQ(shm.Register(Info("c", 0, 10)).code(), absl::StatusCode::kResourceExhausted);
  std::vector<ShmRegionInfo> list = shm.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1].name, "b");
  EXPECT_EQ(list[1].offset, 4096);
  EXPECT_EQ(list[1].byte_size, 10);
}

TEST_F(ShmRegistryTest, UnregisterWhileInUseKeepsTheViewMapped) {
  ShmRegistry shm;
  ASSERT_TRUE(shm.Register(Info("r", 0, kBytes)).ok());
  absl::StatusOr<ShmView> held = shm.Resolve("r", 8192, 16, "x");
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(shm.Unregister("r").ok());
  EXPECT_EQ(shm.Unregister("r").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shm.Resolve("r", 0, 1, "x").status().code(), absl::StatusCode::kNotFound);
  // The call that resolved it still reads and writes its bytes.
  EXPECT_EQ(static_cast<unsigned char>(held->data[1]), (8192 + 1) % 256);
  held->data[1] = 7;
  EXPECT_EQ(client_[8193], 7);
  // The name registers again; shutdown drops every region.
  ASSERT_TRUE(shm.Register(Info("r", 0, 64)).ok());
  ASSERT_TRUE(shm.Register(Info("s", 64, 64)).ok());
  shm.UnregisterAll();
  EXPECT_TRUE(shm.List().empty());
  EXPECT_EQ(static_cast<unsigned char>(held->data[2]), (8192 + 2) % 256);
}

// Overlap is of the object's bytes, whichever registrations the views come
// through (RunMoE writes an output window overlapping its input only after
// the run).
TEST_F(ShmRegistryTest, ViewsOverlapByTheObjectsBytes) {
  ShmRegistry shm;
  ASSERT_TRUE(shm.Register(Info("a", 0, 8192)).ok());
  ASSERT_TRUE(shm.Register(Info("b", 4096, 8192)).ok());  // a's second page is b's first
  const auto view = [&](const char* region, int64_t offset, int64_t size) {
    absl::StatusOr<ShmView> v = shm.Resolve(region, offset, size, "x");
    EXPECT_TRUE(v.ok()) << v.status();
    return *v;
  };
  const ShmView a = view("a", 4000, 200);  // object bytes [4000, 4200)
  EXPECT_TRUE(a.Overlaps(a));
  EXPECT_TRUE(a.Overlaps(view("a", 4199, 1)));
  EXPECT_FALSE(a.Overlaps(view("a", 4200, 100)));
  EXPECT_TRUE(a.Overlaps(view("b", 0, 1)));  // object byte 4096, through b
  EXPECT_TRUE(view("b", 100, 8).Overlaps(a));
  EXPECT_FALSE(a.Overlaps(view("b", 104, 8)));   // object bytes [4200, 4208)
  EXPECT_FALSE(a.Overlaps(view("a", 4100, 0)));  // empty
  // Another object at the same offsets shares nothing.
  const std::string other = key_ + "-other";
  const int fd = shm_open(other.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  close(fd);
  absl::Status added = shm.Register(ShmRegionInfo{"c", other, 0, 8192, "", 0});
  shm_unlink(other.c_str());  // mapped already
  ASSERT_TRUE(added.ok()) << added;
  EXPECT_FALSE(a.Overlaps(view("c", 4000, 200)));
}

// CUDA IPC regions (the real handle's path is the GPU test,
// tests/rpc/gpu_ipc_test.cc): refused clearly without GPUs, and their fields
// checked before any handle is opened.
TEST(ShmRegistryCudaTest, CudaRegionsNeedAGpuAndWellFormedFields) {
  const std::string handle(kCudaIpcHandleBytes, '\x01');
  const ShmRegionInfo cuda{"g", "", 0, 1024, handle, 0};
  ShmRegistry cpu_only;
  absl::Status s = cpu_only.Register(cuda);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "cuda_ipc_handle");
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("no GPU"));

  ShmRegistry gpu(8, {0, 1});
  struct Case {
    ShmRegionInfo info;
    absl::StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {{"g", "", 0, 1024, handle, 2}, absl::StatusCode::kFailedPrecondition, "device_id"},
      {{"g", "/kplan-x", 0, 1024, handle, 0}, absl::StatusCode::kInvalidArgument, "key"},
      {{"g", "", 64, 1024, handle, 0}, absl::StatusCode::kInvalidArgument, "offset"},
      {{"g", "", 0, 0, handle, 0}, absl::StatusCode::kInvalidArgument, "byte_size"},
      {{"", "", 0, 1024, handle, 0}, absl::StatusCode::kInvalidArgument, "name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    s = gpu.Register(c.info);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(FieldOf(s).value_or(""), c.field);
  }
#if !KPLAN_HAVE_CUDA
  // A well-formed registration reaches the opener, which this build lacks.
  s = gpu.Register(cuda);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("without CUDA"));
#endif
  EXPECT_TRUE(gpu.List().empty());
}

}  // namespace
}  // namespace kplan
