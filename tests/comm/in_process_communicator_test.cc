// InProcessCommunicator: collectives against hand-computed results for 1-4
// ranks, uneven all-to-all-v with empty segments, and the failure paths
// (timeout naming the missing ranks, abort from any rank, injected faults,
// mismatched calls). Every test is bounded by short timeouts.
#include "kernels/comm/in_process_communicator.h"

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kplan::comm {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::vector<std::unique_ptr<InProcessCommunicator>> MakeGroup(int n, int timeout_ms = 10000) {
  InProcessOptions options;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  auto group = InProcessGroup::Create(n, options);
  EXPECT_TRUE(group.ok()) << group.status();
  return std::move(group).value();
}

// Runs fn(rank, comm) on one thread per rank; returns each rank's status.
std::vector<absl::Status> RunRanks(std::vector<std::unique_ptr<InProcessCommunicator>>& comms,
                                   const std::function<absl::Status(int, Communicator&)>& fn) {
  std::vector<absl::Status> results(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = fn(static_cast<int>(r), *comms[r]); });
  }
  for (auto& t : threads) t.join();
  return results;
}

class CommCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(CommCollectiveTest, AllGatherConcatenatesInRankOrder) {
  const int n = GetParam();
  auto comms = MakeGroup(n);
  std::vector<std::vector<int32_t>> out(n);
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    std::vector<int32_t> send = {r * 10, r * 10 + 1, r * 10 + 2};
    out[r].assign(3 * n, -1);
    return c.AllGather(send.data(), out[r].data(), 3, kernels::DType::kInt32);
  });
  std::vector<int32_t> want;
  for (int p = 0; p < n; ++p) want.insert(want.end(), {p * 10, p * 10 + 1, p * 10 + 2});
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(out[r], want) << "rank " << r;
  }
}

TEST_P(CommCollectiveTest, AllGatherInPlace) {
  const int n = GetParam();
  auto comms = MakeGroup(n);
  std::vector<std::vector<float>> buf(n);
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    buf[r].assign(2 * n, 0.0f);
    buf[r][2 * r] = r + 0.5f;
    buf[r][2 * r + 1] = -r;
    return c.AllGather(buf[r].data() + 2 * r, buf[r].data(), 2, kernels::DType::kFloat32);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(buf[r][2 * p], p + 0.5f);
      EXPECT_EQ(buf[r][2 * p + 1], -p);
    }
  }
}

TEST_P(CommCollectiveTest, ReduceScatterSumsBlocks) {
  const int n = GetParam();
  auto comms = MakeGroup(n);
  const int count = 3;
  std::vector<std::vector<float>> out(n);
  // send_r[b*count + i] = 100*r + 10*b + i; block b of the sum is
  // sum_r(100 r) + n*(10 b + i).
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    std::vector<float> send(n * count);
    for (int b = 0; b < n; ++b) {
      for (int i = 0; i < count; ++i) send[b * count + i] = 100.0f * r + 10.0f * b + i;
    }
    out[r].assign(count, -1.0f);
    return c.ReduceScatter(send.data(), out[r].data(), count, kernels::DType::kFloat32);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    for (int i = 0; i < count; ++i) {
      EXPECT_EQ(out[r][i], 100.0f * (n * (n - 1) / 2) + n * (10.0f * r + i));
    }
  }
}

TEST_P(CommCollectiveTest, ReduceScatterAddsRanksInOrder) {
  // 1e8 + 1 - 1e8 ... in float: the order of the additions shows in the result.
  const int n = GetParam();
  auto comms = MakeGroup(n);
  const float vals[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  std::vector<float> out(n);
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    std::vector<float> send(n, vals[r]);
    return c.ReduceScatter(send.data(), &out[r], 1, kernels::DType::kFloat32);
  });
  float want = vals[0];
  for (int p = 1; p < n; ++p) want += vals[p];
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(out[r], want);
  }
}

TEST_P(CommCollectiveTest, AllToAllVUnevenWithEmptySegments) {
  // Rank s sends (s + d) % 3 elements to rank d (0 included), each valued
  // 1000*s + 10*d + i; segments are laid out in reverse peer order to check
  // that displacements, not order, place them.
  const int n = GetParam();
  auto comms = MakeGroup(n);
  auto count = [](int s, int d) { return static_cast<int64_t>((s + d) % 3); };
  std::vector<std::vector<int64_t>> out(n);
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
    int64_t off = 0;
    for (int d = n - 1; d >= 0; --d) {
      sc[d] = count(r, d);
      sd[d] = off;
      off += sc[d];
    }
    std::vector<int64_t> send(off);
    for (int d = 0; d < n; ++d) {
      for (int64_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = 1000 * r + 10 * d + i;
    }
    int64_t roff = 1;  // leave element 0 untouched
    for (int s = 0; s < n; ++s) {
      rc[s] = count(s, r);
      rd[s] = roff;
      roff += rc[s];
    }
    out[r].assign(roff, -7);
    return c.AllToAllV(send.empty() ? nullptr : send.data(), sc, sd, out[r].data(), rc, rd,
                       kernels::DType::kInt64);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    std::vector<int64_t> want = {-7};
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < count(s, r); ++i) want.push_back(1000 * s + 10 * r + i);
    }
    EXPECT_EQ(out[r], want) << "rank " << r;
  }
}

