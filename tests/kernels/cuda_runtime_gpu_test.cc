// The CUDA runtime module's owners on a device (kernels/cuda/runtime/):
// DeviceBuffer (plain and stream-ordered), DeviceArena growth and reuse,
// PinnedHostBuffer, Event, DeviceGuard, the cached multiprocessor count, and
// an impossible allocation coming back as RESOURCE_EXHAUSTED. Skips itself without a CUDA device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/status.h"
#include "kernels/cuda/runtime/stream.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan::kernels::cuda {
namespace {

using ::testing::HasSubstr;

constexpr size_t kImpossible = size_t{1} << 50;  // 1 PiB

TEST(DeviceBufferGpuTest, PlainAllocationRoundTrips) {
  SKIP_WITHOUT_CUDA();
  DeviceBuffer buf;
  ASSERT_TRUE(buf.Reserve(1000).ok());
  ASSERT_NE(buf.data(), nullptr);
  EXPECT_EQ(buf.capacity(), 1000u);
  void* const first = buf.data();
  ASSERT_TRUE(buf.Reserve(10).ok());  // smaller: kept
  EXPECT_EQ(buf.data(), first);
  std::vector<uint8_t> in(1000), out(1000, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ(cudaMemcpy(buf.data(), in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), buf.data(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, out);
  ASSERT_TRUE(buf.Reserve(4096).ok());  // larger: reallocated
  EXPECT_EQ(buf.capacity(), 4096u);
  buf.Reset();
  EXPECT_EQ(buf.data(), nullptr);
}

TEST(DeviceBufferGpuTest, OutOfMemoryIsResourceExhausted) {
  SKIP_WITHOUT_CUDA();
  DeviceBuffer plain;
  const absl::Status st = plain.Reserve(kImpossible);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("out of memory"));
  EXPECT_EQ(plain.data(), nullptr);
  // The failure is not left behind for the next launch check.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    DeviceArena arena(stream);
    arena.Reserve(static_cast<int64_t>(kImpossible));
    EXPECT_EQ(arena.Allocate().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(arena.base(), nullptr);
  }
  PinnedHostBuffer pinned;
  EXPECT_FALSE(pinned.Reserve(kImpossible).ok());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST(DeviceArenaGpuTest, GrowsAndIsReusedAcrossCalls) {
  SKIP_WITHOUT_CUDA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    DeviceArena arena(stream);
    const int64_t a = arena.Reserve(100), b = arena.Reserve(100);
    ASSERT_TRUE(arena.Allocate().ok());
    EXPECT_EQ(arena.capacity(), 512);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.At<char>(b)) % 256, 0u);
    ASSERT_EQ(cudaMemsetAsync(arena.At<char>(a), 1, 100, stream), cudaSuccess);
    void* const first = arena.base();
    arena.Clear();  // next call, no larger: same block
    arena.Reserve(300);
    ASSERT_TRUE(arena.Allocate().ok());
    EXPECT_EQ(arena.base(), first);
    arena.Clear();  // larger: grows
    arena.Reserve(1 << 20);
    ASSERT_TRUE(arena.Allocate().ok());
    EXPECT_EQ(arena.capacity(), 1 << 20);
    ASSERT_EQ(cudaMemsetAsync(arena.base(), 0, 1 << 20, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST(PinnedAndEventGpuTest, TimeACopy) {
  SKIP_WITHOUT_CUDA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    PinnedHostBuffer host;
    ASSERT_TRUE(host.Reserve(1 << 20).ok());
    std::memset(host.data(), 3, 1 << 20);
    DeviceBuffer dev(stream);
    ASSERT_TRUE(dev.Reserve(1 << 20).ok());
    Event start, stop;
    ASSERT_TRUE(start.Record(stream).ok());
    ASSERT_EQ(cudaMemcpyAsync(dev.data(), host.data(), 1 << 20, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_TRUE(stop.Record(stream).ok());
    ASSERT_TRUE(SynchronizeStream(stream).ok());
    absl::StatusOr<float> ms = ElapsedMs(start, stop);
    ASSERT_TRUE(ms.ok()) << ms.status();
    EXPECT_GE(*ms, 0.0f);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST(DeviceGuardGpuTest, RestoresThePreviousDevice) {
  SKIP_WITHOUT_CUDA();
  const int n = test_util::CudaDeviceCount();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  {
    DeviceGuard guard;
    ASSERT_TRUE(guard.Enter(n - 1).ok());
    int now = -1;
    ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, n - 1);
  }
  int after = -1;
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, 0);
  DeviceGuard bad;
  const absl::Status st = bad.Enter(n + 5);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(DeviceGuardGpuTest, PlainBufferIsFreedOnItsDevice) {
  SKIP_WITHOUT_CUDA();
  const int n = test_util::CudaDeviceCount();
  ASSERT_EQ(cudaSetDevice(n - 1), cudaSuccess);
  DeviceBuffer buf;
  ASSERT_TRUE(buf.Reserve(1 << 16).ok());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  buf.Reset();  // switches to device n - 1 for cudaFree, then back
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(StreamGpuTest, CreateSynchronizeDestroy) {
  SKIP_WITHOUT_CUDA();
  absl::StatusOr<void*> stream = CreateDeviceStream(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE(SynchronizeStream(*stream).ok());
  DestroyDeviceStream(*stream);
  EXPECT_EQ(CreateDeviceStream(1 << 20).status().code(), absl::StatusCode::kInternal);
}

// Every device's count is the driver's, the same from threads racing on the
// first query and after it; an ordinal past the last device is an error.
TEST(DeviceInfoGpuTest, MultiprocessorCountIsTheDriversOnEveryThread) {
  SKIP_WITHOUT_CUDA();
  const int devices = test_util::CudaDeviceCount();
  for (int d = 0; d < devices; ++d) {
    int want = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&want, cudaDevAttrMultiProcessorCount, d), cudaSuccess);
    ASSERT_GT(want, 0);
    std::vector<int> got(8, -1);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < got.size(); ++t) {
      threads.emplace_back([&, t] {
        const absl::StatusOr<int> n = MultiprocessorCount(d);
        got[t] = n.ok() ? *n : -1;
      });
    }
    for (std::thread& th : threads) th.join();
    for (int n : got) EXPECT_EQ(n, want) << "device " << d;
    const absl::StatusOr<int> again = MultiprocessorCount(d);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, want);
  }
  EXPECT_FALSE(MultiprocessorCount(devices).ok());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace kplan::kernels::cuda
