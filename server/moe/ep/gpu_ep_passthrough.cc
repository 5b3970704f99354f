// passthrough on GPU ranks (moe_backend kplan_ep; docs/EP.md, "GPU
// strategies" and "Failures (passthrough)"): no NCCL collective and no host
// synchronisation inside the step. The rank's KplanEpTransport (held by its
// GpuEpCommunicator) writes each token into the fixed-capacity receive buffer
// of every rank owning one of its experts, EnqueueMoeLayer runs the whole
// receive buffer over the local experts, Return writes each expert output
// row back to its source, and the source combines them in slot order.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/cuda/moe/moe_ep_ops.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/stream.h"
#include "base/status.h"
#include "server/moe/ep/gpu_ep.h"
#include "server/moe/ep/gpu_ep_communicator.h"
#include "server/moe/ep/gpu_ep_step.h"
#include "server/moe/gpu_layer.h"

namespace kplan::moe::ep::gpu_ep_detail {

using kernels::cuda::DeviceGuard;

namespace {

// Passthrough traffic of this step, counted from this rank's top-k ids on
// the host after the step (stats only; outside the timed events).
absl::Status CountPassthroughBytes(GpuEpStep& s) {
  if (s.stats == nullptr || s.M == 0 || s.transport == nullptr) return absl::OkStatus();
  std::vector<int32_t> ids(s.M * s.k);
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpy(ids.data(), s.ids, ids.size() * 4, cudaMemcpyDeviceToHost));
  const comm::KplanEpConfig& c = s.transport->config();
  const int64_t row = s.H * s.es;
  auto owner = [&](int32_t e) {
    for (int r = 0; r < s.n; ++r) {
      if (e >= c.rank_first_expert[r] && e < c.rank_first_expert[r + 1]) return r;
    }
    return -1;
  };
  for (int64_t m = 0; m < s.M; ++m) {
    uint32_t dest = 0;
    for (int j = 0; j < s.k; ++j) {
      const int r = owner(ids[m * s.k + j]);
      if (r < 0 || r == s.rank) continue;
      dest |= 1u << r;
      s.stats->combine_bytes_received += row;
    }
    s.stats->dispatch_bytes_sent += __builtin_popcount(dest) * (row + s.k * 4);
  }
  return absl::OkStatus();
}

// Checks of passthrough that depend only on the layer options and the group
// (identical on every rank), so every rank fails them alike before anything
// collective starts.
absl::Status CheckPassthroughLayer(const GpuEpLayer& L, const comm::Communicator& comm) {
  if (L.placement.num_ranks() != comm.size() || L.placement.num_experts() != L.num_experts) {
    return InvalidField("placement",
                        absl::StrCat("placement is for ", L.placement.num_ranks(), " ranks and ",
                                     L.placement.num_experts(), " experts; the group has ",
                                     comm.size(), " ranks, the layer ", L.num_experts, " experts"));
  }
  if (comm.size() > comm::kKplanEpMaxRanks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "all2all_backend passthrough runs groups of up to ", comm::kKplanEpMaxRanks, " ranks"));
  }
  if (L.act_dtype != kernels::DType::kBFloat16 && L.act_dtype != kernels::DType::kFloat16) {
    return absl::FailedPreconditionError(
        absl::StrCat("all2all_backend passthrough runs bfloat16 / float16 activations, got ",
                     kernels::DTypeName(L.act_dtype)));
  }
  if (L.hidden <= 0 || L.hidden % 8 != 0 || L.intermediate <= 0) {
    return InvalidField("hidden", absl::StrCat("hidden must be a positive multiple of 8 and "
                                               "intermediate positive, got ",
                                               L.hidden, " and ", L.intermediate));
  }
  if (L.top_k <= 0 || L.top_k > L.num_experts || L.top_k > comm::kKplanEpMaxTopK) {
    return InvalidField(
        "top_k", absl::StrCat("passthrough takes top_k in [1, ",
                              std::min(L.num_experts, comm::kKplanEpMaxTopK), "], got ", L.top_k));
  }
  if (L.apply_router_weight_on_input) {
    return WithField(absl::FailedPreconditionError(
                         "all2all_backend passthrough sends no router weights to the experts' "
                         "rank, so apply_router_weight_on_input needs allgather_reducescatter "
                         "or kplan_all2allv"),
                     "apply_router_weight_on_input");
  }
  return absl::OkStatus();
}

}  // namespace

