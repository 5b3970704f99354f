// IdleWatchdog: ends streams whose client went quiet. A LoadExperts stream
// holds a budget reservation and a partly filled buffer; a client that opens
// one and then sends nothing would hold both forever. Each watched stream
// registers a callback and touches its entry on every message; one thread
// checks the entries every `tick` and calls the callback of each stream idle
// for `timeout` or longer (it then finishes its call with DEADLINE_EXCEEDED).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace kplan::rpc {

class IdleWatchdog {
 public:
  using Id = uint64_t;

  IdleWatchdog(absl::Duration timeout, absl::Duration tick);
  ~IdleWatchdog();  // stops the thread; callbacks not yet called are not

  absl::Duration timeout() const { return timeout_; }

  // Watches a stream, active now. `on_idle` runs at most once, on the
  // watchdog's thread, under its lock: it must not call back into the
  // watchdog, and it must not block.
  Id Watch(std::function<void()> on_idle);
  // The stream was active now.
  void Touch(Id id);
  // Stops watching; once it returns, `on_idle` is not running and never
  // will (so its stream may be destroyed). Unknown ids are ignored.
  void Unwatch(Id id);

 private:
  struct Entry {
    absl::Time last_active;
    std::function<void()> on_idle;
  };
  void Loop();

  const absl::Duration timeout_;
  const absl::Duration tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Id, Entry> entries_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kplan::rpc