TEST_P(CommCollectiveTest, ManyCollectivesInSequence) {
  const int n = GetParam();
  auto comms = MakeGroup(n);
  auto st = RunRanks(comms, [&](int r, Communicator& c) -> absl::Status {
    for (int it = 0; it < 50; ++it) {
      int64_t mine = r + it;
      std::vector<int64_t> all(n);
      if (absl::Status s = c.AllGather(&mine, all.data(), 1, kernels::DType::kInt64); !s.ok())
        return s;
      for (int p = 0; p < n; ++p) {
        if (all[p] != p + it) return absl::InternalError("wrong value");
      }
      if (absl::Status s = c.Barrier(); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << st[r];
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommCollectiveTest, ::testing::Values(1, 2, 3, 4));

TEST(InProcessCommunicator, CreateRejectsBadSize) {
  EXPECT_EQ(InProcessGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessCommunicator, TimeoutNamesCollectiveAndMissingRanks) {
  const auto start = std::chrono::steady_clock::now();
  auto comms2 = MakeGroup(3, /*timeout_ms=*/100);
  std::vector<absl::Status> st2(3);
  std::thread a([&] {
    float x = 1, y[3];
    st2[0] = comms2[0]->AllGather(&x, y, 1, kernels::DType::kFloat32);
  });
  a.join();
  EXPECT_EQ(st2[0].code(), absl::StatusCode::kDeadlineExceeded) << st2[0];
  EXPECT_THAT(Msg(st2[0]), HasSubstr("AllGather(count=1, dtype=float32)"));
  EXPECT_THAT(Msg(st2[0]), HasSubstr("waiting for ranks 1, 2 to join"));
  EXPECT_THAT(Msg(st2[0]), HasSubstr("100 ms"));
  // A rank arriving late finds the group failed instead of waiting.
  float x = 2, y[3];
  absl::Status late = comms2[1]->AllGather(&x, y, 1, kernels::DType::kFloat32);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_THAT(Msg(late), HasSubstr("timed out"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(InProcessCommunicator, AbortFailsPendingAndFutureCallsOnEveryRank) {
  auto comms = MakeGroup(3, /*timeout_ms=*/20000);
  std::vector<absl::Status> st(3);
  std::thread t0([&] { st[0] = comms[0]->Barrier(); });
  std::thread t1([&] { st[1] = comms[1]->Barrier(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  comms[2]->Abort("shutting down");
  t0.join();
  t1.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r : {0, 1}) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kAborted) << st[r];
    EXPECT_THAT(Msg(st[r]), HasSubstr("aborted by rank 2: shutting down"));
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(comms[r]->Barrier().code(), absl::StatusCode::kAborted);
  }
  EXPECT_EQ(comms[0]->group().failure().code(), absl::StatusCode::kAborted);
}

TEST(InProcessCommunicator, InjectedFaultFailsThatCallOnly) {
  auto comms = MakeGroup(2, /*timeout_ms=*/100);
  comms[0]->group().InjectFault(1, absl::UnavailableError("link down"), /*after_calls=*/1);
  std::vector<absl::Status> first(2), second(2);
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    first[r] = c.Barrier();
    second[r] = c.Barrier();
    return absl::OkStatus();
  });
  EXPECT_TRUE(first[0].ok()) << first[0];
  EXPECT_TRUE(first[1].ok()) << first[1];
  EXPECT_EQ(second[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(second[1]), HasSubstr("injected fault: link down"));
  EXPECT_EQ(second[0].code(), absl::StatusCode::kDeadlineExceeded) << second[0];
  EXPECT_THAT(Msg(second[0]), HasSubstr("waiting for rank 1 to join"));
}

TEST(InProcessCommunicator, MismatchedCollectivesFailEveryRank) {
  auto comms = MakeGroup(2, /*timeout_ms=*/5000);
  auto st = RunRanks(comms, [&](int r, Communicator& c) -> absl::Status {
    float x = 1, y[2];
    if (r == 0) return c.AllGather(&x, y, 1, kernels::DType::kFloat32);
    return c.Barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kInternal) << st[r];
    EXPECT_THAT(Msg(st[r]), HasSubstr("mismatched collectives"));
  }
}

TEST(InProcessCommunicator, AllToAllVCountMismatchFailsEveryRank) {
  auto comms = MakeGroup(2, /*timeout_ms=*/5000);
  auto st = RunRanks(comms, [&](int r, Communicator& c) {
    std::vector<float> send(4, 1.0f), recv(4);
    std::vector<int64_t> sc = {1, 2}, sd = {0, 1}, rc = {1, r == 1 ? 1 : 2}, rd = {0, 1};
    return c.AllToAllV(send.data(), sc, sd, recv.data(), rc, rd, kernels::DType::kFloat32);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kInvalidArgument) << st[r];
    EXPECT_THAT(Msg(st[r]), HasSubstr("rank 0 sends 2 elements to rank 1 but rank 1 expects 1"));
  }
}

TEST(InProcessCommunicator, BadLocalArgumentsAbortTheGroup) {
  auto comms = MakeGroup(2, /*timeout_ms=*/20000);
  const auto start = std::chrono::steady_clock::now();
  auto st = RunRanks(comms, [&](int r, Communicator& c) -> absl::Status {
    std::vector<float> send(2, 1.0f), recv(2);
    std::vector<int64_t> ok = {1, 1}, displs = {0, 1}, bad = {1};
    if (r == 0)
      return c.AllToAllV(send.data(), bad, displs, recv.data(), ok, displs,
                         kernels::DType::kFloat32);
    return c.AllToAllV(send.data(), ok, displs, recv.data(), ok, displs, kernels::DType::kFloat32);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(st[0].code(), absl::StatusCode::kInvalidArgument) << st[0];
  EXPECT_EQ(st[1].code(), absl::StatusCode::kAborted) << st[1];
}

TEST(InProcessCommunicator, ReduceScatterOnlyFloatSum) {
  auto comms = MakeGroup(1);
  int32_t x = 1, y = 0;
  EXPECT_EQ(comms[0]->ReduceScatter(&x, &y, 1, kernels::DType::kInt32).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace kplan::comm
