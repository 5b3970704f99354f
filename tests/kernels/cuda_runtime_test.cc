// The CUDA runtime module's host-side contract (kernels/cuda/runtime/), on
// any machine with the toolkit: the CUDA / NCCL error mapping (out of memory
// is RESOURCE_EXHAUSTED, with file:line, the call and the library's error
// string), the RETURN_IF_ERROR macros, arena layouts, empty owners and a
// device fact of no device. None
// of it needs a device: cudaGetErrorString is a table lookup and nothing here
// allocates. cuda_runtime_gpu_test covers the allocations themselves.
#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "f.cc", 1, "cudaMalloc(&p, n)").ok());
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  const absl::Status st = CudaStatus(cudaErrorMemoryAllocation, "gpu.cc", 42, "cudaMalloc(&p, n)");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(), std::string("gpu.cc:42: cudaMalloc(&p, n): ") +
                              cudaGetErrorString(cudaErrorMemoryAllocation));
  EXPECT_THAT(std::string(st.message()), HasSubstr("out of memory"));
}

TEST(CudaStatusTest, OtherErrorsAreInternal) {
  for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorIllegalAddress, cudaErrorLaunchFailure,
                        cudaErrorNoDevice, cudaErrorInsufficientDriver}) {
    const absl::Status st = CudaStatus(e, "k.cu", 7, "what");
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << cudaGetErrorName(e);
    EXPECT_EQ(st.message(), std::string("k.cu:7: what: ") + cudaGetErrorString(e));
  }
}

absl::Status ReturnsThrough(cudaError_t e, bool* after) {
  KPLAN_CUDA_RETURN_IF_ERROR(e);
  *after = true;
  return absl::OkStatus();
}

TEST(CudaStatusTest, ReturnIfErrorReturnsTheMappedStatus) {
  bool after = false;
  EXPECT_TRUE(ReturnsThrough(cudaSuccess, &after).ok());
  EXPECT_TRUE(after);

  after = false;
  const absl::Status st = ReturnsThrough(cudaErrorMemoryAllocation, &after);
  EXPECT_FALSE(after);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  // file:line of the macro's use and the expression as written.
  EXPECT_THAT(std::string(st.message()), StartsWith(__FILE__));
  EXPECT_THAT(std::string(st.message()), HasSubstr(": e: out of memory"));

  EXPECT_EQ(ReturnsThrough(cudaErrorInvalidValue, &after).code(), absl::StatusCode::kInternal);
}

TEST(NcclStatusCodeTest, OneTable) {
  // ncclResult_t values: 0 success, 1 unhandled CUDA error, 2 system error,
  // 3 internal error, 4 invalid argument, 5 invalid usage, 6 remote error,
  // 7 in progress.
  EXPECT_EQ(NcclStatusCode(0, ""), absl::StatusCode::kOk);
  EXPECT_EQ(NcclStatusCode(1, ""), absl::StatusCode::kInternal);
  EXPECT_EQ(NcclStatusCode(2, "Failed to open /dev/shm/nccl-x"), absl::StatusCode::kInternal);
  EXPECT_EQ(NcclStatusCode(3, "out of memory"), absl::StatusCode::kInternal);
  EXPECT_EQ(NcclStatusCode(4, ""), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatusCode(5, ""), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatusCode(6, ""), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatusCode(7, ""), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatusCode(99, ""), absl::StatusCode::kInternal);
}

TEST(NcclStatusCodeTest, OutOfMemoryIsResourceExhausted) {
  EXPECT_EQ(NcclStatusCode(1, "Cuda failure 2 'out of memory'"),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(NcclStatusCode(2, "Call to cuMemCreate failed: Out of memory"),
            absl::StatusCode::kResourceExhausted);
}

#if KPLAN_HAVE_NCCL
absl::Status NcclReturnsThrough(int result) {
  KPLAN_NCCL_RETURN_IF_ERROR(result);
  return absl::OkStatus();
}

TEST(NcclStatusTest, CarriesFileLineAndNcclText) {
  EXPECT_TRUE(NcclStatus(0, "c.cc", 3, "ncclAllGather(...)").ok());
  const absl::Status st = NcclStatus(4, "c.cc", 3, "ncclAllGather(...)");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), StartsWith("c.cc:3: ncclAllGather(...): "));
  EXPECT_THAT(std::string(st.message()), HasSubstr("invalid argument"));
  EXPECT_EQ(NcclStatus(6, "c.cc", 3, "x").code(), absl::StatusCode::kUnavailable);

  EXPECT_TRUE(NcclReturnsThrough(0).ok());
  const absl::Status through = NcclReturnsThrough(5);
  EXPECT_EQ(through.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(through.message()), StartsWith(__FILE__));
  EXPECT_THAT(std::string(through.message()), HasSubstr(": result: "));
}
#endif

TEST(DeviceArenaTest, LayoutIs256ByteAligned) {
  int64_t total = 0;
  EXPECT_EQ(ReserveAligned(&total, 1), 0);
  EXPECT_EQ(ReserveAligned(&total, 256), 256);
  EXPECT_EQ(ReserveAligned(&total, 257), 512);
  EXPECT_EQ(total, 1024);
  EXPECT_EQ(ReserveAligned(&total, 0), 1024);
  EXPECT_EQ(total, 1024);

  DeviceArena arena;  // nothing is allocated before Allocate
  EXPECT_EQ(arena.Reserve(10), 0);
  EXPECT_EQ(arena.Reserve(300), 256);
  EXPECT_EQ(arena.Reserve(1), 768);
  EXPECT_EQ(arena.size(), 1024);
  EXPECT_EQ(arena.capacity(), 0);
  EXPECT_EQ(arena.base(), nullptr);
  arena.Clear();
  EXPECT_EQ(arena.size(), 0);
  EXPECT_EQ(arena.Reserve(5), 0);
}

TEST(DeviceArenaTest, EmptyLayoutAllocatesNothing) {
  DeviceArena arena(/*stream=*/nullptr);
  EXPECT_TRUE(arena.Allocate().ok());
  EXPECT_EQ(arena.base(), nullptr);
  EXPECT_EQ(arena.capacity(), 0);
}

TEST(OwnersTest, EmptyOwnersReleaseNothing) {
  DeviceBuffer plain;
  EXPECT_TRUE(plain.Reserve(0).ok());
  EXPECT_EQ(plain.data(), nullptr);
  DeviceBuffer ordered(/*stream=*/nullptr);
  DeviceBuffer moved = std::move(ordered);
  EXPECT_EQ(moved.data(), nullptr);
  PinnedHostBuffer pinned;
  EXPECT_TRUE(pinned.Reserve(0).ok());
  EXPECT_EQ(pinned.data(), nullptr);
  Event event;
  EXPECT_EQ(event.get(), nullptr);
  Event other = std::move(event);
  EXPECT_EQ(other.get(), nullptr);
}

// No device has a negative ordinal, on any machine (without a driver every
// query fails): an error each time, a failure is not cached.
TEST(DeviceInfoTest, NoDeviceIsAnError) {
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(MultiprocessorCount(-1).ok());
}

}  // namespace
}  // namespace kplan::kernels::cuda
