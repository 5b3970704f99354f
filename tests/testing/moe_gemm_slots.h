// The slots of a grouped-GEMM test (moe_ws_gpu_test, moe_fp8_ws_gpu_test):
// counts per expert shuffled over the slots, every expert local but one,
// moe_align_block_size's output on the host and the device, and the routing
// fields of MoeGroupedGemmArgs it gives. Header-only; tests that include it
// link kplan_moe_cpu, kplan_kernels_cuda_moe and CUDA's runtime.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "tests/testing/gpu_test_util.h"

namespace kplan::test_util {

struct GemmSlots {
  std::vector<int32_t> ids;   // slot -> expert
  std::vector<int32_t> emap;  // expert -> local expert, -1 for the non-local one
  int local = 0;              // local experts
  int64_t numel = 0;          // slots
  int block_m = 0;
  int64_t num_blocks = 0;
  std::optional<DeviceBuf<int32_t>> sorted, expert_ids, post;

  // g's slot fields: the alignment's buffers, numel, blocks, local experts.
  void Into(kernels::cuda::MoeGroupedGemmArgs& g) const {
    g.sorted_token_ids = sorted->p;
    g.expert_ids = expert_ids->p;
    g.num_tokens_post_padded = post->p;
    g.numel = numel;
    g.num_blocks = num_blocks;
    g.num_local_experts = local;
    g.block_m = block_m;
  }
};

// out's ids and emap (set) aligned to blocks of block_m: the alignment's
// fields. A failed alignment fails the test (check HasFatalFailure()).
inline void AlignGemmSlots(int block_m, GemmSlots* out) {
  out->numel = static_cast<int64_t>(out->ids.size());
  absl::StatusOr<moe::MoeAlignResult> al = moe::MoeAlignBlockSize(
      out->ids.data(), out->numel, block_m, static_cast<int>(out->emap.size()), out->emap.data());
  ASSERT_TRUE(al.ok()) << al.status();
  out->block_m = block_m;
  out->num_blocks = static_cast<int64_t>(al->expert_ids.size());
  out->sorted.emplace(al->sorted_token_ids);
  out->expert_ids.emplace(al->expert_ids);
  out->post.emplace(std::vector<int32_t>{al->num_tokens_post_padded});
}

// counts[e] slots of expert e in an order drawn from rng; expert non_local
// (-1: none) maps to -1 and the others are renumbered in order; aligned to
// blocks of block_m (AlignGemmSlots).
inline void MakeGemmSlots(const std::vector<int>& counts, int non_local, int block_m,
                          std::mt19937_64& rng, GemmSlots* out) {
  const int E = static_cast<int>(counts.size());
  out->ids.clear();
  for (int e = 0; e < E; ++e) out->ids.insert(out->ids.end(), counts[e], e);
  std::shuffle(out->ids.begin(), out->ids.end(), rng);
  out->emap.assign(E, -1);
  out->local = 0;
  for (int e = 0; e < E; ++e) out->emap[e] = e == non_local ? -1 : out->local++;
  AlignGemmSlots(block_m, out);
}

}  // namespace kplan::test_util
