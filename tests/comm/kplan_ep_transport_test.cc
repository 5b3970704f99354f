// KplanEpTransport on real GPUs (label gpu): one thread per GPU as a rank,
// fresh random bf16 rows (never zero) and random routing every round. After
// Dispatch each destination's recv rows and ids are compared with what every
// source sent (bit-exact, rows and -1 tails); the local experts are emulated
// either by the project's own pipeline (moe_align_block_size + grouped GEMM
// with weights that are shifted identities scaled by a power of two, so Y is
// exact and differs per expert) or by a strided copy (Y = the token row, for
// the DeepSeek-V3 shape whose real weights would not fit); after Return +
// LaunchMoeCombine the result rows and the output must equal the host
// reference (moe::CombineTopK) bit for bit, and recv ids must be -1 again.
// Skips itself with fewer than two GPUs.
#include "kernels/comm/kplan_ep_transport.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/comm/nccl_communicator.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "server/moe/ep/ep_placement.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan::comm {
namespace {

namespace kc = kplan::kernels::cuda;

constexpr int kBlockM = 64;  // moe_align block size = the GEMM's block_m

int DeviceCount() { return test_util::CudaDeviceCount(); }

// Output survives a watchdog exit.
const bool kLineBuffered = std::setvbuf(stdout, nullptr, _IOLBF, 0) == 0;

// Host-side rendezvous of the rank threads (only the test's host checks need
// it: the transport itself synchronises on the device).
using SyncRanks = std::function<void()>;

// Runs body(rank, comm, sync) on one thread per GPU. A rank that fails
// leaves its peers spinning in a device barrier, so a watchdog ends the
// process with a message instead of letting the test hang silently.
void OnEveryRank(int size,
                 const std::function<void(int, NcclCommunicator&, const SyncRanks&)>& body) {
  absl::StatusOr<std::string> id = NcclCommunicator::CreateUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; })) {
      std::printf("watchdog: ranks did not finish within 60 s (device barrier hang?)\n");
      std::fflush(stdout);
      std::_Exit(3);
    }
  });
  std::barrier<> rendezvous(size);
  const SyncRanks sync = [&] { rendezvous.arrive_and_wait(); };
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      auto comm = NcclCommunicator::Create(r, size, *id, r, nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm, sync);
    });
  }
  for (auto& t : threads) t.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
}

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
void Upload(T* dst, const std::vector<T>& src) {
  if (!src.empty()) {
    EXPECT_EQ(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
}

template <typename T>
std::vector<T> Download(const void* src, size_t n) {
  std::vector<T> v(n);
  if (n) {
    EXPECT_EQ(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

enum class Routing { kRandom, kOneExpert, kWithInvalid };
enum class Experts { kGemm, kCopy };

struct Shape {
  std::string name;
  int num_experts = 8, top_k = 2;
  int64_t hidden = 64, max_tokens = 16;
  Routing routing = Routing::kRandom;
  Experts experts = Experts::kGemm;
  int num_ctas = 64;
  // tokens[round][rank % tokens[round].size()]
  std::vector<std::vector<int64_t>> tokens;
};

// One rank's inputs of one round, reproducible by every rank from the seed.
struct RankInput {
  int64_t num_tokens = 0;
  std::vector<uint16_t> hidden;  // bf16 [M, H], never zero
  std::vector<int32_t> ids;      // [M, k]
  std::vector<float> weights;    // [M, k]
};

RankInput MakeInput(const Shape& s, uint32_t seed, int round, int rank) {
  RankInput in;
  in.num_tokens = s.tokens[round][rank % s.tokens[round].size()];
  std::mt19937 rng(seed * 1000003u + round * 7919u + rank * 104729u);
  std::uniform_real_distribution<float> val(-2.f, 2.f), w(0.1f, 1.f);
  in.hidden.resize(in.num_tokens * s.hidden);
  for (uint16_t& h : in.hidden) {
    do {
      h = moe::FloatToBf16(val(rng));
    } while ((h & 0x7fff) == 0);
  }
  in.ids.resize(in.num_tokens * s.top_k);
  in.weights.resize(in.ids.size());
  std::vector<int32_t> perm(s.num_experts);
  for (int64_t m = 0; m < in.num_tokens; ++m) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int j = 0; j < s.top_k; ++j) {  // distinct experts, as a router's top-k
      std::swap(perm[j], perm[j + rng() % (s.num_experts - j)]);
      int32_t e = perm[j];
      if (s.routing == Routing::kOneExpert) e = s.num_experts - 1;
      if (s.routing == Routing::kWithInvalid && rng() % 5 == 0) {
        e = rng() % 2 ? -1 : s.num_experts + static_cast<int32_t>(rng() % 3);
      }
      in.ids[m * s.top_k + j] = e;
      in.weights[m * s.top_k + j] = w(rng);
    }
  }
  return in;
}

float ExpertScale(int e) { return std::ldexp(1.0f, e % 5 - 2); }  // 1/4 .. 4

// The emulated expert output of (row x, global expert e).
void ExpectedY(const Shape& s, const uint16_t* x, int e, uint16_t* y) {
  if (e < 0 || e >= s.num_experts) {
    std::fill(y, y + s.hidden, uint16_t{0});
  } else if (s.experts == Experts::kCopy) {
    std::copy(x, x + s.hidden, y);
  } else {
    const float scale = ExpertScale(e);
    for (int64_t n = 0; n < s.hidden; ++n) {
      y[n] = moe::FloatToBf16(moe::Bf16ToFloat(x[(n + e) % s.hidden]) * scale);
    }
  }
}

// The local experts on the device: Y [n*T*k, H] from the transport's recv
// buffers, stream-ordered (no host synchronisation: capturable).
class LocalExperts {
 public:
  LocalExperts(const Shape& s, const KplanEpTransport& t) : s_(s), t_(t) {
    numel_ = t.recv_pairs();
    y_ = DeviceAlloc<uint16_t>(numel_ * s.hidden);
    e_local_ = t.num_local_experts();
    if (s.experts == Experts::kGemm && e_local_ > 0) {
      std::vector<uint16_t> w(static_cast<size_t>(e_local_) * s.hidden * s.hidden, 0);
      for (int le = 0; le < e_local_; ++le) {
        const int e = t.first_local_expert() + le;
        for (int64_t n = 0; n < s.hidden; ++n) {
          w[(le * s.hidden + n) * s.hidden + (n + e) % s.hidden] = moe::FloatToBf16(ExpertScale(e));
        }
      }
      w_ = DeviceAlloc<uint16_t>(w.size());
      Upload(w_, w);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      max_padded_ = kc::MoeAlignMaxPadded(numel_, e_local_, kBlockM, false);
      max_blocks_ = kc::MoeAlignMaxBlocks(numel_, e_local_, kBlockM, false);
      sorted_ = DeviceAlloc<int32_t>(max_padded_);
      blocks_ = DeviceAlloc<int32_t>(max_blocks_);
      post_ = DeviceAlloc<int32_t>(1);
    }
  }
  ~LocalExperts() {
    cudaFree(y_), cudaFree(w_), cudaFree(sorted_), cudaFree(blocks_), cudaFree(post_);
  }
  const void* y() const { return y_; }

  absl::Status Run(cudaStream_t stream) {
    const int64_t H = s_.hidden, k = s_.top_k, row = H * 2;
    if (s_.experts == Experts::kCopy) {
      for (int64_t j = 0; j < k; ++j) {  // Y[r*k + j] = recv row r
        if (cudaMemcpy2DAsync(reinterpret_cast<char*>(y_) + j * row, k * row, t_.recv_rows(), row,
                              row, t_.recv_tokens(), cudaMemcpyDeviceToDevice,
                              stream) != cudaSuccess) {
          return absl::InternalError("cudaMemcpy2DAsync");
        }
      }
      return absl::OkStatus();
    }
    if (e_local_ == 0) return absl::OkStatus();
    absl::Status st =
        kc::LaunchMoeAlignBlockSize(t_.recv_expert_ids(), numel_, kBlockM, e_local_, nullptr, false,
                                    false, sorted_, blocks_, post_, nullptr, stream);
    if (!st.ok()) return st;
    kc::MoeGroupedGemmArgs g;
    g.dtype = kernels::DType::kBFloat16;
    g.a = t_.recv_rows();
    g.a_row_div = static_cast<int>(k);
    g.w = w_;
    g.c = y_;
    g.sorted_token_ids = sorted_;
    g.expert_ids = blocks_;
    g.num_tokens_post_padded = post_;
    g.numel = numel_;
    g.num_blocks = max_blocks_;
    g.N = H;
    g.K = H;
    g.num_local_experts = e_local_;
    g.block_m = kBlockM;
    return kc::LaunchMoeGroupedGemm(g, stream);
  }

 private:
  const Shape& s_;
  const KplanEpTransport& t_;
  int64_t numel_ = 0, max_padded_ = 0, max_blocks_ = 0;
  int e_local_ = 0;
  uint16_t* y_ = nullptr;
  uint16_t* w_ = nullptr;
  int32_t *sorted_ = nullptr, *blocks_ = nullptr, *post_ = nullptr;
};

// Device inputs/outputs of one rank, sized for max_tokens.
struct RankBuffers {
  explicit RankBuffers(const Shape& s) {
    hidden = DeviceAlloc<uint16_t>(s.max_tokens * s.hidden);
    ids = DeviceAlloc<int32_t>(s.max_tokens * s.top_k);
    weights = DeviceAlloc<float>(s.max_tokens * s.top_k);
    out = DeviceAlloc<uint16_t>(s.max_tokens * s.hidden);
  }
  ~RankBuffers() { cudaFree(hidden), cudaFree(ids), cudaFree(weights), cudaFree(out); }
  // Synchronous: the kernels run on the communicator's non-blocking stream.
  void Load(const RankInput& in) {
    Upload(hidden, in.hidden);
    Upload(ids, in.ids);
    Upload(weights, in.weights);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  uint16_t* hidden;
  int32_t* ids;
  float* weights;
  uint16_t* out;
};

// Compares what destination `rank` received with what every source sent.
void CheckReceived(const Shape& s, const KplanEpTransport& t, const std::vector<RankInput>& inputs,
                   const moe::ep::ExpertPlacement& place) {
  const int n = t.size(), d = t.rank(), k = s.top_k;
  const int64_t T = s.max_tokens, H = s.hidden;
  const auto rows = Download<uint16_t>(t.recv_rows(), n * T * H);
  const auto ids = Download<int32_t>(t.recv_expert_ids(), n * T * k);
  const auto counts = Download<int32_t>(t.recv_num_tokens(), n);
  int64_t bad_rows = 0, bad_ids = 0, rows_in = 0, pairs_in = 0;
  std::string first;
  for (int src = 0; src < n; ++src) {
    const RankInput& in = inputs[src];
    EXPECT_EQ(counts[src], in.num_tokens) << "rank " << d << " source " << src;
    for (int64_t m = 0; m < T; ++m) {
      const int64_t row = src * T + m;
      bool sent = false;
      std::vector<int32_t> want(k, -1);
      for (int j = 0; m < in.num_tokens && j < k; ++j) {
        const int e = in.ids[m * k + j];
        if (e < 0 || e >= s.num_experts) continue;
        const int owner = place.OwnerOf(e);
        sent = sent || owner == d;
        if (owner == d) want[j] = e - place.FirstExpert(d);
      }
      for (int j = 0; j < k; ++j) {
        if (ids[row * k + j] != want[j] && bad_ids++ == 0) {
          first = "ids of source " + std::to_string(src) + " token " + std::to_string(m);
        }
        pairs_in += want[j] >= 0;
      }
      if (sent) {
        ++rows_in;
        if (std::memcmp(&rows[row * H], &in.hidden[m * H], H * 2) != 0 && bad_rows++ == 0) {
          first = "row of source " + std::to_string(src) + " token " + std::to_string(m);
        }
      }
    }
  }
  EXPECT_EQ(bad_rows, 0) << "rank " << d << ": first " << first;
  EXPECT_EQ(bad_ids, 0) << "rank " << d << ": first " << first;
  std::printf("  rank %d received %lld rows, %lld pairs\n", d, static_cast<long long>(rows_in),
              static_cast<long long>(pairs_in));
}

// Checks the result rows and the combined output of source `rank`, and that
// the recv ids are back to -1.
void CheckReturned(const Shape& s, const KplanEpTransport& t, const RankInput& in,
                   const RankBuffers& buf) {
  const int r = t.rank(), k = s.top_k;
  const int64_t M = in.num_tokens, H = s.hidden;
  std::vector<uint16_t> want_y(M * k * H);
  std::vector<float> want_y_f(want_y.size());
  for (int64_t m = 0; m < M; ++m) {
    for (int j = 0; j < k; ++j) {
      ExpectedY(s, &in.hidden[m * H], in.ids[m * k + j], &want_y[(m * k + j) * H]);
    }
  }
  for (size_t i = 0; i < want_y.size(); ++i) want_y_f[i] = moe::Bf16ToFloat(want_y[i]);
  const auto got_y = Download<uint16_t>(t.result_rows(), M * k * H);
  int64_t bad = 0, first = -1;
  for (int64_t p = 0; p < M * k; ++p) {
    if (std::memcmp(&got_y[p * H], &want_y[p * H], H * 2) != 0 && bad++ == 0) first = p;
  }
  EXPECT_EQ(bad, 0) << "rank " << r << ": result rows differ, first pair " << first;

  std::vector<uint16_t> want_out(M * H);
  if (M > 0) {
    absl::Status st = moe::CombineTopK(want_y_f.data(), in.weights.data(), M, k, H, false,
                                       kernels::DType::kBFloat16, want_out.data());
    EXPECT_TRUE(st.ok()) << st;
  }
  const auto got_out = Download<uint16_t>(buf.out, M * H);
  EXPECT_EQ(0, M == 0 ? 0 : std::memcmp(got_out.data(), want_out.data(), M * H * 2))
      << "rank " << r << ": combined output differs from the host reference";

  const auto ids = Download<int32_t>(t.recv_expert_ids(), t.recv_pairs());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), -1), static_cast<int64_t>(ids.size()))
      << "rank " << r << ": recv ids not reset to -1 after Return";
}

// One whole round of this rank on `mine` (every rank runs one), checked.
void RunCheckedRound(const Shape& s, KplanEpTransport& tr, cudaStream_t stream,
                     LocalExperts& experts, RankBuffers& buf, const RankInput& mine) {
  buf.Load(mine);
  EXPECT_TRUE(tr.Dispatch(stream, buf.hidden, buf.ids, mine.num_tokens).ok());
  EXPECT_TRUE(experts.Run(stream).ok());
  EXPECT_TRUE(tr.Return(stream, experts.y()).ok());
  EXPECT_TRUE(kc::LaunchMoeCombine(kernels::DType::kBFloat16, tr.result_rows(), buf.weights,
                                   mine.num_tokens, s.top_k, s.hidden, buf.out, stream)
                  .ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CheckReturned(s, tr, mine, buf);
}

class KplanEpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    size_ = std::min(DeviceCount(), kKplanEpMaxRanks);
    if (size_ < 2) GTEST_SKIP() << "needs two GPUs, found " << size_;
    const char* fixed = std::getenv("KPLAN_TEST_SEED");
    seed_ = fixed != nullptr ? static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10))
                             : std::random_device{}();
    std::printf("ranks %d, seed %u\n", size_, seed_);
  }

  KplanEpConfig ConfigOf(const Shape& s) const {
    KplanEpConfig c;
    c.max_tokens_per_rank = s.max_tokens;
    c.top_k = s.top_k;
    c.hidden = s.hidden;
    c.elem_size = 2;
    c.num_experts = s.num_experts;
    c.num_ctas = s.num_ctas;
    return c;
  }

  // Eager rounds of `s`, each checked after Dispatch and after the combine.
  void RunRounds(const Shape& s) {
    std::printf("shape %s: E=%d k=%d H=%lld T=%lld ctas=%d\n", s.name.c_str(), s.num_experts,
                s.top_k, static_cast<long long>(s.hidden), static_cast<long long>(s.max_tokens),
                s.num_ctas);
    auto place = moe::ep::ExpertPlacement::Linear(s.num_experts, size_);
    ASSERT_TRUE(place.ok()) << place.status();
    OnEveryRank(size_, [&](int r, NcclCommunicator& comm, const SyncRanks& sync) {
      auto t = KplanEpTransport::Create(comm, ConfigOf(s));
      ASSERT_TRUE(t.ok()) << t.status();
      KplanEpTransport& tr = **t;
      EXPECT_EQ(tr.first_local_expert(), place->FirstExpert(r));
      EXPECT_EQ(tr.num_local_experts(), place->NumLocalExperts(r));
      auto stream = static_cast<cudaStream_t>(comm.stream());
      LocalExperts experts(s, tr);
      RankBuffers buf(s);
      for (size_t round = 0; round < s.tokens.size(); ++round) {
        std::vector<RankInput> inputs;
        for (int p = 0; p < size_; ++p) inputs.push_back(MakeInput(s, seed_, round, p));
        const RankInput& mine = inputs[r];
        buf.Load(mine);
        absl::Status st = tr.Dispatch(stream, buf.hidden, buf.ids, mine.num_tokens);
        EXPECT_TRUE(st.ok()) << st;
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        CheckReceived(s, tr, inputs, *place);
        st = experts.Run(stream);
        EXPECT_TRUE(st.ok()) << st;
        st = tr.Return(stream, experts.y());
        EXPECT_TRUE(st.ok()) << st;
        st = kc::LaunchMoeCombine(kernels::DType::kBFloat16, tr.result_rows(), buf.weights,
                                  mine.num_tokens, s.top_k, s.hidden, buf.out, stream);
        EXPECT_TRUE(st.ok()) << st;
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        CheckReturned(s, tr, mine, buf);
        sync();  // a peer's next Dispatch writes recv ids that CheckReturned reads
      }
    });
  }

  int size_ = 0;
  uint32_t seed_ = 0;
};

