#include "server/exec/task_pool.h"

#include <pthread.h>

#include <utility>

namespace kplan {

TaskPool::TaskPool(int threads, const std::string& name) {
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
  }
  work_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

void TaskPool::Schedule(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
  }
  work_.Signal();
}

void TaskPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and everything scheduled ran
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kplan
