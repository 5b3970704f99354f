// Device workers: one thread (and, for a GPU, one CUDA stream) per device the
// server owns, plus one for the CPU reference path. Work submitted to a device
// runs there in submission order, so a handler never blocks a gRPC thread on
// device work and kernels on one GPU never race for its stream. Queues are
// bounded: a full queue is RESOURCE_EXHAUSTED.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/platform/local.h"

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

  // Workers for the CPU and each device.
  static absl::StatusOr<std::unique_ptr<DeviceExecutor>> Create(
      const std::vector<LocalDevice>& devices, size_t max_queue_depth);
  ~DeviceExecutor();  // finishes queued work, then joins

  // Resolves "cpu", "cuda:N" or "" (the first GPU, else the CPU) to a slot
  // index; unknown or absent devices are FAILED_PRECONDITION naming `field`.
  absl::StatusOr<size_t> Resolve(absl::string_view device, absl::string_view field) const;
  const DeviceSlot& slot(size_t index) const { return workers_[index]->slot; }
  size_t size() const { return workers_.size(); }

  // Queues `work` on slot `index`; RESOURCE_EXHAUSTED when its queue is full.
  absl::Status Submit(size_t index, Work work);

 private:
  struct Worker {
    DeviceSlot slot;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<absl::Time, Work>> queue;
    bool stopping = false;
    std::thread thread;
  };
  DeviceExecutor() = default;
  static void Loop(Worker* w);

  size_t max_queue_depth_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace kplan
