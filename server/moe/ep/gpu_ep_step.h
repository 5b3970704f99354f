// Internal to kplan_ep_gpu: the step machinery that gpu_ep.cc shares with
// the strategy files (gpu_ep_allgather_reducescatter.cc, gpu_ep_all2allv.cc,
// gpu_ep_passthrough.cc), as ep_dispatch.h's EpStep and EpDispatch are shared
// by the CPU strategies. A GpuEpStep holds one rank's step: the workspace's
// named buffers, the common prologue (upload, expert map, routing), the local
// experts call, the CUDA events of the stage times and the final download.
// Not a public header: include gpu_ep.h.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/cuda/runtime/status.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "base/status.h"
#include "server/moe/ep/gpu_ep.h"

namespace kplan::moe::ep {

namespace gpu_ep_detail {

// The named buffers of a rank's workspace.
enum Buf : int {
  kHeader,     // int64 [2]: this rank's token count and input verdict
  kHeaderAll,  // int64 [2n]
  kMap,        // int32 [E]: the rank's expert map
  kX,          // act [max(M, maxT), H]: this rank's hidden rows
  kLogits,     // fp32 [M, E]
  kBias,       // fp32 [E]
  kIds,        // int32 [max(M, maxT), k]
  kWeights,    // fp32 [max(M, maxT), k]
  kOut,        // act [M, H]
  kLayer,      // EnqueueMoeLayer's workspace
  kY,          // act: per-slot expert rows (AG: [P*k, H]; a2av: [M*k, H])
  kXAll,       // AG: act [P, H], P = n * maxT
  kIdsAll,     // AG: int32 [P, k]
  kWAll,       // AG: fp32 [P, k]
  kPartial,    // AG: fp32 [P, H]
  kMine,       // AG: fp32 [maxT, H]
  kOrder,      // a2av: int32 [M*k]
  kCounts,     // a2av: int64 [n]
  kCountsAll,  // a2av: int64 [n*n]
  kXSend,      // a2av: act [M*k, H]
  kMetaSend,   // a2av: int32 [M*k, 2]
  kXRecv,      // a2av: act [R, H]
  kMetaRecv,   // a2av: int32 [R, 2]
  kRecvIds,    // a2av: int32 [R]
  kRecvW,      // a2av: fp32 [R]
  kResults,    // a2av: act [R, H]
  kBack,       // a2av: act [M*k, H]
  kPtY,        // passthrough: act [n*T*k, H], expert rows in the transport's recv order
  kPtWeights,  // passthrough: fp32 [n*T*k], never read (combine=false), zeros
  kNumBufs,
};

enum Ev : int { kEvStart, kEvRouted, kEvDispatched, kEvComputed, kEvCombined, kEvDone, kNumEvs };

}  // namespace gpu_ep_detail

struct GpuEpWorkspace::Impl {
  std::array<void*, gpu_ep_detail::kNumBufs> ptr{};
  std::array<int64_t, gpu_ep_detail::kNumBufs> cap{};
  std::array<cudaEvent_t, gpu_ep_detail::kNumEvs> ev{};
  int allocations = 0;
  // What kMap holds.
  int map_experts = -1, map_ranks = -1, map_rank = -1;
  // Passthrough capacity T (tokens per rank per step); 0: not reserved.
  int64_t passthrough_tokens = 0;
};

GpuEpWorkspace::Impl& WorkspaceImpl(GpuEpWorkspace& ws);

namespace gpu_ep_detail {

namespace kc = kernels::cuda;

inline kernels::DType ElemType(kernels::DType dtype) {
  return dtype == kernels::DType::kBFloat16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat16;
}

// Buffer `b` with at least `bytes`, growing it when needed. Growth frees the
// old buffer (cudaFree waits for the device) and allocates 1.25x the need,
// rounded to 2 MiB, so a slowly growing load settles after a few steps.
absl::StatusOr<void*> Ensure(GpuEpWorkspace::Impl& ws, Buf b, int64_t bytes);

template <typename T>
absl::StatusOr<T*> EnsureAs(GpuEpWorkspace::Impl& ws, Buf b, int64_t count) {
  KPLAN_ASSIGN_OR_RETURN(void* p, Ensure(ws, b, count * static_cast<int64_t>(sizeof(T))));
  return static_cast<T*>(p);
}

// Ensure() of each (buffer, bytes) in order.
absl::Status EnsureAll(GpuEpWorkspace::Impl& ws,
                       const std::vector<std::pair<Buf, int64_t>>& buffers);

// Host-side checks of this rank's layer and inputs: the verdict it reports
// to its peers in the header exchange.
absl::Status CheckLocal(const GpuEpLayer& L, const MoeInputsForThisRank& in,
                        const comm::Communicator& comm, kc::MoeRoutingParams* rp);

// One step on one rank: the state every strategy shares and the shared
// stages. Every method returns the first error; the caller aborts the
// communicator on any (passthrough: after the round, see
// gpu_ep_passthrough.cc).
class GpuEpStep {
 public:
  GpuEpStep(const GpuEpLayer& layer, const MoeInputsForThisRank& in, comm::Communicator& comm,
            cudaStream_t stream, GpuEpStats* stats);

