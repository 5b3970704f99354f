// Owners of CUDA memory and events, freed on every exit path: DeviceBuffer
// (one device allocation, plain or stream-ordered), DeviceArena (one device
// block carved into 256-byte aligned pieces, growable and reusable across
// calls), PinnedHostBuffer (page-locked host memory for DMA) and Event. A
// failed allocation is RESOURCE_EXHAUSTED with file:line (status.h) and
// leaves the owner empty. Not thread-safe; movable, not copyable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kplan::kernels::cuda {

// Device allocations are carved at multiples of this (the alignment of
// cudaMalloc and of every vector access of the kernels).
inline constexpr int64_t kDeviceAlignment = 256;

// Whether p is 16-byte aligned, as the kernels' 16-byte vector accesses and
// cp.async chunks need.
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Layouts: reserves `bytes` at the end of a layout of `*total` bytes,
// kDeviceAlignment-aligned; returns its offset.
inline int64_t ReserveAligned(int64_t* total, int64_t bytes) {
  const int64_t at = *total;
  *total += (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  return at;
}

class DeviceBuffer {
 public:
  // Plain: cudaMalloc on the current device, cudaFree on that device.
  DeviceBuffer() = default;
  // Stream-ordered on `stream` (null: the legacy default stream):
  // cudaMallocAsync / cudaFreeAsync, ordered with the work on the stream.
  explicit DeviceBuffer(cudaStream_t stream) : stream_(stream), stream_ordered_(true) {}
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  // Holds at least `bytes` afterwards: a no-op when it does already, else
  // frees what it holds (the contents are lost) and allocates exactly
  // `bytes`. Zero bytes allocate nothing.
  absl::Status Reserve(size_t bytes);
  // Frees what it holds; empty afterwards.
  void Reset();

  void* data() const { return ptr_; }
  size_t capacity() const { return capacity_; }
  template <typename T>
  T* As(size_t offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + offset);
  }

 private:
  cudaStream_t stream_ = nullptr;
  bool stream_ordered_ = false;
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
  int device_ = -1;  // of a plain allocation
};

// Lay out with Reserve, then Allocate, then address pieces with At(offset).
// Reused across calls: Clear() forgets the layout and keeps the block, and
// Allocate grows the block only when a layout needs more (growth frees the
// old block: pointers into it are invalid after a growing Allocate).
class DeviceArena {
 public:
  DeviceArena() = default;                                       // plain
  explicit DeviceArena(cudaStream_t stream) : block_(stream) {}  // stream-ordered

  // Appends `bytes` to the layout; returns their offset (aligned).
  int64_t Reserve(int64_t bytes) { return ReserveAligned(&size_, bytes); }
  // Makes the block hold the layout (size() bytes).
  absl::Status Allocate() { return block_.Reserve(static_cast<size_t>(size_)); }
  void Clear() { size_ = 0; }
  // Frees the block (the layout is kept).
  void Release() { block_.Reset(); }

  template <typename T>
  T* At(int64_t offset) const {
    return block_.As<T>(static_cast<size_t>(offset));
  }
  void* base() const { return block_.data(); }
  int64_t size() const { return size_; }  // of the layout
  int64_t capacity() const { return static_cast<int64_t>(block_.capacity()); }

 private:
  DeviceBuffer block_;
  int64_t size_ = 0;
};

// Page-locked host memory (cudaHostAlloc, portable to every device and
// mapped into their address space): the DMA engines read and write it
// directly, with no hidden staging copy, and so can kernels (at the same
// address under unified addressing).
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  ~PinnedHostBuffer() { Reset(); }
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;

  // As DeviceBuffer::Reserve.
  absl::Status Reserve(size_t bytes);
  void Reset();

  char* data() const { return ptr_; }
  size_t capacity() const { return capacity_; }

 private:
  char* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// A cudaEvent_t, created on first use (Create or Record) on the current
// device and destroyed with the owner.
class Event {
 public:
  Event() = default;
  ~Event() { Reset(); }
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  // cudaEventCreateWithFlags; a no-op once created.
  absl::Status Create(unsigned flags = cudaEventDefault);
  // Creates the event if needed, then cudaEventRecord on `stream`.
  absl::Status Record(cudaStream_t stream);
  void Reset();
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds from `start` to `stop`, both recorded and completed
// (cudaEventElapsedTime).
absl::StatusOr<float> ElapsedMs(const Event& start, const Event& stop);

}  // namespace kplan::kernels::cuda
