#include "kernels/cuda/runtime/buffers.h"

#include <utility>

#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {

// ---------------------------------------------------------------------------
// DeviceBuffer.

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : stream_(other.stream_),
      stream_ordered_(other.stream_ordered_),
      ptr_(std::exchange(other.ptr_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = other.stream_;
    stream_ordered_ = other.stream_ordered_;
    ptr_ = std::exchange(other.ptr_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    device_ = other.device_;
  }
  return *this;
}

absl::Status DeviceBuffer::Reserve(size_t bytes) {
  if (capacity_ >= bytes) return absl::OkStatus();
  Reset();
  void* p = nullptr;
  if (stream_ordered_) {
    KPLAN_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, bytes, stream_));
  } else {
    KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device_));
    KPLAN_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  }
  ptr_ = p;
  capacity_ = bytes;
  return absl::OkStatus();
}

void DeviceBuffer::Reset() {
  if (ptr_ == nullptr) return;
  if (stream_ordered_) {
    (void)cudaFreeAsync(ptr_, stream_);
  } else {
    DeviceGuard guard;  // free on the allocation's device
    (void)guard.Enter(device_);
    (void)cudaFree(ptr_);
  }
  ptr_ = nullptr;
  capacity_ = 0;
}

// ---------------------------------------------------------------------------
// PinnedHostBuffer.

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

absl::Status PinnedHostBuffer::Reserve(size_t bytes) {
  if (capacity_ >= bytes) return absl::OkStatus();
  Reset();
  void* p = nullptr;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  ptr_ = static_cast<char*>(p);
  capacity_ = bytes;
  return absl::OkStatus();
}

void PinnedHostBuffer::Reset() {
  if (ptr_ == nullptr) return;
  (void)cudaFreeHost(ptr_);
  ptr_ = nullptr;
  capacity_ = 0;
}

// ---------------------------------------------------------------------------
// Event.

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Reset();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

absl::Status Event::Create(unsigned flags) {
  if (event_ != nullptr) return absl::OkStatus();
  KPLAN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event_, flags));
  return absl::OkStatus();
}

absl::Status Event::Record(cudaStream_t stream) {
  if (absl::Status st = Create(); !st.ok()) return st;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

void Event::Reset() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
  event_ = nullptr;
}

absl::StatusOr<float> ElapsedMs(const Event& start, const Event& stop) {
  float ms = 0.0f;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

}  // namespace kplan::kernels::cuda
