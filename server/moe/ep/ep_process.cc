#include "server/moe/ep/ep_process.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/checked_size.h"
#include "base/status.h"

namespace kplan::moe::ep {
namespace {

// Rank 0's communicator, shared with ProcessEpRanks so that a remote rank's
// failure can abort it: rank 0 would otherwise sit in a collective waiting
// for a peer that is gone until the collective's own timeout.
class SharedCommunicator final : public comm::Communicator {
 public:
  explicit SharedCommunicator(std::shared_ptr<comm::Communicator> inner)
      : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::string_view backend() const override { return inner_->backend(); }
  absl::Status AllGather(const void* send, void* recv, int64_t count,
                         kernels::DType dtype) override {
    return inner_->AllGather(send, recv, count, dtype);
  }
  absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count, kernels::DType dtype,
                             comm::ReduceOp op) override {
    return inner_->ReduceScatter(send, recv, recv_count, dtype, op);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                         absl::Span<const int64_t> send_displs, void* recv,
                         absl::Span<const int64_t> recv_counts,
                         absl::Span<const int64_t> recv_displs, kernels::DType dtype) override {
    return inner_->AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort(absl::string_view reason) override { inner_->Abort(reason); }
  comm::Communicator& Underlying() override { return inner_->Underlying(); }

 private:
  std::shared_ptr<comm::Communicator> inner_;
};

// What a remote rank's thread on rank 0 holds as its "communicator": the
// real one lives in the peer's process. No collectives run here; Abort
// cancels the rank's step in flight.
class RemoteRankCommunicator final : public comm::Communicator {
 public:
  RemoteRankCommunicator(int rank, int size, int64_t generation,
                         std::shared_ptr<EpRemoteRanks> remote)
      : rank_(rank), size_(size), generation_(generation), remote_(std::move(remote)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "remote"; }
  absl::Status AllGather(const void*, void*, int64_t, kernels::DType) override {
    return Unsupported();
  }
  absl::Status ReduceScatter(const void*, void*, int64_t, kernels::DType, comm::ReduceOp) override {
    return Unsupported();
  }
  absl::Status AllToAllV(const void*, absl::Span<const int64_t>, absl::Span<const int64_t>, void*,
                         absl::Span<const int64_t>, absl::Span<const int64_t>,
                         kernels::DType) override {
    return Unsupported();
  }
  absl::Status Barrier() override { return Unsupported(); }
  void Abort(absl::string_view reason) override { remote_->Cancel(rank_, generation_, reason); }

 private:
  absl::Status Unsupported() const {
    return absl::InternalError(
        absl::StrCat("rank ", rank_, " runs in another process; its collectives run there"));
  }
  const int rank_, size_;
  const int64_t generation_;
  std::shared_ptr<EpRemoteRanks> remote_;
};

class RemoteRankExperts final : public EpRankExperts {
 public:
  explicit RemoteRankExperts(int64_t bytes) : bytes_(bytes) {}
  int64_t bytes() const override { return bytes_; }
  int64_t resident_bytes() const override { return 0; }  // on another server

 private:
  int64_t bytes_;
};

// A multi-process group never tears a communicator down collectively (NCCL's
// destroy, the passthrough windows): the other processes may be gone or busy
// (a peer that stopped first, a rank still in a failed step), and the
// teardown would wait for them. A communicator that is replaced or outlived
// by its server is aborted instead, which waits for no one.
constexpr absl::string_view kReplaced = "replaced by a newer communicator generation";
constexpr absl::string_view kStopping = "the server is stopping";

class ProcessEpRanks final : public EpRankKind {
 public:
  ProcessEpRanks(std::unique_ptr<EpRankKind> local, int size, std::shared_ptr<EpRemoteRanks> remote,
                 EpCommFactory comm_factory, EpGroupIdSource id_source)
      : local_(std::move(local)),
        size_(size),
        remote_(std::move(remote)),
        comm_factory_(std::move(comm_factory)),
        id_source_(std::move(id_source)) {}
  ~ProcessEpRanks() override {
    kplan::MutexLock lock(&mu_);  // no other thread is left; for the analysis
    if (local_comm_ != nullptr) local_comm_->Abort(kStopping);
  }

  int size() const override { return size_; }
  std::string Device(int rank) const override {
    return rank == 0 ? local_->Device(0) : remote_->Device(rank);
  }
  absl::string_view communicator() const override { return local_->communicator(); }
  absl::string_view moe_backend() const override { return local_->moe_backend(); }
  absl::string_view experts_kernel() const override { return local_->experts_kernel(); }

