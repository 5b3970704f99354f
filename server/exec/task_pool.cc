#include "server/exec/task_pool.h"

#include <pthread.h>

#include <algorithm>

#include "spdlog/spdlog.h"

namespace kplan {

TaskPool::TaskPool(int threads, const std::string& name, size_t max_queued)
    : max_queued_(std::max<size_t>(max_queued, 1)) {
  threads = std::max(threads, 1);
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Loop(); });
    pthread_setname_np(threads_.back().native_handle(), name.substr(0, 15).c_str());
  }
}

TaskPool::~TaskPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

void TaskPool::Report(const OnError& on_error, const absl::Status& failed) {
  if (!on_error) {
    spdlog::error("a pooled task failed without an error callback: {}", failed.ToString());
    return;
  }
  try {
    on_error(failed);
  } catch (...) {  // nothing leaves a pool thread
    spdlog::error("a pooled task: reporting '{}' threw", failed.ToString());
  }
}

bool TaskPool::TryQueue(std::function<void()> task) {
  MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(task));
  work_.Signal();  // under the lock: a destructor that follows never races it
  return true;
}

void TaskPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and everything queued ran
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // guarded by Run: it does not throw
  }
}

}  // namespace kplan
