#include "server/moe/ep/ep_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "absl/time/clock.h"
#include "kernels/comm/in_process_communicator.h"
#include "base/status.h"

namespace kplan::moe::ep {

void FillEpLayer(const ExpertSet& set, const ExpertPlacement& placement,
                 const EpMoeOptions& options, EpLayer& layer) {
  layer.hidden = set.spec().hidden;
  layer.intermediate = set.spec().intermediate;
  layer.num_experts = set.spec().num_experts;
  layer.top_k = options.top_k;
  layer.act_dtype = options.act_dtype;
  layer.activation = set.activation();
  layer.apply_router_weight_on_input = options.apply_router_weight_on_input;
  layer.placement = placement;
}

// ---------------------------------------------------------------------------
// CPU ranks.

namespace {

// Bytes of one expert in each tensor of `spec` (every tensor is [E, ...]).
std::map<std::string, int64_t> BytesPerExpert(const ExpertsSpec& spec) {
  std::map<std::string, int64_t> out;
  for (const TensorSpec& t : ExpectedTensors(spec)) out[t.name] = t.bytes() / spec.num_experts;
  return out;
}

// A rank's experts on the CPU: views into the host set's tensors.
class CpuRankExperts final : public EpRankExperts {
 public:
  CpuRankExperts(MoeWeights weights, int64_t bytes) : weights_(weights), bytes_(bytes) {}
  int64_t bytes() const override { return bytes_; }
  int64_t resident_bytes() const override { return 0; }
  const MoeWeights& weights() const { return weights_; }

 private:
  MoeWeights weights_;
  int64_t bytes_;
};

class CpuEpRanks final : public EpRankKind {
 public:
  explicit CpuEpRanks(int size) : size_(size) {}
  int size() const override { return size_; }
  std::string Device(int) const override { return "cpu"; }
  absl::string_view communicator() const override { return "in_process"; }
  absl::string_view moe_backend() const override { return "emulation"; }
  absl::string_view experts_kernel() const override { return "KplanCpuReferenceExperts"; }

  absl::Status NewCommunicators(absl::Duration comm_timeout) override {
    comm::InProcessOptions options;
    options.timeout =
        std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(comm_timeout)));
    KPLAN_ASSIGN_OR_RETURN(auto comms, comm::InProcessGroup::Create(size_, options));
    kplan::MutexLock lock(&mu_);
    pending_ = std::move(comms);
    group_ = &pending_[0]->group();
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> JoinCommunicator(int rank) override {
    kplan::MutexLock lock(&mu_);
    if (rank < 0 || rank >= static_cast<int>(pending_.size()) || pending_[rank] == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("no communicator waiting for rank ", rank));
    }
    return std::unique_ptr<comm::Communicator>(std::move(pending_[rank]));
  }

  absl::StatusOr<std::unique_ptr<EpRankExperts>> PlaceExperts(
      int rank, const ExpertSet& set, const ExpertPlacement& placement) override {
    const int first = placement.FirstExpert(rank), count = placement.NumLocalExperts(rank);
    const std::map<std::string, int64_t> per = BytesPerExpert(set.spec());
    MoeWeights w = set.Weights();
    auto at = [&](const void* p, const char* name) -> const void* {
      if (p == nullptr) return nullptr;
      auto it = per.find(name);
      return it == per.end() ? p : static_cast<const char*>(p) + first * it->second;
    };
    w.num_local_experts = count;
    w.w13 = at(w.w13, "w13");
    w.w2 = at(w.w2, "w2");
    w.b13 = static_cast<const float*>(at(w.b13, "w13_bias"));
    w.b2 = static_cast<const float*>(at(w.b2, "w2_bias"));
    w.quant.w13_scale = static_cast<const float*>(at(w.quant.w13_scale, "w13_scale"));
    w.quant.w2_scale = static_cast<const float*>(at(w.quant.w2_scale, "w2_scale"));
    w.quant.w13_zero = static_cast<const uint8_t*>(at(w.quant.w13_zero, "w13_zero"));
    w.quant.w2_zero = static_cast<const uint8_t*>(at(w.quant.w2_zero, "w2_zero"));
    int64_t bytes = 0;
    for (const auto& [name, b] : per) bytes += b * count;
    return std::unique_ptr<EpRankExperts>(new CpuRankExperts(w, bytes));
  }

