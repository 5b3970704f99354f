// allgather_reducescatter: every rank sees every token (all-gather), runs its
// local experts on all of them, and a reduce-scatter sums the per-rank
// weighted partial outputs back onto the tokens' owners. Collectives need
// equal sizes on every rank (as NCCL's do), so each rank's block is padded to
// the largest rank's token count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/status.h"
#include "server/moe/ep/ep_dispatch.h"

namespace kplan::moe::ep {
namespace {

class AllGatherReduceScatter final : public EpDispatch {
 public:
  EpStrategy strategy() const override { return EpStrategy::kAllGatherReduceScatter; }

  absl::Status Prepare(const EpStep& step, comm::Communicator& comm) override {
    const EpLayer& L = *step.layer;
    const int n = step.size, k = L.top_k;
    const int64_t H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
    max_tokens_ = *std::max_element(step.tokens_per_rank.begin(), step.tokens_per_rank.end());
    total_tokens_ = 0;
    for (int64_t c : step.tokens_per_rank) total_tokens_ += c;
    if (max_tokens_ == 0) return absl::OkStatus();  // every rank agrees: nothing to do

    // Padded send blocks, gathered, then compacted to the real tokens in
    // rank order (= the order of the whole batch).
    std::vector<char> x_send(max_tokens_ * H * es, 0);
    std::vector<int32_t> id_send(max_tokens_ * k, 0);
    std::vector<float> w_send(max_tokens_ * k, 0.0f);
    if (step.num_tokens > 0) {
      std::memcpy(x_send.data(), step.hidden_states, step.num_tokens * H * es);
      std::copy(step.topk_ids, step.topk_ids + step.num_tokens * k, id_send.begin());
      std::copy(step.topk_weights, step.topk_weights + step.num_tokens * k, w_send.begin());
    }
    std::vector<char> x_all(n * max_tokens_ * H * es);
    std::vector<int32_t> id_all(n * max_tokens_ * k);
    std::vector<float> w_all(n * max_tokens_ * k);
    KPLAN_RETURN_IF_ERROR(
        comm.AllGather(x_send.data(), x_all.data(), max_tokens_ * H, CommDTypeOf(L.act_dtype)));
    KPLAN_RETURN_IF_ERROR(
        comm.AllGather(id_send.data(), id_all.data(), max_tokens_ * k, kernels::DType::kInt32));
    KPLAN_RETURN_IF_ERROR(
        comm.AllGather(w_send.data(), w_all.data(), max_tokens_ * k, kernels::DType::kFloat32));
    hidden_.resize(total_tokens_ * H * es);
    ids_.resize(total_tokens_ * k);
    weights_.resize(total_tokens_ * k);
    int64_t row = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t c = step.tokens_per_rank[r];
      std::memcpy(hidden_.data() + row * H * es, x_all.data() + r * max_tokens_ * H * es,
                  c * H * es);
      std::copy_n(id_all.begin() + r * max_tokens_ * k, c * k, ids_.begin() + row * k);
      std::copy_n(w_all.begin() + r * max_tokens_ * k, c * k, weights_.begin() + row * k);
      row += c;
    }
    return absl::OkStatus();
  }

  absl::Status RunLocalExperts(const EpStep& step) override {
    const EpLayer& L = *step.layer;
    const int k = L.top_k;
    const int64_t H = L.hidden;
    // Partial outputs laid out as the reduce-scatter's padded blocks.
    partial_.assign(step.size * max_tokens_ * H, 0.0f);
    if (total_tokens_ == 0 || L.placement.NumLocalExperts(step.rank) == 0) {
      return absl::OkStatus();  // nothing here contributes: zeros
    }
    const std::vector<int32_t> map = L.placement.ExpertMap(step.rank);
    const MoeProblem p =
        LocalExpertProblem(L, step.rank, total_tokens_, k, hidden_.data(), map.data());
    std::vector<float> per_slot(total_tokens_ * k * H);
    KPLAN_RETURN_IF_ERROR(RunExperts(p, ids_.data(), weights_.data(), per_slot.data()));
    int64_t row = 0;
    for (int r = 0; r < step.size; ++r) {
      const int64_t c = step.tokens_per_rank[r];
      if (c > 0) {
        // Weighted sum of this rank's slots per token, in fp32 (non-local
        // slots are exact zeros).
        KPLAN_RETURN_IF_ERROR(CombineTopK(per_slot.data() + row * k * H, weights_.data() + row * k,
                                          c, k, H, L.apply_router_weight_on_input,
                                          kernels::DType::kFloat32,
                                          partial_.data() + r * max_tokens_ * H));
      }
      row += c;
    }
    return absl::OkStatus();
  }

  absl::Status Finalize(const EpStep& step, comm::Communicator& comm) override {
    if (max_tokens_ == 0) return absl::OkStatus();
    const EpLayer& L = *step.layer;
    const int64_t H = L.hidden;
    std::vector<float> mine(max_tokens_ * H);
    KPLAN_RETURN_IF_ERROR(comm.ReduceScatter(partial_.data(), mine.data(), max_tokens_ * H,
                                             kernels::DType::kFloat32));
    for (int64_t i = 0; i < step.num_tokens * H; ++i) {
      StoreFloat(step.output, L.act_dtype, i, mine[i]);
    }
    return absl::OkStatus();
  }

 private:
  int64_t max_tokens_ = 0, total_tokens_ = 0;
  std::vector<char> hidden_;  // [total, H] act_dtype, all ranks' tokens
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<float> partial_;  // [size * max_tokens, H]
};

}  // namespace

std::unique_ptr<EpDispatch> MakeAllGatherReduceScatterDispatch() {
  return std::make_unique<AllGatherReduceScatter>();
}

}  // namespace kplan::moe::ep
