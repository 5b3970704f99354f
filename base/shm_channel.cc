#include "base/shm_channel.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "absl/time/clock.h"

namespace kplan {
namespace {

// A futex word in shared memory: the process-shared forms (no
// FUTEX_PRIVATE_FLAG), keyed by the page, not by this process's address.
long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void ShmChannelInit(void* base) {
  auto* header = new (base) ShmChannelHeader{};
  header->magic = kShmChannelMagic;
  header->version = kShmChannelVersion;
  header->state.store(ShmWord(ShmChannelState::kIdle), std::memory_order_release);
}

void ShmChannelWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  const timespec ts = absl::ToTimespec(timeout);
  Futex(word, FUTEX_WAIT, expected, &ts);  // EAGAIN (changed), EINTR, ETIMEDOUT: re-read
}

void ShmChannelWake(std::atomic<uint32_t>* word) { Futex(word, FUTEX_WAKE, INT32_MAX, nullptr); }

uint32_t ShmChannelAwaitChange(std::atomic<uint32_t>* word, uint32_t value, absl::Duration spin,
                               absl::Time deadline, absl::Duration slice,
                               const std::atomic<bool>* stop) {
  uint32_t now = word->load(std::memory_order_acquire);
  if (now != value) return now;
  const absl::Time spin_end = std::min(absl::Now() + spin, deadline);
  while (absl::Now() < spin_end) {
    if (stop != nullptr && stop->load(std::memory_order_acquire)) return now;
    for (int i = 0; i < 64; ++i) {
      CpuRelax();
      now = word->load(std::memory_order_acquire);
      if (now != value) return now;
    }
    // A thread that has work (the device worker, the other side) gets the
    // core first: polling must not slow what it waits for on a busy host.
    sched_yield();
  }
  while (true) {
    if (stop != nullptr && stop->load(std::memory_order_acquire)) return now;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return now;
    ShmChannelWait(word, value, std::min(left, slice));
    now = word->load(std::memory_order_acquire);
    if (now != value) return now;
  }
}

}  // namespace kplan
