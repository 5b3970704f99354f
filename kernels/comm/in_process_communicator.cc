#include "kernels/comm/in_process_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "absl/time/time.h"

namespace kplan::comm {
namespace {

struct GatherArgs {
  const void* send;
  void* recv;
};

struct AllToAllVArgs {
  const void* send;
  absl::Span<const int64_t> send_counts, send_displs;
  void* recv;
  absl::Span<const int64_t> recv_counts, recv_displs;
};

std::string RankPrefix(int rank) { return absl::StrCat("InProcessCommunicator rank ", rank, ": "); }

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<InProcessCommunicator>>> InProcessGroup::Create(
    int size, InProcessOptions options) {
  if (size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("group size must be positive, got ", size));
  }
  if (options.timeout.count() <= 0) {
    return absl::InvalidArgumentError("InProcessOptions.timeout must be positive");
  }
  std::shared_ptr<InProcessGroup> group(new InProcessGroup(size, options));
  std::vector<std::unique_ptr<InProcessCommunicator>> comms;
  for (int r = 0; r < size; ++r) comms.emplace_back(new InProcessCommunicator(group, r));
  return comms;
}

InProcessGroup::InProcessGroup(int size, InProcessOptions options)
    : size_(size), options_(options), next_call_(size, 0), rank_aborted_(size), faults_(size) {}

void InProcessGroup::InjectFault(int rank, absl::Status status, int after_calls) {
  kplan::MutexLock lock(&mu_);
  if (rank < 0 || rank >= size_ || status.ok()) return;
  faults_[rank][next_call_[rank] + after_calls] = std::move(status);
}

void InProcessGroup::Abort(int by_rank, absl::string_view reason) {
  kplan::MutexLock lock(&mu_);
  if (options_.abort_is_local && by_rank >= 0 && by_rank < size_) {
    if (rank_aborted_[by_rank].empty()) rank_aborted_[by_rank] = std::string(reason);
    if (rank_aborted_[by_rank].empty()) rank_aborted_[by_rank] = "aborted";
    cv_.SignalAll();
    return;
  }
  FailLocked(absl::AbortedError(
      absl::StrCat("InProcessCommunicator group aborted by rank ", by_rank, ": ", reason)));
}

void InProcessGroup::Fail(absl::Status status) {
  kplan::MutexLock lock(&mu_);
  FailLocked(std::move(status));
}

absl::Status InProcessGroup::RankAbortedLocked(int rank, const std::string& signature,
                                               int64_t call) const {
  return absl::AbortedError(absl::StrCat(RankPrefix(rank), signature, " (call #", call,
                                         "): communicator aborted: ", rank_aborted_[rank]));
}

absl::Status InProcessGroup::failure() const {
  kplan::MutexLock lock(&mu_);
  return failure_;
}

int64_t InProcessGroup::calls(int rank) const {
  kplan::MutexLock lock(&mu_);
  return rank >= 0 && rank < size_ ? next_call_[rank] : 0;
}

void InProcessGroup::FailLocked(absl::Status status) {
  if (failure_.ok()) failure_ = std::move(status);
  cv_.SignalAll();
}

absl::Status InProcessGroup::Run(int rank, const std::string& signature, const void* args,
                                 const Work& work) {
  kplan::MutexLock lock(&mu_);
  const int64_t call = next_call_[rank]++;
  if (auto it = faults_[rank].find(call); it != faults_[rank].end()) {
    absl::Status injected = std::move(it->second);
    faults_[rank].erase(it);
    return absl::Status(injected.code(), absl::StrCat(RankPrefix(rank), signature, " (call #", call,
                                                      "): injected fault: ", injected.message()));
  }
  if (!rank_aborted_[rank].empty()) return RankAbortedLocked(rank, signature, call);
  if (!failure_.ok()) {
    if (failure_.code() == absl::StatusCode::kAborted) return failure_;
    return absl::AbortedError(
        absl::StrCat(RankPrefix(rank), signature, " (call #", call,
                     "): group unusable after an earlier failure: ", failure_.message()));
  }
  Op& op = ops_[call];
  if (op.arrived == 0) {
    op.signature = signature;
    op.signature_rank = rank;
    op.args.assign(size_, nullptr);
    op.present.assign(size_, 0);
  } else if (op.signature != signature) {
    FailLocked(absl::InternalError(absl::StrCat(
        "InProcessCommunicator: mismatched collectives at call #", call, ": rank ",
        op.signature_rank, " called ", op.signature, ", rank ", rank, " called ", signature)));
    return failure_;
  }
  op.args[rank] = args;
  op.present[rank] = 1;
  ++op.arrived;
  cv_.SignalAll();

  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  while (op.arrived < size_ && failure_.ok() && rank_aborted_[rank].empty()) {
    // The remaining time to the steady deadline (<= 0: times out at once).
    const bool timed_out =
        cv_.WaitWithTimeout(&mu_, absl::FromChrono(deadline - std::chrono::steady_clock::now()));
    if (timed_out && op.arrived < size_ && failure_.ok() && rank_aborted_[rank].empty()) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!op.present[r]) missing.push_back(r);
      }
      FailLocked(absl::DeadlineExceededError(absl::StrCat(
          "InProcessCommunicator: ", signature, " (call #", call, ") timed out on rank ", rank,
          " after ", options_.timeout.count(), " ms waiting for rank",
          missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "), " to join (", op.arrived,
          " of ", size_, " ranks arrived)")));
    }
  }
  if (op.arrived < size_) {
    // The group failed (or this rank was aborted) before everyone joined:
    // nobody reads this op's buffers.
    absl::Status result = failure_.ok() ? RankAbortedLocked(rank, signature, call) : failure_;
    op.present[rank] = 0;
    if (--op.arrived == 0) ops_.erase(call);
    return result;
  }

  // Everyone has arrived: read the peers' buffers without the lock. The op
  // completes even if the group fails meanwhile, since every buffer is known.
  const std::vector<const void*> all_args = op.args;
  mu_.Unlock();
  absl::Status result = work(all_args);
  mu_.Lock();
  ++op.finished;
  cv_.SignalAll();
  // Bounded: every rank is past its rendezvous and only copying memory.
  while (op.finished != size_) cv_.Wait(&mu_);
  if (++op.left == size_) ops_.erase(call);
  return result;
}

