// Linear expert placement, expert maps and the contiguous token split.
#include "server/moe/ep/ep_placement.h"

#include "gtest/gtest.h"

namespace kplan::moe::ep {
namespace {

TEST(EpPlacement, UnevenCountsGoToTheFirstRanks) {
  auto p = ExpertPlacement::Linear(10, 3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->FirstExpert(0), 0);
  EXPECT_EQ(p->NumLocalExperts(0), 4);
  EXPECT_EQ(p->FirstExpert(1), 4);
  EXPECT_EQ(p->NumLocalExperts(1), 3);
  EXPECT_EQ(p->FirstExpert(2), 7);
  EXPECT_EQ(p->NumLocalExperts(2), 3);
  const int owners[10] = {0, 0, 0, 0, 1, 1, 1, 2, 2, 2};
  for (int e = 0; e < 10; ++e) EXPECT_EQ(p->OwnerOf(e), owners[e]) << e;
  EXPECT_EQ(p->ExpertMap(1), (std::vector<int32_t>{-1, -1, -1, -1, 0, 1, 2, -1, -1, -1}));
}

TEST(EpPlacement, OwnerAgreesWithRangesForManyShapes) {
  for (int e = 1; e <= 17; ++e) {
    for (int n = 1; n <= 6; ++n) {
      auto p = ExpertPlacement::Linear(e, n);
      ASSERT_TRUE(p.ok());
      int next = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(p->FirstExpert(r), next);
        for (int i = 0; i < p->NumLocalExperts(r); ++i) {
          EXPECT_EQ(p->OwnerOf(next + i), r) << e << " experts, " << n << " ranks";
          EXPECT_EQ(p->ExpertMap(r)[next + i], i);
        }
        next += p->NumLocalExperts(r);
      }
      EXPECT_EQ(next, e);
    }
  }
}

TEST(EpPlacement, FewerExpertsThanRanks) {
  auto p = ExpertPlacement::Linear(3, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->NumLocalExperts(3), 0);
  EXPECT_EQ(p->OwnerOf(2), 2);
  EXPECT_EQ(p->ExpertMap(3), (std::vector<int32_t>{-1, -1, -1}));
}

TEST(EpPlacement, RejectsEmptyShapes) {
  EXPECT_EQ(ExpertPlacement::Linear(0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpertPlacement::Linear(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EpSplitTokens, ContiguousUnevenAndEmpty) {
  auto s = SplitTokens(1, 4);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].begin, 0);
  EXPECT_EQ(s[0].count, 1);
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(s[r].count, 0);
    EXPECT_EQ(s[r].begin, 1);
  }
  s = SplitTokens(11, 3);
  EXPECT_EQ(s[0].count, 4);
  EXPECT_EQ(s[1].begin, 4);
  EXPECT_EQ(s[1].count, 4);
  EXPECT_EQ(s[2].begin, 8);
  EXPECT_EQ(s[2].count, 3);
}

}  // namespace
}  // namespace kplan::moe::ep
