// The server's expert-parallel group: N ranks that serve RunMoE together, each
// holding a linear slice of every layer's experts and running
// RunMoeExpertParallel-shaped steps over its own Communicator, fed by ONE step
// queue (a coordinator thread publishes one step at a time; every rank's own
// thread runs its part) because collectives match by order. What the ranks
// are (CPU threads, GPUs) is behind EpRankKind. docs/EP.md ("The server's
// group") explains the design, the failure handling (aborts, rebuilds,
// timeouts) and the locking.
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
#include "server/moe/ep/ep_dispatch.h"
#include "server/moe/ep/ep_placement.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_runner.h"

namespace kplan::moe::ep {

// What a step's work does with the ranks' communicators; decides how a
// failure is handled. Any failure of a step that communicates aborts every
// rank's communicator once the step is over, and the group is rebuilt before
// the next such step.
enum class EpStepComm {
  kNone,  // local work (placing experts): a failure touches no communicator
  // Host-driven collectives (NCCL, in-process): the first failure aborts every
  // rank's communicator at once, so ranks waiting in a collective for the
  // failed one return instead of waiting out their timeout.
  kCollectives,
  // Device-side rounds (passthrough): the ranks meet in device barriers that
  // no host abort can break, and a rank that fails still completes the round,
  // so nothing is aborted while a rank may still be in it.
  kDeviceRound,
};

struct EpGroupOptions {
  // How long a rank may take to pick up a published step and join the
  // group's communicator; past it the step fails with DEADLINE_EXCEEDED
  // naming the ranks that did not.
  absl::Duration join_timeout = absl::Seconds(30);
  // How long one step may run once every rank joined; past it the
  // communicators are aborted and the step fails with DEADLINE_EXCEEDED
  // naming the ranks still running.
  absl::Duration step_timeout = absl::Minutes(5);
  // Per-collective timeout of the communicators the group builds.
  absl::Duration comm_timeout = absl::Seconds(30);
  // Steps waiting beyond the one running; more are RESOURCE_EXHAUSTED.
  size_t max_queue_depth = 256;
};

// One rank's experts of one ExpertSet, as its rank kind holds them.
class EpRankExperts {
 public:
  virtual ~EpRankExperts() = default;
  // Bytes of this rank's expert weights.
  virtual int64_t bytes() const = 0;
  // Bytes this slice added to its device (0 for a view into the host set).
  virtual int64_t resident_bytes() const = 0;
};

// The layer options every rank of one MoE step shares.
struct EpMoeOptions {
  int top_k = 0;
  kernels::DType act_dtype = kernels::DType::kBFloat16;
  bool apply_router_weight_on_input = false;
  EpStrategy strategy = EpStrategy::kAllGatherReduceScatter;
  // The largest rank's token count in this step (the same on every rank):
  // lets passthrough size its fixed-capacity transport without a token count
  // exchange between the ranks.
  int64_t max_tokens_per_rank = 0;
};

// What ranks of one kind are. NewCommunicators runs on the group's
// coordinator thread; everything taking a rank runs on that rank's thread.
class EpRankKind {
 public:
  virtual ~EpRankKind() = default;
  virtual int size() const = 0;
  // "cpu" or "cuda:N": where rank `rank` computes.
  virtual std::string Device(int rank) const = 0;
  // The communicator backend: "in_process", "nccl".
  virtual absl::string_view communicator() const = 0;
  // What the MoE backend of a step is called in RunMoE's plan ("emulation"
  // on CPU ranks, "kplan" on GPU ranks) and its experts kernel.
  virtual absl::string_view moe_backend() const = 0;
  virtual absl::string_view experts_kernel() const = 0;
  // Whether RunMoe runs EpStrategy::kPassthrough (the kplan_ep device
  // transport: GPU ranks of one process); other kinds refuse it.
  virtual bool runs_passthrough() const { return false; }
  // Starts a fresh set of communicators (an InProcessGroup, an NCCL unique
  // id); the ranks then JoinCommunicator() from their threads.
  virtual absl::Status NewCommunicators(absl::Duration comm_timeout) = 0;
  // Rank `rank`'s communicator of the newest set (NCCL: blocks until every
  // rank has joined).
  virtual absl::StatusOr<std::unique_ptr<comm::Communicator>> JoinCommunicator(int rank) = 0;
  // Makes rank `rank`'s slice of `set` resident. FAILED_PRECONDITION when
  // ranks of this kind cannot run the set at all (it then stays on the
  // single-device path).
  virtual absl::StatusOr<std::unique_ptr<EpRankExperts>> PlaceExperts(
      int rank, const ExpertSet& set, const ExpertPlacement& placement) = 0;
  // One MoE layer step of rank `rank` (see RunMoeExpertParallel).
  virtual absl::Status RunMoe(int rank, const ExpertSet& set, const EpRankExperts& experts,
                              const ExpertPlacement& placement, const EpMoeOptions& options,
                              const MoeInputsForThisRank& inputs, comm::Communicator& comm) = 0;
  // Tests: makes the `after_calls`-th next collective of `rank` on the
  // newest communicators fail with `status`. False when unsupported.
  virtual bool InjectFault(int rank, absl::Status status, int after_calls) { return false; }
};

// The fields every rank kind's layer takes from the set and the step, for
// EpRankKind::RunMoe implementations: the shape and options of an EpLayer
// (a GpuEpLayer is one, gpu_ep.h); the rank's experts are the caller's.
void FillEpLayer(const ExpertSet& set, const ExpertPlacement& placement,
                 const EpMoeOptions& options, EpLayer& layer);

// `size` CPU thread-ranks over an InProcessCommunicator.
std::unique_ptr<EpRankKind> MakeCpuEpRanks(int size);

// One rank per CUDA device, over NCCL: available when the build has the GPU
// expert-parallel step (KPLAN_HAVE_GPU_EP); otherwise UNIMPLEMENTED.
absl::StatusOr<std::unique_ptr<EpRankKind>> MakeGpuEpRanks(const std::vector<int>& cuda_devices);
// Whether MakeGpuEpRanks can succeed in this build.
bool HaveGpuEpRanks();

struct EpShard {
  int rank = 0;
  std::string device;  // "cpu", "cuda:1"
  int first_expert = 0;
  int num_experts = 0;
  int64_t bytes = 0;  // of this rank's expert weights
};

class EpGroup;

// A set's experts as placed on an EpGroup: one slice per rank. Attached to
// the ExpertSet as its device copy, so it lives exactly as long as the set.
class EpExperts final : public DeviceExperts {
 public:
  EpExperts(const EpGroup* group, ExpertPlacement placement, std::vector<EpShard> shards,
            std::vector<std::unique_ptr<EpRankExperts>> ranks);
  // The experts of `set` placed on an EpGroup, or null.
  static const EpExperts* Of(const ExpertSet& set);

