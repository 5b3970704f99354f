// Expert-parallel groups larger than one process: several kplan servers, one
// rank each, join one communicator. Rank 0 runs the group's EpGroup over
// ProcessEpRanks (its own rank local, the others forwarded to their servers
// through EpRemoteRanks); a peer server holds one EpPeerRank that runs the
// forwarded steps in arrival order over its own communicator. The
// communicator's id and creation are injected (EpGroupIdSource,
// EpCommFactory) so the CPU tests run it without a GPU. docs/EP.md ("Groups
// across processes") explains generations, forwarding and why communicators
// of such a group are aborted, never destroyed collectively.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "absl/time/time.h"
#include "kernels/comm/communicator.h"
#include "server/moe/ep/ep_group.h"

namespace kplan::moe::ep {

// Rank `rank` of `size`'s communicator of the set named by `group_id`
// (opaque bytes: NCCL's unique id). May block until every rank has joined.
using EpCommFactory = std::function<absl::StatusOr<std::unique_ptr<comm::Communicator>>(
    absl::string_view group_id, int rank, int size, absl::Duration timeout)>;
// A fresh group id (NCCL: ncclGetUniqueId).
using EpGroupIdSource = std::function<absl::StatusOr<std::string>()>;

// NCCL on CUDA device `device` (builds with the GPU EP step; otherwise the
// factory fails with UNIMPLEMENTED), and NCCL's unique ids.
EpCommFactory MakeNcclCommFactory(int device);
EpGroupIdSource MakeNcclIdSource();

// One remote rank's part of a step, as it travels to the peer. Routing has
// already happened on rank 0 (the same per-token function every rank
// runs), so only ids and weights travel, never routing parameters.
struct EpForwardedStep {
  std::string experts_id;
  int64_t generation = 0;
  std::string group_id;
  int rank = 0;
  int size = 0;
  EpMoeOptions options;
  int64_t num_tokens = 0;
  std::string hidden_states;        // [num_tokens, H] in options.act_dtype
  std::vector<int32_t> topk_ids;    // [num_tokens, top_k]
  std::vector<float> topk_weights;  // [num_tokens, top_k]
};

// How rank 0 reaches the other ranks' servers.
class EpRemoteRanks {
 public:
  virtual ~EpRemoteRanks() = default;
  // Where rank `rank` runs, e.g. "10.0.0.2:50051/cuda:0".
  virtual std::string Device(int rank) const = 0;
  // Makes `set` resident on rank `rank`'s server, which keeps its linear
  // slice; returns the slice's bytes. FAILED_PRECONDITION when that rank
  // cannot run the set.
  virtual absl::StatusOr<int64_t> PlaceExperts(int rank, const ExpertSet& set) = 0;
  // Runs `step` on its rank's server; the output rows [num_tokens, H].
  virtual absl::StatusOr<std::string> RunStep(const EpForwardedStep& step) = 0;
  // Rank 0 gives up on rank `rank`'s steps of communicator generation
  // `generation`: the one in flight fails (its RunStep returns, the peer is
  // told and aborts that generation's communicator), and one not sent yet is
  // never sent. Later generations are unaffected.
  virtual void Cancel(int rank, int64_t generation, absl::string_view reason) = 0;
};

// Rank 0 of a multi-process group: `local` computes rank 0 (a kind of
// `remote`'s size whose rank-0 methods use this process's device), `remote`
// reaches ranks 1..size-1.
std::unique_ptr<EpRankKind> MakeProcessEpRanks(std::unique_ptr<EpRankKind> local, int size,
                                               std::shared_ptr<EpRemoteRanks> remote,
                                               EpCommFactory comm_factory,
                                               EpGroupIdSource id_source);
// The group id and generation ProcessEpRanks built last (what JoinEpGroup
// hands a peer); false when `kind` is not ProcessEpRanks.
bool CurrentProcessGroupId(const EpRankKind& kind, std::string* group_id, int64_t* generation);

// A peer's slice of a set: attached as the set's device copy on a peer.
class EpPeerExperts final : public DeviceExperts {
 public:
  EpPeerExperts(int rank, int size, std::string device, ExpertPlacement placement,
                std::unique_ptr<EpRankExperts> experts);
  static const EpPeerExperts* Of(const ExpertSet& set);
  std::string device_name() const override;
  int64_t device_bytes() const override { return experts_->resident_bytes(); }
  int rank() const { return rank_; }
  const std::string& device() const { return device_; }
  const ExpertPlacement& placement() const { return placement_; }
  const EpRankExperts& experts() const { return *experts_; }

 private:
  int rank_, size_;
  std::string device_;
  ExpertPlacement placement_;
  std::unique_ptr<EpRankExperts> experts_;
};

// This process as rank `rank` of a group coordinated elsewhere. Places
// slices and runs forwarded steps on one thread, in arrival order.
class EpPeerRank {
 public:
  // `local`: a kind of size `size` whose rank-`rank` methods use this
  // process's device.
  EpPeerRank(std::unique_ptr<EpRankKind> local, int rank, int size, EpCommFactory comm_factory,
             absl::Duration comm_timeout);
  ~EpPeerRank();  // finishes queued work, then joins the thread
  EpPeerRank(const EpPeerRank&) = delete;
  EpPeerRank& operator=(const EpPeerRank&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string Device() const { return local_->Device(rank_); }
  // The newest generation this peer built a communicator for (0: none yet).
  int64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);

  // Places this rank's slice of `set` (FAILED_PRECONDITION: this rank's kind
  // cannot run it); `done` runs on the peer's thread.
  void PlaceExperts(std::shared_ptr<const ExpertSet> set,
                    std::function<void(absl::StatusOr<std::unique_ptr<EpPeerExperts>>)> done);
  // Runs one forwarded step over `set` (placed on this peer); `done` gets the
  // output rows. A generation older than this peer's is FAILED_PRECONDITION
  // (field "generation"); a newer one builds a communicator from its id.
  void RunStep(std::shared_ptr<const ExpertSet> set, EpForwardedStep step,
               std::function<void(absl::StatusOr<std::string>)> done);
  // Rank 0 gave up on a step of `generation` (it failed, or its deadline
  // passed): aborts this peer's communicator of that generation, so a step
  // waiting in a collective for rank 0 fails now instead of at its timeout,
  // and fails steps of that generation not started yet. Any thread.
  void AbortStep(int64_t generation, absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  void Post(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> RunStepNow(const ExpertSet& set, const EpForwardedStep& step)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<EpRankKind> local_;
  const int rank_, size_;
  const EpCommFactory comm_factory_;
  const absl::Duration comm_timeout_;
  mutable kplan::Mutex mu_;
  kplan::CondVar cv_;  // signalled when work is posted or the peer stops
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Only the peer's thread replaces the communicator, under mu_; AbortStep
  // aborts it under mu_ from other threads. The peer's thread reads the
  // pointer under mu_ too, then uses the communicator outside it (the step
  // runs unlocked; only that thread could replace it meanwhile).
  std::unique_ptr<comm::Communicator> comm_ ABSL_GUARDED_BY(mu_);
  int64_t comm_generation_ ABSL_GUARDED_BY(mu_) = 0;       // comm_'s
  int64_t abandoned_generation_ ABSL_GUARDED_BY(mu_) = 0;  // the newest one AbortStep named
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;            // the newest seen
  std::thread thread_;
};

}  // namespace kplan::moe::ep
