#include "server/moe/ep/gpu_ep.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/comm/nccl_communicator.h"
#include "kernels/cuda/ir_cuda_status.h"
#include "kernels/cuda/moe_ep_ops.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_ops.h"
#include "kernels/cuda/stream.h"
#include "server/base/status.h"
#include "server/moe/gpu_layer.h"

namespace kplan::moe::ep {

namespace kc = kernels::cuda;

#define KPLAN_EP_CUDA(expr) KPLAN_IR_CUDA_RETURN_IF_ERROR(expr)

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

struct GpuEpWorkspace::Impl {
  std::array<void*, kNumBufs> ptr{};
  std::array<int64_t, kNumBufs> cap{};
  std::array<cudaEvent_t, kNumEvs> ev{};
  int allocations = 0;
  // What kMap holds.
  int map_experts = -1, map_ranks = -1, map_rank = -1;
  // Passthrough capacity T (tokens per rank per step); 0: not reserved.
  int64_t passthrough_tokens = 0;
};

GpuEpWorkspace::Impl& WorkspaceImpl(GpuEpWorkspace& ws) { return *ws.impl_; }

namespace {

using kernels::DeviceScope;

int64_t ElemSize(MoeDType dtype) { return dtype == MoeDType::kFloat32 ? 4 : 2; }

kc::MoeElemType ElemType(MoeDType dtype) {
  return dtype == MoeDType::kBFloat16 ? kc::MoeElemType::kBFloat16 : kc::MoeElemType::kFloat16;
}

// Buffer `b` with at least `bytes`, growing it when needed. Growth frees the
// old buffer (cudaFree waits for the device) and allocates 1.25x the need,
// rounded to 2 MiB, so a slowly growing load settles after a few steps.
absl::StatusOr<void*> Ensure(GpuEpWorkspace::Impl& ws, Buf b, int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 256);
  if (ws.cap[b] >= bytes) return ws.ptr[b];
  if (ws.ptr[b] != nullptr) {
    KPLAN_EP_CUDA(cudaFree(ws.ptr[b]));
    ws.ptr[b] = nullptr;
    ws.cap[b] = 0;
  }
  const int64_t granule = 2 << 20;
  const int64_t want =
      bytes < granule ? bytes : (bytes + bytes / 4 + granule - 1) / granule * granule;
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, static_cast<size_t>(want)); e != cudaSuccess) {
    cudaGetLastError();
    return kc::CudaStatus(e, __FILE__, __LINE__, "cudaMalloc(expert-parallel workspace)");
  }
  ++ws.allocations;
  ws.ptr[b] = p;
  ws.cap[b] = want;
  return p;
}

template <typename T>
absl::StatusOr<T*> EnsureAs(GpuEpWorkspace::Impl& ws, Buf b, int64_t count) {
  KPLAN_ASSIGN_OR_RETURN(void* p, Ensure(ws, b, count * static_cast<int64_t>(sizeof(T))));
  return static_cast<T*>(p);
}

