#include "server/moe/moe_coalesce.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"

namespace kplan {

struct MoeCoalescer::Shared {
  std::atomic<int64_t> launches{0}, coalesced_launches{0}, coalesced_requests{0};
  LaunchObserver observer;
  TaskPool* answers = nullptr;  // Options::answers
};

struct MoeCoalescer::Group {
  size_t slot = 0;
  MoeLaunchFn launch;
  absl::Time flush_at = absl::InfiniteFuture();  // while not submitted
  bool submitted = false;                        // guarded by the coalescer's mu_

  std::mutex mu;
  // Started (RunGroup) or failed as a whole: nobody joins any more, and
  // only the thread that closed it touches the members (after a launch, its
  // answer shares: each its own members, the last one Release).
  bool closed ABSL_GUARDED_BY(mu) = false;
  int64_t tokens ABSL_GUARDED_BY(mu) = 0;  // toward max_tokens: max(M, 1) per member
  int64_t bytes ABSL_GUARDED_BY(mu) = 0;   // RunMoeHeldBytes of all members
  // What the executor was charged once submitted (Flush) when the budget
  // capped it: later partners join only within it.
  int64_t charged ABSL_GUARDED_BY(mu) = std::numeric_limits<int64_t>::max();
  std::vector<MoeCoalesceMember> members ABSL_GUARDED_BY(mu);
  std::vector<absl::Time> arrived ABSL_GUARDED_BY(mu);  // per member
  std::vector<char> finished;                           // per member, once closed
  std::atomic<size_t> shares_left{0};                   // answer tasks of the launch still running

  // Closes the group; false when it was closed already.
  bool Close() {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return false;
    closed = true;
    finished.assign(members.size(), 0);
    return true;
  }
  void Fail(size_t i, const absl::Status& status) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (finished[i]) return;
    finished[i] = 1;
    if (members[i].fail) members[i].fail(status);
  }
  // After a refused or dropped job, or a launch that threw: every member not
  // finished yet gets `status`.
  void FailAll(const absl::Status& status) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Close();
    for (size_t i = 0; i < members.size(); ++i) Fail(i, status);
    Release();
  }
  // What a finished group need not hold while it may stay in open_: the
  // members' inputs and the launch (which holds the expert set).
  void Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    members.clear();
    launch = nullptr;
  }
};

namespace {

int64_t TokensOf(const MoeRunInput& in) { return in.hidden_shape.empty() ? 0 : in.hidden_shape[0]; }
int TopKOf(const MoeRunInput& in) {
  if (in.by_logits()) return in.routing.top_k;
  return in.topk_shape.size() == 2 ? static_cast<int>(in.topk_shape[1]) : 0;
}

// Whether the set's fp8 activations take a scale over the whole batch.
bool BatchScaledActivations(const ExpertsQuantSpec& q) {
  const bool per_tensor_fp8 = q.scheme == "fp8_per_tensor" || q.scheme == "fp8_per_channel";
  return per_tensor_fp8 && q.activation_scale != "per_token" && (!q.a1_scale || !q.a2_scale);
}

// The members' inputs one after the other, batch-invariant.
MoeRunInput Merge(const std::vector<const MoeRunInput*>& parts) {
  const MoeRunInput& first = *parts.front();
  MoeRunInput merged;
  merged.act_dtype = first.act_dtype;
  merged.routing = first.routing;
  merged.apply_router_weight_on_input = first.apply_router_weight_on_input;
  merged.batch_invariant = true;
  merged.cuda_graph = first.cuda_graph;
  int64_t m = 0;
  size_t hidden = 0, logits = 0, ids = 0;
  for (const MoeRunInput* p : parts) {
    m += TokensOf(*p);
    hidden += p->hidden_states.size();
    logits += p->router_logits.size();
    ids += p->topk_ids.size();
  }
  std::string merged_hidden, merged_logits;  // the members' rows, read in place or not
  merged_hidden.reserve(hidden);
  merged_logits.reserve(logits);
  merged.topk_ids.reserve(ids);
  merged.topk_weights.reserve(ids);
  for (const MoeRunInput* p : parts) {
    merged_hidden.append(p->hidden_states.data(), p->hidden_states.size());
    merged_logits.append(p->router_logits.data(), p->router_logits.size());
    merged.topk_ids += p->topk_ids;
    merged.topk_weights += p->topk_weights;
  }
  merged.hidden_states = std::move(merged_hidden);
  merged.router_logits = std::move(merged_logits);
  merged.hidden_shape = {m, first.hidden_shape[1]};
  if (first.by_logits()) {
    merged.logits_shape = {m, first.logits_shape[1]};
  } else {
    merged.topk_shape = {m, first.topk_shape[1]};
  }
  return merged;
}

// Rows [first, first + m) of a launch's output.
MoeRunOutput Slice(const MoeRunOutput& all, int64_t first, int64_t m) {
  MoeRunOutput out;
  out.num_tokens = m;
  out.top_k = all.top_k;
  out.experts_kernel = all.experts_kernel;
  const size_t row = all.num_tokens > 0 ? all.output.size() / all.num_tokens : 0;
  out.output = all.output.substr(first * row, m * row);
  const int64_t k = all.top_k;
  out.topk_ids.assign(all.topk_ids.begin() + first * k, all.topk_ids.begin() + (first + m) * k);
  out.topk_weights.assign(all.topk_weights.begin() + first * k,
                          all.topk_weights.begin() + (first + m) * k);
  return out;
}

}  // namespace