// passthrough: Dispatch -> local experts over the whole receive buffer ->
// Return -> combine at the source, all stream-ordered on the
// communicator's stream (the transport's ordering contract). Until this
// rank has dispatched its peers wait for it in Dispatch's device barrier,
// after that in Return's; no host abort reaches them there. So a failure
// before Dispatch (`prepared`, or here) still runs an empty round (no
// tokens, zero rows back), a failure after it still enqueues Return with
// zero rows, and either waits for the round to end before returning the
// error (the transport's memory must outlive its kernels, and the caller
// aborts the communicator).
absl::Status PassthroughOnGpu(GpuEpStep& s, absl::Status prepared) {
  comm::KplanEpTransport& t = *s.transport;
  const kernels::DType et = ElemType(s.L.act_dtype);
  const int64_t recv_tokens = t.recv_tokens(), pairs = t.recv_pairs();
  const int local = t.num_local_experts();
  const bool run_experts = local > 0 && s.experts_usable;
  void* y = nullptr;
  MoeLayerArgs a;
  void* lw = nullptr;
  absl::Status st = std::move(prepared);
  auto prepare = [&]() -> absl::Status {
    KPLAN_ASSIGN_OR_RETURN(y, Ensure(s.ws, kPtY, (local > 0 ? pairs : 1) * s.H * s.es));
    if (!run_experts) return absl::OkStatus();
    const int64_t bytes = MoeLayerWorkspaceBytes(*s.L.local_experts, recv_tokens, s.k, local);
    KPLAN_ASSIGN_OR_RETURN(lw, Ensure(s.ws, kLayer, bytes));
    const int64_t had = s.ws.cap[kPtWeights];
    KPLAN_ASSIGN_OR_RETURN(float* w, EnsureAs<float>(s.ws, kPtWeights, pairs));
    if (s.ws.cap[kPtWeights] != had) {
      KPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w, 0, s.ws.cap[kPtWeights], s.stream));
    }
    a.num_tokens = recv_tokens;
    a.top_k = s.k;
    a.num_experts = local;  // ids are local; -1 (no pair here) is skipped
    a.hidden = t.recv_rows();
    // Read only (no routing): the transport owns the ids.
    a.topk_ids = const_cast<int32_t*>(t.recv_expert_ids());
    a.topk_weights = w;
    a.combine = false;
    a.output = y;
    if (s.stats != nullptr) s.stats->rows_computed = pairs;
    return absl::OkStatus();
  };
  if (st.ok()) st = prepare();
  if (!st.ok()) {
    absl::Status round = t.Dispatch(s.stream, nullptr, nullptr, 0);
    if (round.ok()) round = t.Return(s.stream, nullptr);
    if (round.ok()) (void)cudaStreamSynchronize(s.stream);
    return st;
  }
  KPLAN_RETURN_IF_ERROR(t.Dispatch(s.stream, s.x, s.ids, s.M));

  absl::Status experts = s.Record(kEvDispatched);
  if (experts.ok() && run_experts) {
    experts = EnqueueMoeLayer(*s.L.local_experts, a, lw, s.ws.cap[kLayer], s.stream);
  }
  if (local > 0 && (!experts.ok() || !s.experts_usable)) {
    // This rank's experts did not run: its peers get zero rows (and fail
    // the step through this rank's error) instead of stale ones.
    (void)cudaMemsetAsync(y, 0, pairs * s.H * s.es, s.stream);
  }
  if (experts.ok()) experts = s.Record(kEvComputed);
  KPLAN_RETURN_IF_ERROR(t.Return(s.stream, y));
  if (!experts.ok()) {
    (void)cudaStreamSynchronize(s.stream);
    return experts;
  }
  if (s.M == 0) return absl::OkStatus();
  return kc::LaunchMoeCombine(et, t.result_rows(), s.w, s.M, s.k, s.H, s.out, s.stream);
}

