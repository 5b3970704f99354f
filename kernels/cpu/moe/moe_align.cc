// moe_align_block_size golden reference (vllm-kernel-plan.md §6.5).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "base/status.h"

namespace kplan::moe {

absl::StatusOr<MoeAlignResult> MoeAlignBlockSize(const int32_t* topk_ids, int64_t numel,
                                                 int block_size, int num_experts,
                                                 const int32_t* expert_map, bool pad_sorted_ids,
                                                 bool ignore_invalid_experts) {
  if (block_size <= 0) {
    return InvalidField("block_size",
                        absl::StrCat("block_size must be positive, got ", block_size));
  }
  if (num_experts <= 0) {
    return InvalidField("num_experts",
                        absl::StrCat("num_experts must be positive, got ", num_experts));
  }
  if (numel < 0 || (numel > 0 && topk_ids == nullptr)) {
    return InvalidField("topk_ids", "topk_ids must hold numel >= 0 ids");
  }
  const int64_t bs = block_size;
  int64_t max_padded = numel + static_cast<int64_t>(num_experts) * (bs - 1);
  if (pad_sorted_ids) max_padded = (max_padded + bs - 1) / bs * bs;
  if (numel < num_experts) max_padded = std::min(numel * bs, max_padded);
  const int64_t max_blocks = (max_padded + bs - 1) / bs;

  auto keep = [&](int32_t e) {
    if (e < 0 || e >= num_experts) return false;
    return !(ignore_invalid_experts && expert_map != nullptr && expert_map[e] < 0);
  };
  // Stable counting sort by expert.
  std::vector<std::vector<int32_t>> rows(num_experts);
  for (int64_t t = 0; t < numel; ++t) {
    if (keep(topk_ids[t])) rows[topk_ids[t]].push_back(static_cast<int32_t>(t));
  }
  MoeAlignResult r;
  r.sorted_token_ids.assign(max_padded, static_cast<int32_t>(numel));
  r.expert_ids.assign(max_blocks, -1);
  int64_t pos = 0, block = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int64_t c = static_cast<int64_t>(rows[e].size());
    if (c == 0) continue;
    const int64_t nb = (c + bs - 1) / bs;
    if (pos + nb * bs > max_padded) {
      return absl::InternalError("moe_align_block_size: padded size exceeds max_num_tokens_padded");
    }
    std::copy(rows[e].begin(), rows[e].end(), r.sorted_token_ids.begin() + pos);
    const int32_t id = expert_map != nullptr ? expert_map[e] : e;
    for (int64_t b = 0; b < nb; ++b) r.expert_ids[block++] = id;
    pos += nb * bs;
  }
  r.num_tokens_post_padded = static_cast<int32_t>(pos);
  return r;
}

}  // namespace kplan::moe