std::optional<std::string> MoeCoalesceKey(const ExpertSet& set, const MoeRoute& route,
                                          const MoeRunInput& in, size_t slot, int64_t max_tokens) {
  if (route.kind == MoeRouteKind::kExpertParallel) return std::nullopt;
  if (TokensOf(in) > max_tokens || in.hidden_shape.size() != 2) return std::nullopt;
  if (BatchScaledActivations(set.spec().quant)) return std::nullopt;
  // Tensors in client CUDA memory (CUDA IPC regions) are read and written in
  // place on their device: such a call runs alone.
  if (in.device.any()) return std::nullopt;
  // Everything a row's arithmetic depends on besides its own token.
  std::string key = absl::StrCat(reinterpret_cast<uintptr_t>(&set), "|", slot, "|",
                                 MoeRouteKindName(route.kind), "|", route.backend, "|",
                                 route.experts_kernel, "|", kernels::DTypeName(in.act_dtype), "|",
                                 TopKOf(in), "|", in.apply_router_weight_on_input, "|");
  if (!in.by_logits()) {
    absl::StrAppend(&key, "ids");
    return key;
  }
  const MoeRouting& r = in.routing;
  uint32_t scaling = 0;
  if (r.routed_scaling_factor) std::memcpy(&scaling, &*r.routed_scaling_factor, 4);
  absl::StrAppend(&key, "logits|", r.routing_method, "|", r.num_expert_group, "|", r.topk_group,
                  "|", r.routed_scaling_factor.has_value(), scaling, "|",
                  r.e_score_correction_bias.size(), "|");
  key.append(reinterpret_cast<const char*>(r.e_score_correction_bias.data()),
             r.e_score_correction_bias.size() * sizeof(float));
  return key;
}

absl::StatusOr<std::unique_ptr<MoeCoalescer>> MoeCoalescer::Create(DeviceExecutor& executor,
                                                                   const Options& options,
                                                                   LaunchObserver observer) {
  if (options.window <= absl::ZeroDuration()) {
    return InvalidField("coalesce_window_us", "the coalescing window must be positive");
  }
  if (options.max_tokens < 1 || options.max_tokens > kMaxTokens) {
    return InvalidField("coalesce_max_tokens",
                        absl::StrCat("coalesce_max_tokens must be in [1, ", kMaxTokens, "]"));
  }
  return std::unique_ptr<MoeCoalescer>(new MoeCoalescer(executor, options, std::move(observer)));
}

MoeCoalescer::MoeCoalescer(DeviceExecutor& executor, const Options& options,
                           LaunchObserver observer)
    : executor_(executor), options_(options), shared_(std::make_shared<Shared>()) {
  shared_->observer = std::move(observer);
  shared_->answers = options.answers;
  timer_ = std::thread([this] { TimerLoop(); });
}

MoeCoalescer::~MoeCoalescer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  timer_.join();
  std::map<std::string, std::shared_ptr<Group>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(open_);
  }
  for (auto& [key, group] : left) {
    if (!group->submitted) Flush(std::move(group));
  }
}

int64_t MoeCoalescer::launches() const { return shared_->launches.load(); }
int64_t MoeCoalescer::coalesced_launches() const { return shared_->coalesced_launches.load(); }
int64_t MoeCoalescer::coalesced_requests() const { return shared_->coalesced_requests.load(); }

