// Coalescing of concurrent RunMoE calls (--coalesce_window_us): calls that
// could share one launch of the layer, arriving within a short window, run as
// one launch over their concatenated tokens and get their own rows back, so
// many 1-token clients cost one pass over the experts' weights instead of one
// each. Off unless the server is given a window.
//
// Which calls share a launch (MoeCoalesceKey): the same resident set (the
// very instance), the same route (kind, backend, experts class) on the same
// device, and everything of the request that changes arithmetic: the
// activation dtype, routing by logits or by given top-k, top_k, the routing
// method, groups, scaling factor and correction bias (bit for bit), and
// apply_router_weight_on_input. Never coalesced, running alone as without
// coalescing: calls of more than max_tokens tokens, skip_device calls, the
// expert-parallel group, and sets whose fp8 activations take a dynamic
// per-tensor scale (the maximum over the whole batch: a row would depend on
// its partners), and calls with tensors in CUDA IPC regions. explain and return_routing change only
// what is reported.
//
// Bit-identity: each caller's output is the one it gets running alone.
//   - CPU reference (kernels/cpu/moe): routing, the expert GEMMs (one Dot per
//     row and weight row, a fixed summation order, rows never mixed whatever
//     the unit or thread split), per-token / per-group fp8 quantisation and
//     the combine are per row; the only cross-row quantity is the dynamic
//     per-tensor fp8 scale, excluded above. So a merged launch is bit-for-bit
//     the members run alone with coalescing off.
//   - GPU path: the kernel choice depends on M (gpu_layer.h, MoeLayerArgs::
//     batch_invariant says what and why). Every call this server may coalesce
//     therefore runs batch-invariant while coalescing is on, alone or merged
//     (MoeRunInput::batch_invariant): the same bits either way, equal to the
//     coalescing-off answer only up to the fp32 summation order (the usual
//     GPU-vs-reference tolerance). The cost: a lone decode-sized call loses
//     the decode kernels and split-K, int sets take the dequant route at
//     every size (or the emulation GEMM past a 4 GiB 16-bit copy), and a
//     large merged fp8 launch the warp-specialised fp8 kernel.
//
// The window: the first call of a group waits at most `window` for partners,
// then the group is queued on its device as one job, and it keeps taking
// partners until the job starts (calls that come while the device is busy
// join the launch that waits for it, as a dynamic batcher's queue does). A
// group is sent at once when it reaches max_tokens tokens (a call of 0 tokens
// counts 1) or when a member's deadline comes before the window ends (so the
// window never costs a caller its deadline); one full or started takes no
// more, and the next call opens the next group. The job is charged the bytes
// of a full launch (a cap of many tokens puts it in the executor's large
// lane: server/exec/device_executor.h). When it starts, members past their own deadline or
// cancelled are dropped with DEADLINE_EXCEEDED / CANCELLED and the rest run;
// an error of the launch (or a refused job) reaches every member.
// Coalesced calls never run inline on the gRPC thread (--inline_runs): the
// launch is always a job of the device's worker.
// Shared memory: a merged launch copies each member's hidden states into its
// batch, read in place from a client's window where the member's are (the
// window checked intact first, else that member fails alone), and its rows
// come back in MoeRunOutput::output for the caller to write into a member's
// output window; a member launched alone writes its own in place.
// Answers: once the launch is done its members are answered (their rows
// sliced off, their responses encoded and sent) on the coalescer's answer
// threads (Options::answers), so the device worker starts its next launch
// at once instead of after every member's answer.
// Timing per caller: queue and queued are the caller's own (queue counts from
// its arrival, the window included); device, device_start and device_end are
// the launch's, shared by its members.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/exec/device_executor.h"
#include "server/exec/task_pool.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_route.h"
#include "server/moe/moe_runner.h"
#include "server/moe/run_moe.h"

namespace kplan {

// The layer over a (merged) input on the group's slot, the call's deadline.
using MoeLaunchFn = std::function<absl::StatusOr<MoeRunOutput>(
    const DeviceSlot& where, const MoeRunInput& input, absl::Time deadline)>;

// One caller of a coalesced launch.
struct MoeCoalesceMember {
  MoeRunInput input;  // checked (CheckMoeRunInput) by its route's choice
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;
  // Finishes the call when it does not run (dropped, the launch refused or
  // threw); `finish` is then not called.
  std::function<void(const absl::Status&)> fail;
  // Its rows of the launch's output, or the launch's error.
  std::function<void(absl::StatusOr<MoeRunOutput>, const MoeRunTiming&, const DeviceSlot&)> finish;
};

// The key under which `input`, routed to `route` on executor slot `slot`,
// shares launches; nullopt when it runs alone (the file comment's rules).
std::optional<std::string> MoeCoalesceKey(const ExpertSet& set, const MoeRoute& route,
                                          const MoeRunInput& input, size_t slot,
                                          int64_t max_tokens);

class MoeCoalescer {
 public:
  // The largest max_tokens (a launch's bytes, charged as if full, stay
  // within what the executor's budget can count).
  static constexpr int64_t kMaxTokens = int64_t{1} << 20;
  struct Options {
    absl::Duration window = absl::ZeroDuration();  // > 0
    int64_t max_tokens = 256;                      // in [1, kMaxTokens]
    // Answers a launch's members (slice, encode, send) while the device
    // worker goes on to the next launch; it must outlive the executor's
    // queued work. Null: the worker answers them itself.
    TaskPool* answers = nullptr;
  };
  // Called from the device worker after every launch that ran, with its
  // members (1: alone).
  using LaunchObserver = std::function<void(int members)>;

  // INVALID_ARGUMENT naming coalesce_window_us / coalesce_max_tokens.
  static absl::StatusOr<std::unique_ptr<MoeCoalescer>> Create(DeviceExecutor& executor,
                                                              const Options& options,
                                                              LaunchObserver observer = {});
  // Sends the open groups to the executor (which must outlive this), then
  // stops the timer.
  ~MoeCoalescer();

  const Options& options() const { return options_; }

  // Adds a member to the open group of `key` on `slot` (opening one that
  // runs `launch`). Its `finish` or `fail` is called later, exactly once.
  void Add(std::string key, size_t slot, MoeLaunchFn launch, MoeCoalesceMember member);

  // Launches that ran, those of two or more members, and their members.
  int64_t launches() const;
  int64_t coalesced_launches() const;
  int64_t coalesced_requests() const;

 private:
  struct Group;
  struct Shared;  // what launches still queued after this is gone need
  MoeCoalescer(DeviceExecutor& executor, const Options& options, LaunchObserver observer);
  void TimerLoop();
  void Flush(std::shared_ptr<Group> group);
  static void RunGroup(Shared& shared, const std::shared_ptr<Group>& group,
                       const DeviceSlot& where);

  DeviceExecutor& executor_;
  const Options options_;
  std::shared_ptr<Shared> shared_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Group>> open_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace kplan