TEST_F(KplanEpTest, SmallShapesUnevenAndEmptyRanks) {
  Shape s{.name = "small", .tokens = {{16, 5}, {3, 16}, {0, 7}, {16, 16}, {1, 0}}};
  RunRounds(s);
}

TEST_F(KplanEpTest, OddHiddenAndTopKWithInvalidIds) {
  // H = 200: 25 vectors per row (a partial segment); ids -1 or >= E add zeros.
  Shape s{.name = "odd",
          .num_experts = 12,
          .top_k = 3,
          .hidden = 200,
          .max_tokens = 40,
          .routing = Routing::kWithInvalid,
          .num_ctas = 7,
          .tokens = {{40, 13}, {29, 40}, {40, 0}}};
  RunRounds(s);
}

TEST_F(KplanEpTest, AllTokensToOneExpert) {
  Shape s{.name = "one_expert",
          .num_experts = 16,
          .top_k = 4,
          .hidden = 128,
          .max_tokens = 32,
          .routing = Routing::kOneExpert,
          .num_ctas = 1,
          .tokens = {{32, 9}, {5, 32}}};
  RunRounds(s);
}

TEST_F(KplanEpTest, DeepSeekV3Shape) {
  Shape s{.name = "deepseek_v3",
          .num_experts = 256,
          .top_k = 8,
          .hidden = 7168,
          .max_tokens = 128,
          .experts = Experts::kCopy,
          .tokens = {{128, 77}, {1, 0}, {128, 128}}};
  RunRounds(s);
}

