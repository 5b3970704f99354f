#include "server/moe/gpu_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/status.h"
#include "base/status.h"
#include "server/moe/gpu_layer.h"
#include "server/moe/gpu_layer_emulation.h"
#include "server/moe/gpu_graphs.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;

using kc::DeviceArena;
using kc::DeviceGuard;

absl::Status CopyToDevice(void** dst, const void* src, int64_t bytes) {
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMalloc(dst, static_cast<size_t>(bytes)));
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(*dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// Stream-ordered allocations on the device (the layer's helpers, other
// callers): the device's default pool returns freed memory to the driver at
// every synchronisation unless told to keep it; keeping it makes the next
// allocation a pool hit instead of a fresh mapping.
absl::Status KeepWorkspacesPooled(int device) {
  cudaMemPool_t pool;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  return absl::OkStatus();
}

// Pinned host memory of the calling thread, grown on demand and kept: each
// thread that runs calls (a device worker, or a thread running one inline)
// stages its requests there, so the DMA engines or the SM copy kernels read
// and write it directly (no hidden staging copy of pageable memory) and no
// call pays for cudaHostAlloc after the first large one.
absl::StatusOr<kc::PinnedHostBuffer*> ThisThreadsPinnedBuffer(int64_t bytes,
                                                              MoeGraphCache& graphs) {
  thread_local kc::PinnedHostBuffer pinned;
  if (pinned.capacity() >= static_cast<size_t>(bytes)) return &pinned;
  // Graphs copying from or to the old block: this device's go now; other
  // devices' stay cached but never match again (their key's host_capacity
  // is smaller than the buffer's from now on: it only grows).
  graphs.Clear();
  KPLAN_RETURN_IF_ERROR(
      pinned.Reserve(static_cast<size_t>(std::max<int64_t>(bytes, int64_t{1} << 20))));
  return &pinned;
}

// Bumped when a GpuExperts is destroyed (an unload): each thread's
// workspace then shrinks to what its next call needs.
std::atomic<uint64_t> experts_freed{0};

thread_local int64_t graph_launches = 0;  // MoeGraphLaunchesOnThisThread

// The calling thread's device workspace on `device`: one plain block per
// (thread, device), kept across calls and grown (to a power of two) when a
// layout needs more, so no call allocates on the call path once warm. A
// device worker is one thread with one stream, so its calls never share the
// block; another thread gets its own. Every call synchronises its stream
// before it returns (errors too), so the next call may reuse or free the
// block. Freed when the thread ends (the workers' at shutdown), and after an
// unload on the next call if the block is more than it needs.
struct ThreadWorkspace {
  DeviceArena arena;
  MoeGraphCache graphs;  // into `arena` and the pinned buffer: destroyed first
  uint64_t freed_seen = 0;
};

ThreadWorkspace& ThisThreadsWorkspace(int device) {
  thread_local std::map<int, ThreadWorkspace> workspaces;
  ThreadWorkspace& w = workspaces[device];
  const uint64_t freed = experts_freed.load(std::memory_order_relaxed);
  if (w.freed_seen != freed) {
    w.freed_seen = freed;
    w.graphs.Clear();
    w.arena.Release();  // regrown to this call's layout below
  }
  w.arena.Clear();
  return w;
}

// Captures `enqueue` (work on `stream` only) into an instantiated graph.
// Null when the runtime refused the capture: nothing was done then, and the
// caller runs the work eagerly. An error of `enqueue` itself is returned.
template <typename Enqueue>
absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream, const Enqueue& enqueue) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  absl::Cleanup destroy = [&] {
    if (graph != nullptr) cudaGraphDestroy(graph);
  };
  if (ended != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  KPLAN_RETURN_IF_ERROR(enqueued);
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return exec;
}