  absl::Status NewCommunicators(absl::Duration comm_timeout) override {
    KPLAN_ASSIGN_OR_RETURN(std::string id, id_source_());
    kplan::MutexLock lock(&mu_);
    group_id_ = std::move(id);
    ++generation_;
    timeout_ = comm_timeout;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> JoinCommunicator(int rank) override {
    if (rank != 0) {
      kplan::MutexLock lock(&mu_);
      return std::unique_ptr<comm::Communicator>(
          new RemoteRankCommunicator(rank, size_, generation_, remote_));
    }
    std::string id;
    absl::Duration timeout;
    {
      kplan::MutexLock lock(&mu_);
      id = group_id_;
      timeout = timeout_;
    }
    KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                           comm_factory_(id, 0, size_, timeout));
    std::shared_ptr<comm::Communicator> shared(std::move(comm));
    std::shared_ptr<comm::Communicator> old;
    {
      kplan::MutexLock lock(&mu_);
      old = std::exchange(local_comm_, shared);
    }
    if (old != nullptr) old->Abort(kReplaced);
    return std::unique_ptr<comm::Communicator>(new SharedCommunicator(std::move(shared)));
  }

  absl::StatusOr<std::unique_ptr<EpRankExperts>> PlaceExperts(
      int rank, const ExpertSet& set, const ExpertPlacement& placement) override {
    if (rank == 0) return local_->PlaceExperts(0, set, placement);
    KPLAN_ASSIGN_OR_RETURN(int64_t bytes, remote_->PlaceExperts(rank, set));
    return std::unique_ptr<EpRankExperts>(new RemoteRankExperts(bytes));
  }

  absl::Status RunMoe(int rank, const ExpertSet& set, const EpRankExperts& experts,
                      const ExpertPlacement& placement, const EpMoeOptions& options,
                      const MoeInputsForThisRank& inputs, comm::Communicator& comm) override {
    if (rank == 0) return local_->RunMoe(0, set, experts, placement, options, inputs, comm);
    EpForwardedStep step;
    step.experts_id = set.spec().experts_id;
    {
      kplan::MutexLock lock(&mu_);
      step.generation = generation_;
      step.group_id = group_id_;
    }
    step.rank = rank;
    step.size = size_;
    step.options = options;
    step.num_tokens = inputs.num_tokens;
    const int64_t row = set.spec().hidden * kernels::DTypeSize(options.act_dtype);
    const int64_t k = options.top_k;
    step.hidden_states.assign(static_cast<const char*>(inputs.hidden_states),
                              inputs.num_tokens * row);
    step.topk_ids.resize(inputs.num_tokens * k);
    step.topk_weights.resize(inputs.num_tokens * k);
    if (inputs.num_tokens > 0) {
      if (inputs.router_logits != nullptr) {
        KPLAN_RETURN_IF_ERROR(RouteTokens(inputs.routing, inputs.router_logits, inputs.num_tokens,
                                          step.topk_weights.data(), step.topk_ids.data()));
      } else {
        std::memcpy(step.topk_ids.data(), inputs.topk_ids, step.topk_ids.size() * 4);
        std::memcpy(step.topk_weights.data(), inputs.topk_weights, step.topk_weights.size() * 4);
      }
    }
    absl::StatusOr<std::string> out = remote_->RunStep(step);
    if (out.ok() && static_cast<int64_t>(out->size()) != inputs.num_tokens * row) {
      out = absl::InternalError(absl::StrCat("rank ", rank, " returned ", out->size(),
                                             " output bytes, expected ", inputs.num_tokens * row));
    }
    if (!out.ok()) {
      // Rank 0 may be waiting in a collective for this rank: stop it now.
      std::shared_ptr<comm::Communicator> local;
      {
        kplan::MutexLock lock(&mu_);
        local = local_comm_;
      }
      if (local != nullptr) {
        local->Abort(absl::StrCat("rank ", rank, " failed: ", out.status().message()));
      }
      return out.status();
    }
    if (!out->empty()) std::memcpy(inputs.output, out->data(), out->size());
    return absl::OkStatus();
  }

  void CurrentId(std::string* id, int64_t* generation) const {
    kplan::MutexLock lock(&mu_);
    *id = group_id_;
    *generation = generation_;
  }

