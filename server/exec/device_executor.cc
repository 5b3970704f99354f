#include "server/exec/device_executor.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

#if KPLAN_HAVE_CUDA
#include "kernels/cuda/runtime/stream.h"
#endif

namespace kplan {

absl::StatusOr<std::unique_ptr<DeviceExecutor>> DeviceExecutor::Create(
    const std::vector<LocalDevice>& devices, size_t max_queue_depth) {
  Options options;
  options.max_queue_depth = max_queue_depth;
  return Create(devices, options);
}

absl::StatusOr<std::unique_ptr<DeviceExecutor>> DeviceExecutor::Create(
    const std::vector<LocalDevice>& devices, const Options& options) {
  if (options.max_queue_depth < 1) {
    return InvalidField("max_queue_depth", "max_queue_depth must be at least 1");
  }
  if (options.max_queued_bytes < 1) {
    return InvalidField("max_queued_bytes", "max_queued_bytes must be positive");
  }
  std::unique_ptr<DeviceExecutor> ex(new DeviceExecutor());
  ex->max_queue_depth_ = options.max_queue_depth;
  ex->max_queued_bytes_ = options.max_queued_bytes;
  auto cpu = std::make_unique<Worker>();
  cpu->slot.name = "cpu";
  cpu->bound = true;  // nothing to set up
  ex->workers_.push_back(std::move(cpu));
  for (const LocalDevice& d : devices) {
    auto w = std::make_unique<Worker>();
    w->slot.name = absl::StrCat("cuda:", d.index);
    w->slot.cuda_device = d.index;
    ex->workers_.push_back(std::move(w));
  }
  for (auto& w : ex->workers_) {
    Worker* raw = w.get();
    raw->thread = std::thread([e = ex.get(), raw] { e->Loop(raw); });
  }
  return ex;
}

DeviceExecutor::~DeviceExecutor() {
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->stopping = true;
    }
    w->cv.notify_all();
  }
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
}

DeviceExecutor::Queued DeviceExecutor::PopLocked(Worker* w) {
  // Small first, unless the large head has been overtaken often enough.
  const bool take_large =
      w->small.empty() || (!w->large.empty() && w->overtakes >= kMaxSmallOvertakes);
  std::deque<Queued>& lane = take_large ? w->large : w->small;
  Queued item = std::move(lane.front());
  lane.pop_front();
  if (take_large) {
    w->overtakes = 0;  // the next large head starts its own count
  } else if (!w->large.empty()) {
    ++w->overtakes;
  }
  return item;
}

void DeviceExecutor::RunJob(const DeviceSlot& slot, Queued item) {
  Job& job = item.job;
  absl::Status dropped;
  // The deadline first: gRPC also marks a call past its deadline cancelled,
  // and the code should say which.
  if (absl::Now() >= job.deadline) {
    dropped = absl::DeadlineExceededError(
        absl::StrCat("the deadline passed while the request was queued on ", slot.name, " (for ",
                     absl::FormatDuration(absl::Now() - item.enqueued), ")"));
  } else if (job.cancelled && job.cancelled()) {
    dropped = absl::CancelledError("the call was cancelled while it was queued");
  }
  if (dropped.ok()) {
    try {
      job.work(slot, absl::Now() - item.enqueued);
      return;
    } catch (...) {
      dropped = StatusOfCurrentException(absl::StrCat("running the request on ", slot.name),
                                         absl::StrCat("the request failed on ", slot.name));
    }
  }
  if (!job.fail) {
    spdlog::warn("work on {} without an error callback: {}", slot.name, dropped.ToString());
    return;
  }
  try {
    job.fail(dropped);
  } catch (...) {  // nothing leaves a worker; the call layer does not throw
    spdlog::error("work on {}: reporting '{}' threw", slot.name, dropped.ToString());
  }
}

void DeviceExecutor::Release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(budget_mu_);
  queued_bytes_ -= bytes;
}

size_t DeviceExecutor::queue_size(size_t index) const {
  Worker* w = workers_.at(index).get();
  std::lock_guard<std::mutex> lock(w->mu);
  return w->small.size() + w->large.size();
}

int64_t DeviceExecutor::queued_bytes() const {
  std::lock_guard<std::mutex> lock(budget_mu_);
  return queued_bytes_;
}

