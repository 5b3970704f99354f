// kplan_all2allv: only the (token, slot) rows a rank's experts need travel to
// it. Dispatch = all-gather of the per-destination row counts (so every rank
// knows what it receives), then all-to-all-v of the hidden rows and of their
// (expert id, weight bits) pairs; combine = all-to-all-v of the unweighted
// expert outputs back in the same order, then moe::CombineTopK at the source.
// Rows go out grouped by destination rank and, within one, in (token, slot)
// order, so the receiver's rows and the returned results need no index.
#include <cstring>
#include <vector>

#include "base/status.h"
#include "server/moe/ep/ep_dispatch.h"

namespace kplan::moe::ep {
namespace {

class All2AllV final : public EpDispatch {
 public:
  EpStrategy strategy() const override { return EpStrategy::kAll2AllV; }

  absl::Status Prepare(const EpStep& step, comm::Communicator& comm) override {
    const EpLayer& L = *step.layer;
    const int n = step.size, k = L.top_k;
    const int64_t H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
    const int64_t slots = step.num_tokens * k;

    // Slots grouped by destination, (token, slot) order within each.
    std::vector<std::vector<int64_t>> by_dest(n);
    for (int64_t t = 0; t < slots; ++t) {
      by_dest[L.placement.OwnerOf(step.topk_ids[t])].push_back(t);
    }
    send_order_.clear();
    send_rows_.assign(n, 0);
    for (int d = 0; d < n; ++d) {
      send_rows_[d] = static_cast<int64_t>(by_dest[d].size());
      send_order_.insert(send_order_.end(), by_dest[d].begin(), by_dest[d].end());
    }

    std::vector<int64_t> counts(n * n);  // counts[s * n + d]: rows s sends d
    KPLAN_RETURN_IF_ERROR(
        comm.AllGather(send_rows_.data(), counts.data(), n, kernels::DType::kInt64));
    recv_rows_.assign(n, 0);
    recv_total_ = 0;
    for (int s = 0; s < n; ++s) {
      recv_rows_[s] = counts[s * n + step.rank];
      recv_total_ += recv_rows_[s];
    }

    std::vector<char> x_send(send_order_.size() * H * es);
    std::vector<int32_t> meta_send(send_order_.size() * 2);
    for (size_t i = 0; i < send_order_.size(); ++i) {
      const int64_t t = send_order_[i], m = t / k;
      std::memcpy(x_send.data() + i * H * es,
                  static_cast<const char*>(step.hidden_states) + m * H * es, H * es);
      meta_send[2 * i] = step.topk_ids[t];
      std::memcpy(&meta_send[2 * i + 1], &step.topk_weights[t], sizeof(float));
    }
    hidden_.resize(recv_total_ * H * es);
    std::vector<int32_t> meta(recv_total_ * 2);
    KPLAN_RETURN_IF_ERROR(Exchange(comm, x_send.empty() ? nullptr : x_send.data(), send_rows_,
                                   hidden_.empty() ? nullptr : hidden_.data(), recv_rows_, H,
                                   CommDTypeOf(L.act_dtype)));
    KPLAN_RETURN_IF_ERROR(Exchange(comm, meta_send.empty() ? nullptr : meta_send.data(), send_rows_,
                                   meta.empty() ? nullptr : meta.data(), recv_rows_, 2,
                                   kernels::DType::kInt32));
    ids_.resize(recv_total_);
    weights_.resize(recv_total_);
    for (int64_t i = 0; i < recv_total_; ++i) {
      ids_[i] = meta[2 * i];
      std::memcpy(&weights_[i], &meta[2 * i + 1], sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status RunLocalExperts(const EpStep& step) override {
    const EpLayer& L = *step.layer;
    const int64_t H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
    results_.resize(recv_total_ * H * es);
    if (recv_total_ == 0) return absl::OkStatus();
    // Every received row is one slot of k = 1; its weight travels along for
    // apply_router_weight_on_input (then the layer's k is 1 as well).
    const std::vector<int32_t> map = L.placement.ExpertMap(step.rank);
    const MoeProblem p =
        LocalExpertProblem(L, step.rank, recv_total_, /*top_k=*/1, hidden_.data(), map.data());
    std::vector<float> out(recv_total_ * H);
    KPLAN_RETURN_IF_ERROR(RunExperts(p, ids_.data(), weights_.data(), out.data()));
    // RunExperts rounds its outputs to act_dtype: sending them in it is exact.
    for (int64_t i = 0; i < recv_total_ * H; ++i) {
      StoreFloat(results_.data(), L.act_dtype, i, out[i]);
    }
    return absl::OkStatus();
  }

  absl::Status Finalize(const EpStep& step, comm::Communicator& comm) override {
    const EpLayer& L = *step.layer;
    const int k = L.top_k;
    const int64_t H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
    std::vector<char> back(send_order_.size() * H * es);
    KPLAN_RETURN_IF_ERROR(Exchange(comm, results_.empty() ? nullptr : results_.data(), recv_rows_,
                                   back.empty() ? nullptr : back.data(), send_rows_, H,
                                   CommDTypeOf(L.act_dtype)));
    if (step.num_tokens == 0) return absl::OkStatus();
    std::vector<float> per_slot(step.num_tokens * k * H, 0.0f);
    for (size_t i = 0; i < send_order_.size(); ++i) {
      float* dst = per_slot.data() + send_order_[i] * H;
      for (int64_t h = 0; h < H; ++h) dst[h] = LoadFloat(back.data(), L.act_dtype, i * H + h);
    }
    return CombineTopK(per_slot.data(), step.topk_weights, step.num_tokens, k, H,
                       L.apply_router_weight_on_input, L.act_dtype, step.output);
  }

 private:
  static absl::Status Exchange(comm::Communicator& comm, const void* send,
                               const std::vector<int64_t>& send_rows, void* recv,
                               const std::vector<int64_t>& recv_rows, int64_t width,
                               kernels::DType dtype) {
    return comm::ExchangeRows(comm, send, send_rows, recv, recv_rows, width, dtype);
  }

  std::vector<int64_t> send_order_;  // slot index (token * k + j) per sent row
  std::vector<int64_t> send_rows_, recv_rows_;
  int64_t recv_total_ = 0;
  std::vector<char> hidden_;  // [recv_total, H] act_dtype
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<char> results_;  // [recv_total, H] act_dtype
};

}  // namespace

std::unique_ptr<EpDispatch> MakeAll2AllVDispatch() { return std::make_unique<All2AllV>(); }

}  // namespace kplan::moe::ep