  // "ep:" and the ranks' devices, e.g. "ep:cuda:0,cuda:1".
  std::string device_name() const override;
  // What the slices added to their devices (0 for CPU ranks: views).
  int64_t device_bytes() const override;

  const EpGroup* group() const { return group_; }
  const ExpertPlacement& placement() const { return placement_; }
  const std::vector<EpShard>& shards() const { return shards_; }
  const EpRankExperts& rank(int r) const { return *ranks_[r]; }

 private:
  const EpGroup* group_;
  ExpertPlacement placement_;
  std::vector<EpShard> shards_;
  std::vector<std::unique_ptr<EpRankExperts>> ranks_;
};

// When a queued step of the group is dropped instead of run: past
// `deadline`, or once `cancelled` (may be empty) says the caller gave up.
// Its `done` then gets DEADLINE_EXCEEDED or CANCELLED; no rank ran any of it.
struct EpStepLimits {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;
};

class EpGroup {
 public:
  // Per-rank work of one step: `comm` is the rank's communicator for a
  // communicating step (fresh after a failure) and null for a local one.
  using RankWork = std::function<absl::Status(int rank, comm::Communicator* comm)>;
  // Called once per step, on the group's coordinator thread, with the
  // combined status, the time the step waited in the queue and the time it
  // ran (publish to completion). It may Submit() but must not wait for
  // another step (Run() from it would deadlock the group).
  using StepDone = std::function<void(absl::Status, absl::Duration queued, absl::Duration ran)>;

