// The shared-memory call channel's layout and doorbell (issue #15): a
// co-located client calls RunMoE through a POSIX shared-memory region it
// registered, without gRPC on the call path. gRPC sets the channel up
// (RegisterSharedMemory, then OpenShmChannel, both authorised); each call
// is then a serialized RunMoERequest written into the region, a state word
// flipped, and the serialized RunMoEResponse read back from it. Both sides
// spin briefly on the state word before they sleep on it (a futex on the
// shared page), so back-to-back calls pay no system call.
//
// The window of the region, from its first byte:
//   [0, 64)                         ShmChannelHeader
//   [64, 64 + request_capacity)     the request's bytes (the client's; tensors
//                                   it references there are the call's: read,
//                                   and its output written, by the server)
//   [64 + request_capacity, end)    the answer's bytes (the server's)
// request_capacity is fixed when the channel opens; the server keeps its
// own copy of it and never trusts a length in the header beyond it.
//
// One call at a time per channel. The state word moves
//   client: Idle|Done -> Posted          (request written)
//   server: Posted -> Running            (request copied out)
//   server: Running -> Done              (answer written, status set)
//   client: Posted|Running -> Cancelled  (the client gave up)
//   server: Cancelled -> Idle            (the abandoned call has ended)
//   server: any -> Closed                (channel closed or server stopping)
// The client writes its fields only in Idle or Done, the server its only in
// Running (and an output_shm slice in the request area until it lets go of
// the call: Done, or Cancelled -> Idle); every move is a compare-and-swap,
// so neither side overwrites a move of the other. A client that breaks these rules only breaks its
// own calls: the server copies the request before it parses it and bounds every length it reads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace kplan {

inline constexpr uint32_t kShmChannelMagic = 0x4843504b;  // "KPCH", little-endian
inline constexpr uint32_t kShmChannelVersion = 1;

enum class ShmChannelState : uint32_t {
  kIdle = 0,
  kPosted = 1,
  kRunning = 2,
  kDone = 3,
  kCancelled = 4,
  kClosed = 5,
};

struct alignas(64) ShmChannelHeader {
  uint32_t magic;    // kShmChannelMagic, written by the client before it opens the channel
  uint32_t version;  // kShmChannelVersion
  std::atomic<uint32_t> state;  // ShmChannelState; the futex word
  int32_t status_code;          // the answer's absl::StatusCode (server)
  uint64_t request_bytes;       // the request's length (client)
  uint64_t response_bytes;      // the answer's length (server): the response, or the error text
  int64_t timeout_us;           // the call's budget from Posted (client); <= 0: the server's cap
  uint64_t sequence;            // the client's call number, echoed into response_sequence
  uint64_t response_sequence;   // the sequence the answer belongs to (server)
  uint64_t reserved;
};
static_assert(sizeof(ShmChannelHeader) == 64);

// The state word's value of `s`.
constexpr uint32_t ShmWord(ShmChannelState s) { return static_cast<uint32_t>(s); }

// A header field the other process may write at any time: read once, as a
// value (never re-read between a bounds check and its use), and written
// whole.
template <typename T>
T ShmChannelLoad(const T* field) {
  return __atomic_load_n(field, __ATOMIC_RELAXED);
}
template <typename T>
void ShmChannelStore(T* field, T value) {
  __atomic_store_n(field, value, __ATOMIC_RELAXED);
}
static_assert(std::atomic<uint32_t>::is_always_lock_free);

inline constexpr int64_t kShmChannelHeaderBytes = sizeof(ShmChannelHeader);
// The smallest answer area a channel may have: room for any error (its
// message of at most 1 KiB twice, and the field).
inline constexpr int64_t kShmChannelMinResponseBytes = 4096;

// Where a channel's header and areas lie in its window at `base` (the
// layout above), for a request area of `request_capacity` bytes.
struct ShmChannelAreas {
  ShmChannelHeader* header;
  char* request;
  char* response;
};
inline ShmChannelAreas ShmChannelAreasAt(char* base, int64_t request_capacity) {
  return {reinterpret_cast<ShmChannelHeader*>(base), base + kShmChannelHeaderBytes,
          base + kShmChannelHeaderBytes + request_capacity};
}

// Writes a fresh header (magic, version, Idle) at `base`, 64-byte aligned:
// what a client does before it asks the server to open the channel.
void ShmChannelInit(void* base);

// Sleeps while `*word` holds `expected`, at most `timeout`, on a futex that
// works across processes mapping the same page. Returns early on a wake,
// a change of the word, or a signal; the caller re-reads the word.
void ShmChannelWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);
// Wakes every waiter on `word`.
void ShmChannelWake(std::atomic<uint32_t>* word);

// Spins up to `spin`, then sleeps in slices of at most `slice`, until
// `*word` no longer holds `value`, `deadline` passes, or `*stop` (when not
// null) is set, which is checked at each slice. Returns the word's last
// value (still `value` on a deadline or a stop).
uint32_t ShmChannelAwaitChange(std::atomic<uint32_t>* word, uint32_t value, absl::Duration spin,
                               absl::Time deadline, absl::Duration slice,
                               const std::atomic<bool>* stop = nullptr);

}  // namespace kplan