absl::Status InProcessCommunicator::FailGroup(absl::Status status) {
  group_->Fail(absl::AbortedError(
      absl::StrCat("InProcessCommunicator group aborted by rank ", rank_, ": ", status.message())));
  return status;
}

absl::Status InProcessCommunicator::AllGather(const void* send, void* recv, int64_t count,
                                              kernels::DType dtype) {
  const std::string sig =
      absl::StrCat("AllGather(count=", count, ", dtype=", kernels::DTypeName(dtype), ")");
  if (count < 0 || (count > 0 && (send == nullptr || recv == nullptr))) {
    return FailGroup(absl::InvalidArgumentError(
        absl::StrCat(RankPrefix(rank_), sig, ": negative count or null buffer")));
  }
  const int64_t bytes = count * kernels::DTypeSize(dtype);
  const GatherArgs mine{send, recv};
  return group_->Run(rank_, sig, &mine, [&](const std::vector<const void*>& args) {
    for (int p = 0; p < size(); ++p) {
      const void* src = static_cast<const GatherArgs*>(args[p])->send;
      char* dst = static_cast<char*>(recv) + p * bytes;
      if (bytes > 0 && src != dst) std::memcpy(dst, src, bytes);
    }
    return absl::OkStatus();
  });
}

absl::Status InProcessCommunicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                                  kernels::DType dtype, ReduceOp op) {
  const std::string sig = absl::StrCat("ReduceScatter(recv_count=", recv_count,
                                       ", dtype=", kernels::DTypeName(dtype), ", op=sum)");
  if (dtype != kernels::DType::kFloat32 || op != ReduceOp::kSum) {
    return FailGroup(absl::UnimplementedError(
        absl::StrCat(RankPrefix(rank_), sig, ": only a float32 sum is supported")));
  }
  if (recv_count < 0 || (recv_count > 0 && (send == nullptr || recv == nullptr))) {
    return FailGroup(absl::InvalidArgumentError(
        absl::StrCat(RankPrefix(rank_), sig, ": negative count or null buffer")));
  }
  const GatherArgs mine{send, recv};
  return group_->Run(rank_, sig, &mine, [&](const std::vector<const void*>& args) {
    // Block rank_ of every rank's send buffer is read by this rank only, so
    // an in-place reduction (recv inside send) is safe element by element.
    float* out = static_cast<float*>(recv);
    const int64_t base = static_cast<int64_t>(rank_) * recv_count;
    for (int64_t i = 0; i < recv_count; ++i) {
      float acc =
          static_cast<const float*>(static_cast<const GatherArgs*>(args[0])->send)[base + i];
      for (int p = 1; p < size(); ++p) {
        acc += static_cast<const float*>(static_cast<const GatherArgs*>(args[p])->send)[base + i];
      }
      out[i] = acc;
    }
    return absl::OkStatus();
  });
}