  // After the header: upload, route, the strategy, download.
  absl::Status Run(EpStrategy strategy, const kc::MoeRoutingParams& rp);

  // Records event `e` on the stream (stats only).
  absl::Status Record(Ev e);
  int64_t MaxTokens() const;
  // EnqueueMoeLayer on `rows` rows of `k` slots, per-slot output into `y`;
  // slots_local: every slot's expert is this rank's (MoeLayerArgs).
  absl::Status RunExperts(int64_t rows, int k, const void* x, int32_t* ids, float* w, void* y,
                          bool slots_local);

  const GpuEpLayer& L;
  const MoeInputsForThisRank& in;
  comm::Communicator& comm;
  GpuEpWorkspace::Impl& ws;
  const cudaStream_t stream;
  GpuEpStats* const stats;
  const int n, rank, k;
  const int64_t H, es, M;
  // Set by UploadAndRoute: this rank's rows, top-k ids and weights, output
  // and expert map on the device.
  void* x = nullptr;
  int32_t* ids = nullptr;
  float* w = nullptr;
  void* out = nullptr;
  int32_t* map = nullptr;

  std::vector<int64_t> tokens_per_rank;  // set by the caller after the header
  // Passthrough: the rank's transport, and whether its experts can run (a
  // rank whose own experts failed the checks returns zero rows).
  comm::KplanEpTransport* transport = nullptr;
  bool experts_usable = true;

 private:
  absl::Status UploadAndRoute(EpStrategy strategy, kc::MoeRoutingParams rp);
  // The download of the output and the stats, once the strategy combined.
  absl::Status Finish();
};

// The header exchange: every rank's (token count, status code).
absl::Status ExchangeHeader(GpuEpWorkspace::Impl& ws, comm::Communicator& comm, cudaStream_t stream,
                            int64_t num_tokens, absl::StatusCode verdict,
                            std::vector<int64_t>& headers);

// The strategies (one file each). Each runs between the routed prologue and
// the download, recording kEvDispatched and kEvComputed on the way.
// gpu_ep_allgather_reducescatter.cc
absl::Status AllGatherReduceScatterOnGpu(GpuEpStep& s);
absl::Status ReserveAllGatherReduceScatter(GpuEpWorkspace::Impl& ws, const GpuEpLayer& L, int64_t n,
                                           int64_t T);
// gpu_ep_all2allv.cc
absl::Status All2AllVOnGpu(GpuEpStep& s);
absl::Status ReserveAll2AllV(GpuEpWorkspace::Impl& ws, const GpuEpLayer& L, int64_t n, int64_t T);
// gpu_ep_passthrough.cc. `prepared`: the prologue's status (a failed
// prologue still runs an empty round).
absl::Status PassthroughOnGpu(GpuEpStep& s, absl::Status prepared);
absl::Status ReservePassthrough(GpuEpWorkspace::Impl& ws, const GpuEpLayer& L, int64_t n,
                                int64_t T);
absl::Status RunPassthroughOnGpu(const GpuEpLayer& layer, const MoeInputsForThisRank& inputs,
                                 GpuEpCommunicator& comm, GpuEpStats* stats);

}  // namespace gpu_ep_detail
}  // namespace kplan::moe::ep
