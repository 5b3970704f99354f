// A fixed set of threads running closures in FIFO order (LevelDB's
// Env::Schedule, with a pool): for host work that must not hold a device
// worker, such as answering a call whose layer ran there while the worker
// takes its next job (server/moe/run_moe.h, server/moe/moe_coalesce.h).
//
// The queue is bounded: past `max_queued` tasks (or when it cannot grow) Run
// runs the task on the calling thread, so work that hands its tail here
// slows down with it instead of piling up memory. A task must not wait for a
// task run after it. The destructor runs every task already queued, then
// joins the threads; it must not run on one of them, nor while another
// thread may still call Run.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "base/mutex.h"
#include "base/status.h"

namespace kplan {

class TaskPool {
 public:
  using OnError = std::function<void(const absl::Status&)>;

  // `threads` threads (at least 1) named `name` (15 characters show in top
  // and gdb).
  TaskPool(int threads, const std::string& name, size_t max_queued = 1024);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Runs `task` (copyable) on a pool thread, or here when the queue is full.
  // What it throws goes to `on_error` as a status (RESOURCE_EXHAUSTED for
  // std::bad_alloc, INTERNAL otherwise); what on_error throws is logged.
  template <typename F>
  void Run(F task, OnError on_error = {}) {
    auto guarded = [task = std::move(task), on_error = std::move(on_error)]() mutable {
      RunGuarded(task, on_error);
    };
    bool queued = false;
    try {
      queued = TryQueue(std::function<void()>(guarded));  // a copy: `guarded` stays whole
    } catch (const std::bad_alloc&) {
    }
    if (!queued) guarded();
  }

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs `task` here, what it throws going to `on_error` as Run says.
  template <typename F>
  static void RunGuarded(F& task, const OnError& on_error) {
    try {
      task();
    } catch (...) {
      Report(on_error, StatusOfCurrentException("finishing the call", "finishing the call failed"));
    }
  }

 private:
  static void Report(const OnError& on_error, const absl::Status& failed);
  // False when the queue holds max_queued_ tasks.
  bool TryQueue(std::function<void()> task);
  void Loop();

  const size_t max_queued_;
  Mutex mu_;
  CondVar work_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kplan