  absl::Status RunMoe(int rank, const ExpertSet& set, const EpRankExperts& experts,
                      const ExpertPlacement& placement, const EpMoeOptions& options,
                      const MoeInputsForThisRank& inputs, comm::Communicator& comm) override {
    EpLayer layer;
    FillEpLayer(set, placement, options, layer);
    layer.local_weights = static_cast<const CpuRankExperts&>(experts).weights();
    // One compute thread per rank: the ranks already are the parallelism.
    layer.num_threads = 1;
    return RunMoeExpertParallel(layer, inputs, comm, options.strategy);
  }

  bool InjectFault(int rank, absl::Status status, int after_calls) override {
    kplan::MutexLock lock(&mu_);
    if (group_ == nullptr) return false;
    group_->InjectFault(rank, std::move(status), after_calls);
    return true;
  }

 private:
  const int size_;
  kplan::Mutex mu_;
  std::vector<std::unique_ptr<comm::InProcessCommunicator>> pending_ ABSL_GUARDED_BY(mu_);
  // The newest group, for fault injection. Its communicators (which own it)
  // stay alive in pending_ or with their ranks until the next
  // NewCommunicators, which replaces this pointer first.
  comm::InProcessGroup* group_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace

std::unique_ptr<EpRankKind> MakeCpuEpRanks(int size) { return std::make_unique<CpuEpRanks>(size); }

// ---------------------------------------------------------------------------
// EpExperts.

EpExperts::EpExperts(const EpGroup* group, ExpertPlacement placement, std::vector<EpShard> shards,
                     std::vector<std::unique_ptr<EpRankExperts>> ranks)
    : group_(group),
      placement_(std::move(placement)),
      shards_(std::move(shards)),
      ranks_(std::move(ranks)) {}

const EpExperts* EpExperts::Of(const ExpertSet& set) {
  return dynamic_cast<const EpExperts*>(set.device_copy());
}

std::string EpExperts::device_name() const {
  std::vector<std::string> devices;
  for (const EpShard& s : shards_) devices.push_back(s.device);
  return absl::StrCat("ep:", absl::StrJoin(devices, ","));
}

int64_t EpExperts::device_bytes() const {
  int64_t n = 0;
  for (const auto& r : ranks_) n += r->resident_bytes();
  return n;
}

// ---------------------------------------------------------------------------
// EpGroup.

struct EpGroup::Step {
  RankWork work;
  StepDone done;
  EpStepComm comm = EpStepComm::kCollectives;
  EpStepLimits limits;
  bool communicates() const { return comm != EpStepComm::kNone; }
  absl::Time submitted;
  absl::Time published;
  int64_t seq = 0;
  int64_t generation = 0;
  bool cancelled = false;  // the coordinator gave up; ranks that have not started skip it
  // Per rank, guarded by the group's mutex.
  std::vector<char> picked, joined, finished;
  std::vector<absl::Status> status;
  std::vector<int> failed_order;  // ranks in the order their failures were recorded
  int num_joined = 0, num_finished = 0;
};

EpGroup::EpGroup(std::unique_ptr<EpRankKind> kind, EpGroupOptions options)
    : kind_(std::move(kind)),
      options_(options),
      size_(kind_->size()),
      comms_(size_),
      comm_generation_(size_, 0) {}

absl::StatusOr<std::unique_ptr<EpGroup>> EpGroup::Create(std::unique_ptr<EpRankKind> kind,
                                                         EpGroupOptions options) {
  if (kind == nullptr || kind->size() < 1) {
    return absl::InvalidArgumentError("an expert-parallel group needs at least one rank");
  }
  if (options.join_timeout <= absl::ZeroDuration() ||
      options.step_timeout <= absl::ZeroDuration() ||
      options.comm_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("expert-parallel group timeouts must be positive");
  }
  std::unique_ptr<EpGroup> group(new EpGroup(std::move(kind), options));
  // The first communicators now, so a broken setup fails at start-up.
  KPLAN_RETURN_IF_ERROR(group->kind_->NewCommunicators(options.comm_timeout));
  {
    kplan::MutexLock lock(&group->mu_);  // no other thread yet; for the analysis
    group->generation_ = 1;
    group->needs_rebuild_ = false;
  }
  for (int r = 0; r < group->size_; ++r) {
    group->rank_threads_.emplace_back([g = group.get(), r] { g->RankLoop(r); });
  }
  group->coordinator_ = std::thread([g = group.get()] { g->CoordinatorLoop(); });
  return group;
}

EpGroup::~EpGroup() {
  {
    kplan::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (coordinator_.joinable()) coordinator_.join();
  for (std::thread& t : rank_threads_) t.join();
}

std::vector<std::string> EpGroup::Devices() const {
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(kind_->Device(r));
  return out;
}

int64_t EpGroup::generation() const {
  kplan::MutexLock lock(&mu_);
  return generation_;
}

void EpGroup::Invalidate() {
  kplan::MutexLock lock(&mu_);
  needs_rebuild_ = true;
}

bool EpGroup::InjectFault(int rank, absl::Status status, int after_calls) {
  return kind_->InjectFault(rank, std::move(status), after_calls);
}

absl::Status EpGroup::Submit(RankWork work, StepDone done, EpStepComm comm, EpStepLimits limits) {
  auto step = std::make_shared<Step>();
  step->work = std::move(work);
  step->done = std::move(done);
  step->comm = comm;
  step->limits = std::move(limits);
  step->submitted = absl::Now();
  {
    kplan::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the expert-parallel group is stopping");
    if (queue_.size() >= options_.max_queue_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the expert-parallel group's queue is full (", options_.max_queue_depth,
                       " steps waiting)"));
    }
    queue_.push_back(std::move(step));
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::Status EpGroup::Run(RankWork work, EpStepComm comm) {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  absl::Status result;
  KPLAN_RETURN_IF_ERROR(Submit(
      std::move(work),
      [&](absl::Status st, absl::Duration, absl::Duration) {
        std::lock_guard<std::mutex> lock(mu);
        result = std::move(st);
        finished = true;
        cv.notify_all();
      },
      comm));
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished; });
  return result;
}