 private:
  const std::unique_ptr<EpRankKind> local_;
  const int size_;
  const std::shared_ptr<EpRemoteRanks> remote_;
  const EpCommFactory comm_factory_;
  const EpGroupIdSource id_source_;
  mutable kplan::Mutex mu_;
  std::string group_id_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(30);
  std::shared_ptr<comm::Communicator> local_comm_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<EpRankKind> MakeProcessEpRanks(std::unique_ptr<EpRankKind> local, int size,
                                               std::shared_ptr<EpRemoteRanks> remote,
                                               EpCommFactory comm_factory,
                                               EpGroupIdSource id_source) {
  return std::make_unique<ProcessEpRanks>(std::move(local), size, std::move(remote),
                                          std::move(comm_factory), std::move(id_source));
}

bool CurrentProcessGroupId(const EpRankKind& kind, std::string* group_id, int64_t* generation) {
  const auto* p = dynamic_cast<const ProcessEpRanks*>(&kind);
  if (p == nullptr) return false;
  p->CurrentId(group_id, generation);
  return true;
}

// ---------------------------------------------------------------------------
// EpPeerExperts.

EpPeerExperts::EpPeerExperts(int rank, int size, std::string device, ExpertPlacement placement,
                             std::unique_ptr<EpRankExperts> experts)
    : rank_(rank),
      size_(size),
      device_(std::move(device)),
      placement_(std::move(placement)),
      experts_(std::move(experts)) {}

const EpPeerExperts* EpPeerExperts::Of(const ExpertSet& set) {
  return dynamic_cast<const EpPeerExperts*>(set.device_copy());
}

std::string EpPeerExperts::device_name() const {
  return absl::StrCat("ep-rank", rank_, "/", size_, ":", device_);
}

// ---------------------------------------------------------------------------
// EpPeerRank.

EpPeerRank::EpPeerRank(std::unique_ptr<EpRankKind> local, int rank, int size,
                       EpCommFactory comm_factory, absl::Duration comm_timeout)
    : local_(std::move(local)),
      rank_(rank),
      size_(size),
      comm_factory_(std::move(comm_factory)),
      comm_timeout_(comm_timeout) {
  thread_ = std::thread([this] { Loop(); });
}

EpPeerRank::~EpPeerRank() {
  {
    kplan::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  kplan::MutexLock lock(&mu_);  // the peer's thread is gone; for the analysis
  if (comm_ != nullptr) comm_->Abort(kStopping);
}

int64_t EpPeerRank::generation() const {
  kplan::MutexLock lock(&mu_);
  return generation_;
}

void EpPeerRank::Post(std::function<void()> work) {
  {
    kplan::MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
  }
  cv_.SignalAll();
}

void EpPeerRank::Loop() {
  kplan::MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) return;
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    work();
    mu_.Lock();
  }
}

void EpPeerRank::PlaceExperts(
    std::shared_ptr<const ExpertSet> set,
    std::function<void(absl::StatusOr<std::unique_ptr<EpPeerExperts>>)> done) {
  Post([this, set = std::move(set), done = std::move(done)] {
    absl::StatusOr<ExpertPlacement> placement =
        ExpertPlacement::Linear(set->spec().num_experts, size_);
    if (!placement.ok()) {
      done(placement.status());
      return;
    }
    absl::StatusOr<std::unique_ptr<EpRankExperts>> mine =
        local_->PlaceExperts(rank_, *set, *placement);
    if (!mine.ok()) {
      done(mine.status());
      return;
    }
    done(std::make_unique<EpPeerExperts>(rank_, size_, local_->Device(rank_), *placement,
                                         std::move(*mine)));
  });
}

void EpPeerRank::RunStep(std::shared_ptr<const ExpertSet> set, EpForwardedStep step,
                         std::function<void(absl::StatusOr<std::string>)> done) {
  Post([this, set = std::move(set), step = std::move(step), done = std::move(done)] {
    done(RunStepNow(*set, step));
  });
}

absl::StatusOr<std::string> EpPeerRank::RunStepNow(const ExpertSet& set,
                                                   const EpForwardedStep& step) {
  if (step.size != size_) {
    return WithField(absl::FailedPreconditionError(
                         absl::StrCat("this server is rank ", rank_, " of a group of ", size_,
                                      "; the step is for a group of ", step.size)),
                     "size");
  }
  if (step.rank != rank_) {
    return WithField(absl::FailedPreconditionError(absl::StrCat(
                         "this server is rank ", rank_, "; the step is for rank ", step.rank)),
                     "rank");
  }
  const EpPeerExperts* experts = EpPeerExperts::Of(set);
  if (experts == nullptr) {
    return WithField(absl::FailedPreconditionError(absl::StrCat("experts '", step.experts_id,
                                                                "' are not placed on this rank")),
                     "experts_id");
  }
  const int64_t row = set.spec().hidden * kernels::DTypeSize(step.options.act_dtype);
  const int64_t k = step.options.top_k;
  const int num_experts = set.spec().num_experts;
  if (k < 1 || k > num_experts) {
    return InvalidField("top_k", absl::StrCat("top_k must be in [1, ", num_experts, "], got ", k));
  }
  // Sizes from the wire: checked products before anything is sized by them.
  KPLAN_RETURN_IF_ERROR(CheckTensorBytes({step.num_tokens, set.spec().hidden},
                                         kernels::DTypeSize(step.options.act_dtype),
                                         static_cast<int64_t>(step.hidden_states.size()),
                                         "hidden_states")
                            .status());
  if (static_cast<int64_t>(step.topk_ids.size()) != step.num_tokens * k ||
      static_cast<int64_t>(step.topk_weights.size()) != step.num_tokens * k) {
    return WithField(absl::InvalidArgumentError(absl::StrCat("the step's tensors do not match ",
                                                             step.num_tokens, " tokens of hidden ",
                                                             set.spec().hidden, " and top_k ", k)),
                     "topk_ids");
  }
  for (size_t t = 0; t < step.topk_ids.size(); ++t) {
    if (step.topk_ids[t] < 0 || step.topk_ids[t] >= num_experts) {
      return InvalidField("topk_ids",
                          absl::StrCat("topk_ids[", t / k, "][", t % k, "] = ", step.topk_ids[t],
                                       " is not in [0, ", num_experts, ")"));
    }
  }
  int64_t generation;
  bool have_comm;  // only this thread changes comm_
  {
    kplan::MutexLock lock(&mu_);
    generation = generation_;
    have_comm = comm_ != nullptr;
    if (step.generation <= abandoned_generation_) {
      // Rank 0 gave up on this generation before the step started here.
      return absl::CancelledError(absl::StrCat("rank 0 cancelled the steps of generation ",
                                               step.generation, " before this one started"));
    }
  }
  if (step.generation < generation || (step.generation == generation && !have_comm)) {
    return WithField(absl::FailedPreconditionError(
                         absl::StrCat("rank ", rank_, " is at communicator generation ", generation,
                                      !have_comm ? " (failed; waiting for a newer one)" : "",
                                      "; the step is for generation ", step.generation)),
                     "generation");
  }
  if (step.generation > generation) {
    {
      kplan::MutexLock lock(&mu_);
      generation_ = step.generation;
    }
    // Join the new generation first and abort the old communicator after,
    // in the order rank 0 does (see kReplaced).
    absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
        comm_factory_(step.group_id, rank_, size_, comm_timeout_);
    std::unique_ptr<comm::Communicator> old;
    bool abandoned = false;
    {
      kplan::MutexLock lock(&mu_);
      old = std::move(comm_);
      if (comm.ok()) {
        comm_ = std::move(*comm);
        comm_generation_ = step.generation;
        // Rank 0 may have given up while this rank was joining.
        abandoned = step.generation <= abandoned_generation_;
        if (abandoned) comm_->Abort("rank 0 cancelled the step while this rank joined");
      }
    }
    if (abandoned) {
      if (old != nullptr) old->Abort(kReplaced);
      return absl::CancelledError(absl::StrCat("rank 0 cancelled the steps of generation ",
                                               step.generation, " while this rank joined"));
    }
    if (!comm.ok()) {
      if (old != nullptr) old->Abort(kReplaced);
      old.reset();
      return absl::Status(comm.status().code(),
                          absl::StrCat("rank ", rank_, " could not join generation ",
                                       step.generation, ": ", comm.status().message()));
    }
    if (old != nullptr) old->Abort(kReplaced);
    old.reset();
  }
  std::string output(step.num_tokens * row, '\0');
  MoeInputsForThisRank inputs;
  inputs.num_tokens = step.num_tokens;
  inputs.hidden_states = step.hidden_states.data();
  inputs.topk_ids = step.topk_ids.data();
  inputs.topk_weights = step.topk_weights.data();
  inputs.output = output.data();
  comm::Communicator* comm;  // only this thread replaces comm_, so it stays valid unlocked
  {
    kplan::MutexLock lock(&mu_);
    comm = comm_.get();
  }
  absl::Status st = local_->RunMoe(rank_, set, experts->experts(), experts->placement(),
                                   step.options, inputs, *comm);
  if (!st.ok()) {
    comm->Abort(absl::StrCat("rank ", rank_, " failed: ", st.message()));
    std::unique_ptr<comm::Communicator> failed;
    {
      kplan::MutexLock lock(&mu_);
      failed = std::move(comm_);
    }
    return st;
  }
  return output;
}

void EpPeerRank::AbortStep(int64_t generation, absl::string_view reason) {
  kplan::MutexLock lock(&mu_);
  abandoned_generation_ = std::max(abandoned_generation_, generation);
  if (comm_ != nullptr && comm_generation_ == generation) comm_->Abort(reason);
}

#if !KPLAN_HAVE_GPU_EP
EpCommFactory MakeNcclCommFactory(int) {
  return [](absl::string_view, int, int,
            absl::Duration) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    return absl::UnimplementedError(
        "this build has no NCCL expert-parallel step; groups across servers need CUDA and NCCL");
  };
}
EpGroupIdSource MakeNcclIdSource() {
  return []() -> absl::StatusOr<std::string> {
    return absl::UnimplementedError(
        "this build has no NCCL expert-parallel step; groups across servers need CUDA and NCCL");
  };
}
#endif

}  // namespace kplan::moe::ep
