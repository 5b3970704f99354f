// kplan_all2allv on GPU ranks (the GPU twin of ep_all2allv.cc; docs/EP.md,
// "GPU strategies"): the (token, slot) rows grouped by owning rank on the GPU,
// an all-gather of the per-peer row counts, all-to-all-v of the rows and of
// their (expert id, weight) pairs, the received rows run as top_k=1 rows,
// all-to-all-v of the unweighted rows back, put back in slot order and
// combined by LaunchMoeCombine.
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

absl::Status All2AllVOnGpu(GpuEpStep& s) {
  auto Exchange = [&s](const void* send, const std::vector<int64_t>& send_rows, void* recv,
                       const std::vector<int64_t>& recv_rows, int64_t width, kernels::DType dtype) {
    return comm::ExchangeRows(s.comm, send, send_rows, recv, recv_rows, width, dtype);
  };
  const kernels::DType act = CommDTypeOf(s.L.act_dtype);
  const kernels::DType et = ElemType(s.L.act_dtype);
  const int64_t S = s.M * s.k;
  KPLAN_ASSIGN_OR_RETURN(int32_t * order, EnsureAs<int32_t>(s.ws, kOrder, S));
  KPLAN_ASSIGN_OR_RETURN(int64_t * counts, EnsureAs<int64_t>(s.ws, kCounts, s.n));
  KPLAN_ASSIGN_OR_RETURN(int64_t * counts_all, EnsureAs<int64_t>(s.ws, kCountsAll, s.n * s.n));
  KPLAN_RETURN_IF_ERROR(
      kc::LaunchMoeEpPartitionByRank(s.ids, S, s.L.num_experts, s.n, order, counts, s.stream));
  KPLAN_RETURN_IF_ERROR(s.comm.AllGather(counts, counts_all, s.n, kernels::DType::kInt64));
  std::vector<int64_t> all(s.n * s.n);
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(all.data(), counts_all, s.n * s.n * 8, cudaMemcpyDeviceToHost, s.stream));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream));
  std::vector<int64_t> send_rows(s.n), recv_rows(s.n);
  int64_t sent = 0, R = 0;
  for (int p = 0; p < s.n; ++p) {
    send_rows[p] = all[s.rank * s.n + p];
    recv_rows[p] = all[p * s.n + s.rank];
    sent += send_rows[p];
    R += recv_rows[p];
  }
  if (sent != S) {
    return absl::InternalError(
        absl::StrCat("expert-parallel partition placed ", sent, " of ", S, " slots"));
  }
  KPLAN_ASSIGN_OR_RETURN(void* x_send, Ensure(s.ws, kXSend, S * s.H * s.es));
  KPLAN_ASSIGN_OR_RETURN(int32_t * meta_send, EnsureAs<int32_t>(s.ws, kMetaSend, S * 2));
  KPLAN_ASSIGN_OR_RETURN(void* x_recv, Ensure(s.ws, kXRecv, R * s.H * s.es));
  KPLAN_ASSIGN_OR_RETURN(int32_t * meta_recv, EnsureAs<int32_t>(s.ws, kMetaRecv, R * 2));
  KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpGatherRows(et, s.x, order, S, s.k, s.H, s.ids, s.w, x_send,
                                                  meta_send, s.stream));
  KPLAN_RETURN_IF_ERROR(Exchange(x_send, send_rows, x_recv, recv_rows, s.H, act));
  KPLAN_RETURN_IF_ERROR(
      Exchange(meta_send, send_rows, meta_recv, recv_rows, 2, kernels::DType::kInt32));
  KPLAN_ASSIGN_OR_RETURN(int32_t * recv_ids, EnsureAs<int32_t>(s.ws, kRecvIds, R));
  KPLAN_ASSIGN_OR_RETURN(float* recv_w, EnsureAs<float>(s.ws, kRecvW, R));
  KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpUnpackMeta(meta_recv, R, recv_ids, recv_w, s.stream));
  if (s.stats != nullptr) {
    const int64_t row = s.H * s.es + 8;
    s.stats->dispatch_bytes_sent = (S - send_rows[s.rank]) * row;
    s.stats->dispatch_bytes_received = (R - recv_rows[s.rank]) * row;
  }
  KPLAN_RETURN_IF_ERROR(s.Record(kEvDispatched));

  KPLAN_ASSIGN_OR_RETURN(void* results, Ensure(s.ws, kResults, R * s.H * s.es));
  KPLAN_RETURN_IF_ERROR(
      s.RunExperts(R, 1, x_recv, recv_ids, recv_w, results, /*slots_local=*/true));
  KPLAN_RETURN_IF_ERROR(s.Record(kEvComputed));

  KPLAN_ASSIGN_OR_RETURN(void* back, Ensure(s.ws, kBack, S * s.H * s.es));
  KPLAN_RETURN_IF_ERROR(Exchange(results, recv_rows, back, send_rows, s.H, act));
  if (s.stats != nullptr) {
    s.stats->combine_bytes_sent = (R - recv_rows[s.rank]) * s.H * s.es;
    s.stats->combine_bytes_received = (S - send_rows[s.rank]) * s.H * s.es;
  }
  if (s.M == 0) return absl::OkStatus();
  KPLAN_ASSIGN_OR_RETURN(void* y, Ensure(s.ws, kY, S * s.H * s.es));
  KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpScatterRows(back, order, S, s.H, y, s.stream));
  return kc::LaunchMoeCombine(et, y, s.L.apply_router_weight_on_input ? nullptr : s.w, s.M, s.k,
                              s.H, s.out, s.stream);
}

absl::Status ReserveAll2AllV(GpuEpWorkspace::Impl& ws, const GpuEpLayer& L, int64_t n, int64_t T) {
  const int64_t k = L.top_k, H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
  const int64_t S = T * k, R = n * T * k;  // worst case: every slot of every rank lands here
  KPLAN_RETURN_IF_ERROR(EnsureAll(ws, {{kOrder, S * 4},
                                       {kCounts, 8 * n},
                                       {kCountsAll, 8 * n * n},
                                       {kXSend, S * H * es},
                                       {kMetaSend, S * 8},
                                       {kXRecv, R * H * es},
                                       {kMetaRecv, R * 8},
                                       {kRecvIds, R * 4},
                                       {kRecvW, R * 4},
                                       {kResults, R * H * es},
                                       {kBack, S * H * es},
                                       {kY, S * H * es}}));
  if (L.local_experts != nullptr && R > 0) {
    KPLAN_RETURN_IF_ERROR(
        Ensure(ws, kLayer, MoeLayerWorkspaceBytes(*L.local_experts, R, 1, L.num_experts)).status());
  }
  return absl::OkStatus();
}

}  // namespace kplan::moe::ep::gpu_ep_detail
