// Communicator over NCCL: the GPU transport of expert parallelism. Buffers
// are device pointers; every collective is enqueued on the communicator's
// CUDA stream and then waited for, polling the stream and NCCL's async error
// state, so a dead peer becomes DEADLINE_EXCEEDED after `timeout` (the
// communicator is then aborted) instead of a hang. Built only when CMake
// finds NCCL (KPLAN_HAVE_NCCL); the header itself names no CUDA or NCCL type.
//
// Group formation: one rank calls CreateUniqueId() and hands the bytes to the
// others out of band (an RPC between servers, or memory within one process);
// every rank then calls Create() with them, which waits until all ranks have
// joined, at most `timeout` (DEADLINE_EXCEEDED naming the rank after it). NVLink multicast (NVLS)
// must stay off: the server sets NCCL_NVLS_ENABLE=0 before the first communicator is created.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "kernels/comm/communicator.h"

struct ncclComm;  // NCCL's opaque communicator (ncclComm_t is ncclComm*)

namespace kplan::comm {

struct NcclOptions {
  // How long one collective may take before the communicator is aborted,
  // and how long Create() waits for the other ranks to join.
  std::chrono::milliseconds timeout{300000};
};

class NcclCommunicator final : public Communicator {
 public:
  // The bytes of a fresh ncclUniqueId (NCCL_UNIQUE_ID_BYTES long).
  static absl::StatusOr<std::string> CreateUniqueId();

  // Joins the group as `rank` of `size` on CUDA device `device`. `stream` is
  // a cudaStream_t passed as void*; null creates a non-blocking stream that
  // the communicator owns.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int rank, int size,
                                                                  absl::string_view unique_id,
                                                                  int device, void* stream,
                                                                  NcclOptions options = {});
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "nccl"; }
  void* stream() const { return stream_; }
  int device() const { return device_; }
  // The NCCL communicator itself, for transports that build on it (the
  // kplan_ep device-API transport); owned by this object.
  ncclComm* nccl_comm() const { return comm_; }

  absl::Status AllGather(const void* send, void* recv, int64_t count,
                         kernels::DType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count, kernels::DType dtype,
                             ReduceOp op = ReduceOp::kSum) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                         absl::Span<const int64_t> send_displs, void* recv,
                         absl::Span<const int64_t> recv_counts,
                         absl::Span<const int64_t> recv_displs, kernels::DType dtype) override;
  absl::Status Barrier() override;
  // Aborts this rank's NCCL communicator (ncclCommAbort). Peers are not
  // told; their pending collectives fail at their own timeout or abort.
  void Abort(absl::string_view reason) override;

 private:
  NcclCommunicator(int rank, int size, int device, ncclComm* comm, void* stream, bool owns_stream,
                   NcclOptions options);
  // ABORTED once Abort() ran or an earlier call failed.
  absl::Status CheckUsable(absl::string_view what) const ABSL_LOCKS_EXCLUDED(reason_mu_);
  // Waits for the work enqueued on the stream; on an NCCL async error or a
  // timeout aborts the communicator and returns the error.
  absl::Status Wait(absl::string_view what) ABSL_LOCKS_EXCLUDED(poll_mu_, reason_mu_);
  void AbortComm(absl::Status why) ABSL_LOCKS_EXCLUDED(poll_mu_, reason_mu_);

  const int rank_, size_, device_;
  ncclComm* comm_;
  void* stream_;
  const bool owns_stream_;
  const NcclOptions options_;
  std::atomic<bool> aborted_{false};
  mutable kplan::Mutex reason_mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(reason_mu_);  // the first abort's
  // Held by each poll of Wait() and by the abort: Abort may come from
  // another thread (the group's coordinator) while the rank's thread polls.
  // Enqueueing a collective is not under it: a first collective may block in
  // NCCL's connection setup on a dead peer, and ncclCommAbort from another
  // thread is NCCL's way to break that (it sets the abort flag those host
  // loops poll), so it must not wait for the enqueue to return.
  // It guards no member: comm_ is also used outside it on purpose (the
  // enqueues above), so the lock orders the queries and the abort instead.
  kplan::Mutex poll_mu_ ABSL_ACQUIRED_BEFORE(reason_mu_);  // Wait() checks the reason under it
  // Device scratch for Barrier (one float).
  void* barrier_buffer_ = nullptr;
};

}  // namespace kplan::comm
