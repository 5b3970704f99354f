// The GPU path reading hidden states in place from a client's POSIX window
// and writing the output straight into one (server/moe/gpu_runner.h), in a
// region the server page-locked for its GPUs (ShmRegistry with a GPU:
// cudaHostRegister, DMA both ways) and in an unpinned one (staged through the
// pinned buffer): fresh random tokens, the window bit for bit the run on the
// server's own bytes (batch-invariant kernels, so the two runs choose alike),
// nothing around the window written, and a call that ended leaving the
// window as it was. Skips without a device.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "server/moe/gpu_runner.h"
#include "server/moe/shm_regions.h"
#include "tests/moe/random_moe.h"
#include "tests/moe/test_shm_object.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan {
namespace {

constexpr int kExperts = 16, kTopK = 2;
constexpr int64_t kHidden = 256, kInter = 128, kTokens = 33;
constexpr int64_t kX = kTokens * kHidden * 2;  // bf16 [M, H]
constexpr int64_t kOut = 64 * 1024;            // the output window's offset
constexpr int64_t kBytes = 2 * kOut;
constexpr char kUntouched = 0x5a;

TEST(ShmInPlaceGpuTest, PinnedAndUnpinnedWindowsGetTheBitsOfTheOwnedRun) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(test_util::TestSeed("shm_inplace_gpu_test", "SHM_INPLACE_GPU_TEST_SEED"));
  std::shared_ptr<ExpertSet> set =
      RandomExpertSet(PlainSpec("shm-inplace-gpu", kExperts, kHidden, kInter), rng);
  absl::StatusOr<std::unique_ptr<GpuExperts>> gpu = GpuExperts::Create(*set, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  MoeRunInput in = RandomMoeInput(kExperts, kHidden, kTokens, kernels::DType::kBFloat16,
                                  "Renormalize", kTopK, rng);
  in.batch_invariant = true;
  absl::StatusOr<MoeRunOutput> owned = RunMoeOnGpu(**gpu, in, nullptr);
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_EQ(owned->output.size(), static_cast<size_t>(kX));

  for (bool with_gpu : {true, false}) {
    SCOPED_TRACE(with_gpu ? "registry of a server with a GPU" : "registry without GPUs");
    TestShmObject object("shm-inplace-gpu-test", kBytes, kUntouched);
    char* const client = object.data();
    ASSERT_NE(client, nullptr);
    ShmRegistry regions(16, with_gpu ? std::vector<int>{0} : std::vector<int>{});
    ASSERT_TRUE(regions.Register(ShmRegionInfo{"r", object.key(), 0, kBytes, "", 0}).ok());
    absl::StatusOr<ShmView> hidden = regions.Resolve("r", 256, kX, "hidden_states");
    absl::StatusOr<ShmView> window = regions.Resolve("r", kOut + 128, kX, "output_shm");
    ASSERT_TRUE(hidden.ok() && window.ok());
    const bool pinned = hidden->region->pinned();
    std::printf("%s: region %s\n", with_gpu ? "with a GPU" : "without GPUs",
                pinned ? "pinned (cudaHostRegister)" : "unpinned");
    // With a GPU the region must be pinned, else the pinned path never ran.
    ASSERT_EQ(pinned, with_gpu);
    if (pinned) {  // the driver knows the mapping as page-locked host memory
      cudaPointerAttributes attr{};
      ASSERT_EQ(cudaPointerGetAttributes(&attr, hidden->data), cudaSuccess);
      EXPECT_EQ(attr.type, cudaMemoryTypeHost);
    }
    std::memcpy(hidden->data, in.hidden_states.data(), kX);
    MoeRunInput shm = in;
    shm.hidden_states = HostBytes(*hidden);
    shm.host_output.view = *window;
    absl::StatusOr<MoeRunOutput> got = RunMoeOnGpu(**gpu, shm, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->in_place);
    EXPECT_TRUE(got->output.empty());
    EXPECT_EQ(std::memcmp(client + kOut + 128, owned->output.data(), kX), 0);
    EXPECT_EQ(got->topk_ids, owned->topk_ids);
    EXPECT_EQ(std::string(client + kOut, 128), std::string(128, kUntouched));
    EXPECT_EQ(std::string(client + kOut + 128 + kX, 128), std::string(128, kUntouched));

    // A call that ended before the write leaves the window as it was.
    std::memset(client + kOut, kUntouched, kOut);
    shm.host_output.cancelled = [] { return true; };
    absl::StatusOr<MoeRunOutput> ended = RunMoeOnGpu(**gpu, shm, nullptr);
    EXPECT_EQ(ended.status().code(), absl::StatusCode::kCancelled) << ended.status();
    EXPECT_EQ(std::string(client + kOut, kOut), std::string(kOut, kUntouched));
  }
}

}  // namespace
}  // namespace kplan
