// allgather_reducescatter on GPU ranks (the GPU twin of
// ep_allgather_reducescatter.cc; docs/EP.md, "GPU strategies"): all-gather
// of every rank's hidden rows, top-k ids and weights padded to the largest
// rank's token count, the local experts on all tokens, this rank's slots
// summed per token in fp32, reduce-scatter of the fp32 partials, one
// rounding to the activation dtype.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/comm/communicator.h"
#include "kernels/cuda/moe/moe_ep_ops.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "base/status.h"
#include "server/moe/ep/gpu_ep.h"
#include "server/moe/ep/gpu_ep_step.h"
#include "server/moe/gpu_layer.h"

namespace kplan::moe::ep::gpu_ep_detail {

absl::Status AllGatherReduceScatterOnGpu(GpuEpStep& s) {
  const int64_t maxT = s.MaxTokens(), P = s.n * maxT;
  if (maxT == 0) {  // every rank agrees: nothing to do
    KPLAN_RETURN_IF_ERROR(s.Record(kEvDispatched));
    return s.Record(kEvComputed);
  }
  const kernels::DType act = CommDTypeOf(s.L.act_dtype);
  // Padding rows: id -1 (never computed, never combined), weight 0.
  if (maxT > s.M) {
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(s.ids + s.M * s.k, 0xff, (maxT - s.M) * s.k * 4, s.stream));
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(s.w + s.M * s.k, 0, (maxT - s.M) * s.k * 4, s.stream));
  }
  KPLAN_ASSIGN_OR_RETURN(void* x_all, Ensure(s.ws, kXAll, P * s.H * s.es));
  KPLAN_ASSIGN_OR_RETURN(int32_t * ids_all, EnsureAs<int32_t>(s.ws, kIdsAll, P * s.k));
  KPLAN_ASSIGN_OR_RETURN(float* w_all, EnsureAs<float>(s.ws, kWAll, P * s.k));
  KPLAN_RETURN_IF_ERROR(s.comm.AllGather(s.x, x_all, maxT * s.H, act));
  KPLAN_RETURN_IF_ERROR(s.comm.AllGather(s.ids, ids_all, maxT * s.k, kernels::DType::kInt32));
  KPLAN_RETURN_IF_ERROR(s.comm.AllGather(s.w, w_all, maxT * s.k, kernels::DType::kFloat32));
  if (s.stats != nullptr) {
    const int64_t block = maxT * (s.H * s.es + s.k * 8);
    s.stats->dispatch_bytes_sent = (s.n - 1) * block;
    s.stats->dispatch_bytes_received = (s.n - 1) * block;
  }
  KPLAN_RETURN_IF_ERROR(s.Record(kEvDispatched));

  KPLAN_ASSIGN_OR_RETURN(void* y, Ensure(s.ws, kY, P * s.k * s.H * s.es));
  KPLAN_RETURN_IF_ERROR(s.RunExperts(P, s.k, x_all, ids_all, w_all, y, /*slots_local=*/false));
  KPLAN_RETURN_IF_ERROR(s.Record(kEvComputed));

  KPLAN_ASSIGN_OR_RETURN(float* partial, EnsureAs<float>(s.ws, kPartial, P * s.H));
  if (s.L.local_experts == nullptr) {
    KPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(partial, 0, P * s.H * 4, s.stream));
  } else {
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpCombineFp32(
        ElemType(s.L.act_dtype), y, ids_all, s.L.apply_router_weight_on_input ? nullptr : w_all,
        s.map, s.L.num_experts, P, s.k, s.H, partial, s.stream));
  }
  KPLAN_ASSIGN_OR_RETURN(float* mine, EnsureAs<float>(s.ws, kMine, maxT * s.H));
  KPLAN_RETURN_IF_ERROR(s.comm.ReduceScatter(partial, mine, maxT * s.H, kernels::DType::kFloat32));
  if (s.stats != nullptr) {
    s.stats->combine_bytes_sent = (s.n - 1) * maxT * s.H * 4;
    s.stats->combine_bytes_received = (s.n - 1) * maxT * s.H * 4;
  }
  return kc::LaunchMoeEpCastFromFp32(ElemType(s.L.act_dtype), mine, s.M * s.H, s.out, s.stream);
}

absl::Status ReserveAllGatherReduceScatter(GpuEpWorkspace::Impl& ws, const GpuEpLayer& L, int64_t n,
                                           int64_t T) {
  const int64_t k = L.top_k, H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
  const int64_t P = n * T;
  KPLAN_RETURN_IF_ERROR(EnsureAll(ws, {{kXAll, P * H * es},
                                       {kIdsAll, P * k * 4},
                                       {kWAll, P * k * 4},
                                       {kY, P * k * H * es},
                                       {kPartial, P * H * 4},
                                       {kMine, T * H * 4}}));
  if (L.local_experts != nullptr && P > 0) {
    KPLAN_RETURN_IF_ERROR(
        Ensure(ws, kLayer,
               MoeLayerWorkspaceBytes(*L.local_experts, P, static_cast<int>(k), L.num_experts))
            .status());
  }
  return absl::OkStatus();
}

}  // namespace kplan::moe::ep::gpu_ep_detail