void EpGroup::AbortAllLocked(absl::string_view reason) {
  for (auto& c : comms_) {
    if (c != nullptr) c->Abort(reason);
  }
}

void EpGroup::CoordinatorLoop() {
  kplan::MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) {  // stopping, nothing left
      coordinator_done_ = true;
      cv_.SignalAll();
      return;
    }
    std::shared_ptr<Step> step = std::move(queue_.front());
    queue_.pop_front();
    // A step whose caller is gone is dropped before any rank sees it (the
    // deadline first: gRPC also marks expired calls cancelled).
    absl::Status dropped;
    if (absl::Now() > step->limits.deadline) {
      dropped = absl::DeadlineExceededError(
          "the deadline passed while the step waited for the expert-parallel group");
    } else if (step->limits.cancelled && step->limits.cancelled()) {
      dropped = absl::CancelledError("the caller cancelled while the step waited");
    }
    if (!dropped.ok()) {
      const absl::Duration queued = absl::Now() - step->submitted;
      mu_.Unlock();
      if (step->done) step->done(std::move(dropped), queued, absl::ZeroDuration());
      mu_.Lock();
      continue;
    }
    absl::Status status = RunStepLocked(step);
    const absl::Time end = absl::Now();
    const absl::Duration queued =
        (step->published == absl::InfinitePast() ? end : step->published) - step->submitted;
    const absl::Duration ran =
        step->published == absl::InfinitePast() ? absl::ZeroDuration() : end - step->published;
    mu_.Unlock();
    if (step->done) step->done(std::move(status), queued, ran);
    mu_.Lock();
  }
}

