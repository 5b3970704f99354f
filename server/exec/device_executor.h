// Device workers: one thread (and, for a GPU, one CUDA stream) per device the
// server owns, plus one for the CPU reference path, so a handler never blocks
// a gRPC thread on device work and kernels on one GPU never race for its
// stream. No request may wedge a worker or take the server's memory:
//
// - Admission. Each queue is bounded by depth, and all queues together by the
//   bytes their requests hold (request + expected output, as the handler
//   states them in Job::bytes): beyond either, Submit is RESOURCE_EXHAUSTED.
//   The bytes are charged at Submit and released when the work has finished
//   (or was dropped), so 24 queued 100 MiB requests cannot hold 2.6 GB
//   unless the budget allows it.
// - Order. Each worker has two lanes, small (Job::bytes < kLargeJobBytes) and
//   large, FIFO within a lane. The worker takes small work first, except that
//   once small items have overtaken the head of the large lane
//   kMaxSmallOvertakes times, that large item runs next. So small work waits
//   behind at most one large item (the one running, or the one aged past the
//   bound), and large work is never starved. The expert-parallel group's steps
//   have their own FIFO queue (server/moe/ep/ep_group.h, EpGroup::RunMoe) and
//   are not ordered here.
// - Deadlines and cancellation. A job carries its call's deadline and a
//   cancellation check; before it runs, work whose deadline passed or whose
//   call was cancelled is dropped and `fail` reports DEADLINE_EXCEEDED or
//   CANCELLED. Work that runs long must check the deadline itself (the CPU
//   MoE reference does, per block of rows), so no request holds the worker
//   past its deadline.
// - Exceptions. Nothing thrown by a job leaves the worker: std::bad_alloc
//   becomes RESOURCE_EXHAUSTED, any other exception INTERNAL, both reported
//   through `fail`. A job's `work` and `fail` must finish their call exactly
//   once between them (the RPC layer's Call guards that).
//
// - The fast path. A small job marked inline_ok (a large one only with
//   inline_large_ok too) runs on the submitting thread, inside Submit, when
//   its worker is idle (nothing queued, nothing running, its device bound):
//   no hand-over to the worker and no wake-up. The slot
//   is claimed for that time, so the worker and other submitters wait; one
//   job runs on a slot at a time either way.
//
// This library stays free of gRPC: cancellation is a plain callback.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "resolve/platform/local.h"

namespace kplan {

// Where a work item runs: the CPU, or CUDA device `cuda_device` on `stream`.
// A GPU worker binds its device and creates its stream before its first work
// item; if that failed, `status` says why and work must not touch the device.
struct DeviceSlot {
  std::string name;      // "cpu", "cuda:0"
  int cuda_device = -1;  // -1: the CPU
  void* stream = nullptr;
  absl::Status status;
};

class DeviceExecutor {
 public:
  // Work receives its slot and how long it waited in the queue.
  using Work = std::function<void(const DeviceSlot&, absl::Duration queued)>;

  // Jobs of at least this many bytes queue in the large lane.
  static constexpr int64_t kLargeJobBytes = int64_t{1} << 20;
  // How many small jobs may overtake the head of the large lane.
  static constexpr int kMaxSmallOvertakes = 16;

  struct Job {
    Work work;
    // What the queued request holds: its input plus the output it will
    // produce. Charged against the queued-bytes budget; also picks the lane.
    int64_t bytes = 0;
    // Large-lane work whose memory is charged elsewhere (a load's set is
    // the expert budget's): queued as large without charging `bytes`.
    bool large = false;
    // Past it, queued work is dropped with DEADLINE_EXCEEDED.
    absl::Time deadline = absl::InfiniteFuture();
    // True once the caller gave up: queued work is dropped with CANCELLED.
    std::function<bool()> cancelled;
    // Finishes the call with an error when `work` does not run (dropped) or
    // threw. Without it such a job is only logged (tests, internal jobs).
    std::function<void(const absl::Status&)> fail;
    // May run on the submitting thread when the worker is idle (see the
    // file comment); `work` or `fail` has then run when Submit returns OK.
    bool inline_ok = false;
    // With inline_ok, a large job too: the submitting thread may be held
    // for as long as the work takes (a shared-memory channel's own thread,
    // which waits for the answer anyway), not only a gRPC thread's share.
    // RunMoe sets it for GPU runs of up to RunMoeCall::kInlineLargeMaxBytes.
    bool inline_large_ok = false;
  };