void MoeCoalescer::Add(std::string key, size_t slot, MoeLaunchFn launch, MoeCoalesceMember member) {
  const absl::Time now = absl::Now();
  const int64_t cost = std::max<int64_t>(TokensOf(member.input), 1);
  const int64_t bytes = RunMoeHeldBytes(member.input);
  std::vector<std::shared_ptr<Group>> ready;  // to submit once mu_ is released
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The open group of the key, if it still takes this call; a full or
    // started one leaves open_ (sent first if it was not yet).
    std::shared_ptr<Group> group;
    // Read under the group's lock as the member goes in: once it is
    // unlocked, a submitted group may start, run and clear its members.
    bool full = false;
    const absl::Time deadline = member.deadline;
    if (auto it = open_.find(key); it != open_.end()) {
      std::shared_ptr<Group>& g = it->second;
      bool joined = false;
      {
        std::lock_guard<std::mutex> glock(g->mu);
        if (!g->closed && g->tokens + cost <= options_.max_tokens &&
            g->bytes + bytes <= g->charged) {
          g->tokens += cost;
          g->bytes += bytes;
          g->arrived.push_back(now);
          g->members.push_back(std::move(member));
          full = g->tokens >= options_.max_tokens;
          joined = true;
        }
      }
      if (joined) {
        group = g;
      } else {
        if (!g->submitted) {
          g->submitted = true;
          ready.push_back(g);
        }
        open_.erase(it);
      }
    }
    if (group == nullptr) {
      group = std::make_shared<Group>();
      group->slot = slot;
      group->launch = std::move(launch);
      group->flush_at = now + options_.window;
      std::lock_guard<std::mutex> glock(group->mu);
      group->tokens = cost;
      group->bytes = bytes;
      group->arrived.push_back(now);
      group->members.push_back(std::move(member));
      full = group->tokens >= options_.max_tokens;
      if (!stopping_) open_.emplace(key, group);
      wake = true;
    }
    if (full) {
      auto it = open_.find(key);
      if (it != open_.end() && it->second == group) open_.erase(it);
    }
    // Sent now: once full, when stopping, or when the new member's deadline
    // comes before the window ends (the window never costs a caller its
    // deadline). A group sent still takes members until it starts.
    if (!group->submitted && (stopping_ || full || deadline < group->flush_at)) {
      group->submitted = true;
      ready.push_back(std::move(group));
    }
  }
  if (wake) cv_.notify_one();
  for (std::shared_ptr<Group>& g : ready) Flush(std::move(g));
}

void MoeCoalescer::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [key, group] : open_) {
      if (!group->submitted) next = std::min(next, group->flush_at);
    }
    if (next == absl::InfiniteFuture()) {
      cv_.wait(lock);
    } else if (absl::Now() < next) {
      cv_.wait_until(lock, absl::ToChronoTime(next));
    }
    if (stopping_) break;
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Group>> due;
    for (auto it = open_.begin(); it != open_.end();) {
      Group& g = *it->second;
      bool closed;
      {
        std::lock_guard<std::mutex> glock(g.mu);
        closed = g.closed;
      }
      if (closed) {  // started: its entry goes
        it = open_.erase(it);
        continue;
      }
      if (!g.submitted && g.flush_at <= now) {
        g.submitted = true;  // stays open for partners until it starts
        due.push_back(it->second);
      }
      ++it;
    }
    if (due.empty()) continue;
    lock.unlock();
    for (std::shared_ptr<Group>& g : due) Flush(std::move(g));
    lock.lock();
  }
}

void MoeCoalescer::Flush(std::shared_ptr<Group> group) {
  DeviceExecutor::Job job;
  {
    // Partners may still join until the launch starts: charge the bytes of
    // a full launch at this one's bytes per token, but never more than a
    // quarter of the executor's budget (a large --coalesce_max_tokens would
    // otherwise charge more than all of it); partners join within the charge.
    std::lock_guard<std::mutex> glock(group->mu);
    const int64_t full = group->bytes / group->tokens * options_.max_tokens;
    const int64_t cap = executor_.max_queued_bytes() / 4;
    job.bytes = std::max(group->bytes, std::min(full, cap));
    if (full > cap) group->charged = job.bytes;
  }
  // No job deadline or cancellation: partners may still join, so RunGroup
  // checks each member's as the launch starts.
  job.fail = [group](const absl::Status& status) { group->FailAll(status); };
  job.work = [group, shared = shared_](const DeviceSlot& where, absl::Duration) {
    if (group->Close()) RunGroup(*shared, group, where);
  };
  const size_t slot = group->slot;
  if (absl::Status queued = executor_.Submit(slot, std::move(job)); !queued.ok()) {
    group->FailAll(queued);
  }
}

