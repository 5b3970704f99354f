// RunMoeOnGpu's CUDA graphs (server/moe/gpu_graphs.h, MoeRunInput::cuda_graph):
// a graphed call gives the bits of the same call run eagerly, on fresh random
// data every run, for each shape's first (eager), second (captured) and later
// (replayed) calls; a replay with other inputs of the same shape gives that
// input's bits (the data flows through the graph, nothing is baked in); the
// workspace poisoned with NaN before a replay still comes back complete; after
// a large call regrows the workspace, after another set is loaded in place of
// a freed one (its addresses may be the old ones) and after any set is freed,
// the graphs are rebuilt, not replayed stale; the copies by the SMs (the
// default) and by the copy engines (GpuRunOptions::stage_by_sm) give the
// same bits. The
// shapes: Qwen3-30B-A3B's widths in bf16 (32 of its 128 experts, top-8,
// H=2048, I=768; decode kernels at one token, grouped GEMMs above), DeepSeek-V3-style grouped
// routing with a correction bias on a smaller set, fp8 128x128 blocks, and fp8
// per-channel weights with per-token activations (Qwen3's widths). Skips
// without a device.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/runtime/stream.h"
#include "server/moe/gpu_runner.h"
#include "tests/moe/random_moe.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan {
namespace {

struct Case {
  std::string name;
  int experts, top_k;
  int64_t hidden, inter;
  kernels::DType weights;
  std::string scheme, method;
  std::string act_scale = "per_tensor";  // quantised schemes' activation scale
};

// A stream of the test's own, made as the device workers make theirs
// (graphs need one: the legacy stream is never captured).
class Stream {
 public:
  Stream() {
    absl::StatusOr<void*> s = kernels::cuda::CreateDeviceStream(0);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) s_ = *s;
  }
  ~Stream() { kernels::cuda::DestroyDeviceStream(s_); }
  void* get() const { return s_; }

 private:
  void* s_ = nullptr;
};

void ExpectSameBits(const MoeRunOutput& got, const MoeRunOutput& want, const std::string& what) {
  ASSERT_EQ(got.output.size(), want.output.size()) << what;
  EXPECT_EQ(std::memcmp(got.output.data(), want.output.data(), want.output.size()), 0) << what;
  EXPECT_EQ(got.topk_ids, want.topk_ids) << what;
  EXPECT_EQ(
      std::memcmp(got.topk_weights.data(), want.topk_weights.data(), want.topk_weights.size() * 4),
      0)
      << what;
}

MoeRunOutput RunOnce(const GpuExperts& gpu, MoeRunInput in, bool graph, void* stream,
                     bool poison = false, bool stage_by_sm = true) {
  in.cuda_graph = graph;
  GpuRunOptions options;
  options.poison_workspace = poison;
  options.stage_by_sm = stage_by_sm;
  absl::StatusOr<MoeRunOutput> out = RunMoeOnGpu(gpu, in, stream, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : MoeRunOutput{};
}

TEST(MoeGraphGpuTest, GraphedCallsGiveTheEagerBits) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(test_util::TestSeed("moe_graph_gpu_test", "MOE_GRAPH_GPU_TEST_SEED"));
  const std::vector<Case> cases = {
      {"Qwen3-30B-A3B widths bf16", 32, 8, 2048, 768, kernels::DType::kBFloat16, "", "Renormalize"},
      {"DeepSeekV3 routing, bias", 64, 6, 1024, 256, kernels::DType::kBFloat16, "", "DeepSeekV3"},
      {"fp8 128x128 blocks", 64, 4, 1024, 512, kernels::DType::kFp8E4m3, "fp8_block",
       "Renormalize"},
      // One token: the matvec route, whose GEMM 2 with the combine loads
      // before its PDL wait (moe_quant_matvec.cu); a read-only activation
      // load once ran ahead of the wait there and read NaN in graph replays.
      {"fp8 per channel, per-token activations", 32, 8, 2048, 768, kernels::DType::kFp8E4m3,
       "fp8_per_channel", "Renormalize", "per_token"},
  };
  Stream stream;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpertsSpec spec = PlainSpec(c.name, c.experts, c.hidden, c.inter, c.weights);
    spec.quant.scheme = c.scheme;
    if (!c.scheme.empty()) spec.quant.activation_scale = c.act_scale;
    std::shared_ptr<ExpertSet> set = RandomExpertSet(spec, rng);
    absl::StatusOr<std::unique_ptr<GpuExperts>> gpu = GpuExperts::Create(*set, 0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{64}}) {
      SCOPED_TRACE(m);
      const auto input = [&] {
        return RandomMoeInput(c.experts, c.hidden, m, kernels::DType::kBFloat16, c.method, c.top_k,
                              rng);
      };
      const MoeRunInput a = input(), b = input();
      const MoeRunOutput want_a = RunOnce(**gpu, a, false, stream.get());
      const MoeRunOutput want_b = RunOnce(**gpu, b, false, stream.get());
      const int64_t launches = MoeGraphLaunchesOnThisThread();
      ExpectSameBits(RunOnce(**gpu, a, true, stream.get()), want_a, "first (eager)");
      ExpectSameBits(RunOnce(**gpu, a, true, stream.get()), want_a, "second (captured)");
      ExpectSameBits(RunOnce(**gpu, b, true, stream.get()), want_b, "replay, other inputs");
      ExpectSameBits(RunOnce(**gpu, a, true, stream.get(), /*poison=*/true), want_a,
                     "replay after poisoning the workspace");
      EXPECT_EQ(MoeGraphLaunchesOnThisThread() - launches, 3) << "graph replays";
      // Staged by the copy engines instead of the SMs: eager, captured,
      // replayed (a graph of its own: the key tells the forms apart).
      for (const char* what :
           {"copy engines (eager)", "copy engines (captured)", "copy engines (replayed)"}) {
        ExpectSameBits(RunOnce(**gpu, b, true, stream.get(), /*poison=*/true,
                               /*stage_by_sm=*/false),
                       want_b, what);
      }
      EXPECT_EQ(MoeGraphLaunchesOnThisThread() - launches, 5) << "graph replays";
      // The same shape eagerly again: graphs did not disturb the eager path.
      ExpectSameBits(RunOnce(**gpu, b, false, stream.get()), want_b, "eager after graphs");
    }
  }
}