namespace {
thread_local bool on_worker_thread = false;
}  // namespace

bool DeviceExecutor::OnWorkerThread() { return on_worker_thread; }

void DeviceExecutor::Loop(Worker* w) {
  on_worker_thread = true;
  bool bound;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    bound = w->bound;
  }
  for (;;) {
    Queued item;
    {
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait(lock, [w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
        return !w->busy && (w->stopping || !w->small.empty() || !w->large.empty());
      });
      if (w->small.empty() && w->large.empty()) break;  // stopping, and everything queued is done
      item = PopLocked(w);
      w->busy = true;
    }
    if (!bound) {  // first GPU work: bind the device and make the stream here
      bound = true;
#if KPLAN_HAVE_CUDA
      absl::StatusOr<void*> stream = kernels::cuda::CreateDeviceStream(w->slot.cuda_device);
      if (stream.ok()) {
        w->slot.stream = *stream;
      } else {
        w->slot.status = stream.status();
      }
#else
      w->slot.status = absl::FailedPreconditionError("this server was built without CUDA kernels");
#endif
    }
    const int64_t bytes = item.job.bytes;
    RunJob(w->slot, std::move(item));
    Release(bytes);
    std::lock_guard<std::mutex> lock(w->mu);
    w->busy = false;
    w->bound = true;  // slot (stream, status) is set before; published under mu
  }
#if KPLAN_HAVE_CUDA
  kernels::cuda::DestroyDeviceStream(w->slot.stream);
#endif
}

absl::StatusOr<size_t> DeviceExecutor::Resolve(absl::string_view device,
                                               absl::string_view field) const {
  if (device.empty()) return workers_.size() > 1 ? 1 : 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->slot.name == device) return i;
  }
  std::string names;
  for (const auto& w : workers_) absl::StrAppend(&names, names.empty() ? "" : ", ", w->slot.name);
  return WithField(absl::FailedPreconditionError(absl::StrCat(
                       "device '", device, "' is not one of this server's devices (", names, ")")),
                   field);
}

absl::Status DeviceExecutor::Submit(size_t index, Work work) {
  Job job;
  job.work = std::move(work);
  return Submit(index, std::move(job));
}

absl::Status DeviceExecutor::Submit(size_t index, Job job) {
  Worker* w = workers_.at(index).get();
  const int64_t bytes = std::max<int64_t>(job.bytes, 0);
  job.bytes = bytes;
  {
    std::lock_guard<std::mutex> budget(budget_mu_);
    if (bytes > max_queued_bytes_ - queued_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the request's ", bytes, " bytes would exceed the server's budget for queued requests ",
          "(--max_queued_bytes: ", queued_bytes_, " of ", max_queued_bytes_,
          " bytes queued or running); retry later"));
    }
    queued_bytes_ += bytes;
  }
  bool run_here = false;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    absl::Status refused;
    if (w->stopping) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (w->small.size() + w->large.size() >= max_queue_depth_) {
      refused =
          absl::ResourceExhaustedError(absl::StrCat("the queue of ", w->slot.name, " is full (",
                                                    max_queue_depth_, " requests); retry later"));
    }
    if (!refused.ok()) {
      Release(bytes);
      return refused;
    }
    const bool large = job.large || bytes >= kLargeJobBytes;
    run_here = job.inline_ok && (!large || job.inline_large_ok) && !w->busy && w->bound &&
               w->small.empty() && w->large.empty();
    if (run_here) {
      w->busy = true;  // the slot is this thread's until the job ran
    } else {
      (large ? w->large : w->small).push_back(Queued{absl::Now(), std::move(job)});
    }
  }
  if (!run_here) {
    w->cv.notify_one();
    return absl::OkStatus();
  }
  inline_runs_.fetch_add(1, std::memory_order_relaxed);
  RunJob(w->slot, Queued{absl::Now(), std::move(job)});
  Release(bytes);
  bool queued;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->busy = false;
    queued = !w->small.empty() || !w->large.empty() || w->stopping;
  }
  if (queued) w->cv.notify_one();  // what came meanwhile waits for the worker
  return absl::OkStatus();
}

}  // namespace kplan
