// Communicator whose ranks are threads of one process: the CPU execution path
// of expert parallelism and the harness every dispatch/combine test runs on.
// The ranks share one InProcessGroup (the hub). A collective is a rendezvous:
// each rank posts its buffers, waits until every rank has arrived, copies or
// reduces what it needs straight out of its peers' send buffers, then waits
// until every rank has finished reading before it returns (so callers may
// free their buffers). Reductions add ranks in order 0..n-1, so every result
// is deterministic and independent of thread scheduling.
//
// Failures never hang: a rank waiting longer than `timeout` for its peers
// fails the collective with DEADLINE_EXCEEDED naming the collective and the
// ranks that never joined; Abort() on any rank fails every pending and future
// call of every rank with ABORTED (or, as NCCL does, only the aborting rank's:
// InProcessOptions.abort_is_local); mismatched calls (different collectives or
// sizes at the same position) fail every rank. Any of these leaves the group
// unusable, as a failed NCCL communicator is; create a new group.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "kernels/comm/communicator.h"

namespace kplan::comm {

struct InProcessOptions {
  // How long a rank waits in one collective for the others to join.
  std::chrono::milliseconds timeout{30000};
  // NCCL's semantics: Abort() fails only the aborting rank's own pending and
  // future calls (ncclCommAbort tells no peer); a peer waiting for it fails at
  // its timeout or its own Abort(). For tests of code that must cope with a
  // transport like that (the expert-parallel group across servers).
  bool abort_is_local = false;
};

class InProcessCommunicator;

class InProcessGroup {
 public:
  // The n communicators of a new group, element r being rank r. Each is used
  // by one thread at a time (its rank's thread).
  static absl::StatusOr<std::vector<std::unique_ptr<InProcessCommunicator>>> Create(
      int size, InProcessOptions options = {});

  int size() const { return size_; }
  const InProcessOptions& options() const { return options_; }

  // Fault injection: the call of `rank` that comes `after_calls` calls from
  // now (0 = its next call) returns `status` without joining its collective,
  // as if the rank's transport had failed. Its peers then wait for it and
  // fail with DEADLINE_EXCEEDED unless someone calls Abort().
  void InjectFault(int rank, absl::Status status, int after_calls = 0);

  // Fails every pending and future call of every rank with ABORTED (with
  // abort_is_local: those of `by_rank` only).
  void Abort(int by_rank, absl::string_view reason);

  // OK while the group is usable, else the first failure.
  absl::Status failure() const;

  // Number of collectives `rank` has entered (faulted ones included).
  int64_t calls(int rank) const;

 private:
  friend class InProcessCommunicator;
  struct Op {
    std::string signature;  // what the first rank to arrive called
    int signature_rank = -1;
    std::vector<const void*> args;  // per rank: its call description
    std::vector<char> present;      // per rank: has arrived
    int arrived = 0;
    int finished = 0;  // ranks done reading peers' buffers
    int left = 0;      // ranks gone after finishing
  };
  using Work = std::function<absl::Status(const std::vector<const void*>& args)>;

  InProcessGroup(int size, InProcessOptions options);
  // The rendezvous. `args` points to this rank's call description (valid
  // until Run returns); `work` runs once every rank has arrived and reads the
  // peers' descriptions.
  absl::Status Run(int rank, const std::string& signature, const void* args, const Work& work)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the group failed with `status` (first failure wins) and wakes all.
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // The status of `rank`'s calls once its own Abort (abort_is_local) ran.
  absl::Status RankAbortedLocked(int rank, const std::string& signature, int64_t call) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int size_;
  const InProcessOptions options_;
  mutable kplan::Mutex mu_;
  kplan::CondVar cv_;  // signalled on every arrival, finish and failure
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> next_call_ ABSL_GUARDED_BY(mu_);  // per rank
  // Per rank: the abort reason, if any.
  std::vector<std::string> rank_aborted_ ABSL_GUARDED_BY(mu_);
  // Per rank: call number -> injected status.
  std::vector<std::map<int64_t, absl::Status>> faults_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Op> ops_ ABSL_GUARDED_BY(mu_);  // by call number
};

class InProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::string_view backend() const override { return "in_process"; }

  absl::Status AllGather(const void* send, void* recv, int64_t count,
                         kernels::DType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count, kernels::DType dtype,
                             ReduceOp op = ReduceOp::kSum) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                         absl::Span<const int64_t> send_displs, void* recv,
                         absl::Span<const int64_t> recv_counts,
                         absl::Span<const int64_t> recv_displs, kernels::DType dtype) override;
  absl::Status Barrier() override;
  void Abort(absl::string_view reason) override;

  InProcessGroup& group() const { return *group_; }

 private:
  friend class InProcessGroup;
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  // Local argument errors fail the whole group, so no peer waits for a rank
  // that bailed out before joining.
  absl::Status FailGroup(absl::Status status);

  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

}  // namespace kplan::comm
