// Kernels of the kplan_ep transport (kplan_ep_transport.h explains the
// layout and the protocol). Both kernels run a fixed grid of num_ctas CTAs x
// 512 threads and end in an LSA barrier where CTA j meets CTA j of every
// peer: writes before it are released at system scope, the peers' writes are
// acquired, so once the kernel has finished on this rank every peer's
// writes to this rank are visible to the next kernel on the stream.
//
// Copies move 16-byte vectors, 2 KiB (4 vectors per lane) per warp and
// unit; a unit's loads are all issued before its stores so that each warp
// has 2 KiB in flight. Peer memory is addressed through the LSA pointers of
// the window (ncclGetPeerPointer), resolved once per CTA into shared memory.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>

#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::comm::ep_internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kVecPerLane = 4;
constexpr int kSegVecs = 32 * kVecPerLane;  // 16-byte vectors per unit (2 KiB)
constexpr unsigned kFull = 0xffffffffu;

// The kernels' parameters (by value; __grid_constant__).
struct KernelArgs {
  ncclDevComm dev_comm;
  ncclWindow_t window;
  int rank, size, top_k, num_experts;
  int64_t max_tokens;
  int64_t row_vecs;  // row bytes / 16
  int64_t ids_offset, counts_offset, result_offset;
  int first_expert[kKplanEpMaxRanks + 1];
};
static_assert(sizeof(KernelArgs) < 4000, "kernel parameters are limited to 4 KiB");

KernelArgs MakeArgs(const EpKernelParams& p) {
  KernelArgs a;
  a.dev_comm = *p.dev_comm;
  a.window = p.window;
  a.rank = p.rank;
  a.size = p.size;
  a.top_k = p.top_k;
  a.num_experts = p.num_experts;
  a.max_tokens = p.max_tokens;
  a.row_vecs = p.layout.row_bytes / 16;
  a.ids_offset = p.layout.ids_offset;
  a.counts_offset = p.layout.counts_offset;
  a.result_offset = p.layout.result_offset;
  for (int r = 0; r <= kKplanEpMaxRanks; ++r) a.first_expert[r] = p.first_expert[r];
  return a;
}

// Every CTA: the base of each rank's window (LSA pointers).
__device__ __forceinline__ void LoadPeerBases(const KernelArgs& a, char** s_base) {
  if (threadIdx.x < a.size) {
    s_base[threadIdx.x] = static_cast<char*>(ncclGetPeerPointer(a.window, 0, threadIdx.x));
  }
}

// Ends a kernel: CTA j of this rank meets CTA j of every peer.
__device__ __forceinline__ void BarrierWithPeers(const KernelArgs& a) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), a.dev_comm, ncclTeamLsa(a.dev_comm),
                                         a.dev_comm.lsaBarrier, blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

// Loads the lane's vectors of unit segment `seg` of a row (vectors past the
// row's end are not touched).
__device__ __forceinline__ void LoadSegment(const int4* __restrict__ row, int64_t row_vecs,
                                            int64_t seg, int lane, int4 (&v)[kVecPerLane]) {
#pragma unroll
  for (int i = 0; i < kVecPerLane; ++i) {
    const int64_t idx = seg * kSegVecs + i * 32 + lane;
    if (idx < row_vecs) v[i] = __ldg(row + idx);
  }
}

__device__ __forceinline__ void StoreSegment(int4* row, int64_t row_vecs, int64_t seg, int lane,
                                             const int4 (&v)[kVecPerLane]) {
#pragma unroll
  for (int i = 0; i < kVecPerLane; ++i) {
    const int64_t idx = seg * kSegVecs + i * 32 + lane;
    if (idx < row_vecs) row[idx] = v[i];
  }
}

// Units: (token m, segment) pairs, token-major, one warp each, grid-strided.
// The warp reads the token's k ids (lane j < k: slot j), finds the ranks
// owning them, loads its segment of the token's row once and stores it to
// recv row (rank * T + m) of every such rank; the unit of segment 0 also
// writes the token's ids there (local id on the owner, -1 elsewhere). Slots
// with an id outside [0, E) zero their result row here instead.
__global__ void __launch_bounds__(kThreads)
    EpDispatchKernel(const __grid_constant__ KernelArgs a, const int4* __restrict__ hidden,
                     const int32_t* __restrict__ topk_ids, int num_tokens) {
  __shared__ char* s_base[kKplanEpMaxRanks];
  __shared__ int s_first[kKplanEpMaxRanks + 1];
  LoadPeerBases(a, s_base);
  if (threadIdx.x <= a.size) s_first[threadIdx.x] = a.first_expert[threadIdx.x];
  __syncthreads();

  const int lane = threadIdx.x & 31, k = a.top_k;
  const int64_t row_bytes = a.row_vecs * 16;
  const int64_t nseg = (a.row_vecs + kSegVecs - 1) / kSegVecs;
  const int64_t units = static_cast<int64_t>(num_tokens) * nseg;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; u < units;
       u += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t m = u / nseg, seg = u - m * nseg;
    int e = -1, owner = -1;
    if (lane < k) {
      e = __ldg(topk_ids + m * k + lane);
      if (e >= 0 && e < a.num_experts) {
        owner = 0;
        while (e >= s_first[owner + 1]) ++owner;
      }
    }
    const unsigned dests = __reduce_or_sync(kFull, owner >= 0 ? 1u << owner : 0u);
    const unsigned dropped = __ballot_sync(kFull, lane < k && owner < 0);

    int4 v[kVecPerLane];
    LoadSegment(hidden + m * a.row_vecs, a.row_vecs, seg, lane, v);
    const int64_t recv_row = a.rank * a.max_tokens + m;
    for (unsigned d = dests; d != 0; d &= d - 1) {
      const int r = __ffs(d) - 1;
      StoreSegment(reinterpret_cast<int4*>(s_base[r] + recv_row * row_bytes), a.row_vecs, seg, lane,
                   v);
    }
    if (dropped != 0) {
      int4 zero[kVecPerLane];
#pragma unroll
      for (int i = 0; i < kVecPerLane; ++i) zero[i] = make_int4(0, 0, 0, 0);
      for (unsigned d = dropped; d != 0; d &= d - 1) {
        const int j = __ffs(d) - 1;
        StoreSegment(
            reinterpret_cast<int4*>(s_base[a.rank] + a.result_offset + (m * k + j) * row_bytes),
            a.row_vecs, seg, lane, zero);
      }
    }
    if (seg == 0 && lane < k) {
      for (unsigned d = dests; d != 0; d &= d - 1) {
        const int r = __ffs(d) - 1;
        int32_t* ids = reinterpret_cast<int32_t*>(s_base[r] + a.ids_offset) + recv_row * k;
        ids[lane] = owner == r ? e - s_first[r] : -1;
      }
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < a.size) {
    reinterpret_cast<int32_t*>(s_base[threadIdx.x] + a.counts_offset)[a.rank] = num_tokens;
  }
  BarrierWithPeers(a);
}

