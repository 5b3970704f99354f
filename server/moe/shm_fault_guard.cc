#include "server/moe/shm_fault_guard.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace kplan {
namespace {

// Slots the handler scans without a lock: a slot is in use while `start`
// is non-zero; `bytes` is written before `start` is published.
struct Slot {
  std::atomic<uintptr_t> start{0};
  std::atomic<size_t> bytes{0};
  std::atomic<bool> lost{false};
};
constexpr int kSlots = 1024;
Slot slots[kSlots];
std::atomic<int> slots_used{0};  // the handler scans [0, slots_used)
// Handlers running now: ShmUnguard waits for them, so that a slot is never
// freed (and reused for another mapping) under a scan that read it.
std::atomic<int> in_handler{0};
std::mutex slot_mu;  // guards claiming and freeing (not the handler's reads)
struct sigaction previous;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  in_handler.fetch_add(1, std::memory_order_seq_cst);
  bool handled = false;
  // Only a fault of an address past the object's end: not a machine check,
  // nor a signal sent by kill (whose info holds no address).
  if (info != nullptr && info->si_code == BUS_ADRERR) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
    const int used = slots_used.load(std::memory_order_acquire);
    for (int i = 0; i < used && !handled; ++i) {
      Slot& s = slots[i];
      const uintptr_t start = s.start.load(std::memory_order_seq_cst);
      const size_t bytes = s.bytes.load(std::memory_order_seq_cst);
      if (start == 0 || at < start || at - start >= bytes) continue;
      // mmap is a system call: async-signal-safe in practice (Wayland relies
      // on it too). The faulting access is retried on the zero pages.
      void* p = mmap(reinterpret_cast<void*>(start), bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p != MAP_FAILED) {
        s.lost.store(true, std::memory_order_release);
        handled = true;
      }
    }
  }
  in_handler.fetch_sub(1, std::memory_order_seq_cst);
  errno = saved_errno;
  if (handled) return;
  // Not ours (or the remap failed): what would have happened without us.
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) return previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN &&
             previous.sa_handler != nullptr) {
    return previous.sa_handler(sig);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The handler before ours is read first, so that a fault meanwhile
    // still finds it.
    sigaction(SIGBUS, nullptr, &previous);
    struct sigaction sa = {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

}  // namespace

int ShmGuard(void* addr, size_t bytes) {
  InstallOnce();
  std::lock_guard<std::mutex> lock(slot_mu);
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = slots[i];
    if (s.start.load(std::memory_order_relaxed) != 0) continue;
    s.bytes.store(bytes, std::memory_order_relaxed);
    s.lost.store(false, std::memory_order_relaxed);
    s.start.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_release);
    if (i >= slots_used.load(std::memory_order_relaxed)) {
      slots_used.store(i + 1, std::memory_order_release);
    }
    return i;
  }
  return -1;
}

void ShmUnguard(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  std::lock_guard<std::mutex> lock(slot_mu);
  slots[slot].start.store(0, std::memory_order_seq_cst);
  // A handler that read the slot before it was freed is done with it before
  // the mapping goes (and before the slot is reused).
  while (in_handler.load(std::memory_order_seq_cst) != 0) sched_yield();
}

bool ShmMappingLost(int slot) {
  return slot >= 0 && slot < kSlots && slots[slot].lost.load(std::memory_order_acquire);
}

}  // namespace kplan
