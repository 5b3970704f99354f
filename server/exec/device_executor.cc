#include "server/exec/device_executor.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/base/status.h"

#if KPLAN_HAVE_CUDA
#include "kernels/cuda/runtime/stream.h"
#endif

namespace kplan {

absl::StatusOr<std::unique_ptr<DeviceExecutor>> DeviceExecutor::Create(
    const std::vector<LocalDevice>& devices, size_t max_queue_depth) {
  std::unique_ptr<DeviceExecutor> ex(new DeviceExecutor());
  ex->max_queue_depth_ = max_queue_depth;
  auto cpu = std::make_unique<Worker>();
  cpu->slot.name = "cpu";
  ex->workers_.push_back(std::move(cpu));
  for (const LocalDevice& d : devices) {
    auto w = std::make_unique<Worker>();
    w->slot.name = absl::StrCat("cuda:", d.index);
    w->slot.cuda_device = d.index;
    ex->workers_.push_back(std::move(w));
  }
  for (auto& w : ex->workers_) {
    Worker* raw = w.get();
    raw->thread = std::thread([raw] { Loop(raw); });
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

void DeviceExecutor::Loop(Worker* w) {
  bool bound = w->slot.cuda_device < 0;
  for (;;) {
    std::pair<absl::Time, Work> item;
    {
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait(lock, [w] { return w->stopping || !w->queue.empty(); });
      if (w->queue.empty()) break;  // stopping, and everything queued is done
      item = std::move(w->queue.front());
      w->queue.pop_front();
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
    item.second(w->slot, absl::Now() - item.first);
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
  Worker* w = workers_.at(index).get();
  {
    std::lock_guard<std::mutex> lock(w->mu);
    if (w->stopping) return absl::UnavailableError("the server is shutting down");
    if (w->queue.size() >= max_queue_depth_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the queue of ", w->slot.name, " is full (", max_queue_depth_, " requests); retry later"));
    }
    w->queue.emplace_back(absl::Now(), std::move(work));
  }
  w->cv.notify_one();
  return absl::OkStatus();
}

}  // namespace kplan