// One passthrough step (docs/EP.md): the transport's round, the only
// host wait the final download.
absl::Status RunPassthroughOnGpu(const GpuEpLayer& layer, const MoeInputsForThisRank& inputs,
                                 GpuEpCommunicator& comm, GpuEpStats* stats) {
  const int rank = comm.rank();
  auto fail = [&](const absl::Status& st) {
    comm.Abort(absl::StrCat("passthrough step failed on rank ", rank, ": ", st.message()));
    return absl::Status(st.code(),
                        absl::StrCat("passthrough on GPU rank ", rank, ": ", st.message()));
  };
  if (stats != nullptr) *stats = GpuEpStats{};
  if (absl::Status st = CheckPassthroughLayer(layer, comm); !st.ok()) return st;
  if (comm.nccl().device() != layer.workspace->device()) {
    return fail(InvalidField("comm", absl::StrCat("communicator on device ", comm.nccl().device(),
                                                  ", workspace on ", layer.workspace->device())));
  }
  DeviceGuard scope;
  if (absl::Status st = scope.Enter(layer.workspace->device()); !st.ok()) return fail(st);
  GpuEpWorkspace::Impl& ws = WorkspaceImpl(*layer.workspace);
  const int n = comm.size();
  comm::KplanEpConfig config;
  config.max_tokens_per_rank =
      ws.passthrough_tokens > 0 ? ws.passthrough_tokens : kDefaultPassthroughTokens;
  config.top_k = layer.top_k;
  config.hidden = layer.hidden;
  config.elem_size = static_cast<int>(kernels::DTypeSize(layer.act_dtype));
  config.num_experts = layer.num_experts;
  for (int r = 0; r < n; ++r) config.rank_first_expert.push_back(layer.placement.FirstExpert(r));
  config.rank_first_expert.push_back(layer.num_experts);
  absl::StatusOr<comm::KplanEpTransport*> transport = comm.Transport(config);
  if (!transport.ok()) return fail(transport.status());

  // This rank's own checks. A failing rank still joins the round with no
  // tokens of its own, so its peers are not left in the device barrier.
  kc::MoeRoutingParams rp;
  absl::Status local = CheckLocal(layer, inputs, comm, &rp);
  if (local.ok() && inputs.num_tokens > config.max_tokens_per_rank) {
    local =
        InvalidField("num_tokens", absl::StrCat(inputs.num_tokens, " tokens on rank ", rank,
                                                " exceed the passthrough "
                                                "capacity of ",
                                                config.max_tokens_per_rank,
                                                " tokens per rank (reserve "
                                                "more with ReserveGpuEpWorkspace on every rank)"));
  }
  MoeInputsForThisRank none;
  bool experts_usable = true;
  if (!local.ok()) {
    const int32_t id = 0;
    const float w = 0;
    none.topk_ids = &id;  // checks the layer and the experts only
    none.topk_weights = &w;
    kc::MoeRoutingParams unused;
    experts_usable = CheckLocal(layer, none, comm, &unused).ok();
    none.topk_ids = nullptr;
    none.topk_weights = nullptr;
  }
  const auto stream = static_cast<cudaStream_t>(comm.nccl().stream());
  GpuEpStep step(layer, local.ok() ? inputs : none, comm, stream, stats);
  step.transport = *transport;
  step.experts_usable = experts_usable;
  if (absl::Status st = step.Record(kEvStart); !st.ok()) return fail(st);
  if (absl::Status st = step.Run(EpStrategy::kPassthrough, rp); !st.ok()) return fail(st);
  if (!local.ok()) return local;
  if (absl::Status st = CountPassthroughBytes(step); !st.ok()) return fail(st);
  return absl::OkStatus();
}

absl::Status ReservePassthrough(GpuEpWorkspace::Impl& ws, const GpuEpLayer& L, int64_t n,
                                int64_t T) {
  const int64_t k = L.top_k, H = L.hidden, es = kernels::DTypeSize(L.act_dtype);
  // The transport's receive buffer holds n*T tokens of k slots; the layer
  // runs all of them over the local experts.
  ws.passthrough_tokens = std::max(ws.passthrough_tokens, std::max<int64_t>(T, 1));
  const int64_t pairs = n * ws.passthrough_tokens * k;
  KPLAN_RETURN_IF_ERROR(Ensure(ws, kPtY, pairs * H * es).status());
  KPLAN_ASSIGN_OR_RETURN(void* w, Ensure(ws, kPtWeights, pairs * 4));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMemset(w, 0, ws.cap[kPtWeights]));  // never read; defined anyway
  if (L.local_experts != nullptr) {
    KPLAN_RETURN_IF_ERROR(
        Ensure(ws, kLayer,
               MoeLayerWorkspaceBytes(*L.local_experts, n * ws.passthrough_tokens,
                                      static_cast<int>(k), L.local_experts->spec().num_experts))
            .status());
  }
  return absl::OkStatus();
}

}  // namespace kplan::moe::ep::gpu_ep_detail