// Host-side checks of this rank's layer and inputs: the verdict it reports
// to its peers in the header exchange.
absl::Status CheckLocal(const GpuEpLayer& L, const MoeInputsForThisRank& in,
                        const comm::Communicator& comm, kc::MoeRoutingParams* rp) {
  const ExpertPlacement& pl = L.placement;
  const int rank = comm.rank();
  if (pl.num_ranks() != comm.size()) {
    return InvalidField("placement", absl::StrCat("placement is for ", pl.num_ranks(),
                                                  " ranks but the communicator has ", comm.size()));
  }
  if (pl.num_experts() != L.num_experts) {
    return InvalidField("placement", absl::StrCat("placement covers ", pl.num_experts(),
                                                  " experts, the layer has ", L.num_experts));
  }
  if (comm.size() > kc::kMoeEpMaxRanks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the GPU expert-parallel path runs groups of up to ", kc::kMoeEpMaxRanks, " ranks"));
  }
  if (L.act_dtype != MoeDType::kBFloat16 && L.act_dtype != MoeDType::kFloat16) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU expert-parallel path runs bfloat16 / float16 activations, got ",
                     MoeDTypeName(L.act_dtype)));
  }
  if (L.hidden <= 0 || L.hidden % 8 != 0 || L.intermediate <= 0) {
    return InvalidField("hidden", absl::StrCat("hidden must be a positive multiple of 8 and "
                                               "intermediate positive, got ",
                                               L.hidden, " and ", L.intermediate));
  }
  const int k = L.top_k;
  if (k <= 0 || k > L.num_experts) {
    return InvalidField("top_k",
                        absl::StrCat("top_k must be in [1, ", L.num_experts, "], got ", k));
  }
  if (L.apply_router_weight_on_input && k != 1) {
    return InvalidField("apply_router_weight_on_input", "needs top_k == 1");
  }
  const int local = pl.NumLocalExperts(rank);
  if (local > 0) {
    const GpuExperts* g = L.local_experts;
    if (g == nullptr) {
      return InvalidField("local_experts", absl::StrCat("rank ", rank, " owns ", local,
                                                        " experts but has none on its GPU"));
    }
    const ExpertsSpec& s = g->spec();
    if (s.num_experts != local || g->first_expert() != pl.FirstExpert(rank)) {
      return InvalidField(
          "local_experts",
          absl::StrCat("rank ", rank, " owns experts [", pl.FirstExpert(rank), ", ",
                       pl.FirstExpert(rank) + local, ") but its GPU holds [", g->first_expert(),
                       ", ", g->first_expert() + s.num_experts, ")"));
    }
    if (s.hidden != L.hidden || s.intermediate != L.intermediate) {
      return InvalidField("local_experts",
                          "the experts' hidden / intermediate sizes differ "
                          "from the layer's");
    }
    if (g->activation() != L.activation || s.dtype != L.act_dtype) {
      return absl::FailedPreconditionError(
          "the GPU expert-parallel path runs the experts' own activation in their dtype; the "
          "layer asks for another");
    }
    if (g->device() != L.workspace->device()) {
      return InvalidField("local_experts", absl::StrCat("experts on device ", g->device(),
                                                        ", workspace on ", L.workspace->device()));
    }
  }
  const int64_t M = in.num_tokens;
  if (M < 0) return InvalidField("num_tokens", "must be >= 0");
  if (M > 0 && (in.hidden_states == nullptr || in.output == nullptr)) {
    return InvalidField(in.hidden_states == nullptr ? "hidden_states" : "output",
                        "must not be null");
  }
  const bool route = in.topk_ids == nullptr;
  if (route) {
    RoutingSpec spec = in.routing;
    if (spec.num_experts == 0) spec.num_experts = L.num_experts;
    if (spec.top_k == 0) spec.top_k = k;
    if (spec.num_experts != L.num_experts || spec.top_k != k) {
      return InvalidField(
          spec.num_experts != L.num_experts ? "routing.num_experts" : "routing.top_k",
          "routing spec disagrees with the layer's num_experts / top_k");
    }
    if (M > 0 && in.router_logits == nullptr) {
      return InvalidField("router_logits", "give router_logits or topk_ids / topk_weights");
    }
    KPLAN_RETURN_IF_ERROR(ValidateRoutingSpec(spec));
    *rp = MoeRoutingParamsOf(spec);
    KPLAN_RETURN_IF_ERROR(kc::ValidateMoeRoutingParams(*rp));
  } else {
    if (M > 0 && in.topk_weights == nullptr) {
      return InvalidField("topk_weights", "topk_ids needs topk_weights");
    }
    for (int64_t t = 0; t < M * k; ++t) {
      if (in.topk_ids[t] < 0 || in.topk_ids[t] >= L.num_experts) {
        return InvalidField("topk_ids",
                            absl::StrCat("topk_ids[", t / k, "][", t % k, "] = ", in.topk_ids[t],
                                         " is not in [0, ", L.num_experts, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// One step on one rank; every method returns the first error, and the caller
// aborts the communicator on any.
class Step {
 public:
  Step(const GpuEpLayer& layer, const MoeInputsForThisRank& in, comm::Communicator& comm,
       cudaStream_t stream, GpuEpStats* stats)
      : L_(layer),
        in_(in),
        comm_(comm),
        ws_(WorkspaceImpl(*layer.workspace)),
        stream_(stream),
        stats_(stats),
        n_(comm.size()),
        rank_(comm.rank()),
        k_(layer.top_k),
        H_(layer.hidden),
        es_(ElemSize(layer.act_dtype)),
        M_(in.num_tokens) {}

  // After the header: upload, route, the strategy, download.
  absl::Status Run(EpStrategy strategy, const kc::MoeRoutingParams& rp) {
    absl::Status prepared = UploadAndRoute(strategy, rp);
    if (prepared.ok()) prepared = Record(kEvRouted);
    if (strategy == EpStrategy::kPassthrough) {
      KPLAN_RETURN_IF_ERROR(Passthrough(prepared));
    } else {
      KPLAN_RETURN_IF_ERROR(prepared);
      KPLAN_RETURN_IF_ERROR(strategy == EpStrategy::kAllGatherReduceScatter ? AllGatherReduceScatter()
                                                                           : All2AllV());
    }
    KPLAN_RETURN_IF_ERROR(Record(kEvCombined));
    if (M_ > 0) {
      KPLAN_EP_CUDA(
          cudaMemcpyAsync(in_.output, out_, M_ * H_ * es_, cudaMemcpyDeviceToHost, stream_));
    }
    KPLAN_RETURN_IF_ERROR(Record(kEvDone));
    KPLAN_EP_CUDA(cudaStreamSynchronize(stream_));
    if (stats_ != nullptr) {
      auto ms = [&](Ev a, Ev b) {
        float t = 0;
        return cudaEventElapsedTime(&t, ws_.ev[a], ws_.ev[b]) == cudaSuccess ? t : -1.0f;
      };
      stats_->prologue_ms = ms(kEvStart, kEvRouted);
      stats_->dispatch_ms = ms(kEvRouted, kEvDispatched);
      stats_->experts_ms = ms(kEvDispatched, kEvComputed);
      stats_->combine_ms = ms(kEvComputed, kEvCombined);
      stats_->download_ms = ms(kEvCombined, kEvDone);
      stats_->total_ms = ms(kEvStart, kEvDone);
      int64_t total = 0;
      for (int64_t c : ws_.cap) total += c;
      stats_->workspace_bytes = total;
      stats_->workspace_allocations = ws_.allocations;
    }
    return absl::OkStatus();
  }

  std::vector<int64_t> tokens_per_rank;  // set by the caller after the header
  // Passthrough: the rank's transport, and whether its experts can run (a
  // rank whose own experts failed the checks returns zero rows).
  comm::KplanEpTransport* transport = nullptr;
  bool experts_usable = true;

  // Passthrough traffic of this step, counted from this rank's top-k ids on
  // the host after the step (stats only; outside the timed events).
  absl::Status CountPassthroughBytes() {
    if (stats_ == nullptr || M_ == 0 || transport == nullptr) return absl::OkStatus();
    std::vector<int32_t> ids(M_ * k_);
    KPLAN_EP_CUDA(cudaMemcpy(ids.data(), ids_, ids.size() * 4, cudaMemcpyDeviceToHost));
    const comm::KplanEpConfig& c = transport->config();
    const int64_t row = H_ * es_;
    auto owner = [&](int32_t e) {
      for (int r = 0; r < n_; ++r) {
        if (e >= c.rank_first_expert[r] && e < c.rank_first_expert[r + 1]) return r;
      }
      return -1;
    };
    for (int64_t m = 0; m < M_; ++m) {
      uint32_t dest = 0;
      for (int j = 0; j < k_; ++j) {
        const int r = owner(ids[m * k_ + j]);
        if (r < 0 || r == rank_) continue;
        dest |= 1u << r;
        stats_->combine_bytes_received += row;
      }
      stats_->dispatch_bytes_sent += __builtin_popcount(dest) * (row + k_ * 4);
    }
    return absl::OkStatus();
  }

  absl::Status Record(Ev e) {
    if (stats_ == nullptr) return absl::OkStatus();
    if (ws_.ev[e] == nullptr) KPLAN_EP_CUDA(cudaEventCreate(&ws_.ev[e]));
    KPLAN_EP_CUDA(cudaEventRecord(ws_.ev[e], stream_));
    return absl::OkStatus();
  }

 private:
  int64_t MaxTokens() const {
    return *std::max_element(tokens_per_rank.begin(), tokens_per_rank.end());
  }

  absl::Status UploadAndRoute(EpStrategy strategy, kc::MoeRoutingParams rp) {
    // AG-RS sends maxT rows from these buffers: size them for that.
    const int64_t rows =
        strategy == EpStrategy::kAllGatherReduceScatter ? std::max(M_, MaxTokens()) : M_;
    KPLAN_ASSIGN_OR_RETURN(x_, Ensure(ws_, kX, rows * H_ * es_));
    KPLAN_ASSIGN_OR_RETURN(ids_, EnsureAs<int32_t>(ws_, kIds, rows * k_));
    KPLAN_ASSIGN_OR_RETURN(w_, EnsureAs<float>(ws_, kWeights, rows * k_));
    KPLAN_ASSIGN_OR_RETURN(out_, Ensure(ws_, kOut, M_ * H_ * es_));
    // The expert map, uploaded when the layer's shape changes.
    KPLAN_ASSIGN_OR_RETURN(map_, EnsureAs<int32_t>(ws_, kMap, L_.num_experts));
    if (ws_.map_experts != L_.num_experts || ws_.map_ranks != n_ || ws_.map_rank != rank_) {
      const std::vector<int32_t> map = L_.placement.ExpertMap(rank_);
      KPLAN_EP_CUDA(
          cudaMemcpyAsync(map_, map.data(), map.size() * 4, cudaMemcpyHostToDevice, stream_));
      KPLAN_EP_CUDA(cudaStreamSynchronize(stream_));  // `map` is a pageable temporary
      ws_.map_experts = L_.num_experts;
      ws_.map_ranks = n_;
      ws_.map_rank = rank_;
    }
    if (M_ > 0) {
      KPLAN_EP_CUDA(
          cudaMemcpyAsync(x_, in_.hidden_states, M_ * H_ * es_, cudaMemcpyHostToDevice, stream_));
      if (in_.topk_ids != nullptr) {
        KPLAN_EP_CUDA(
            cudaMemcpyAsync(ids_, in_.topk_ids, M_ * k_ * 4, cudaMemcpyHostToDevice, stream_));
        KPLAN_EP_CUDA(
            cudaMemcpyAsync(w_, in_.topk_weights, M_ * k_ * 4, cudaMemcpyHostToDevice, stream_));
      } else {
        const int E = L_.num_experts;
        KPLAN_ASSIGN_OR_RETURN(float* logits, EnsureAs<float>(ws_, kLogits, M_ * E));
        KPLAN_EP_CUDA(cudaMemcpyAsync(logits, in_.router_logits, M_ * E * 4, cudaMemcpyHostToDevice,
                                      stream_));
        if (in_.routing.e_score_correction_bias != nullptr) {
          KPLAN_ASSIGN_OR_RETURN(float* bias, EnsureAs<float>(ws_, kBias, E));
          KPLAN_EP_CUDA(cudaMemcpyAsync(bias, in_.routing.e_score_correction_bias, E * 4,
                                        cudaMemcpyHostToDevice, stream_));
          rp.e_score_correction_bias = bias;
        }
        KPLAN_RETURN_IF_ERROR(kc::LaunchMoeRouting(rp, logits, M_, w_, ids_, stream_));
      }
    }
    return absl::OkStatus();
  }

  // EnqueueMoeLayer on `rows` rows of `k` slots, per-slot output into `y`.
  absl::Status RunExperts(int64_t rows, int k, const void* x, int32_t* ids, float* w, void* y) {
    if (rows == 0 || L_.local_experts == nullptr) return absl::OkStatus();
    const GpuExperts& g = *L_.local_experts;
    const int64_t bytes = MoeLayerWorkspaceBytes(g, rows, k, L_.num_experts);
    KPLAN_ASSIGN_OR_RETURN(void* lw, Ensure(ws_, kLayer, bytes));
    MoeLayerArgs a;
    a.num_tokens = rows;
    a.top_k = k;
    a.num_experts = L_.num_experts;
    a.hidden = x;
    a.topk_ids = ids;
    a.topk_weights = w;
    a.expert_map = map_;
    a.apply_router_weight_on_input = L_.apply_router_weight_on_input;
    a.combine = false;
    a.output = y;
    if (stats_ != nullptr) stats_->rows_computed = rows * k;
    return EnqueueMoeLayer(g, a, lw, ws_.cap[kLayer], stream_);
  }

  absl::Status AllGatherReduceScatter() {
    const int64_t maxT = MaxTokens(), P = n_ * maxT;
    if (maxT == 0) {  // every rank agrees: nothing to do
      KPLAN_RETURN_IF_ERROR(Record(kEvDispatched));
      return Record(kEvComputed);
    }
    const comm::CommDType act = CommDTypeOf(L_.act_dtype);
    // Padding rows: id -1 (never computed, never combined), weight 0.
    if (maxT > M_) {
      KPLAN_EP_CUDA(cudaMemsetAsync(ids_ + M_ * k_, 0xff, (maxT - M_) * k_ * 4, stream_));
      KPLAN_EP_CUDA(cudaMemsetAsync(w_ + M_ * k_, 0, (maxT - M_) * k_ * 4, stream_));
    }
    KPLAN_ASSIGN_OR_RETURN(void* x_all, Ensure(ws_, kXAll, P * H_ * es_));
    KPLAN_ASSIGN_OR_RETURN(int32_t * ids_all, EnsureAs<int32_t>(ws_, kIdsAll, P * k_));
    KPLAN_ASSIGN_OR_RETURN(float* w_all, EnsureAs<float>(ws_, kWAll, P * k_));
    KPLAN_RETURN_IF_ERROR(comm_.AllGather(x_, x_all, maxT * H_, act));
    KPLAN_RETURN_IF_ERROR(comm_.AllGather(ids_, ids_all, maxT * k_, comm::CommDType::kInt32));
    KPLAN_RETURN_IF_ERROR(comm_.AllGather(w_, w_all, maxT * k_, comm::CommDType::kFloat32));
    if (stats_ != nullptr) {
      const int64_t block = maxT * (H_ * es_ + k_ * 8);
      stats_->dispatch_bytes_sent = (n_ - 1) * block;
      stats_->dispatch_bytes_received = (n_ - 1) * block;
    }
    KPLAN_RETURN_IF_ERROR(Record(kEvDispatched));

    KPLAN_ASSIGN_OR_RETURN(void* y, Ensure(ws_, kY, P * k_ * H_ * es_));
    KPLAN_RETURN_IF_ERROR(RunExperts(P, k_, x_all, ids_all, w_all, y));
    KPLAN_RETURN_IF_ERROR(Record(kEvComputed));

    KPLAN_ASSIGN_OR_RETURN(float* partial, EnsureAs<float>(ws_, kPartial, P * H_));
    if (L_.local_experts == nullptr) {
      KPLAN_EP_CUDA(cudaMemsetAsync(partial, 0, P * H_ * 4, stream_));
    } else {
      KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpCombineFp32(
          ElemType(L_.act_dtype), y, ids_all, L_.apply_router_weight_on_input ? nullptr : w_all,
          map_, L_.num_experts, P, k_, H_, partial, stream_));
    }
    KPLAN_ASSIGN_OR_RETURN(float* mine, EnsureAs<float>(ws_, kMine, maxT * H_));
    KPLAN_RETURN_IF_ERROR(comm_.ReduceScatter(partial, mine, maxT * H_, comm::CommDType::kFloat32));
    if (stats_ != nullptr) {
      stats_->combine_bytes_sent = (n_ - 1) * maxT * H_ * 4;
      stats_->combine_bytes_received = (n_ - 1) * maxT * H_ * 4;
    }
    return kc::LaunchMoeEpCastFromFp32(ElemType(L_.act_dtype), mine, M_ * H_, out_, stream_);
  }

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
  absl::Status Passthrough(absl::Status prepared) {
    comm::KplanEpTransport& t = *transport;
    const kc::MoeElemType et = ElemType(L_.act_dtype);
    const int64_t recv_tokens = t.recv_tokens(), pairs = t.recv_pairs();
    const int local = t.num_local_experts();
    const bool run_experts = local > 0 && experts_usable;
    void* y = nullptr;
    MoeLayerArgs a;
    void* lw = nullptr;
    absl::Status st = std::move(prepared);
    auto prepare = [&]() -> absl::Status {
      KPLAN_ASSIGN_OR_RETURN(y, Ensure(ws_, kPtY, (local > 0 ? pairs : 1) * H_ * es_));
      if (!run_experts) return absl::OkStatus();
      const int64_t bytes = MoeLayerWorkspaceBytes(*L_.local_experts, recv_tokens, k_, local);
      KPLAN_ASSIGN_OR_RETURN(lw, Ensure(ws_, kLayer, bytes));
      const int64_t had = ws_.cap[kPtWeights];
      KPLAN_ASSIGN_OR_RETURN(float* w, EnsureAs<float>(ws_, kPtWeights, pairs));
      if (ws_.cap[kPtWeights] != had) {
        KPLAN_EP_CUDA(cudaMemsetAsync(w, 0, ws_.cap[kPtWeights], stream_));
      }
      a.num_tokens = recv_tokens;
      a.top_k = k_;
      a.num_experts = local;  // ids are local; -1 (no pair here) is skipped
      a.hidden = t.recv_rows();
      // Read only (no routing): the transport owns the ids.
      a.topk_ids = const_cast<int32_t*>(t.recv_expert_ids());
      a.topk_weights = w;
      a.combine = false;
      a.output = y;
      if (stats_ != nullptr) stats_->rows_computed = pairs;
      return absl::OkStatus();
    };
    if (st.ok()) st = prepare();
    if (!st.ok()) {
      absl::Status round = t.Dispatch(stream_, nullptr, nullptr, 0);
      if (round.ok()) round = t.Return(stream_, nullptr);
      if (round.ok()) (void)cudaStreamSynchronize(stream_);
      return st;
    }
    KPLAN_RETURN_IF_ERROR(t.Dispatch(stream_, x_, ids_, M_));

    absl::Status experts = Record(kEvDispatched);
    if (experts.ok() && run_experts) {
      experts = EnqueueMoeLayer(*L_.local_experts, a, lw, ws_.cap[kLayer], stream_);
    }
    if (local > 0 && (!experts.ok() || !experts_usable)) {
      // This rank's experts did not run: its peers get zero rows (and fail
      // the step through this rank's error) instead of stale ones.
      (void)cudaMemsetAsync(y, 0, pairs * H_ * es_, stream_);
    }
    if (experts.ok()) experts = Record(kEvComputed);
    KPLAN_RETURN_IF_ERROR(t.Return(stream_, y));
    if (!experts.ok()) {
      (void)cudaStreamSynchronize(stream_);
      return experts;
    }
    if (M_ == 0) return absl::OkStatus();
    return kc::LaunchMoeCombine(et, t.result_rows(), w_, M_, k_, H_, out_, stream_);
  }

  absl::Status Exchange(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t width,
                        comm::CommDType dtype) {
    return comm::ExchangeRows(comm_, send, send_rows, recv, recv_rows, width, dtype);
  }

  absl::Status All2AllV() {
    const comm::CommDType act = CommDTypeOf(L_.act_dtype);
    const kc::MoeElemType et = ElemType(L_.act_dtype);
    const int64_t S = M_ * k_;
    KPLAN_ASSIGN_OR_RETURN(int32_t * order, EnsureAs<int32_t>(ws_, kOrder, S));
    KPLAN_ASSIGN_OR_RETURN(int64_t * counts, EnsureAs<int64_t>(ws_, kCounts, n_));
    KPLAN_ASSIGN_OR_RETURN(int64_t * counts_all, EnsureAs<int64_t>(ws_, kCountsAll, n_ * n_));
    KPLAN_RETURN_IF_ERROR(
        kc::LaunchMoeEpPartitionByRank(ids_, S, L_.num_experts, n_, order, counts, stream_));
    KPLAN_RETURN_IF_ERROR(comm_.AllGather(counts, counts_all, n_, comm::CommDType::kInt64));
    std::vector<int64_t> all(n_ * n_);
    KPLAN_EP_CUDA(
        cudaMemcpyAsync(all.data(), counts_all, n_ * n_ * 8, cudaMemcpyDeviceToHost, stream_));
    KPLAN_EP_CUDA(cudaStreamSynchronize(stream_));
    std::vector<int64_t> send_rows(n_), recv_rows(n_);
    int64_t sent = 0, R = 0;
    for (int p = 0; p < n_; ++p) {
      send_rows[p] = all[rank_ * n_ + p];
      recv_rows[p] = all[p * n_ + rank_];
      sent += send_rows[p];
      R += recv_rows[p];
    }
    if (sent != S) {
      return absl::InternalError(
          absl::StrCat("expert-parallel partition placed ", sent, " of ", S, " slots"));
    }
    KPLAN_ASSIGN_OR_RETURN(void* x_send, Ensure(ws_, kXSend, S * H_ * es_));
    KPLAN_ASSIGN_OR_RETURN(int32_t * meta_send, EnsureAs<int32_t>(ws_, kMetaSend, S * 2));
    KPLAN_ASSIGN_OR_RETURN(void* x_recv, Ensure(ws_, kXRecv, R * H_ * es_));
    KPLAN_ASSIGN_OR_RETURN(int32_t * meta_recv, EnsureAs<int32_t>(ws_, kMetaRecv, R * 2));
    KPLAN_RETURN_IF_ERROR(
        kc::LaunchMoeEpGatherRows(et, x_, order, S, k_, H_, ids_, w_, x_send, meta_send, stream_));
    KPLAN_RETURN_IF_ERROR(Exchange(x_send, send_rows, x_recv, recv_rows, H_, act));
    KPLAN_RETURN_IF_ERROR(
        Exchange(meta_send, send_rows, meta_recv, recv_rows, 2, comm::CommDType::kInt32));
    KPLAN_ASSIGN_OR_RETURN(int32_t * recv_ids, EnsureAs<int32_t>(ws_, kRecvIds, R));
    KPLAN_ASSIGN_OR_RETURN(float* recv_w, EnsureAs<float>(ws_, kRecvW, R));
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpUnpackMeta(meta_recv, R, recv_ids, recv_w, stream_));
    if (stats_ != nullptr) {
      const int64_t row = H_ * es_ + 8;
      stats_->dispatch_bytes_sent = (S - send_rows[rank_]) * row;
      stats_->dispatch_bytes_received = (R - recv_rows[rank_]) * row;
    }
    KPLAN_RETURN_IF_ERROR(Record(kEvDispatched));

    KPLAN_ASSIGN_OR_RETURN(void* results, Ensure(ws_, kResults, R * H_ * es_));
    KPLAN_RETURN_IF_ERROR(RunExperts(R, 1, x_recv, recv_ids, recv_w, results));
    KPLAN_RETURN_IF_ERROR(Record(kEvComputed));

    KPLAN_ASSIGN_OR_RETURN(void* back, Ensure(ws_, kBack, S * H_ * es_));
    KPLAN_RETURN_IF_ERROR(Exchange(results, recv_rows, back, send_rows, H_, act));
    if (stats_ != nullptr) {
      stats_->combine_bytes_sent = (R - recv_rows[rank_]) * H_ * es_;
      stats_->combine_bytes_received = (S - send_rows[rank_]) * H_ * es_;
    }
    if (M_ == 0) return absl::OkStatus();
    KPLAN_ASSIGN_OR_RETURN(void* y, Ensure(ws_, kY, S * H_ * es_));
    KPLAN_RETURN_IF_ERROR(kc::LaunchMoeEpScatterRows(back, order, S, H_, y, stream_));
    return kc::LaunchMoeCombine(et, y, L_.apply_router_weight_on_input ? nullptr : w_, M_, k_, H_,
                                out_, stream_);
  }

  const GpuEpLayer& L_;
  const MoeInputsForThisRank& in_;
  comm::Communicator& comm_;
  GpuEpWorkspace::Impl& ws_;
  const cudaStream_t stream_;
  GpuEpStats* const stats_;
  const int n_, rank_, k_;
  const int64_t H_, es_, M_;
  void* x_ = nullptr;
  int32_t* ids_ = nullptr;
  float* w_ = nullptr;
  void* out_ = nullptr;
  int32_t* map_ = nullptr;
};

// The header exchange: every rank's (token count, status code).
absl::Status ExchangeHeader(GpuEpWorkspace::Impl& ws, comm::Communicator& comm, cudaStream_t stream,
                            int64_t num_tokens, absl::StatusCode verdict,
                            std::vector<int64_t>& headers) {
  const int n = comm.size();
  const int64_t header[2] = {num_tokens, static_cast<int64_t>(verdict)};
  KPLAN_ASSIGN_OR_RETURN(int64_t * d_header, EnsureAs<int64_t>(ws, kHeader, 2));
  KPLAN_ASSIGN_OR_RETURN(int64_t * d_all, EnsureAs<int64_t>(ws, kHeaderAll, 2 * n));
  KPLAN_EP_CUDA(cudaMemcpyAsync(d_header, header, sizeof(header), cudaMemcpyHostToDevice, stream));
  KPLAN_RETURN_IF_ERROR(comm.AllGather(d_header, d_all, 2, comm::CommDType::kInt64));
  headers.resize(2 * n);
  KPLAN_EP_CUDA(cudaMemcpyAsync(headers.data(), d_all, 2 * n * 8, cudaMemcpyDeviceToHost, stream));
  KPLAN_EP_CUDA(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

GpuEpWorkspace::GpuEpWorkspace(int device) : device_(device), impl_(std::make_unique<Impl>()) {}

GpuEpWorkspace::~GpuEpWorkspace() {
  int prev = -1;
  const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  for (void* p : impl_->ptr) {
    if (p != nullptr) cudaFree(p);
  }
  for (cudaEvent_t e : impl_->ev) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (switched) cudaSetDevice(prev);
}

int64_t GpuEpWorkspace::bytes() const {
  int64_t total = 0;
  for (int64_t c : impl_->cap) total += c;
  return total;
}

int GpuEpWorkspace::allocations() const { return impl_->allocations; }

absl::Status ReserveGpuEpWorkspace(const GpuEpLayer& L, int num_ranks, int64_t max_tokens_per_rank,
                                   EpStrategy strategy) {
  if (L.workspace == nullptr) return InvalidField("workspace", "must not be null");
  if (num_ranks <= 0 || max_tokens_per_rank < 0) {
    return absl::InvalidArgumentError("ReserveGpuEpWorkspace: bad sizes");
  }
  GpuEpWorkspace::Impl& ws = WorkspaceImpl(*L.workspace);
  DeviceScope scope;
  KPLAN_RETURN_IF_ERROR(scope.Enter(L.workspace->device()));
  const int64_t n = num_ranks, T = max_tokens_per_rank, k = L.top_k, H = L.hidden;
  const int64_t es = ElemSize(L.act_dtype), E = L.num_experts;
  const std::vector<std::pair<Buf, int64_t>> common = {
      {kHeader, 16},     {kHeaderAll, 16 * n},  {kMap, 4 * E},     {kX, T * H * es},
      {kIds, T * k * 4}, {kWeights, T * k * 4}, {kOut, T * H * es}};
  for (const auto& [b, bytes] : common) KPLAN_RETURN_IF_ERROR(Ensure(ws, b, bytes).status());
  int64_t layer_rows = 0, layer_k = 1;
  if (strategy == EpStrategy::kAllGatherReduceScatter) {
    const int64_t P = n * T;
    layer_rows = P;
    layer_k = k;
    const std::vector<std::pair<Buf, int64_t>> ag = {{kXAll, P * H * es},   {kIdsAll, P * k * 4},
                                                     {kWAll, P * k * 4},    {kY, P * k * H * es},
                                                     {kPartial, P * H * 4}, {kMine, T * H * 4}};
    for (const auto& [b, bytes] : ag) KPLAN_RETURN_IF_ERROR(Ensure(ws, b, bytes).status());
  } else if (strategy == EpStrategy::kPassthrough) {
    // The transport's receive buffer holds n*T tokens of k slots; the layer
    // runs all of them over the local experts.
    ws.passthrough_tokens = std::max(ws.passthrough_tokens, std::max<int64_t>(T, 1));
    const int64_t pairs = n * ws.passthrough_tokens * k;
    KPLAN_RETURN_IF_ERROR(Ensure(ws, kPtY, pairs * H * es).status());
    KPLAN_ASSIGN_OR_RETURN(void* w, Ensure(ws, kPtWeights, pairs * 4));
    KPLAN_EP_CUDA(cudaMemset(w, 0, ws.cap[kPtWeights]));  // never read; defined anyway
    if (L.local_experts != nullptr) {
      KPLAN_RETURN_IF_ERROR(Ensure(ws, kLayer,
                                   MoeLayerWorkspaceBytes(*L.local_experts, n * ws.passthrough_tokens,
                                                          static_cast<int>(k),
                                                          L.local_experts->spec().num_experts))
                                .status());
    }
    return absl::OkStatus();
  } else {
    const int64_t S = T * k, R = n * T * k;  // worst case: every slot of every rank lands here
    layer_rows = R;
    const std::vector<std::pair<Buf, int64_t>> a2a = {
        {kOrder, S * 4},    {kCounts, 8 * n},       {kCountsAll, 8 * n * n}, {kXSend, S * H * es},
        {kMetaSend, S * 8}, {kXRecv, R * H * es},   {kMetaRecv, R * 8},      {kRecvIds, R * 4},
        {kRecvW, R * 4},    {kResults, R * H * es}, {kBack, S * H * es},     {kY, S * H * es}};
    for (const auto& [b, bytes] : a2a) KPLAN_RETURN_IF_ERROR(Ensure(ws, b, bytes).status());
  }
  if (L.local_experts != nullptr && layer_rows > 0) {
    KPLAN_RETURN_IF_ERROR(Ensure(ws, kLayer,
                                 MoeLayerWorkspaceBytes(*L.local_experts, layer_rows,
                                                        static_cast<int>(layer_k), L.num_experts))
                              .status());
  }
  return absl::OkStatus();
}

GpuEpCommunicator::GpuEpCommunicator(std::unique_ptr<comm::NcclCommunicator> nccl)
    : nccl_(std::move(nccl)) {}

GpuEpCommunicator::~GpuEpCommunicator() {
  if (aborted_) {
    // A failed call marks the wrapper aborted without necessarily aborting
    // NCCL (an enqueue error, a failed transport Create): make it so, then
    // the transports' registrations died with it and only their window
    // memory is left to free.
    nccl_->Abort("a call on the communicator failed");
    for (auto& t : transports_) t->Abandon();
  }
  transports_.clear();  // before nccl_, which they use
}

absl::Status GpuEpCommunicator::Track(absl::Status st) {
  if (!st.ok()) aborted_ = true;  // NcclCommunicator aborts itself on a failed call
  return st;
}

absl::Status GpuEpCommunicator::AllGather(const void* send, void* recv, int64_t count,
                                          comm::CommDType dtype) {
  return Track(nccl_->AllGather(send, recv, count, dtype));
}

absl::Status GpuEpCommunicator::ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                              comm::CommDType dtype, comm::ReduceOp op) {
  return Track(nccl_->ReduceScatter(send, recv, recv_count, dtype, op));
}

absl::Status GpuEpCommunicator::AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                                          absl::Span<const int64_t> send_displs, void* recv,
                                          absl::Span<const int64_t> recv_counts,
                                          absl::Span<const int64_t> recv_displs,
                                          comm::CommDType dtype) {
  return Track(nccl_->AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                dtype));
}

absl::Status GpuEpCommunicator::Barrier() { return Track(nccl_->Barrier()); }

void GpuEpCommunicator::Abort(absl::string_view reason) {
  aborted_ = true;
  nccl_->Abort(reason);
}

absl::StatusOr<comm::KplanEpTransport*> GpuEpCommunicator::Transport(
    const comm::KplanEpConfig& c) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  for (auto& t : transports_) {
    const comm::KplanEpConfig& h = t->config();
    if (h.top_k != c.top_k || h.hidden != c.hidden || h.elem_size != c.elem_size ||
        h.num_experts != c.num_experts || h.rank_first_expert != c.rank_first_expert ||
        h.num_ctas != c.num_ctas) {
      continue;
    }
    if (h.max_tokens_per_rank >= c.max_tokens_per_rank) return t.get();
    t.reset();  // collective: every rank replaces the same transport in the same step
    absl::StatusOr<std::unique_ptr<comm::KplanEpTransport>> fresh =
        comm::KplanEpTransport::Create(*nccl_, c);
    if (!fresh.ok()) return Track(fresh.status());
    ++transports_created_;
    t = *std::move(fresh);
    return t.get();
  }
  absl::StatusOr<std::unique_ptr<comm::KplanEpTransport>> fresh =
      comm::KplanEpTransport::Create(*nccl_, c);
  if (!fresh.ok()) return Track(fresh.status());
  ++transports_created_;
  transports_.push_back(*std::move(fresh));
  return transports_.back().get();
}

namespace {

// Checks of passthrough that depend only on the layer options and the group
// (identical on every rank), so every rank fails them alike before anything
// collective starts.
absl::Status CheckPassthroughLayer(const GpuEpLayer& L, const comm::Communicator& comm) {
  if (L.placement.num_ranks() != comm.size() || L.placement.num_experts() != L.num_experts) {
    return InvalidField("placement", absl::StrCat("placement is for ", L.placement.num_ranks(),
                                                  " ranks and ", L.placement.num_experts(),
                                                  " experts; the group has ", comm.size(),
                                                  " ranks, the layer ", L.num_experts, " experts"));
  }
  if (comm.size() > comm::kKplanEpMaxRanks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "all2all_backend passthrough runs groups of up to ", comm::kKplanEpMaxRanks, " ranks"));
  }
  if (L.act_dtype != MoeDType::kBFloat16 && L.act_dtype != MoeDType::kFloat16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "all2all_backend passthrough runs bfloat16 / float16 activations, got ",
        MoeDTypeName(L.act_dtype)));
  }
  if (L.hidden <= 0 || L.hidden % 8 != 0 || L.intermediate <= 0) {
    return InvalidField("hidden", absl::StrCat("hidden must be a positive multiple of 8 and "
                                               "intermediate positive, got ",
                                               L.hidden, " and ", L.intermediate));
  }
  if (L.top_k <= 0 || L.top_k > L.num_experts || L.top_k > comm::kKplanEpMaxTopK) {
    return InvalidField("top_k", absl::StrCat("passthrough takes top_k in [1, ",
                                              std::min(L.num_experts, comm::kKplanEpMaxTopK),
                                              "], got ", L.top_k));
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

// One passthrough step (see the header): the transport's round, the only
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
                                                  ", workspace on ",
                                                  layer.workspace->device())));
  }
  DeviceScope scope;
  if (absl::Status st = scope.Enter(layer.workspace->device()); !st.ok()) return fail(st);
  GpuEpWorkspace::Impl& ws = WorkspaceImpl(*layer.workspace);
  const int n = comm.size();
  comm::KplanEpConfig config;
  config.max_tokens_per_rank =
      ws.passthrough_tokens > 0 ? ws.passthrough_tokens : kDefaultPassthroughTokens;
  config.top_k = layer.top_k;
  config.hidden = layer.hidden;
  config.elem_size = static_cast<int>(ElemSize(layer.act_dtype));
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
    local = InvalidField(
        "num_tokens",
        absl::StrCat(inputs.num_tokens, " tokens on rank ", rank, " exceed the passthrough "
                     "capacity of ", config.max_tokens_per_rank, " tokens per rank (reserve "
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
  Step step(layer, local.ok() ? inputs : none, comm, stream, stats);
  step.transport = *transport;
  step.experts_usable = experts_usable;
  if (absl::Status st = step.Record(kEvStart); !st.ok()) return fail(st);
  if (absl::Status st = step.Run(EpStrategy::kPassthrough, rp); !st.ok()) return fail(st);
  if (!local.ok()) return local;
  if (absl::Status st = step.CountPassthroughBytes(); !st.ok()) return fail(st);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMoeExpertParallelOnGpu(const GpuEpLayer& layer, const MoeInputsForThisRank& inputs,
                                       comm::Communicator& comm, EpStrategy strategy,
                                       GpuEpStats* stats) {
  const int rank = comm.rank();
  // Through forwarding wrappers (a group across servers shares rank 0's
  // communicator so that a peer's failure can abort it).
  comm::Communicator& underlying = comm.Underlying();
  auto* wrapped = dynamic_cast<GpuEpCommunicator*>(&underlying);
  auto* nccl = wrapped != nullptr ? &wrapped->nccl()
                                  : dynamic_cast<comm::NcclCommunicator*>(&underlying);
  if (nccl == nullptr || layer.workspace == nullptr) {
    const absl::Status st = InvalidField(
        nccl == nullptr ? "comm" : "workspace",
        nccl == nullptr ? absl::StrCat("the GPU expert-parallel path needs an NCCL "
                                       "communicator, got '",
                                       comm.backend(), "'")
                        : std::string("a GPU expert-parallel layer needs a workspace"));
    comm.Abort(st.message());  // peers would wait for this rank's collectives
    return st;
  }
  if (strategy == EpStrategy::kPassthrough) {
    if (wrapped == nullptr) {
      // Every rank passes the same kind of communicator: all fail alike.
      return InvalidField("comm",
                          "all2all_backend passthrough needs a GpuEpCommunicator (the "
                          "NcclCommunicator that holds the rank's kplan_ep transport)");
    }
    return RunPassthroughOnGpu(layer, inputs, *wrapped, stats);
  }
  if (strategy != EpStrategy::kAllGatherReduceScatter && strategy != EpStrategy::kAll2AllV) {
    const absl::Status st = absl::UnimplementedError(
        absl::StrCat("the GPU expert-parallel path does not run '", EpStrategyName(strategy), "'"));
    comm.Abort(st.message());
    return st;
  }
  const auto stream = static_cast<cudaStream_t>(nccl->stream());
  GpuEpWorkspace::Impl& ws = WorkspaceImpl(*layer.workspace);
  auto fail = [&](const absl::Status& st) {
    // Peers may be waiting in a collective this rank will never join.
    comm.Abort(
        absl::StrCat(EpStrategyName(strategy), " step failed on rank ", rank, ": ", st.message()));
    return absl::Status(st.code(), absl::StrCat(EpStrategyName(strategy), " on GPU rank ", rank,
                                                ": ", st.message()));
  };
  DeviceScope scope;
  if (absl::Status st = scope.Enter(layer.workspace->device()); !st.ok()) return fail(st);

  kc::MoeRoutingParams rp;
  const absl::Status local = CheckLocal(layer, inputs, comm, &rp);
  Step step(layer, inputs, comm, stream, stats);
  if (stats != nullptr) *stats = GpuEpStats{};
  if (absl::Status st = step.Record(kEvStart); !st.ok()) return fail(st);
  std::vector<int64_t> headers;
  if (absl::Status st = ExchangeHeader(ws, comm, stream, inputs.num_tokens, local.code(), headers);
      !st.ok()) {
    return fail(st);
  }
  if (!local.ok()) return local;
  const int n = comm.size();
  for (int r = 0; r < n; ++r) {
    if (headers[2 * r + 1] != 0) {
      const auto code = static_cast<absl::StatusCode>(headers[2 * r + 1]);
      return absl::Status(
          code, absl::StrCat("expert-parallel step rejected by rank ", r, " (",
                             absl::StatusCodeToString(code), "); that rank returned the details"));
    }
  }
  step.tokens_per_rank.resize(n);
  for (int r = 0; r < n; ++r) step.tokens_per_rank[r] = headers[2 * r];
  if (absl::Status st = step.Run(strategy, rp); !st.ok()) return fail(st);
  return absl::OkStatus();
}

}  // namespace kplan::moe::ep