// Grows `ws` to hold its layout, rounded up to a power of two so that a
// slowly growing batch reallocates seldom; a regrowth drops the graphs that
// point into the old block.
absl::Status AllocateWorkspace(DeviceArena& ws, MoeGraphCache& graphs) {
  if (ws.capacity() >= ws.size()) return ws.Allocate();
  graphs.Clear();
  const int64_t layout = ws.size();
  int64_t rounded = int64_t{1} << 20;
  while (rounded < layout) rounded *= 2;
  ws.Reserve(rounded - layout);
  return ws.Allocate();
}

}  // namespace

// ---------------------------------------------------------------------------
// GpuExperts.

int64_t GpuExperts::n13() const {
  return moe::IsGated(activation_) ? 2 * spec_.intermediate : spec_.intermediate;
}

std::string GpuExperts::device_name() const { return absl::StrCat("cuda:", device_); }

absl::StatusOr<MoeRunOutput> GpuExperts::Run(const MoeRunInput& input, void* stream) const {
  return RunMoeOnGpu(*this, input, stream);
}

bool GpuExperts::FastPathFor(kernels::DType act_dtype) const {
  const bool act16 =
      act_dtype == kernels::DType::kBFloat16 || act_dtype == kernels::DType::kFloat16;
  if (spec_.quant.scheme.empty()) return act16 && act_dtype == spec_.dtype;
  return act16 && (Fp8OnTensorCores() || IntKernelsApply(*this, act_dtype));
}

bool GpuExperts::Fp8OnTensorCores() const {
  const ExpertsQuantSpec& q = spec_.quant;
  const bool scheme = q.scheme == "fp8_per_tensor" || q.scheme == "fp8_per_channel" ||
                      (q.scheme == "fp8_block" && q.block_n == 128 && q.block_k == 128);
  return scheme && spec_.hidden % 16 == 0 && spec_.intermediate % 16 == 0;
}

GpuExperts::~GpuExperts() {
  experts_freed.fetch_add(1, std::memory_order_relaxed);
  void* const all[] = {w13_,
                       w2_,
                       static_cast<void*>(b13_),
                       static_cast<void*>(b2_),
                       static_cast<void*>(w13_scale_),
                       static_cast<void*>(w2_scale_),
                       static_cast<void*>(w13_zero_),
                       static_cast<void*>(w2_zero_)};
  if (std::all_of(std::begin(all), std::end(all), [](void* p) { return p == nullptr; })) return;
  DeviceGuard guard;  // free on the experts' device
  (void)guard.Enter(device_);
  for (void* p : all) {
    if (p != nullptr) cudaFree(p);
  }
}

absl::StatusOr<std::unique_ptr<GpuExperts>> GpuExperts::Create(const ExpertSet& set, int device) {
  return Create(set, device, 0, set.spec().num_experts);
}

