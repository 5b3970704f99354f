#include "server/moe/ep/ep_placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kplan::moe::ep {

absl::StatusOr<ExpertPlacement> ExpertPlacement::Linear(int num_experts, int num_ranks) {
  if (num_experts <= 0) {
    return InvalidField("num_experts",
                        absl::StrCat("num_experts must be positive, got ", num_experts));
  }
  if (num_ranks <= 0) {
    return InvalidField("ep_size", absl::StrCat("the expert-parallel group size must be "
                                                "positive, got ",
                                                num_ranks));
  }
  ExpertPlacement p;
  p.num_experts_ = num_experts;
  p.num_ranks_ = num_ranks;
  return p;
}

int ExpertPlacement::FirstExpert(int rank) const {
  const int base = num_experts_ / num_ranks_, rem = num_experts_ % num_ranks_;
  return rank * base + std::min(rank, rem);
}

int ExpertPlacement::NumLocalExperts(int rank) const {
  const int base = num_experts_ / num_ranks_, rem = num_experts_ % num_ranks_;
  return base + (rank < rem ? 1 : 0);
}

int ExpertPlacement::OwnerOf(int expert) const {
  const int base = num_experts_ / num_ranks_, rem = num_experts_ % num_ranks_;
  const int big = rem * (base + 1);  // experts held by the ranks with one extra
  if (expert < big) return expert / (base + 1);
  return rem + (expert - big) / base;
}

std::vector<int32_t> ExpertPlacement::ExpertMap(int rank) const {
  std::vector<int32_t> map(num_experts_, -1);
  const int first = FirstExpert(rank), count = NumLocalExperts(rank);
  for (int i = 0; i < count; ++i) map[first + i] = i;
  return map;
}

std::vector<TokenRange> SplitTokens(int64_t num_tokens, int num_ranks) {
  std::vector<TokenRange> ranges(std::max(num_ranks, 0));
  if (num_ranks <= 0) return ranges;
  const int64_t base = num_tokens / num_ranks, rem = num_tokens % num_ranks;
  for (int r = 0; r < num_ranks; ++r) {
    ranges[r].begin = r * base + std::min<int64_t>(r, rem);
    ranges[r].count = base + (r < rem ? 1 : 0);
  }
  return ranges;
}

}  // namespace kplan::moe::ep