// The received tokens (m < M_s of every source s, numbered source-major) are
// split into one contiguous chunk per CTA. Units: (token, slot, segment)
// over the chunk, one warp each; a unit whose slot this rank does not own
// (id -1) does nothing, the others copy their segment of Y row
// (s*T + m)*k + j to result row m*k + j on rank s. After a __syncthreads
// (every unit has read its id) the CTA resets its chunk's ids to -1. A null
// y returns zero rows.
__global__ void __launch_bounds__(kThreads)
    EpReturnKernel(const __grid_constant__ KernelArgs a, const int4* __restrict__ y) {
  __shared__ char* s_base[kKplanEpMaxRanks];
  __shared__ int s_begin[kKplanEpMaxRanks + 1];  // first flat token of each source
  LoadPeerBases(a, s_base);
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t* counts = reinterpret_cast<const int32_t*>(s_base[a.rank] + a.counts_offset);
    int total = 0;
    for (int s = 0; s < a.size; ++s) {
      s_begin[s] = total;
      total += min(max(counts[s], 0), static_cast<int>(a.max_tokens));
    }
    s_begin[a.size] = total;
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, k = a.top_k;
  const int64_t row_bytes = a.row_vecs * 16;
  const int64_t nseg = (a.row_vecs + kSegVecs - 1) / kSegVecs;
  const int total = s_begin[a.size];
  const int per_cta = (total + gridDim.x - 1) / gridDim.x;
  const int t0 = min(total, static_cast<int>(blockIdx.x) * per_cta);
  const int t1 = min(total, t0 + per_cta);
  int32_t* ids = reinterpret_cast<int32_t*>(s_base[a.rank] + a.ids_offset);

  const int64_t units = static_cast<int64_t>(t1 - t0) * k * nseg;
  for (int64_t u = threadIdx.x / 32; u < units; u += kWarps) {
    const int64_t pair = u / nseg, seg = u - pair * nseg;
    const int t = t0 + static_cast<int>(pair / k), j = static_cast<int>(pair % k);
    int s = 0;
    while (t >= s_begin[s + 1]) ++s;
    const int64_t m = t - s_begin[s], recv_row = s * a.max_tokens + m;
    if (ids[recv_row * k + j] < 0) continue;  // warp-uniform
    int4 v[kVecPerLane];
    if (y != nullptr) {
      LoadSegment(y + (recv_row * k + j) * a.row_vecs, a.row_vecs, seg, lane, v);
    } else {  // an empty round: zero rows
#pragma unroll
      for (int i = 0; i < kVecPerLane; ++i) v[i] = make_int4(0, 0, 0, 0);
    }
    StoreSegment(reinterpret_cast<int4*>(s_base[s] + a.result_offset + (m * k + j) * row_bytes),
                 a.row_vecs, seg, lane, v);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(t1 - t0) * k; i += kThreads) {
    const int t = t0 + static_cast<int>(i / k), j = static_cast<int>(i % k);
    int s = 0;
    while (t >= s_begin[s + 1]) ++s;
    ids[(s * a.max_tokens + t - s_begin[s]) * k + j] = -1;
  }
  BarrierWithPeers(a);
}

}  // namespace

absl::Status LaunchEpDispatch(const EpKernelParams& p, const void* hidden, const int32_t* topk_ids,
                              int64_t num_tokens, void* stream) {
  const KernelArgs a = MakeArgs(p);
  EpDispatchKernel<<<p.num_ctas, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, static_cast<const int4*>(hidden), topk_ids, static_cast<int>(num_tokens));
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("EpDispatchKernel");
  return absl::OkStatus();
}

absl::Status LaunchEpReturn(const EpKernelParams& p, const void* expert_out, void* stream) {
  const KernelArgs a = MakeArgs(p);
  EpReturnKernel<<<p.num_ctas, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, static_cast<const int4*>(expert_out));
  KPLAN_CUDA_RETURN_IF_LAUNCH_ERROR("EpReturnKernel");
  return absl::OkStatus();
}

}  // namespace kplan::comm::ep_internal
