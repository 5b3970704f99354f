// NcclCommunicator on real GPUs (label gpu): one thread per GPU as a rank,
// every collective on fresh random data against the result computed on the
// host (two GPUs, else skipped), and a group that never forms (one GPU).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/comm/nccl_communicator.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan::comm {
namespace {

int DeviceCount() { return test_util::CudaDeviceCount(); }

// Runs `body(rank, comm)` on one thread per rank, each on its own GPU.
template <typename Body>
void OnEveryRank(int size, Body body) {
  absl::StatusOr<std::string> id = NcclCommunicator::CreateUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      auto comm = NcclCommunicator::Create(r, size, *id, r, nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float* ToDevice(const std::vector<float>& v) {
  float* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(v.size(), 1) * 4),
            cudaSuccess);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  return p;
}

std::vector<float> ToHost(const float* p, size_t n) {
  std::vector<float> v(n);
  if (n) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    size_ = DeviceCount();
    if (size_ < 2) GTEST_SKIP() << "needs two GPUs, found " << size_;
    seed_ = std::random_device{}();
    std::printf("ranks %d, seed %u\n", size_, seed_);
  }
  int size_ = 0;
  uint32_t seed_ = 0;
};

TEST_F(NcclTest, AllGatherAndReduceScatterMatchTheHost) {
  const int64_t count = 1 << 20;
  OnEveryRank(size_, [&](int r, Communicator& comm) {
    std::vector<float> mine = Random(count, seed_ + r);
    float* send = ToDevice(mine);
    float* recv = ToDevice(std::vector<float>(count * size_, NAN));
    ASSERT_TRUE(comm.AllGather(send, recv, count, kernels::DType::kFloat32).ok());
    std::vector<float> got = ToHost(recv, count * size_);
    for (int p = 0; p < size_; ++p) {
      std::vector<float> theirs = Random(count, seed_ + p);
      EXPECT_EQ(0, std::memcmp(theirs.data(), &got[p * count], count * 4)) << "block " << p;
    }
    // ReduceScatter of every rank's [size * count] vector.
    std::vector<float> full = Random(count * size_, seed_ + 100 + r);
    float* rs_send = ToDevice(full);
    float* rs_recv = ToDevice(std::vector<float>(count, NAN));
    ASSERT_TRUE(comm.ReduceScatter(rs_send, rs_recv, count, kernels::DType::kFloat32).ok());
    std::vector<float> sum(count, 0.f);
    for (int p = 0; p < size_; ++p) {
      std::vector<float> v = Random(count * size_, seed_ + 100 + p);
      for (int64_t i = 0; i < count; ++i) sum[i] += v[r * count + i];
    }
    std::vector<float> out = ToHost(rs_recv, count);
    for (int64_t i = 0; i < count; ++i) ASSERT_NEAR(out[i], sum[i], 1e-5f) << i;
    ASSERT_TRUE(comm.Barrier().ok());
    cudaFree(send), cudaFree(recv), cudaFree(rs_send), cudaFree(rs_recv);
  });
}

TEST_F(NcclTest, AllToAllVWithUnevenAndEmptySegments) {
  // Rank r sends (r + 1) * (p + 1) * 1000 elements to rank p, none to itself when r == 1.
  auto n = [](int from, int to) -> int64_t {
    return from == 1 && to == 1 ? 0 : (from + 1) * (to + 1) * 1000;
  };
  OnEveryRank(size_, [&](int r, Communicator& comm) {
    std::vector<int64_t> sc(size_), sd(size_), rc(size_), rd(size_);
    int64_t stotal = 0, rtotal = 0;
    for (int p = 0; p < size_; ++p) {
      sc[p] = n(r, p), sd[p] = stotal, stotal += sc[p];
      rc[p] = n(p, r), rd[p] = rtotal, rtotal += rc[p];
    }
    std::vector<float> send_h = Random(stotal, seed_ + 200 + r);
    float* send = ToDevice(send_h);
    float* recv = ToDevice(std::vector<float>(rtotal, NAN));
    absl::Status s = comm.AllToAllV(send, sc, sd, recv, rc, rd, kernels::DType::kFloat32);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<float> got = ToHost(recv, rtotal);
    for (int p = 0; p < size_; ++p) {
      std::vector<float> theirs = Random(
          [&] {
            int64_t t = 0;
            for (int q = 0; q < size_; ++q) t += n(p, q);
            return t;
          }(),
          seed_ + 200 + p);
      int64_t their_displ = 0;
      for (int q = 0; q < r; ++q) their_displ += n(p, q);
      EXPECT_EQ(0, std::memcmp(&theirs[their_displ], &got[rd[p]], rc[p] * 4)) << "from " << p;
    }
    cudaFree(send), cudaFree(recv);
  });
}

// A rank whose peers never join gives up after the timeout instead of
// blocking its thread forever, and the process still forms groups after.
TEST(NcclJoinTest, AGroupThatNeverFormsTimesOutNamingTheRank) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::string> id = NcclCommunicator::CreateUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  const auto start = std::chrono::steady_clock::now();
  auto lonely = NcclCommunicator::Create(0, 2, *id, 0, nullptr, options);  // rank 1 never comes
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(lonely.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(lonely.status())) << lonely.status();
  EXPECT_NE(lonely.status().message().find("rank 0 of 2"), absl::string_view::npos)
      << lonely.status();
  EXPECT_GE(waited, 1.9);
  EXPECT_LT(waited, 10.0);

  const int size = std::min(DeviceCount(), 2);
  OnEveryRank(size, [&](int r, Communicator& comm) {
    const int32_t mine = 7 + r;
    int32_t* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 4 * (size + 1)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, &mine, 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(comm.AllGather(d, d + 1, 1, kernels::DType::kInt32).ok());
    std::vector<int32_t> all(size);
    ASSERT_EQ(cudaMemcpy(all.data(), d + 1, 4 * size, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int p = 0; p < size; ++p) EXPECT_EQ(all[p], 7 + p);
    cudaFree(d);
  });
}

}  // namespace
}  // namespace kplan::comm