absl::Status EpGroup::RunStepLocked(const std::shared_ptr<Step>& step_ptr) {
  Step& step = *step_ptr;
  step.published = absl::InfinitePast();
  if (step.communicates() && needs_rebuild_) {
    mu_.Unlock();
    absl::Status built = kind_->NewCommunicators(options_.comm_timeout);
    mu_.Lock();
    if (!built.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "the expert-parallel group could not build new communicators after a failure: ",
          built.message()));
    }
    ++generation_;
    needs_rebuild_ = false;
  }
  step.seq = ++next_seq_;
  step.generation = generation_;
  step.picked.assign(size_, 0);
  step.joined.assign(size_, 0);
  step.finished.assign(size_, 0);
  step.status.assign(size_, absl::OkStatus());
  step.published = absl::Now();
  current_ = step_ptr;
  cv_.SignalAll();

  auto names = [&](const std::vector<int>& ranks) {
    std::vector<std::string> out;
    for (int r : ranks) out.push_back(absl::StrCat(r, " (", kind_->Device(r), ")"));
    return absl::StrJoin(out, ", ");
  };
  const absl::Time join_deadline = step.published + options_.join_timeout;
  while (step.num_joined < size_ && absl::Now() < join_deadline) {
    cv_.WaitWithDeadline(&mu_, join_deadline);
  }
  if (step.num_joined < size_) {
    step.cancelled = true;
    std::vector<int> busy, joining;
    for (int r = 0; r < size_; ++r) {
      if (!step.picked[r])
        busy.push_back(r);
      else if (!step.joined[r])
        joining.push_back(r);
    }
    std::string why;
    if (!busy.empty()) {
      absl::StrAppend(&why, "rank", busy.size() == 1 ? " " : "s ", names(busy),
                      " did not pick up the step (still busy with an earlier one)");
    }
    if (!joining.empty()) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", "rank", joining.size() == 1 ? " " : "s ",
                      names(joining), " did not finish joining the communicator");
    }
    absl::Status st = absl::DeadlineExceededError(absl::StrCat(
        "expert-parallel step #", step.seq, " timed out after ",
        absl::FormatDuration(options_.join_timeout), " waiting for its ranks to join: ", why));
    if (step.communicates()) {
      AbortAllLocked(st.message());
      needs_rebuild_ = true;
    }
    return st;
  }
  const absl::Time step_deadline = absl::Now() + options_.step_timeout;
  bool aborted = false;
  while (step.num_finished < size_ && absl::Now() < step_deadline) {
    if (!aborted && step.comm == EpStepComm::kCollectives) {
      // A rank that failed by itself (not the ABORTED echo of an abort from
      // elsewhere) aborted only its own communicator; its peers may be
      // waiting for it in a collective.
      for (int r : step.failed_order) {
        if (absl::IsAborted(step.status[r])) continue;
        AbortAllLocked(absl::StrCat("rank ", r, " failed: ", step.status[r].message()));
        aborted = true;
        break;
      }
    }
    cv_.WaitWithDeadline(&mu_, step_deadline);
  }
  if (step.num_finished < size_) {
    step.cancelled = true;
    std::vector<int> late;
    for (int r = 0; r < size_; ++r) {
      if (!step.finished[r]) late.push_back(r);
    }
    const std::string what =
        absl::StrCat("expert-parallel step #", step.seq, " did not finish within ",
                     absl::FormatDuration(options_.step_timeout));
    if (step.communicates()) {
      // Ranks blocked in a collective on a peer return once aborted; the
      // ranks still running a moment later are the stuck ones.
      AbortAllLocked(what);
      needs_rebuild_ = true;
      const absl::Time grace = absl::Now() + std::min(absl::Seconds(1), options_.step_timeout);
      while (step.num_finished < size_ && absl::Now() < grace) {
        cv_.WaitWithDeadline(&mu_, grace);
      }
      std::vector<int> stuck;
      for (int r : late) {
        if (!step.finished[r]) stuck.push_back(r);
      }
      if (!stuck.empty()) late = stuck;
    }
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": rank", late.size() == 1 ? " " : "s ", names(late), " still running"));
  }
  absl::Status st = Combine(step);
  if (!st.ok() && step.communicates()) {
    // Abort every rank's communicator, not only the failed ones: a healthy
    // rank's next rebuild would otherwise tear its old one down collectively
    // (the passthrough transport's windows) and wait for a peer whose own
    // communicator was aborted and never takes part.
    AbortAllLocked(st.message());
    needs_rebuild_ = true;
  }
  return st;
}

