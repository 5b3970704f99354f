#include "server/moe/ep/gpu_ep.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/comm/nccl_communicator.h"
#include "kernels/cuda/runtime/status.h"
#include "kernels/cuda/moe/moe_ep_ops.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/stream.h"
#include "base/status.h"
#include "server/moe/ep/gpu_ep_step.h"
#include "server/moe/gpu_layer.h"

// The step machinery every GPU strategy shares (gpu_ep_step.h): the
// workspace, the local checks, the header exchange, the common prologue and
// download, and RunMoeExpertParallelOnGpu, which picks the strategy. The
// strategies themselves: gpu_ep_allgather_reducescatter.cc,
// gpu_ep_all2allv.cc, gpu_ep_passthrough.cc.

namespace kplan::moe::ep {

GpuEpWorkspace::Impl& WorkspaceImpl(GpuEpWorkspace& ws) { return *ws.impl_; }

namespace gpu_ep_detail {

using kernels::cuda::DeviceGuard;

// Buffer `b` with at least `bytes`, growing it when needed. Growth frees the
// old buffer (cudaFree waits for the device) and allocates 1.25x the need,
// rounded to 2 MiB, so a slowly growing load settles after a few steps.
absl::StatusOr<void*> Ensure(GpuEpWorkspace::Impl& ws, Buf b, int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 256);
  if (ws.cap[b] >= bytes) return ws.ptr[b];
  if (ws.ptr[b] != nullptr) {
    KPLAN_CUDA_RETURN_IF_ERROR(cudaFree(ws.ptr[b]));
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

absl::Status EnsureAll(GpuEpWorkspace::Impl& ws,
                       const std::vector<std::pair<Buf, int64_t>>& buffers) {
  for (const auto& [b, bytes] : buffers) KPLAN_RETURN_IF_ERROR(Ensure(ws, b, bytes).status());
  return absl::OkStatus();
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
  if (L.act_dtype != kernels::DType::kBFloat16 && L.act_dtype != kernels::DType::kFloat16) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU expert-parallel path runs bfloat16 / float16 activations, got ",
                     kernels::DTypeName(L.act_dtype)));
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
    *rp = kc::MoeRoutingParamsOf(spec);
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

GpuEpStep::GpuEpStep(const GpuEpLayer& layer, const MoeInputsForThisRank& in,
                     comm::Communicator& comm, cudaStream_t stream, GpuEpStats* stats)
    : L(layer),
      in(in),
      comm(comm),
      ws(WorkspaceImpl(*layer.workspace)),
      stream(stream),
      stats(stats),
      n(comm.size()),
      rank(comm.rank()),
      k(layer.top_k),
      H(layer.hidden),
      es(kernels::DTypeSize(layer.act_dtype)),
      M(in.num_tokens) {}

absl::Status GpuEpStep::Run(EpStrategy strategy, const kc::MoeRoutingParams& rp) {
  absl::Status prepared = UploadAndRoute(strategy, rp);
  if (prepared.ok()) prepared = Record(kEvRouted);
  if (strategy == EpStrategy::kPassthrough) {
    KPLAN_RETURN_IF_ERROR(PassthroughOnGpu(*this, std::move(prepared)));
  } else {
    KPLAN_RETURN_IF_ERROR(prepared);
    KPLAN_RETURN_IF_ERROR(strategy == EpStrategy::kAllGatherReduceScatter
                              ? AllGatherReduceScatterOnGpu(*this)
                              : All2AllVOnGpu(*this));
  }
  return Finish();
}

absl::Status GpuEpStep::Finish() {
  KPLAN_RETURN_IF_ERROR(Record(kEvCombined));
  if (M > 0) {
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(in.output, out, M * H * es, cudaMemcpyDeviceToHost, stream));
  }
  KPLAN_RETURN_IF_ERROR(Record(kEvDone));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (stats != nullptr) {
    auto ms = [&](Ev a, Ev b) {
      float t = 0;
      return cudaEventElapsedTime(&t, ws.ev[a], ws.ev[b]) == cudaSuccess ? t : -1.0f;
    };
    stats->prologue_ms = ms(kEvStart, kEvRouted);
    stats->dispatch_ms = ms(kEvRouted, kEvDispatched);
    stats->experts_ms = ms(kEvDispatched, kEvComputed);
    stats->combine_ms = ms(kEvComputed, kEvCombined);
    stats->download_ms = ms(kEvCombined, kEvDone);
    stats->total_ms = ms(kEvStart, kEvDone);
    int64_t total = 0;
    for (int64_t c : ws.cap) total += c;
    stats->workspace_bytes = total;
    stats->workspace_allocations = ws.allocations;
  }
  return absl::OkStatus();
}

absl::Status GpuEpStep::Record(Ev e) {
  if (stats == nullptr) return absl::OkStatus();
  if (ws.ev[e] == nullptr) KPLAN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ws.ev[e]));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaEventRecord(ws.ev[e], stream));
  return absl::OkStatus();
}

