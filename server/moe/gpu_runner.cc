#include "server/moe/gpu_runner.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/ir_cuda_status.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_ops.h"
#include "server/moe/gpu_layer.h"
#include "server/base/status.h"

namespace kplan {
namespace {

namespace kc = kernels::cuda;

#define KPLAN_GPU_RETURN_IF_ERROR(expr) KPLAN_IR_CUDA_RETURN_IF_ERROR(expr)

// The kernels' mirrors of the reference enums must agree value for value.
static_assert(static_cast<int>(kc::MoeActKind::kRelu2NoMul) ==
              static_cast<int>(moe::MoeActivation::kRelu2NoMul));
static_assert(static_cast<int>(kc::MoeActKind::kSwigluOai) ==
              static_cast<int>(moe::MoeActivation::kSwigluOai));
static_assert(static_cast<int>(kc::MoeRoutingMethod::kLlama4) ==
              static_cast<int>(moe::RoutingMethod::kLlama4));
static_assert(static_cast<int>(kc::MoeScoringFunc::kSqrtSoftplus) ==
              static_cast<int>(moe::ScoringFunc::kSqrtSoftplus));

// Makes `device` current for a scope and restores the previous one.
class DeviceScope {
 public:
  absl::Status Enter(int device) {
    KPLAN_GPU_RETURN_IF_ERROR(cudaGetDevice(&prev_));
    if (prev_ != device) KPLAN_GPU_RETURN_IF_ERROR(cudaSetDevice(device));
    device_ = device;
    return absl::OkStatus();
  }
  ~DeviceScope() {
    if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1, device_ = -1;
};


absl::Status CopyToDevice(void** dst, const void* src, int64_t bytes) {
  KPLAN_GPU_RETURN_IF_ERROR(cudaMalloc(dst, static_cast<size_t>(bytes)));
  KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpy(*dst, src, static_cast<size_t>(bytes),
                                       cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// One stream-ordered device allocation carved into 256-byte aligned pieces.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream) : stream_(stream) {}
  ~Workspace() {
    if (base_ != nullptr) cudaFreeAsync(base_, stream_);
  }
  // Reserves `bytes`; returns its offset (valid after Allocate).
  int64_t Reserve(int64_t bytes) {
    const int64_t at = size_;
    size_ += (bytes + 255) / 256 * 256;
    return at;
  }
  absl::Status Allocate() {
    if (size_ == 0) return absl::OkStatus();
    const cudaError_t err = cudaMallocAsync(&base_, static_cast<size_t>(size_), stream_);
    if (err != cudaSuccess) {
      base_ = nullptr;
      cudaGetLastError();
      return kc::CudaStatus(err, __FILE__, __LINE__, "cudaMallocAsync(workspace)");
    }
    return absl::OkStatus();
  }
  template <typename T>
  T* At(int64_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }
  void* base() const { return base_; }
  int64_t size() const { return size_; }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  int64_t size_ = 0;
};

class Events {
 public:
  ~Events() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
  cudaEvent_t start = nullptr, stop = nullptr;
};

}  // namespace

// ---------------------------------------------------------------------------
// GpuExperts.

int64_t GpuExperts::n13() const {
  return moe::IsGated(activation_) ? 2 * spec_.intermediate : spec_.intermediate;
}

std::string GpuExperts::device_name() const { return absl::StrCat("cuda:", device_); }

GpuExperts::~GpuExperts() {
  if (w13_ == nullptr && w2_ == nullptr && b13_ == nullptr && b2_ == nullptr) return;
  int prev = -1;
  const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  for (void* p : {w13_, w2_, static_cast<void*>(b13_), static_cast<void*>(b2_)}) {
    if (p != nullptr) cudaFree(p);
  }
  if (switched) cudaSetDevice(prev);
}

absl::StatusOr<std::unique_ptr<GpuExperts>> GpuExperts::Create(const ExpertSet& set, int device) {
  return Create(set, device, 0, set.spec().num_experts);
}

absl::StatusOr<std::unique_ptr<GpuExperts>> GpuExperts::Create(const ExpertSet& set, int device,
                                                               int first_expert,
                                                               int num_experts) {
  const ExpertsSpec& spec = set.spec();
  if (first_expert < 0 || num_experts <= 0 || first_expert + num_experts > spec.num_experts) {
    return InvalidField("num_experts", absl::StrCat("experts [", first_expert, ", ",
                                                    first_expert + num_experts,
                                                    ") are not a slice of the set's ",
                                                    spec.num_experts));
  }
  if (!spec.quant.scheme.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU MoE path runs unquantised weights only; experts '",
                     spec.experts_id, "' use ", spec.quant.scheme));
  }
  if (spec.dtype != moe::MoeDType::kBFloat16 && spec.dtype != moe::MoeDType::kFloat16) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU MoE path runs bfloat16 / float16 weights; experts '",
                     spec.experts_id, "' are ", moe::MoeDTypeName(spec.dtype)));
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
  const int64_t E = num_experts, H = spec.hidden, I = spec.intermediate, N13 = g->n13();
  const int64_t f = first_expert;  // offsets of the slice in the set's tensors
  DeviceScope scope;
  KPLAN_RETURN_IF_ERROR(scope.Enter(device));
  // On failure `g` is destroyed on return, freeing what was allocated.
  KPLAN_RETURN_IF_ERROR(
      CopyToDevice(&g->w13_, static_cast<const char*>(w.w13) + f * N13 * H * 2, E * N13 * H * 2));
  KPLAN_RETURN_IF_ERROR(
      CopyToDevice(&g->w2_, static_cast<const char*>(w.w2) + f * H * I * 2, E * H * I * 2));
  g->bytes_ = E * N13 * H * 2 + E * H * I * 2;
  if (w.b13 != nullptr && w.b2 != nullptr) {
    void* b13 = nullptr;
    void* b2 = nullptr;
    absl::Status st = CopyToDevice(&b13, w.b13 + f * N13, E * N13 * 4);
    g->b13_ = static_cast<float*>(b13);
    KPLAN_RETURN_IF_ERROR(st);
    st = CopyToDevice(&b2, w.b2 + f * H, E * H * 4);
    g->b2_ = static_cast<float*>(b2);
    KPLAN_RETURN_IF_ERROR(st);
    g->bytes_ += E * N13 * 4 + E * H * 4;
  }
  return g;
}