absl::Status EpGroup::Combine(const Step& step) const {
  if (step.failed_order.empty()) return absl::OkStatus();
  // The root cause: the first failure that is not another rank's abort.
  int root = step.failed_order.front();
  for (int r : step.failed_order) {
    if (!absl::IsAborted(step.status[r])) {
      root = r;
      break;
    }
  }
  const absl::Status& cause = step.status[root];
  if (!step.communicates()) {
    // A local step (placing experts): the rank's own error, with its rank.
    absl::Status st(cause.code(), absl::StrCat("expert-parallel rank ", root, " (",
                                               kind_->Device(root), "): ", cause.message()));
    if (std::optional<std::string> field = FieldOf(cause)) st = WithField(st, *field);
    return st;
  }
  // A communicating step: the communicators are gone. The request itself was
  // fine (its inputs were checked before the step), so a transport failure
  // is UNAVAILABLE (retrying reaches the rebuilt group), a timeout stays
  // DEADLINE_EXCEEDED, anything else keeps its code.
  absl::StatusCode code = cause.code();
  if (code == absl::StatusCode::kAborted) code = absl::StatusCode::kUnavailable;
  if (code == absl::StatusCode::kUnknown) code = absl::StatusCode::kInternal;
  std::vector<std::string> others;
  for (int r : step.failed_order) {
    if (r != root) others.push_back(absl::StrCat(r));
  }
  return absl::Status(
      code, absl::StrCat("expert-parallel step #", step.seq, " failed on rank ", root, " (",
                         kind_->Device(root), ") of ", size_, ": ", cause.message(),
                         others.empty() ? ""
                                        : absl::StrCat(" (ranks ", absl::StrJoin(others, ", "),
                                                       " failed after it)"),
                         "; the group's communicators were aborted and are rebuilt before the "
                         "next step"));
}