int64_t GpuEpStep::MaxTokens() const {
  return *std::max_element(tokens_per_rank.begin(), tokens_per_rank.end());
}

absl::Status GpuEpStep::UploadAndRoute(EpStrategy strategy, kc::MoeRoutingParams rp) {
  // AG-RS sends maxT rows from these buffers: size them for that.
  const int64_t rows =
      strategy == EpStrategy::kAllGatherReduceScatter ? std::max(M, MaxTokens()) : M;
  KPLAN_ASSIGN_OR_RETURN(x, Ensure(ws, kX, rows * H * es));
  KPLAN_ASSIGN_OR_RETURN(ids, EnsureAs<int32_t>(ws, kIds, rows * k));
  KPLAN_ASSIGN_OR_RETURN(w, EnsureAs<float>(ws, kWeights, rows * k));
  KPLAN_ASSIGN_OR_RETURN(out, Ensure(ws, kOut, M * H * es));
  // The expert map, uploaded when the layer's shape changes.
  KPLAN_ASSIGN_OR_RETURN(map, EnsureAs<int32_t>(ws, kMap, L.num_experts));
  if (ws.map_experts != L.num_experts || ws.map_ranks != n || ws.map_rank != rank) {
    const std::vector<int32_t> host_map = L.placement.ExpertMap(rank);
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(map, host_map.data(), host_map.size() * 4, cudaMemcpyHostToDevice, stream));
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaStreamSynchronize(stream));  // `host_map` is a pageable temporary
    ws.map_experts = L.num_experts;
    ws.map_ranks = n;
    ws.map_rank = rank;
  }
  if (M > 0) {
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(x, in.hidden_states, M * H * es, cudaMemcpyHostToDevice, stream));
    if (in.topk_ids != nullptr) {
      KPLAN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(ids, in.topk_ids, M * k * 4, cudaMemcpyHostToDevice, stream));
      KPLAN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(w, in.topk_weights, M * k * 4, cudaMemcpyHostToDevice, stream));
    } else {
      const int E = L.num_experts;
      KPLAN_ASSIGN_OR_RETURN(float* logits, EnsureAs<float>(ws, kLogits, M * E));
      KPLAN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(logits, in.router_logits, M * E * 4, cudaMemcpyHostToDevice, stream));
      if (in.routing.e_score_correction_bias != nullptr) {
        KPLAN_ASSIGN_OR_RETURN(float* bias, EnsureAs<float>(ws, kBias, E));
        KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bias, in.routing.e_score_correction_bias, E * 4,
                                                   cudaMemcpyHostToDevice, stream));
        rp.e_score_correction_bias = bias;
      }
      KPLAN_RETURN_IF_ERROR(kc::LaunchMoeRouting(rp, logits, M, w, ids, stream));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEpStep::RunExperts(int64_t rows, int slots, const void* rows_x, int32_t* slot_ids,
                                   float* slot_w, void* y, bool slots_local) {
  if (rows == 0 || L.local_experts == nullptr) return absl::OkStatus();
  const GpuExperts& g = *L.local_experts;
  const int64_t bytes = MoeLayerWorkspaceBytes(g, rows, slots, L.num_experts);
  KPLAN_ASSIGN_OR_RETURN(void* lw, Ensure(ws, kLayer, bytes));
  MoeLayerArgs a;
  a.num_tokens = rows;
  a.top_k = slots;
  a.num_experts = L.num_experts;
  a.hidden = rows_x;
  a.topk_ids = slot_ids;
  a.topk_weights = slot_w;
  a.expert_map = map;
  a.slots_local = slots_local;
  a.apply_router_weight_on_input = L.apply_router_weight_on_input;
  a.combine = false;
  a.output = y;
  if (stats != nullptr) stats->rows_computed = rows * slots;
  return EnqueueMoeLayer(g, a, lw, ws.cap[kLayer], stream);
}