absl::Status InProcessCommunicator::AllToAllV(const void* send,
                                              absl::Span<const int64_t> send_counts,
                                              absl::Span<const int64_t> send_displs, void* recv,
                                              absl::Span<const int64_t> recv_counts,
                                              absl::Span<const int64_t> recv_displs,
                                              kernels::DType dtype) {
  const std::string sig = absl::StrCat("AllToAllV(dtype=", kernels::DTypeName(dtype), ")");
  if (absl::Status st = ValidateAllToAllVSide(size(), send, send_counts, send_displs, "send");
      !st.ok()) {
    return FailGroup(absl::InvalidArgumentError(absl::StrCat(RankPrefix(rank_), st.message())));
  }
  if (absl::Status st = ValidateAllToAllVSide(size(), recv, recv_counts, recv_displs, "recv");
      !st.ok()) {
    return FailGroup(absl::InvalidArgumentError(absl::StrCat(RankPrefix(rank_), st.message())));
  }
  const int64_t elem = kernels::DTypeSize(dtype);
  const AllToAllVArgs mine{send, send_counts, send_displs, recv, recv_counts, recv_displs};
  return group_->Run(rank_, sig, &mine, [&](const std::vector<const void*>& args) {
    // Every rank checks the whole count matrix, so all reach the same verdict.
    for (int s = 0; s < size(); ++s) {
      const auto* a = static_cast<const AllToAllVArgs*>(args[s]);
      for (int d = 0; d < size(); ++d) {
        const auto* b = static_cast<const AllToAllVArgs*>(args[d]);
        if (a->send_counts[d] != b->recv_counts[s]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "InProcessCommunicator: AllToAllV: rank ", s, " sends ", a->send_counts[d],
              " elements to rank ", d, " but rank ", d, " expects ", b->recv_counts[s]));
        }
      }
    }
    for (int p = 0; p < size(); ++p) {
      const auto* a = static_cast<const AllToAllVArgs*>(args[p]);
      const int64_t bytes = recv_counts[p] * elem;
      if (bytes == 0) continue;
      std::memcpy(static_cast<char*>(recv) + recv_displs[p] * elem,
                  static_cast<const char*>(a->send) + a->send_displs[rank_] * elem, bytes);
    }
    return absl::OkStatus();
  });
}

absl::Status InProcessCommunicator::Barrier() {
  return group_->Run(rank_, "Barrier()", nullptr,
                     [](const std::vector<const void*>&) { return absl::OkStatus(); });
}

void InProcessCommunicator::Abort(absl::string_view reason) { group_->Abort(rank_, reason); }

}  // namespace kplan::comm