void EpGroup::RankLoop(int rank) {
  int64_t last_seq = 0;
  kplan::MutexLock lock(&mu_);
  for (;;) {
    while (!((current_ != nullptr && current_->seq > last_seq) || coordinator_done_)) {
      cv_.Wait(&mu_);
    }
    if (current_ == nullptr || current_->seq <= last_seq) {  // stopping
      // Every rank tears its own communicator down, all at once: NCCL's
      // teardown (the passthrough transport's window deregistration) is
      // collective, so one thread destroying them in turn would wait forever.
      std::unique_ptr<comm::Communicator> mine = std::move(comms_[rank]);
      mu_.Unlock();
      mine.reset();
      mu_.Lock();
      return;
    }
    std::shared_ptr<Step> step = current_;
    last_seq = step->seq;
    if (step->cancelled) continue;
    step->picked[rank] = 1;
    cv_.SignalAll();

    absl::Status st;
    comm::Communicator* comm = nullptr;
    if (step->communicates()) {
      if (comm_generation_[rank] != step->generation) {
        mu_.Unlock();
        absl::StatusOr<std::unique_ptr<comm::Communicator>> fresh = kind_->JoinCommunicator(rank);
        std::unique_ptr<comm::Communicator> old;
        mu_.Lock();
        if (fresh.ok()) {
          old = std::move(comms_[rank]);
          comms_[rank] = std::move(*fresh);
          comm_generation_[rank] = step->generation;
        } else {
          st = absl::Status(
              fresh.status().code(),
              absl::StrCat("could not join the group's communicator: ", fresh.status().message()));
        }
        mu_.Unlock();
        old.reset();  // outside the lock: NCCL teardown may take a while
        mu_.Lock();
      }
      comm = comms_[rank].get();
    }
    step->joined[rank] = 1;
    ++step->num_joined;
    cv_.SignalAll();
    if (st.ok() && !step->cancelled) {
      mu_.Unlock();
      st = step->work(rank, comm);
      if (!st.ok() && comm != nullptr) {
        comm->Abort(absl::StrCat("rank ", rank, " failed: ", st.message()));
      }
      mu_.Lock();
    } else if (st.ok()) {
      st = absl::CancelledError("the step was abandoned before this rank started it");
    }
    step->status[rank] = st;
    if (!st.ok()) step->failed_order.push_back(rank);
    step->finished[rank] = 1;
    ++step->num_finished;
    cv_.SignalAll();
  }
}

// ---------------------------------------------------------------------------
// MoE on the group.

absl::Status EpGroup::PlaceExperts(std::shared_ptr<const ExpertSet> set, PlaceDone done) {
  KPLAN_ASSIGN_OR_RETURN(ExpertPlacement placement,
                         ExpertPlacement::Linear(set->spec().num_experts, size_));
  struct State {
    std::shared_ptr<const ExpertSet> set;
    ExpertPlacement placement;
    std::vector<std::unique_ptr<EpRankExperts>> ranks;
  };
  auto state = std::make_shared<State>();
  state->set = std::move(set);
  state->placement = placement;
  state->ranks.resize(size_);
  RankWork work = [this, state](int rank, comm::Communicator*) -> absl::Status {
    KPLAN_ASSIGN_OR_RETURN(state->ranks[rank],
                           kind_->PlaceExperts(rank, *state->set, state->placement));
    return absl::OkStatus();
  };
  StepDone finish = [this, state, done = std::move(done)](absl::Status st, absl::Duration,
                                                          absl::Duration) {
    if (!st.ok()) {
      done(st);
      return;
    }
    std::vector<EpShard> shards;
    for (int r = 0; r < size_; ++r) {
      shards.push_back(EpShard{r, kind_->Device(r), state->placement.FirstExpert(r),
                               state->placement.NumLocalExperts(r), state->ranks[r]->bytes()});
    }
    done(std::make_unique<EpExperts>(this, state->placement, std::move(shards),
                                     std::move(state->ranks)));
  };
  return Submit(std::move(work), std::move(finish), EpStepComm::kNone);
}