// The header exchange: every rank's (token count, status code).
absl::Status ExchangeHeader(GpuEpWorkspace::Impl& ws, comm::Communicator& comm, cudaStream_t stream,
                            int64_t num_tokens, absl::StatusCode verdict,
                            std::vector<int64_t>& headers) {
  const int n = comm.size();
  const int64_t header[2] = {num_tokens, static_cast<int64_t>(verdict)};
  KPLAN_ASSIGN_OR_RETURN(int64_t * d_header, EnsureAs<int64_t>(ws, kHeader, 2));
  KPLAN_ASSIGN_OR_RETURN(int64_t * d_all, EnsureAs<int64_t>(ws, kHeaderAll, 2 * n));
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_header, header, sizeof(header), cudaMemcpyHostToDevice, stream));
  KPLAN_RETURN_IF_ERROR(comm.AllGather(d_header, d_all, 2, kernels::DType::kInt64));
  headers.resize(2 * n);
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(headers.data(), d_all, 2 * n * 8, cudaMemcpyDeviceToHost, stream));
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace gpu_ep_detail

using namespace gpu_ep_detail;  // NOLINT(build/namespaces): this file's own helpers

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
  DeviceGuard scope;
  KPLAN_RETURN_IF_ERROR(scope.Enter(L.workspace->device()));
  const int64_t n = num_ranks, T = max_tokens_per_rank, k = L.top_k, H = L.hidden;
  const int64_t es = kernels::DTypeSize(L.act_dtype), E = L.num_experts;
  KPLAN_RETURN_IF_ERROR(EnsureAll(ws, {{kHeader, 16},
                                       {kHeaderAll, 16 * n},
                                       {kMap, 4 * E},
                                       {kX, T * H * es},
                                       {kIds, T * k * 4},
                                       {kWeights, T * k * 4},
                                       {kOut, T * H * es}}));
  if (strategy == EpStrategy::kAllGatherReduceScatter) {
    return ReserveAllGatherReduceScatter(ws, L, n, T);
  }
  if (strategy == EpStrategy::kPassthrough) return ReservePassthrough(ws, L, n, T);
  return ReserveAll2AllV(ws, L, n, T);
}

absl::Status RunMoeExpertParallelOnGpu(const GpuEpLayer& layer, const MoeInputsForThisRank& inputs,
                                       comm::Communicator& comm, EpStrategy strategy,
                                       GpuEpStats* stats) {
  const int rank = comm.rank();
  // Through forwarding wrappers (a group across servers shares rank 0's
  // communicator so that a peer's failure can abort it).
  comm::Communicator& underlying = comm.Underlying();
  auto* wrapped = dynamic_cast<GpuEpCommunicator*>(&underlying);
  auto* nccl =
      wrapped != nullptr ? &wrapped->nccl() : dynamic_cast<comm::NcclCommunicator*>(&underlying);
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
  DeviceGuard scope;
  if (absl::Status st = scope.Enter(layer.workspace->device()); !st.ok()) return fail(st);

  kc::MoeRoutingParams rp;
  const absl::Status local = CheckLocal(layer, inputs, comm, &rp);
  GpuEpStep step(layer, inputs, comm, stream, stats);
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