absl::StatusOr<std::unique_ptr<GpuExperts>> GpuExperts::Create(const ExpertSet& set, int device,
                                                               int first_expert, int num_experts) {
  const ExpertsSpec& spec = set.spec();
  if (first_expert < 0 || num_experts <= 0 || first_expert + num_experts > spec.num_experts) {
    return InvalidField("num_experts",
                        absl::StrCat("experts [", first_expert, ", ", first_expert + num_experts,
                                     ") are not a slice of the set's ", spec.num_experts));
  }
  if (spec.hidden % 8 != 0 || spec.intermediate % 8 != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU MoE path needs hidden and intermediate multiples of 8, got ",
                     spec.hidden, " and ", spec.intermediate));
  }
  const moe::MoeWeights w = set.Weights();
  if (w.w13 == nullptr || w.w2 == nullptr) {
    return InvalidField(w.w13 == nullptr ? "w13" : "w2", "the expert set lacks a weight tensor");
  }
  {
    // The option combinations the CPU reference accepts (e.g. fp8 block
    // scales need per-group activation scales): what it rejects per request
    // stays on the CPU path, which reports it.
    moe::MoeProblem probe;
    probe.hidden = spec.hidden;
    probe.intermediate = spec.intermediate;
    probe.num_experts = spec.num_experts;
    probe.top_k = 1;
    probe.activation = set.activation();
    probe.weights = w;
    if (absl::Status st = moe::ValidateMoeProblem(probe, /*needs_routing=*/false); !st.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the GPU MoE path cannot run experts '",
                                                        spec.experts_id, "': ", st.message()));
    }
  }
  if (spec.has_bias && (w.b13 == nullptr || w.b2 == nullptr)) {
    return InvalidField(w.b13 == nullptr ? "w13_bias" : "w2_bias",
                        "the expert set lacks a bias tensor");
  }
  std::unique_ptr<GpuExperts> g(new GpuExperts());
  g->spec_ = spec;
  g->spec_.num_experts = num_experts;
  g->activation_ = set.activation();
  g->device_ = device;
  g->first_expert_ = first_expert;
  DeviceGuard guard;
  KPLAN_RETURN_IF_ERROR(guard.Enter(device));
  KPLAN_RETURN_IF_ERROR(KeepWorkspacesPooled(device));
  // Every tensor of the set (ExpectedTensors: first dimension = expert) as
  // stored, sliced to the experts copied. On failure `g` is destroyed on
  // return, freeing what was allocated.
  const std::map<std::string, std::pair<const void*, void**>> where = {
      {"w13", {w.w13, &g->w13_}},
      {"w2", {w.w2, &g->w2_}},
      {"w13_bias", {w.b13, reinterpret_cast<void**>(&g->b13_)}},
      {"w2_bias", {w.b2, reinterpret_cast<void**>(&g->b2_)}},
      {"w13_scale", {w.quant.w13_scale, reinterpret_cast<void**>(&g->w13_scale_)}},
      {"w2_scale", {w.quant.w2_scale, reinterpret_cast<void**>(&g->w2_scale_)}},
      {"w13_zero", {w.quant.w13_zero, reinterpret_cast<void**>(&g->w13_zero_)}},
      {"w2_zero", {w.quant.w2_zero, reinterpret_cast<void**>(&g->w2_zero_)}},
  };
  for (const TensorSpec& t : ExpectedTensors(spec)) {
    auto it = where.find(t.name);
    if (it == where.end()) continue;
    if (it->second.first == nullptr) {
      return InvalidField(t.name, "the expert set lacks this tensor");
    }
    const int64_t per_expert = t.bytes() / spec.num_experts;
    KPLAN_RETURN_IF_ERROR(CopyToDevice(
        it->second.second, static_cast<const char*>(it->second.first) + first_expert * per_expert,
        num_experts * per_expert));
    g->bytes_ += num_experts * per_expert;
  }
  return g;
}

// ---------------------------------------------------------------------------
// RunMoeOnGpu.

int64_t MoeGraphLaunchesOnThisThread() { return graph_launches; }

