#include "kernels/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "kernels/cuda/runtime/status.h"
#include "base/status.h"

namespace kplan::comm {
namespace {

using kernels::cuda::CudaStatus;
using kernels::cuda::NcclStatus;

ncclDataType_t NcclType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kUint8:
      return ncclUint8;
    case kernels::DType::kInt32:
      return ncclInt32;
    case kernels::DType::kInt64:
      return ncclInt64;
    case kernels::DType::kFloat32:
      return ncclFloat32;
    case kernels::DType::kFloat16:
      return ncclFloat16;
    case kernels::DType::kBFloat16:
      return ncclBfloat16;
    case kernels::DType::kInt8:
      return ncclInt8;
    case kernels::DType::kFp8E4m3:
    case kernels::DType::kInt4Packed:
      return ncclUint8;  // moved as bytes, never reduced
  }
  return ncclUint8;
}

// Makes `device` current for this thread for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// ncclCommInitRank blocks until every rank of the group has joined, with no
// timeout of its own: a peer that died after receiving the unique id would
// hold this rank forever (and with it the rank's thread: a group's steps
// would wait behind it). So the join runs on a thread of its own, and the
// caller stops waiting after `timeout`; an abandoned join that completes later
// aborts its communicator, one that never does stays parked on its thread
// until the process exits.
absl::StatusOr<ncclComm_t> JoinWithin(int rank, int size, const ncclUniqueId& id, int device,
                                      std::chrono::milliseconds timeout) {
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, abandoned = false;
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclSuccess;
  };
  auto pending = std::make_shared<Pending>();
  std::thread([pending, rank, size, id, device] {
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclUnhandledCudaError;
    if (cudaSetDevice(device) == cudaSuccess) r = ncclCommInitRank(&comm, size, id, rank);
    std::lock_guard<std::mutex> lock(pending->mu);
    if (pending->abandoned) {
      if (r == ncclSuccess) (void)ncclCommAbort(comm);
      return;
    }
    pending->comm = comm;
    pending->result = r;
    pending->done = true;
    pending->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(pending->mu);
  if (!pending->cv.wait_for(lock, timeout, [&] { return pending->done; })) {
    pending->abandoned = true;
    return absl::DeadlineExceededError(absl::StrCat(
        "NCCL rank ", rank, " of ", size, " on cuda:", device, ": the group did not form within ",
        timeout.count(), " ms (a peer never joined); gave up waiting"));
  }
  if (pending->result != ncclSuccess) {
    return NcclStatus(pending->result, __FILE__, __LINE__,
                      "ncclCommInitRank(&comm, size, id, rank)");
  }
  return pending->comm;
}

}  // namespace

absl::StatusOr<std::string> NcclCommunicator::CreateUniqueId() {
  ncclUniqueId id;
  KPLAN_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int rank, int size, absl::string_view unique_id, int device, void* stream,
    NcclOptions options) {
  if (size <= 0 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", rank, " is not in a group of size ", size));
  }
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id must be ", sizeof(id.internal),
                                                   " bytes, got ", unique_id.size()));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  DeviceGuard guard(device);
  KPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  bool owns_stream = false;
  if (stream == nullptr) {
    cudaStream_t s;
    KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream = s;
    owns_stream = true;
  }
  absl::StatusOr<ncclComm_t> joined = JoinWithin(rank, size, id, device, options.timeout);
  if (!joined.ok()) {
    if (owns_stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
    return joined.status();
  }
  ncclComm_t comm = *joined;
  std::unique_ptr<NcclCommunicator> result(
      new NcclCommunicator(rank, size, device, comm, stream, owns_stream, options));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMalloc(&result->barrier_buffer_, sizeof(float)));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMemset(result->barrier_buffer_, 0, sizeof(float)));
  return result;
}

NcclCommunicator::NcclCommunicator(int rank, int size, int device, ncclComm* comm, void* stream,
                                   bool owns_stream, NcclOptions options)
    : rank_(rank),
      size_(size),
      device_(device),
      comm_(comm),
      stream_(stream),
      owns_stream_(owns_stream),
      options_(options) {}

