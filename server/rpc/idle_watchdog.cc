#include "server/rpc/idle_watchdog.h"

#include <vector>

#include "absl/time/clock.h"

namespace kplan::rpc {

IdleWatchdog::IdleWatchdog(absl::Duration timeout, absl::Duration tick)
    : timeout_(timeout), tick_(tick) {
  thread_ = std::thread([this] { Loop(); });
}

IdleWatchdog::~IdleWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

IdleWatchdog::Id IdleWatchdog::Watch(std::function<void()> on_idle) {
  std::lock_guard<std::mutex> lock(mu_);
  const Id id = next_id_++;
  entries_[id] = Entry{absl::Now(), std::move(on_idle)};
  return id;
}

void IdleWatchdog::Touch(Id id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.last_active = absl::Now();
}

void IdleWatchdog::Unwatch(Id id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(id);
}

void IdleWatchdog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const absl::Time now = absl::Now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (now - it->second.last_active >= timeout_) {
        // Under the lock, so Unwatch (and the stream's destruction) waits.
        it->second.on_idle();
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    cv_.wait_for(lock, absl::ToChronoNanoseconds(tick_),
                 [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; });
  }
}

}  // namespace kplan::rpc
