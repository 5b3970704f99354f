#include "server/moe/ep/gpu_ep_communicator.h"

#include <utility>

namespace kplan::moe::ep {

GpuEpCommunicator::GpuEpCommunicator(std::unique_ptr<comm::NcclCommunicator> nccl)
    : nccl_(std::move(nccl)) {}

GpuEpCommunicator::~GpuEpCommunicator() {
  if (aborted_) {
    // A failed call marks the wrapper aborted without necessarily aborting
    // NCCL (an enqueue error, a failed transport Create): make it so, then
    // the transports' registrations died with it and only their window
    // memory is left to free.
    nccl_->Abort("a call on the communicator failed");
    for (auto& t : transports_) t->Abandon();
  }
  transports_.clear();  // before nccl_, which they use
}

absl::Status GpuEpCommunicator::Track(absl::Status st) {
  if (!st.ok()) aborted_ = true;  // NcclCommunicator aborts itself on a failed call
  return st;
}

absl::Status GpuEpCommunicator::AllGather(const void* send, void* recv, int64_t count,
                                          kernels::DType dtype) {
  return Track(nccl_->AllGather(send, recv, count, dtype));
}

absl::Status GpuEpCommunicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                              kernels::DType dtype, comm::ReduceOp op) {
  return Track(nccl_->ReduceScatter(send, recv, recv_count, dtype, op));
}

absl::Status GpuEpCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                          absl::Span<const int64_t> send_displs, void* recv,
                                          absl::Span<const int64_t> recv_counts,
                                          absl::Span<const int64_t> recv_displs,
                                          kernels::DType dtype) {
  return Track(
      nccl_->AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype));
}

absl::Status GpuEpCommunicator::Barrier() { return Track(nccl_->Barrier()); }

void GpuEpCommunicator::Abort(absl::string_view reason) {
  aborted_ = true;
  nccl_->Abort(reason);
}

absl::StatusOr<comm::KplanEpTransport*> GpuEpCommunicator::Transport(const comm::KplanEpConfig& c) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  for (auto& t : transports_) {
    const comm::KplanEpConfig& h = t->config();
    if (h.top_k != c.top_k || h.hidden != c.hidden || h.elem_size != c.elem_size ||
        h.num_experts != c.num_experts || h.rank_first_expert != c.rank_first_expert ||
        h.num_ctas != c.num_ctas) {
      continue;
    }
    if (h.max_tokens_per_rank >= c.max_tokens_per_rank) return t.get();
    t.reset();  // collective: every rank replaces the same transport in the same step
    absl::StatusOr<std::unique_ptr<comm::KplanEpTransport>> fresh =
        comm::KplanEpTransport::Create(*nccl_, c);
    if (!fresh.ok()) return Track(fresh.status());
    ++transports_created_;
    t = *std::move(fresh);
    return t.get();
  }
  absl::StatusOr<std::unique_ptr<comm::KplanEpTransport>> fresh =
      comm::KplanEpTransport::Create(*nccl_, c);
  if (!fresh.ok()) return Track(fresh.status());
  ++transports_created_;
  transports_.push_back(*std::move(fresh));
  return transports_.back().get();
}

}  // namespace kplan::moe::ep