void MoeCoalescer::RunGroup(Shared& shared, const std::shared_ptr<Group>& group,
                            const DeviceSlot& where)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // closed: the members are this thread's, then its shares'
  Group& g = *group;
  const absl::Time start = absl::Now();
  std::vector<size_t> live;
  absl::Time deadline = absl::InfinitePast();
  for (size_t i = 0; i < g.members.size(); ++i) {
    const MoeCoalesceMember& m = g.members[i];
    if (start >= m.deadline) {
      g.Fail(i, absl::DeadlineExceededError(absl::StrCat(
                    "the deadline passed while the request waited for its coalesced launch on ",
                    where.name, " (for ", absl::FormatDuration(start - g.arrived[i]), ")")));
    } else if (m.cancelled && m.cancelled()) {
      g.Fail(i, absl::CancelledError("the call was cancelled while it waited for its launch"));
    } else if (absl::Status intact = m.input.CheckIntact(); !intact.ok()) {
      g.Fail(i, intact);  // its window was truncated: reading it for the merge would fault
    } else {
      live.push_back(i);
      deadline = std::max(deadline, m.deadline);
    }
  }
  if (live.empty()) {
    g.Release();
    return;
  }
  auto out = std::make_shared<absl::StatusOr<MoeRunOutput>>();
  if (live.size() == 1) {
    MoeRunInput& alone = g.members[live[0]].input;
    alone.batch_invariant = true;
    *out = g.launch(where, alone, deadline);
  } else {
    std::vector<const MoeRunInput*> parts;
    for (size_t i : live) parts.push_back(&g.members[i].input);
    *out = g.launch(where, Merge(parts), deadline);
  }
  const absl::Time end = absl::Now();
  g.launch = nullptr;  // the expert set it holds is let go here, not on an answer thread
  shared.launches.fetch_add(1);
  if (live.size() > 1) {
    shared.coalesced_launches.fetch_add(1);
    shared.coalesced_requests.fetch_add(static_cast<int64_t>(live.size()));
  }
  if (shared.observer) shared.observer(static_cast<int>(live.size()));
  // The members are answered (their rows sliced, their responses encoded
  // and sent) on the answer threads when there are some, a contiguous share
  // of them each, while this worker starts its next launch: one by one
  // here, 63 answers held the GPU idle ~1.9 ms after a 0.24 ms launch
  // (docs/PERF.md, session 14).
  struct Answer {
    size_t member;
    int64_t first, m;  // its rows of the launch's output
    MoeRunTiming timing;
  };
  auto replies = std::make_shared<std::vector<Answer>>();
  replies->reserve(live.size());
  int64_t first = 0;
  for (size_t i : live) {
    MoeRunTiming timing;
    timing.queued = g.arrived[i];
    timing.queue = start - g.arrived[i];
    timing.device_start = start;
    timing.device_end = end;
    timing.device = end - start;
    timing.coalesced_requests = static_cast<int>(live.size());
    const int64_t m = TokensOf(g.members[i].input);
    replies->push_back({i, first, m, timing});
    first += m;
  }
  const auto slot = std::make_shared<const DeviceSlot>(where);
  const size_t n = replies->size();
  const size_t shares =
      shared.answers == nullptr ? 1 : std::min(n, static_cast<size_t>(shared.answers->size()));
  // Nothing below throws once the first share may run: a FailAll from the
  // executor would race the shares for the members.
  g.shares_left.store(shares);
  for (size_t t = 0; t < shares; ++t) {
    auto share = [group, out, replies, slot, lo = t * n / shares, hi = (t + 1) * n / shares] {
      Group& g = *group;
      for (size_t k = lo; k < hi; ++k) {
        const Answer& a = (*replies)[k];
        MoeCoalesceMember& member = g.members[a.member];
        auto answer = [&] {
          absl::StatusOr<MoeRunOutput> mine = !out->ok()
                                                  ? absl::StatusOr<MoeRunOutput>(out->status())
                                              : replies->size() == 1 ? std::move(*out)
                                                                     : Slice(**out, a.first, a.m);
          g.finished[a.member] = 1;
          member.finish(std::move(mine), a.timing, *slot);
        };
        TaskPool::RunGuarded(answer, member.fail);
      }
      if (g.shares_left.fetch_sub(1, std::memory_order_acq_rel) == 1) g.Release();
    };
    if (shared.answers != nullptr) {
      shared.answers->Run(share);
    } else {
      share();
    }
  }
}

}  // namespace kplan