absl::StatusOr<MoeRunOutput> RunMoeOnGpu(const GpuExperts& experts, const MoeRunInput& in,
                                         void* stream_ptr, const GpuRunOptions& options,
                                         GpuRunStats* stats) {
  const ExpertsSpec& spec = experts.spec();
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // --- Input checks: the CPU path's, then what the GPU path runs.
  KPLAN_ASSIGN_OR_RETURN(const MoeRunShape shape, CheckMoeRunInput(spec, in));
  if (!moe::IsFloatDType(in.act_dtype)) {
    return InvalidField("hidden_states.dtype",
                        absl::StrCat("activations must be float32, float16 or bfloat16, got ",
                                     kernels::DTypeName(in.act_dtype)));
  }
  const int64_t act_bytes = kernels::DTypeSize(in.act_dtype);
  const int64_t M = shape.num_tokens;
  const int E = spec.num_experts;
  const int k = shape.top_k;
  const bool by_logits = shape.by_logits;
  const moe::RoutingSpec& routing = shape.routing;
  kc::MoeRoutingParams rp;
  if (by_logits) {
    rp = kc::MoeRoutingParamsOf(routing);
    KPLAN_RETURN_IF_ERROR(kc::ValidateMoeRoutingParams(rp));
  }

  const MoeDeviceTensors& dev = in.device;
  if (dev.any() && dev.device != experts.device()) {
    return WithField(
        absl::FailedPreconditionError(absl::StrCat(
            "the CUDA shared-memory region is on cuda:", dev.device, ", experts '", spec.experts_id,
            "' run on cuda:", experts.device(), "; allocate the tensors on that GPU")),
        dev.field);
  }
  // The output goes to client device memory, into a client's POSIX window
  // (in_place), or back in `out`.
  const MoeHostOutput& window = in.host_output;
  const bool to_window = dev.output == nullptr && window.any();
  MoeRunOutput out;
  out.num_tokens = M;
  out.top_k = k;
  out.in_place = to_window;
  out.topk_ids.resize(M * k);
  out.topk_weights.resize(M * k);
  if (M == 0) return out;

  // --- Workspace: the inputs, routing and output of this call, then the layer's.
  const int64_t H = spec.hidden;
  const int64_t numel = M * k;
  const bool has_bias = by_logits && routing.e_score_correction_bias != nullptr;
  DeviceGuard guard;  // outlives the workspace, which is freed on this device
  KPLAN_RETURN_IF_ERROR(guard.Enter(experts.device()));
  // This thread's block on the device, carved into 256-byte aligned pieces.
  ThreadWorkspace& tw = ThisThreadsWorkspace(experts.device());
  DeviceArena& ws = tw.arena;
  // The request's buffers first, in the order of a pinned host mirror with
  // the same offsets: inputs [hidden, logits, bias, ids, weights] go up in
  // one copy, results [ids, weights, output] come down in one.
  const int64_t o_hidden = ws.Reserve(M * H * act_bytes);
  const int64_t o_logits = by_logits ? ws.Reserve(M * E * 4) : -1;
  const int64_t o_bias = has_bias ? ws.Reserve(E * 4) : -1;
  const int64_t o_ids = ws.Reserve(numel * 4);
  const int64_t o_w = ws.Reserve(numel * 4);
  const int64_t o_out = ws.Reserve(M * H * act_bytes);
  const int64_t io_bytes = ws.size();
  const int64_t layer_bytes =
      MoeLayerWorkspaceBytes(experts, M, k, E, in.act_dtype, in.batch_invariant);
  const int64_t o_layer = ws.Reserve(layer_bytes);

  if (stats != nullptr) stats->workspace_bytes = ws.size();
  KPLAN_RETURN_IF_ERROR(AllocateWorkspace(ws, tw.graphs));
  // From here an error return must not leave work in flight on the
  // workspace or the pinned buffer, which the next (larger) request on this
  // thread may free.
  bool drained = false;
  absl::Cleanup drain_on_error = [&] {
    if (!drained) cudaStreamSynchronize(stream);
  };
  if (options.poison_workspace) {
    KPLAN_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(ws.base(), 0xff, static_cast<size_t>(ws.size()), stream));
  }
  kc::Event start, stop;
  if (stats != nullptr) {
    KPLAN_RETURN_IF_ERROR(start.Create());
    KPLAN_RETURN_IF_ERROR(stop.Create());
  }

  // --- Uploads: one copy of each host input into pinned memory, one upload
  // (by SM copy kernels for a graph-sized call, GpuRunOptions::stage_by_sm;
  // else a DMA);
  // then inputs in client device memory device-to-device over their part,
  // and hidden states read in place from a window the server pinned
  // (ShmRegion::pinned) by a DMA of their own, never staged (hidden states,
  // then logits, lead the layout: the staged DMA starts after those that
  // are not staged).
  KPLAN_ASSIGN_OR_RETURN(kc::PinnedHostBuffer * pinned,
                         ThisThreadsPinnedBuffer(io_bytes, tw.graphs));
  char* host = pinned->data();
  // A call small enough for a graph stages a pinned window too (a few KiB
  // of memcpy): the graph's copies are the thread's own buffers.
  const bool graph_sized = in.cuda_graph && M <= kMoeGraphMaxTokens;
  const bool hidden_pinned = !graph_sized && dev.hidden_states == nullptr &&
                             in.hidden_states.in_place() && in.hidden_states.shm().region->pinned();
  if (dev.hidden_states == nullptr && !hidden_pinned) {
    std::memcpy(host + o_hidden, in.hidden_states.data(), M * H * act_bytes);
  }
  if (by_logits) {
    if (dev.router_logits == nullptr) {
      std::memcpy(host + o_logits, in.router_logits.data(), M * E * 4);
    }
    if (has_bias) std::memcpy(host + o_bias, routing.e_score_correction_bias, E * 4);
  } else {
    std::memcpy(host + o_ids, in.topk_ids.data(), numel * 4);
    std::memcpy(host + o_w, in.topk_weights.data(), numel * 4);
  }
  int64_t upload_from = 0;
  if (dev.hidden_states != nullptr || hidden_pinned) {
    upload_from = by_logits ? o_logits : o_ids;
    if (by_logits && dev.router_logits != nullptr) upload_from = has_bias ? o_bias : o_ids;
  }
  if (has_bias) rp.e_score_correction_bias = ws.At<float>(o_bias);
  MoeLayerArgs la;
  la.num_tokens = M;
  la.top_k = k;
  la.num_experts = E;
  la.hidden = ws.At<void>(o_hidden);
  la.router_logits = by_logits ? ws.At<float>(o_logits) : nullptr;
  la.routing = rp;
  la.topk_ids = ws.At<int32_t>(o_ids);
  la.topk_weights = ws.At<float>(o_w);
  la.apply_router_weight_on_input = in.apply_router_weight_on_input;
  la.batch_invariant = in.batch_invariant;
  la.act_dtype = in.act_dtype;
  la.output = ws.At<void>(o_out);
  const bool window_pinned = !graph_sized && to_window && window.view.region->pinned();
  // The staging copies by the SMs: graph-sized calls whose inputs and output
  // all pass through the pinned buffer.
  const bool stage_by_sm = options.stage_by_sm && graph_sized && !dev.any();
  // A staging copy between the pinned mirror and the workspace: by the SMs
  // or by a copy engine.
  const auto stage = [&](void* dst, const void* src, int64_t bytes,
                         cudaMemcpyKind kind) -> absl::Status {
    if (stage_by_sm) return kc::LaunchMoeStageCopy(dst, src, bytes, stream);
    KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    return absl::OkStatus();
  };
  // Everything on the stream from the upload to the download: enqueued
  // directly, or captured once into a graph and replayed (gpu_graphs.h).
  const auto enqueue = [&]() -> absl::Status {
    KPLAN_RETURN_IF_ERROR(stage(ws.At<void>(upload_from), host + upload_from, o_out - upload_from,
                                cudaMemcpyHostToDevice));
    const auto d2d = [&](int64_t at, const void* src, int64_t bytes) -> absl::Status {
      if (src == nullptr) return absl::OkStatus();
      KPLAN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(ws.At<void>(at), src, bytes, cudaMemcpyDeviceToDevice, stream));
      return absl::OkStatus();
    };
    KPLAN_RETURN_IF_ERROR(d2d(o_hidden, dev.hidden_states, M * H * act_bytes));
    if (hidden_pinned) {
      KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ws.At<void>(o_hidden), in.hidden_states.data(),
                                                 M * H * act_bytes, cudaMemcpyHostToDevice,
                                                 stream));
    }
    if (by_logits) KPLAN_RETURN_IF_ERROR(d2d(o_logits, dev.router_logits, M * E * 4));
    if (stats != nullptr) KPLAN_RETURN_IF_ERROR(start.Record(stream));
    KPLAN_RETURN_IF_ERROR(EnqueueMoeLayer(experts, la, ws.At<void>(o_layer), layer_bytes, stream));
    if (stats != nullptr) KPLAN_RETURN_IF_ERROR(stop.Record(stream));
    // Downloads: one copy (as the upload) into the pinned mirror (the
    // routing, and the output unless it goes to client device memory or to
    // a pinned window).
    const int64_t download_end = dev.output != nullptr || window_pinned ? o_out : io_bytes;
    return stage(host + o_ids, ws.At<void>(o_ids), download_end - o_ids, cudaMemcpyDeviceToHost);
  };
  // Not graphed: copies from or to client device memory (its addresses
  // vary); pinned client windows are staged at graph sizes (above).
  const bool graphable = graph_sized && stream != nullptr && stats == nullptr && !dev.any();
  if (!graphable) {
    KPLAN_RETURN_IF_ERROR(enqueue());
  } else {
    const MoeGraphKey key{&experts,
                          la,
                          ws.base(),
                          ws.capacity(),
                          host,
                          static_cast<int64_t>(pinned->capacity()),
                          kc::MoeQuantRouteModeNow(),
                          stage_by_sm};
    cudaGraphExec_t exec = nullptr;
    MoeGraphCache::Use use = tw.graphs.Lookup(key, &exec);
    if (use == MoeGraphCache::Use::kCapture) {
      KPLAN_ASSIGN_OR_RETURN(exec, CaptureGraph(stream, enqueue));
      tw.graphs.Store(key, exec);
      use = exec != nullptr ? MoeGraphCache::Use::kReplay : MoeGraphCache::Use::kEager;
    }
    if (use == MoeGraphCache::Use::kReplay) {
      KPLAN_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
      ++graph_launches;
    } else {
      KPLAN_RETURN_IF_ERROR(enqueue());
    }
  }
  const GpuLayerFacts facts = GpuLayerFactsOf(experts, in.act_dtype, M, k, E, in.batch_invariant);
  out.experts_kernel = std::string(GpuLayerExpertsKernel(facts));
  if (stats != nullptr) stats->layer = facts;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  drained = true;
  if (stats != nullptr) {
    KPLAN_ASSIGN_OR_RETURN(stats->device_ms, kc::ElapsedMs(start, stop));
  }
  if (dev.output != nullptr) {
    // Into the client's memory only while its call stands: a client that
    // gave up may reuse the buffer (no late writes).
    if (dev.cancelled && dev.cancelled()) {
      return absl::CancelledError("the call ended before its output was written to output_shm");
    }
    KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev.output, ws.At<void>(o_out), M * H * act_bytes,
                                               cudaMemcpyDeviceToDevice, stream));
    drained = false;
    KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    drained = true;
  } else if (to_window) {
    // Likewise into a client's window; a pinned one by DMA from the
    // workspace, else from the pinned mirror (no copy in between).
    if (window_pinned) {
      KPLAN_RETURN_IF_ERROR(window.Writable(M * H * act_bytes));
      KPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          window.view.data, ws.At<void>(o_out), M * H * act_bytes, cudaMemcpyDeviceToHost, stream));
      drained = false;
      KPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      drained = true;
    } else {
      KPLAN_RETURN_IF_ERROR(window.Write(host + o_out, M * H * act_bytes));
    }
  } else {
    out.output.assign(host + o_out, M * H * act_bytes);  // one pass: no zero fill first
  }
  std::memcpy(out.topk_ids.data(), host + o_ids, numel * 4);
  std::memcpy(out.topk_weights.data(), host + o_w, numel * 4);
  return out;
}

}  // namespace kplan