// One round (Dispatch -> align -> GEMM -> Return -> combine) captured in a
// CUDA graph per rank, replayed twice with new inputs in the same buffers.
TEST_F(KplanEpTest, GraphCapturedRoundReplaysWithNewData) {
  Shape s{.name = "graph",
          .num_experts = 16,
          .top_k = 4,
          .hidden = 128,
          .max_tokens = 64,
          .tokens = {{64, 33}, {64, 33}, {64, 33}}};
  auto place = moe::ep::ExpertPlacement::Linear(s.num_experts, size_);
  ASSERT_TRUE(place.ok());
  OnEveryRank(size_, [&](int r, NcclCommunicator& comm, const SyncRanks& sync) {
    auto t = KplanEpTransport::Create(comm, ConfigOf(s));
    ASSERT_TRUE(t.ok()) << t.status();
    KplanEpTransport& tr = **t;
    auto stream = static_cast<cudaStream_t>(comm.stream());
    LocalExperts experts(s, tr);
    RankBuffers buf(s);
    const int64_t M = s.tokens[0][r % s.tokens[0].size()];
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    absl::Status st = tr.Dispatch(stream, buf.hidden, buf.ids, M);
    if (st.ok()) st = experts.Run(stream);
    if (st.ok()) st = tr.Return(stream, experts.y());
    if (st.ok()) {
      st = kc::LaunchMoeCombine(kernels::DType::kBFloat16, tr.result_rows(), buf.weights, M,
                                s.top_k, s.hidden, buf.out, stream);
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 1; replay <= 2; ++replay) {
      std::vector<RankInput> inputs;
      for (int p = 0; p < size_; ++p) inputs.push_back(MakeInput(s, seed_, replay, p));
      buf.Load(inputs[r]);
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      CheckReturned(s, tr, inputs[r], buf);
      std::printf("  rank %d replay %d checked\n", r, replay);
      sync();
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

// A rank that cannot run its step still completes the round: Dispatch with
// no tokens, Return with no expert output (zero rows). Its peers get zero
// rows for the pairs it owns and correct ones elsewhere, and the next round
// is a normal one.
TEST_F(KplanEpTest, AnEmptyRoundFromOneRankReturnsZeroRows) {
  Shape s{.name = "empty_round", .tokens = {{9, 16}, {12, 5}}};
  auto place = moe::ep::ExpertPlacement::Linear(s.num_experts, size_);
  ASSERT_TRUE(place.ok()) << place.status();
  OnEveryRank(size_, [&](int r, NcclCommunicator& comm, const SyncRanks& sync) {
    auto t = KplanEpTransport::Create(comm, ConfigOf(s));
    ASSERT_TRUE(t.ok()) << t.status();
    KplanEpTransport& tr = **t;
    auto stream = static_cast<cudaStream_t>(comm.stream());
    LocalExperts experts(s, tr);
    RankBuffers buf(s);
    std::vector<RankInput> inputs;
    for (int p = 0; p < size_; ++p) inputs.push_back(MakeInput(s, seed_, 0, p));
    const RankInput& mine = inputs[r];
    buf.Load(mine);
    const bool failing = r == 0;
    EXPECT_TRUE(tr.Dispatch(stream, buf.hidden, buf.ids, failing ? 0 : mine.num_tokens).ok());
    if (failing) {
      EXPECT_TRUE(tr.Return(stream, nullptr).ok());
    } else {
      EXPECT_TRUE(experts.Run(stream).ok());
      EXPECT_TRUE(tr.Return(stream, experts.y()).ok());
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    if (!failing) {
      const int k = s.top_k;
      const int64_t H = s.hidden, M = mine.num_tokens;
      const auto got = Download<uint16_t>(tr.result_rows(), M * k * H);
      std::vector<uint16_t> want(H);
      int64_t bad = 0, zeros = 0;
      for (int64_t p = 0; p < M * k; ++p) {
        const int e = mine.ids[p];
        const bool on_failing =
            e >= place->FirstExpert(0) && e < place->FirstExpert(0) + place->NumLocalExperts(0);
        if (on_failing) {
          std::fill(want.begin(), want.end(), uint16_t{0});
          ++zeros;
        } else {
          ExpectedY(s, &mine.hidden[(p / k) * H], e, want.data());
        }
        if (std::memcmp(&got[p * H], want.data(), H * 2) != 0) ++bad;
      }
      EXPECT_EQ(bad, 0) << "rank " << r;
      EXPECT_GT(zeros, 0) << "rank " << r << ": no pair on the failing rank (seed)";
    }
    const auto ids = Download<int32_t>(tr.recv_expert_ids(), tr.recv_pairs());
    EXPECT_EQ(std::count(ids.begin(), ids.end(), -1), static_cast<int64_t>(ids.size()))
        << "rank " << r << ": recv ids not reset after the empty round";
    sync();
    // The next round is normal on every rank.
    RunCheckedRound(s, tr, stream, experts, buf, MakeInput(s, seed_, 1, r));
  });
}

TEST_F(KplanEpTest, RejectsBadArgumentsBeforeLaunching) {
  Shape s{.name = "bad_args", .tokens = {{16, 16}}};
  KplanEpConfig bad = ConfigOf(s);
  bad.top_k = 0;
  OnEveryRank(size_, [&](int r, NcclCommunicator& comm, const SyncRanks&) {
    EXPECT_EQ(KplanEpTransport::Create(comm, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
    KplanEpConfig odd = ConfigOf(s);
    odd.hidden = 12;  // 24 bytes: not a multiple of 16
    EXPECT_EQ(KplanEpTransport::Create(comm, odd).status().code(),
              absl::StatusCode::kInvalidArgument);
    auto t = KplanEpTransport::Create(comm, ConfigOf(s));
    ASSERT_TRUE(t.ok()) << t.status();
    KplanEpTransport& tr = **t;
    auto stream = static_cast<cudaStream_t>(comm.stream());
    RankBuffers buf(s);
    absl::Status st = tr.Dispatch(stream, buf.hidden, buf.ids, s.max_tokens + 1);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("max_tokens_per_rank"), absl::string_view::npos) << st;
    EXPECT_EQ(tr.Dispatch(stream, buf.hidden, buf.ids, -1).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(tr.Dispatch(stream, reinterpret_cast<char*>(buf.hidden) + 2, buf.ids, 1).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(tr.Return(stream, reinterpret_cast<char*>(buf.hidden) + 2).code(),
              absl::StatusCode::kInvalidArgument);
    // Nothing was launched: a valid round still completes on every rank.
    LocalExperts experts(s, tr);
    RunCheckedRound(s, tr, stream, experts, buf, MakeInput(s, seed_, 0, r));
  });
}

}  // namespace
}  // namespace kplan::comm