TEST(MoeGraphGpuTest, GraphsAreRebuiltWhenTheirMemoryChanges) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(test_util::TestSeed("moe_graph_gpu_test", "MOE_GRAPH_GPU_TEST_SEED") + 1);
  const ExpertsSpec spec = PlainSpec("rebuilt", 32, 1024, 512);
  Stream stream;
  std::shared_ptr<ExpertSet> set = RandomExpertSet(spec, rng);
  absl::StatusOr<std::unique_ptr<GpuExperts>> gpu = GpuExperts::Create(*set, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const MoeRunInput one =
      RandomMoeInput(32, 1024, 2, kernels::DType::kBFloat16, "Renormalize", 4, rng);
  const MoeRunOutput want = RunOnce(**gpu, one, false, stream.get());
  for (int i = 0; i < 3; ++i) ExpectSameBits(RunOnce(**gpu, one, true, stream.get()), want, "warm");
  // A large call regrows the workspace and the pinned buffer.
  const MoeRunInput big =
      RandomMoeInput(32, 1024, 4096, kernels::DType::kBFloat16, "Renormalize", 4, rng);
  RunOnce(**gpu, big, true, stream.get());
  int64_t launches = MoeGraphLaunchesOnThisThread();
  ExpectSameBits(RunOnce(**gpu, one, true, stream.get()), want, "after regrowth (eager)");
  EXPECT_EQ(MoeGraphLaunchesOnThisThread(), launches) << "a stale graph replayed";
  for (int i = 0; i < 2; ++i) {
    ExpectSameBits(RunOnce(**gpu, one, true, stream.get()), want, "after regrowth (graphed)");
  }
  // Another set of the same spec, other weights, loaded after this one is
  // freed: its allocations may take the old addresses.
  gpu->reset();
  std::shared_ptr<ExpertSet> other = RandomExpertSet(spec, rng);
  absl::StatusOr<std::unique_ptr<GpuExperts>> gpu2 = GpuExperts::Create(*other, 0);
  ASSERT_TRUE(gpu2.ok()) << gpu2.status();
  const MoeRunOutput want2 = RunOnce(**gpu2, one, false, stream.get());
  EXPECT_NE(std::memcmp(want2.output.data(), want.output.data(), want.output.size()), 0)
      << "two random sets gave the same output";
  launches = MoeGraphLaunchesOnThisThread();
  ExpectSameBits(RunOnce(**gpu2, one, true, stream.get()), want2, "other set (eager)");
  EXPECT_EQ(MoeGraphLaunchesOnThisThread(), launches) << "the freed set's graph replayed";
  for (int i = 0; i < 2; ++i) {
    ExpectSameBits(RunOnce(**gpu2, one, true, stream.get()), want2, "other set (graphed)");
  }
  EXPECT_EQ(MoeGraphLaunchesOnThisThread() - launches, 2) << "graph replays";
  // Whether the new set took the old addresses or not, any set freed drops
  // this thread's graphs: a warm shape runs eagerly once, then is graphed
  // again (the check above holds even where the addresses differ).
  {
    ExpertsSpec small = spec;
    small.experts_id = "unrelated";
    small.num_experts = 4;
    absl::StatusOr<std::unique_ptr<GpuExperts>> unrelated =
        GpuExperts::Create(*RandomExpertSet(small, rng), 0);
    ASSERT_TRUE(unrelated.ok()) << unrelated.status();
  }
  launches = MoeGraphLaunchesOnThisThread();
  ExpectSameBits(RunOnce(**gpu2, one, true, stream.get()), want2, "after a free (eager)");
  EXPECT_EQ(MoeGraphLaunchesOnThisThread(), launches) << "a graph outlived a free";
  ExpectSameBits(RunOnce(**gpu2, one, true, stream.get()), want2, "after a free (graphed)");
  EXPECT_EQ(MoeGraphLaunchesOnThisThread() - launches, 1) << "graph replays";
}

}  // namespace
}  // namespace kplan