absl::Status EpGroup::RunMoe(std::shared_ptr<const ExpertSet> set, MoeRunInput input,
                             EpStrategy strategy, bool return_routing, MoeDone done,
                             EpStepLimits limits) {
  const EpExperts* experts = EpExperts::Of(*set);
  if (experts == nullptr || experts->group() != this) {
    return absl::FailedPreconditionError(absl::StrCat(
        "experts '", set->spec().experts_id, "' are not placed on this expert-parallel group"));
  }
  struct State {
    std::shared_ptr<const ExpertSet> set;
    MoeRunInput input;
    MoeRunShape shape;
    std::vector<TokenRange> split;
    MoeRunOutput out;
  };
  auto state = std::make_shared<State>();
  state->set = std::move(set);
  state->input = std::move(input);
  // After the move: the routing spec points into state->input.
  KPLAN_ASSIGN_OR_RETURN(state->shape, CheckMoeRunInput(state->set->spec(), state->input));
  const int64_t m = state->shape.num_tokens, h = state->set->spec().hidden;
  const int k = state->shape.top_k;
  const int64_t act = kernels::DTypeSize(state->input.act_dtype);
  state->split = SplitTokens(m, size_);
  state->out.num_tokens = m;
  state->out.top_k = k;
  state->out.output.assign(m * h * act, '\0');
  if (return_routing) {
    // The ranks route their own tokens; the response's copy is routed here
    // with the same per-token function.
    state->out.topk_ids.resize(m * k);
    state->out.topk_weights.resize(m * k);
    if (state->shape.by_logits) {
      if (m > 0) {
        KPLAN_RETURN_IF_ERROR(RouteTokens(
            state->shape.routing, reinterpret_cast<const float*>(state->input.router_logits.data()),
            m, state->out.topk_weights.data(), state->out.topk_ids.data()));
      }
    } else {
      if (m > 0) {  // no tokens: empty vectors, whose null data() memcpy must not see
        std::memcpy(state->out.topk_ids.data(), state->input.topk_ids.data(), m * k * 4);
        std::memcpy(state->out.topk_weights.data(), state->input.topk_weights.data(), m * k * 4);
      }
    }
  }
  EpMoeOptions options;
  options.top_k = k;
  options.act_dtype = state->input.act_dtype;
  options.apply_router_weight_on_input = state->input.apply_router_weight_on_input;
  options.strategy = strategy;
  for (const TokenRange& tr : state->split) {
    options.max_tokens_per_rank = std::max(options.max_tokens_per_rank, tr.count);
  }

  RankWork work = [this, state, experts, options](int rank,
                                                  comm::Communicator* comm) -> absl::Status {
    const TokenRange& tr = state->split[rank];
    const MoeRunInput& in = state->input;
    const int64_t hidden = state->set->spec().hidden, act_bytes = kernels::DTypeSize(in.act_dtype);
    const int e = state->set->spec().num_experts, top_k = options.top_k;
    MoeInputsForThisRank mine;
    mine.num_tokens = tr.count;
    mine.hidden_states = in.hidden_states.data() + tr.begin * hidden * act_bytes;
    if (state->shape.by_logits) {
      mine.router_logits = reinterpret_cast<const float*>(in.router_logits.data()) + tr.begin * e;
      mine.routing = state->shape.routing;
    } else {
      mine.topk_ids = reinterpret_cast<const int32_t*>(in.topk_ids.data()) + tr.begin * top_k;
      mine.topk_weights = reinterpret_cast<const float*>(in.topk_weights.data()) + tr.begin * top_k;
    }
    mine.output = state->out.output.data() + tr.begin * hidden * act_bytes;
    return kind_->RunMoe(rank, *state->set, experts->rank(rank), experts->placement(), options,
                         mine, *comm);
  };
  StepDone finish = [state, done = std::move(done)](absl::Status st, absl::Duration queued,
                                                    absl::Duration ran) {
    if (!st.ok()) {
      done(st, queued, ran);
      return;
    }
    done(std::move(state->out), queued, ran);
  };
  return Submit(
      std::move(work), std::move(finish),
      strategy == EpStrategy::kPassthrough ? EpStepComm::kDeviceRound : EpStepComm::kCollectives,
      std::move(limits));
}

// ---------------------------------------------------------------------------
// GPU ranks: see ep_group_gpu.cc when the build has them.

#if !KPLAN_HAVE_GPU_EP
absl::StatusOr<std::unique_ptr<EpRankKind>> MakeGpuEpRanks(const std::vector<int>&) {
  return absl::UnimplementedError(
      "this build has no GPU expert-parallel step (needs CUDA, NCCL and server/moe/ep/gpu_ep)");
}
bool HaveGpuEpRanks() { return false; }
#endif

}  // namespace kplan::moe::ep
