// GpuEpCommunicator: a GPU rank's NcclCommunicator together with the
// passthrough transports (kernels/comm/kplan_ep_transport.h) built on it, so
// that a generation's transports live and die with that generation's NCCL
// communicator. The collective strategies use it as a plain Communicator; the
// passthrough step (gpu_ep_passthrough.cc) takes its transport from it.
// docs/EP.md ("GPU communicator") says why the transports are released
// before the communicator and abandoned after an abort. Built only with CUDA
// and NCCL.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/comm/nccl_communicator.h"

namespace kplan::moe::ep {

// One transport per layer configuration (capacity, k, H, E, placement),
// created on the first passthrough step that needs it; creation and
// destruction are collective, and every rank takes the same decisions
// because they depend only on the step's shared layer options and
// reservation. Destroy the ranks' wrappers concurrently (one thread per
// rank), as the collective strategies' communicators are.
//
// Threads: the rank's thread makes every call; only Abort() (and aborted())
// may come from another thread (the group's coordinator). The transports are
// therefore not under a mutex: a lock that Abort() had to take would wait for
// a transport's collective Create(), which is exactly what an abort must
// break.
class GpuEpCommunicator final : public comm::Communicator {
 public:
  explicit GpuEpCommunicator(std::unique_ptr<comm::NcclCommunicator> nccl);
  ~GpuEpCommunicator() override;

  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  absl::string_view backend() const override { return nccl_->backend(); }
  absl::Status AllGather(const void* send, void* recv, int64_t count,
                         kernels::DType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count, kernels::DType dtype,
                             comm::ReduceOp op) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                         absl::Span<const int64_t> send_displs, void* recv,
                         absl::Span<const int64_t> recv_counts,
                         absl::Span<const int64_t> recv_displs, kernels::DType dtype) override;
  absl::Status Barrier() override;
  // Any thread.
  void Abort(absl::string_view reason) override;

  comm::NcclCommunicator& nccl() { return *nccl_; }
  // Any thread.
  bool aborted() const { return aborted_; }
  // The transport for `config` (identical on every rank), created (a
  // collective) when missing or smaller; a transport of the same shape but a
  // smaller capacity is replaced.
  absl::StatusOr<comm::KplanEpTransport*> Transport(const comm::KplanEpConfig& config);
  int64_t transports_created() const { return transports_created_; }

 private:
  // Marks the wrapper aborted when `st` is an error.
  absl::Status Track(absl::Status st);

  std::unique_ptr<comm::NcclCommunicator> nccl_;
  // The rank thread's only.
  std::vector<std::unique_ptr<comm::KplanEpTransport>> transports_;
  int64_t transports_created_ = 0;
  std::atomic<bool> aborted_{false};  // set by the rank thread or by an abort from another
};

}  // namespace kplan::moe::ep