  // Starts the ranks' threads and builds the first communicators.
  static absl::StatusOr<std::unique_ptr<EpGroup>> Create(std::unique_ptr<EpRankKind> kind,
                                                         EpGroupOptions options = {});
  // Finishes the queued steps, then joins the threads.
  ~EpGroup();
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int size() const { return size_; }
  std::string Device(int rank) const { return kind_->Device(rank); }
  std::vector<std::string> Devices() const;
  const EpRankKind& kind() const { return *kind_; }
  const EpGroupOptions& options() const { return options_; }
  // How many communicator sets have been built (1 after Create; one more
  // after each failed communicating step).
  int64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the next communicating step build fresh communicators (a new
  // generation), e.g. when a peer server of a multi-process group came back.
  void Invalidate() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues a step. Steps run one at a time, in submission order, on every
  // rank. `comm`: what the work does with the communicator (EpStepComm).
  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once stopping;
  // `done` is then never called.
  absl::Status Submit(RankWork work, StepDone done, EpStepComm comm = EpStepComm::kCollectives,
                      EpStepLimits limits = {});
  // Submit and wait.
  absl::Status Run(RankWork work, EpStepComm comm = EpStepComm::kCollectives);

  // Places `set` linearly over the ranks (each rank uploads its own slice on
  // its thread). FAILED_PRECONDITION when this group's ranks cannot run the
  // set (it then stays on the single-device path).
  using PlaceDone = std::function<void(absl::StatusOr<std::unique_ptr<EpExperts>>)>;
  absl::Status PlaceExperts(std::shared_ptr<const ExpertSet> set, PlaceDone done);

  // Runs one MoE layer over `set` (placed on this group: EpExperts::Of(set))
  // with `strategy`: the tokens are split over the ranks (SplitTokens), each
  // rank runs its slice, the output is gathered in token order. Input errors
  // (CheckMoeRunInput) and a full queue return here; otherwise `done` gets
  // the output (with the routing when `return_routing`).
  using MoeDone =
      std::function<void(absl::StatusOr<MoeRunOutput>, absl::Duration queued, absl::Duration ran)>;
  absl::Status RunMoe(std::shared_ptr<const ExpertSet> set, MoeRunInput input, EpStrategy strategy,
                      bool return_routing, MoeDone done, EpStepLimits limits = {});

  // Tests: fault injection into the current communicators (EpRankKind::InjectFault).
  bool InjectFault(int rank, absl::Status status, int after_calls = 0);

 private:
  struct Step;
  EpGroup(std::unique_ptr<EpRankKind> kind, EpGroupOptions options);
  void CoordinatorLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void RankLoop(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `step` to completion (or timeout); returns its combined status.
  // Releases mu_ while it builds communicators and while it waits.
  absl::Status RunStepLocked(const std::shared_ptr<Step>& step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Combine(const Step& step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortAllLocked(absl::string_view reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<EpRankKind> kind_;
  const EpGroupOptions options_;
  const int size_;

  mutable kplan::Mutex mu_;
  kplan::CondVar cv_;  // signalled on every change of the state below
  std::deque<std::shared_ptr<Step>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Step> current_ ABSL_GUARDED_BY(mu_);  // the published step
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Stopping and every step done: ranks exit.
  bool coordinator_done_ ABSL_GUARDED_BY(mu_) = false;
  bool needs_rebuild_ ABSL_GUARDED_BY(mu_) = true;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Per rank: its communicator (swapped by its own thread under mu_) and
  // the generation it belongs to.
  std::vector<std::unique_ptr<comm::Communicator>> comms_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> comm_generation_ ABSL_GUARDED_BY(mu_);
  // Written by Create before any thread starts, joined by the destructor.
  std::vector<std::thread> rank_threads_;
  std::thread coordinator_;
};

}  // namespace kplan::moe::ep