  struct Options {
    size_t max_queue_depth = 256;                 // per worker, both lanes together
    int64_t max_queued_bytes = int64_t{2} << 30;  // all workers together
  };

  // Workers for the CPU and each device.
  static absl::StatusOr<std::unique_ptr<DeviceExecutor>> Create(
      const std::vector<LocalDevice>& devices, const Options& options);
  static absl::StatusOr<std::unique_ptr<DeviceExecutor>> Create(
      const std::vector<LocalDevice>& devices, size_t max_queue_depth);
  ~DeviceExecutor();  // finishes (or drops, past their deadline) queued work, then joins

  // Resolves "cpu", "cuda:N" or "" (the first GPU, else the CPU) to a slot
  // index; unknown or absent devices are FAILED_PRECONDITION naming `field`.
  absl::StatusOr<size_t> Resolve(absl::string_view device, absl::string_view field) const;
  const DeviceSlot& slot(size_t index) const { return workers_[index]->slot; }
  size_t size() const { return workers_.size(); }

  // Queues `job` on slot `index`; RESOURCE_EXHAUSTED when its queue is full
  // or the queued-bytes budget cannot take job.bytes more. On error nothing
  // was queued and neither `work` nor `fail` will be called.
  absl::Status Submit(size_t index, Job job);
  // A job of no bytes, no deadline and no error callback.
  absl::Status Submit(size_t index, Work work);

  // Whether the calling thread is one of the device workers (not a
  // submitting thread that runs a job inline): work that ends in host-only
  // steps may hand them to other threads there.
  static bool OnWorkerThread();

  // Jobs queued (not running) on slot `index` now.
  size_t queue_size(size_t index) const;
  // Jobs that ran on their submitting thread so far (all slots).
  int64_t inline_runs() const { return inline_runs_.load(std::memory_order_relaxed); }
  // Bytes charged by queued and running jobs now.
  int64_t queued_bytes() const;
  int64_t max_queued_bytes() const { return max_queued_bytes_; }

 private:
  struct Queued {
    absl::Time enqueued;
    Job job;
  };
  struct Worker {
    DeviceSlot slot;
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<Queued> small ABSL_GUARDED_BY(mu);
    std::deque<Queued> large ABSL_GUARDED_BY(mu);
    int overtakes ABSL_GUARDED_BY(mu) = 0;  // small jobs run since the large head queued
    bool stopping ABSL_GUARDED_BY(mu) = false;
    bool busy ABSL_GUARDED_BY(mu) = false;   // a job runs (on the worker or inline)
    bool bound ABSL_GUARDED_BY(mu) = false;  // the slot's device and stream are set up
    std::thread thread;
  };
  DeviceExecutor() = default;
  void Loop(Worker* w);
  // The next job by the lane policy above; the worker's queue is not empty.
  static Queued PopLocked(Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu);
  // Runs (or drops) one job, catching whatever it throws.
  static void RunJob(const DeviceSlot& slot, Queued item);
  void Release(int64_t bytes);

  size_t max_queue_depth_ = 0;
  int64_t max_queued_bytes_ = 0;
  mutable std::mutex budget_mu_;
  int64_t queued_bytes_ ABSL_GUARDED_BY(budget_mu_) = 0;
  std::atomic<int64_t> inline_runs_{0};
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace kplan