NcclCommunicator::~NcclCommunicator() {
  DeviceGuard guard(device_);
  if (!aborted_.load()) {
    (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    (void)ncclCommDestroy(comm_);
  }
  if (barrier_buffer_ != nullptr) (void)cudaFree(barrier_buffer_);
  if (owns_stream_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status NcclCommunicator::CheckUsable(absl::string_view what) const {
  if (!aborted_.load()) return absl::OkStatus();
  std::string reason;
  {
    kplan::MutexLock lock(&reason_mu_);
    reason = abort_reason_;
  }
  return absl::AbortedError(absl::StrCat("NcclCommunicator rank ", rank_, ": ", what,
                                         ": communicator aborted",
                                         reason.empty() ? std::string() : ": " + reason));
}

void NcclCommunicator::AbortComm(absl::Status why) {
  {
    kplan::MutexLock lock(&reason_mu_);
    if (abort_reason_.empty()) abort_reason_ = std::string(why.message());
  }
  bool expected = false;
  if (aborted_.compare_exchange_strong(expected, true)) {
    // Not while Wait() is inside an NCCL query on the rank's thread: it would
    // read a freed communicator. Wait sees aborted_ at its next poll.
    kplan::MutexLock lock(&poll_mu_);
    DeviceGuard guard(device_);
    (void)ncclCommAbort(comm_);
  }
}

void NcclCommunicator::Abort(absl::string_view reason) { AbortComm(absl::AbortedError(reason)); }

absl::Status NcclCommunicator::Wait(absl::string_view what) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  auto stream = static_cast<cudaStream_t>(stream_);
  for (int spin = 0;; ++spin) {
    absl::Status failure;
    {
      // One poll, never overlapping an abort from another thread.
      kplan::MutexLock lock(&poll_mu_);
      if (aborted_.load()) return CheckUsable(what);
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return absl::OkStatus();
      ncclResult_t async = ncclSuccess;
      if (e != cudaErrorNotReady) {
        failure = CudaStatus(e, __FILE__, __LINE__, "cudaStreamQuery(stream)");
      } else if (ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
                 r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        const absl::Status st = NcclStatus(r != ncclSuccess ? r : async, __FILE__, __LINE__,
                                           "ncclCommGetAsyncError(comm)");
        failure = absl::Status(st.code(), absl::StrCat("NcclCommunicator rank ", rank_, ": ", what,
                                                       ": ", st.message()));
      } else if (std::chrono::steady_clock::now() > deadline) {
        failure = absl::DeadlineExceededError(
            absl::StrCat("NcclCommunicator rank ", rank_, ": ", what, " did not complete within ",
                         options_.timeout.count(), " ms (a peer never joined or died); aborted"));
      }
    }
    if (!failure.ok()) {
      AbortComm(failure);
      return failure;
    }
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, int64_t count,
                                         kernels::DType dtype) {
  KPLAN_RETURN_IF_ERROR(CheckUsable("AllGather"));
  if (count < 0) return absl::InvalidArgumentError("AllGather: negative count");
  DeviceGuard guard(device_);
  KPLAN_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, static_cast<size_t>(count), NcclType(dtype),
                                           comm_, static_cast<cudaStream_t>(stream_)));
  return Wait("AllGather");
}

absl::Status NcclCommunicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                             kernels::DType dtype, ReduceOp op) {
  KPLAN_RETURN_IF_ERROR(CheckUsable("ReduceScatter"));
  if (recv_count < 0) return absl::InvalidArgumentError("ReduceScatter: negative count");
  if (op != ReduceOp::kSum) return absl::UnimplementedError("ReduceScatter: only sum");
  DeviceGuard guard(device_);
  KPLAN_NCCL_RETURN_IF_ERROR(ncclReduceScatter(send, recv, static_cast<size_t>(recv_count),
                                               NcclType(dtype), ncclSum, comm_,
                                               static_cast<cudaStream_t>(stream_)));
  return Wait("ReduceScatter");
}

absl::Status NcclCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                         absl::Span<const int64_t> send_displs, void* recv,
                                         absl::Span<const int64_t> recv_counts,
                                         absl::Span<const int64_t> recv_displs,
                                         kernels::DType dtype) {
  KPLAN_RETURN_IF_ERROR(CheckUsable("AllToAllV"));
  KPLAN_RETURN_IF_ERROR(ValidateAllToAllVSide(size_, send, send_counts, send_displs, "send"));
  KPLAN_RETURN_IF_ERROR(ValidateAllToAllVSide(size_, recv, recv_counts, recv_displs, "recv"));
  const int64_t elem = kernels::DTypeSize(dtype);
  const ncclDataType_t type = NcclType(dtype);
  auto stream = static_cast<cudaStream_t>(stream_);
  DeviceGuard guard(device_);
  KPLAN_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (int p = 0; p < size_; ++p) {
    if (send_counts[p] > 0) {
      if (ncclResult_t r = ncclSend(static_cast<const char*>(send) + send_displs[p] * elem,
                                    static_cast<size_t>(send_counts[p]), type, p, comm_, stream);
          r != ncclSuccess) {
        (void)ncclGroupEnd();
        return NcclStatus(r, __FILE__, __LINE__, "ncclSend");
      }
    }
    if (recv_counts[p] > 0) {
      if (ncclResult_t r = ncclRecv(static_cast<char*>(recv) + recv_displs[p] * elem,
                                    static_cast<size_t>(recv_counts[p]), type, p, comm_, stream);
          r != ncclSuccess) {
        (void)ncclGroupEnd();
        return NcclStatus(r, __FILE__, __LINE__, "ncclRecv");
      }
    }
  }
  KPLAN_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  return Wait("AllToAllV");
}

absl::Status NcclCommunicator::Barrier() {
  KPLAN_RETURN_IF_ERROR(CheckUsable("Barrier"));
  DeviceGuard guard(device_);
  KPLAN_NCCL_RETURN_IF_ERROR(ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32,
                                           ncclSum, comm_, static_cast<cudaStream_t>(stream_)));
  return Wait("Barrier");
}

}  // namespace kplan::comm
