// A fixed set of threads running closures in FIFO order (LevelDB's
// Env::Schedule, with a pool): for host work that must not hold a device
// worker, such as answering the members of a coalesced launch while the
// worker starts the next one (server/moe/moe_coalesce.h).
//
// A task must not throw (Schedule's callers catch what their work may
// throw) and must not wait for a task scheduled after it. The destructor
// runs every task already scheduled, then joins the threads; it must not run
// on one of them.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace kplan {

class TaskPool {
 public:
  // `threads` >= 1, named `name` (at most 15 characters show in top / gdb).
  TaskPool(int threads, const std::string& name);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Schedule(std::function<void()> task);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  Mutex mu_;
  CondVar work_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kplan
