// The communication layer of expert parallelism: a group of `size()` ranks
// that run collectives on raw buffers. Expert-parallel dispatch/combine
// (server/moe/ep/) is written against this interface only, so the same logic
// runs over threads of one process (InProcessCommunicator, the CPU path and
// every test) and over NCCL (NcclCommunicator, device pointers on the
// communicator's own CUDA stream). The interface carries no CUDA types.
//
// Semantics follow NCCL so a GPU implementation is a thin wrapper:
//  - every rank calls the same collectives in the same order with matching
//    sizes; counts are in elements of `dtype`;
//  - calls are synchronous: when one returns OK the receive buffer is final
//    and the send buffer may be reused;
//  - after any failure (a timeout, an abort, a mismatched call) the group is
//    unusable: every later call fails, on every rank that can observe it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/common/types.h"

namespace kplan::comm {

enum class ReduceOp { kSum };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "in_process", "nccl".
  virtual absl::string_view backend() const = 0;

  // Every rank contributes `count` elements; `recv` receives size() * count
  // elements, rank r's contribution at element r * count. In place when
  // send == recv + rank() * count * elem_size.
  virtual absl::Status AllGather(const void* send, void* recv, int64_t count,
                                 kernels::DType dtype) = 0;

  // `send` holds size() * recv_count elements; `recv` receives block rank()
  // (elements [rank() * recv_count, (rank() + 1) * recv_count)) reduced over
  // all ranks. Only ReduceOp::kSum on kFloat32 is required of every backend.
  // The in-process backend adds the ranks in order 0, 1, ..., size()-1, so
  // results are deterministic; NCCL's order depends on its algorithm.
  virtual absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                     kernels::DType dtype, ReduceOp op = ReduceOp::kSum) = 0;

  // All-to-all with per-peer sizes. send_counts[p] elements starting at
  // element send_displs[p] of `send` go to rank p; recv_counts[p] elements
  // from rank p land at element recv_displs[p] of `recv`. Every span has
  // size() entries; zero counts are allowed (the buffers may then be null).
  // send_counts[p] on rank r must equal recv_counts[r] on rank p.
  virtual absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                 absl::Span<const int64_t> send_displs, void* recv,
                                 absl::Span<const int64_t> recv_counts,
                                 absl::Span<const int64_t> recv_displs, kernels::DType dtype) = 0;

  virtual absl::Status Barrier() = 0;

  // The communicator that runs the collectives: this one, or for a wrapper
  // that forwards every call to another (e.g. to share it for aborts), that
  // other one's. Paths that need the concrete transport (the GPU
  // expert-parallel path needs NCCL's stream and device API) look through
  // wrappers with it; everything else talks to the wrapper.
  virtual Communicator& Underlying() { return *this; }

  // Makes every pending and future call fail with ABORTED. The in-process
  // backend propagates this to every rank of the group; NCCL aborts this
  // rank's communicator (peers fail when their own calls time out or abort).
  virtual void Abort(absl::string_view reason) = 0;
};

// All-to-all-v of whole rows of `width` elements, packed contiguously in
// peer order on both sides: send_rows[p] rows go to rank p, recv_rows[p]
// rows arrive from rank p (each has size() entries). A side with no rows may
// pass a null buffer.
absl::Status ExchangeRows(Communicator& comm, const void* send, absl::Span<const int64_t> send_rows,
                          void* recv, absl::Span<const int64_t> recv_rows, int64_t width,
                          kernels::DType dtype);

// INVALID_ARGUMENT unless `counts` and `displs` have `size` entries, counts
// and displacements are non-negative and a non-empty segment has a buffer.
// `what` names the side ("send" / "recv") in the message.
absl::Status ValidateAllToAllVSide(int size, const void* buffer, absl::Span<const int64_t> counts,
                                   absl::Span<const int64_t> displs, absl::string_view what);

}  // namespace kplan::comm
