// Mutex, MutexLock and CondVar: the subset of absl::Mutex's interface this
// tree uses, with the same thread-safety annotations (clang -Wthread-safety
// checks ABSL_GUARDED_BY against them), over std::mutex and
// std::condition_variable_any. Why not absl::Mutex itself: the
// distribution's abseil is not built with ThreadSanitizer, and absl::Mutex
// synchronises through its own futex code that an uninstrumented library
// hides from TSan, so the TSan CI job would report every access it guards
// as a race. std::mutex goes through pthreads, which TSan intercepts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kplan {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // BasicLockable, for std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits release `mu` (which the caller holds) and hold it again on return.
class CondVar {
 public:
  void Wait(Mutex* mu) { cv_.wait(*mu); }
  // True when the timeout passed before a signal (as absl::CondVar).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    return WaitWithDeadline(mu, absl::Now() + timeout);
  }
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    if (deadline == absl::InfiniteFuture()) {
      cv_.wait(*mu);
      return false;
    }
    return cv_.wait_until(*mu, absl::ToChronoTime(deadline)) == std::cv_status::timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace kplan
