// Where experts and tokens live in an expert-parallel group of n ranks.
// Experts are placed linearly (vLLM's default expert placement without
// EPLB): rank r owns the contiguous experts
//   [r * (E / n) + min(r, E % n), ... + E / n + (r < E % n ? 1 : 0)),
// so counts differ by at most one and ranks may own none when E < n. A
// rank's expert_map ([E], global id -> local id or -1) is what the CPU
// reference and the fused kernels take to skip non-local experts (their
// slots produce zeros, vllm-kernel-plan.md §6.2). Tokens of a request are
// split the same way: contiguous, uneven allowed, possibly empty.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace kplan::moe::ep {

class ExpertPlacement {
 public:
  ExpertPlacement() = default;
  // INVALID_ARGUMENT unless num_experts > 0 and num_ranks > 0.
  static absl::StatusOr<ExpertPlacement> Linear(int num_experts, int num_ranks);

  int num_experts() const { return num_experts_; }
  int num_ranks() const { return num_ranks_; }
  int FirstExpert(int rank) const;
  int NumLocalExperts(int rank) const;
  // The rank owning global expert `expert` (in [0, num_experts)).
  int OwnerOf(int expert) const;
  // [num_experts]: local index on `rank`, or -1 where another rank owns it.
  std::vector<int32_t> ExpertMap(int rank) const;

 private:
  int num_experts_ = 0;
  int num_ranks_ = 0;
};

struct TokenRange {
  int64_t begin = 0;
  int64_t count = 0;
};

// The same contiguous split for tokens: rank r gets
// [r * (M / n) + min(r, M % n), ...), M / n tokens plus one for r < M % n.
std::vector<TokenRange> SplitTokens(int64_t num_tokens, int num_ranks);

}  // namespace kplan::moe::ep