// ---------------------------------------------------------------------------
// RunMoeOnGpu.

absl::StatusOr<MoeRunOutput> RunMoeOnGpu(const GpuExperts& experts, const MoeRunInput& in,
                                         void* stream_ptr, const GpuRunOptions& options,
                                         GpuRunStats* stats) {
  const ExpertsSpec& spec = experts.spec();
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  // --- Input checks: the CPU path's, then what the GPU path runs.
  KPLAN_ASSIGN_OR_RETURN(const MoeRunShape shape, CheckMoeRunInput(spec, in));
  if (in.act_dtype != spec.dtype) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU MoE path runs activations in the weights' dtype (",
                     moe::MoeDTypeName(spec.dtype), "), got ", moe::MoeDTypeName(in.act_dtype)));
  }
  const int64_t M = shape.num_tokens;
  const int E = spec.num_experts;
  const int k = shape.top_k;
  const bool by_logits = shape.by_logits;
  const moe::RoutingSpec& routing = shape.routing;
  kc::MoeRoutingParams rp;
  if (by_logits) {
    rp.num_experts = routing.num_experts;
    rp.top_k = routing.top_k;
    rp.method = static_cast<kc::MoeRoutingMethod>(routing.method);
    rp.scoring = static_cast<kc::MoeScoringFunc>(routing.scoring);
    rp.renormalize = routing.renormalize;
    rp.routed_scaling_factor = routing.routed_scaling_factor;
    rp.num_expert_group = routing.num_expert_group;
    rp.topk_group = routing.topk_group;
    KPLAN_RETURN_IF_ERROR(kc::ValidateMoeRoutingParams(rp));
  }

  MoeRunOutput out;
  out.num_tokens = M;
  out.top_k = k;
  out.output.resize(M * spec.hidden * 2);
  out.topk_ids.resize(M * k);
  out.topk_weights.resize(M * k);
  if (M == 0) return out;

  // --- Workspace: the inputs, routing and output of this call, then the layer's.
  const int64_t H = spec.hidden;
  const int64_t numel = M * k;
  const bool has_bias = by_logits && routing.e_score_correction_bias != nullptr;
  DeviceScope scope;  // outlives the workspace, which is freed on this device
  KPLAN_RETURN_IF_ERROR(scope.Enter(experts.device()));
  Workspace ws(stream);
  const int64_t o_hidden = ws.Reserve(M * H * 2);
  const int64_t o_logits = by_logits ? ws.Reserve(M * E * 4) : -1;
  const int64_t o_bias = has_bias ? ws.Reserve(E * 4) : -1;
  const int64_t o_w = ws.Reserve(numel * 4);
  const int64_t o_ids = ws.Reserve(numel * 4);
  const int64_t o_out = ws.Reserve(M * H * 2);
  const int64_t layer_bytes = MoeLayerWorkspaceBytes(experts, M, k, E);
  const int64_t o_layer = ws.Reserve(layer_bytes);

  KPLAN_RETURN_IF_ERROR(ws.Allocate());
  if (stats != nullptr) stats->workspace_bytes = ws.size();
  if (options.poison_workspace) {
    KPLAN_GPU_RETURN_IF_ERROR(
        cudaMemsetAsync(ws.base(), 0xff, static_cast<size_t>(ws.size()), stream));
  }
  Events ev;
  if (stats != nullptr) {
    KPLAN_GPU_RETURN_IF_ERROR(cudaEventCreate(&ev.start));
    KPLAN_GPU_RETURN_IF_ERROR(cudaEventCreate(&ev.stop));
  }

  // --- Uploads.
  void* d_hidden = ws.At<void>(o_hidden);
  float* d_w = ws.At<float>(o_w);
  int32_t* d_ids = ws.At<int32_t>(o_ids);
  KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(d_hidden, in.hidden_states.data(), M * H * 2,
                                            cudaMemcpyHostToDevice, stream));
  if (by_logits) {
    KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(ws.At<void>(o_logits), in.router_logits.data(),
                                              M * E * 4, cudaMemcpyHostToDevice, stream));
    if (has_bias) {
      KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(ws.At<void>(o_bias),
                                                routing.e_score_correction_bias, E * 4,
                                                cudaMemcpyHostToDevice, stream));
      rp.e_score_correction_bias = ws.At<float>(o_bias);
    }
  } else {
    KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(d_ids, in.topk_ids.data(), numel * 4,
                                              cudaMemcpyHostToDevice, stream));
    KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(d_w, in.topk_weights.data(), numel * 4,
                                              cudaMemcpyHostToDevice, stream));
  }
  if (stats != nullptr) KPLAN_GPU_RETURN_IF_ERROR(cudaEventRecord(ev.start, stream));

  // --- The layer.
  MoeLayerArgs la;
  la.num_tokens = M;
  la.top_k = k;
  la.num_experts = E;
  la.hidden = d_hidden;
  la.router_logits = by_logits ? ws.At<float>(o_logits) : nullptr;
  la.routing = rp;
  la.topk_ids = d_ids;
  la.topk_weights = d_w;
  la.apply_router_weight_on_input = in.apply_router_weight_on_input;
  la.output = ws.At<void>(o_out);
  KPLAN_RETURN_IF_ERROR(
      EnqueueMoeLayer(experts, la, ws.At<void>(o_layer), layer_bytes, stream));
  if (stats != nullptr) KPLAN_GPU_RETURN_IF_ERROR(cudaEventRecord(ev.stop, stream));

  // --- Downloads, one synchronisation.
  KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(out.output.data(), ws.At<void>(o_out), M * H * 2,
                                            cudaMemcpyDeviceToHost, stream));
  KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(out.topk_ids.data(), d_ids, numel * 4,
                                            cudaMemcpyDeviceToHost, stream));
  KPLAN_GPU_RETURN_IF_ERROR(cudaMemcpyAsync(out.topk_weights.data(), d_w, numel * 4,
                                            cudaMemcpyDeviceToHost, stream));
  KPLAN_GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (stats != nullptr) {
    KPLAN_GPU_RETURN_IF_ERROR(cudaEventElapsedTime(&stats->device_ms, ev.start, ev.stop));
  }
  return out;
}

}  // namespace kplan
