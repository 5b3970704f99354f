// Runs one fused MoE layer over a resident ExpertSet: routing from router
// logits (vLLM's RoutingMethodType vocabulary) or given top-k ids/weights,
// the experts, the weighted combine. This is the `emulation` backend of the
// CPU reference path (kernels/cpu/moe); GPU backends plug in beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "kernels/cuda/moe/moe_quant_route.h"
#include "server/moe/expert_set.h"
#include "server/moe/shm_regions.h"

namespace kplan {

struct MoeRouting {
  std::string routing_method;  // RoutingMethodType name; "" = Default
  int top_k = 0;
  int num_expert_group = 0;
  int topk_group = 0;
  std::optional<float> routed_scaling_factor;
  std::vector<float> e_score_correction_bias;  // [E] or empty
};

// Tensors in a client's CUDA memory (CUDA IPC regions, shm_regions.h), all
// on GPU `device`: the GPU path copies the inputs device-to-device into its
// workspace and the output from it into `output`, never through the host;
// the host strings of the inputs given here stay empty. `holds` keeps the
// regions open while the call runs; `cancelled` is asked before the output
// is written (true: CANCELLED, nothing written). `field` names the first
// reference (hidden_states.shm, ...) for a path that refuses them.
struct MoeDeviceTensors {
  int device = -1;
  const void* hidden_states = nullptr;
  int64_t hidden_bytes = 0;
  const void* router_logits = nullptr;
  int64_t logits_bytes = 0;
  void* output = nullptr;  // [M, H] in act_dtype
  std::function<bool()> cancelled;
  std::vector<std::shared_ptr<const void>> holds;
  std::string field;
  bool any() const { return hidden_states != nullptr || router_logits != nullptr || output; }
};

// An input's bytes in host memory (hidden states, router logits): the
// server's own (moved out of the request), or read in place in a client's
// POSIX shared-memory window (RunMoE's Tensor.shm), which the view keeps
// mapped while the call holds it. Read in place means one snapshot right
// after the window was found intact, into memory of the server's, aligned:
// the GPU path's staging or pinned upload, the CPU reference's copy (it
// reads its input for the whole layer; a client truncating its object
// mid-layer would fault the reads), the coalescer's merge, the
// expert-parallel group's copy. A client that rewrites the window during its
// call races that one read (the API forbids it) and gets its own garbage:
// values, never an index (logits pick among experts [0, E)). A given top-k,
// which indexes memory once checked, is copied at decode instead.
class HostBytes {
 public:
  HostBytes() = default;
  HostBytes(std::string bytes) : owned_(std::move(bytes)) {}  // NOLINT: as the string it was
  explicit HostBytes(ShmView view) : view_(std::move(view)) {}
  const char* data() const { return in_place() ? view_.data : owned_.data(); }
  size_t size() const { return in_place() ? static_cast<size_t>(view_.size) : owned_.size(); }
  bool empty() const { return size() == 0; }
  absl::string_view bytes() const { return absl::string_view(data(), size()); }
  // Read in place from a client's window (shm()), not the server's bytes.
  bool in_place() const { return view_.region != nullptr; }
  const ShmView& shm() const { return view_; }
  // OK for the server's bytes; for a window, its region's CheckIntact
  // (FAILED_PRECONDITION naming `<tensor>.shm.region` when its object was
  // truncated: reading would raise SIGBUS). MoeRunInput::CheckIntact asks it
  // of every tensor read in place; every path asks that before it reads.
  absl::Status CheckIntact(absl::string_view tensor) const;
  // The bytes for a reader that holds them long (the CPU reference): the
  // server's own, or a snapshot of the window in `*copy`, one read of it.
  const char* Snapshot(std::string* copy) const {
    if (!in_place()) return data();
    copy->assign(data(), size());
    return copy->data();
  }
  // Replacing the bytes (tests and benchmarks build inputs as strings).
  void assign(size_t n, char c) { *this = HostBytes(std::string(n, c)); }
  void assign(const char* p, size_t n) { *this = HostBytes(std::string(p, n)); }
  void clear() { *this = HostBytes(); }

 private:
  std::string owned_;
  ShmView view_;
};

// The output in a window of a client's POSIX region (RunMoE's output_shm),
// [M, H] in act_dtype, instead of MoeRunOutput::output. The paths that can
// (the CPU reference, the GPU path, a skipped run) write it there in one
// copy or DMA, only once the layer ran and Writable() says so, and set
// MoeRunOutput::in_place; the others (the expert-parallel group, a launch
// coalescing several calls) leave it in MoeRunOutput::output for the caller
// to copy. Never set while the window overlaps an input's (the caller
// copies after the run: an input is never overwritten while read).
struct MoeHostOutput {
  ShmView view;                     // region null: the output comes back in MoeRunOutput
  std::function<bool()> cancelled;  // the call ended
  bool any() const { return view.region != nullptr; }
  // Asked just before writing the output's `bytes`: CANCELLED once the call
  // ended (its client may reuse the window: no late writes),
  // FAILED_PRECONDITION naming output_shm.region when its object was
  // truncated, INVALID_ARGUMENT naming output_shm.byte_size when the window
  // is not `bytes` long.
  absl::Status Writable(int64_t bytes) const;
  // Writable(bytes), then the output's `bytes` from `src` into the window.
  absl::Status Write(const void* src, int64_t bytes) const;
};

struct MoeRunInput {
  kernels::DType act_dtype = kernels::DType::kBFloat16;  // float32 | float16 | bfloat16
  std::vector<int64_t> hidden_shape;                     // [M, H]
  HostBytes hidden_states;                               // raw bytes
  // Either router logits (fp32 [M, E]) with routing ...
  std::vector<int64_t> logits_shape;
  HostBytes router_logits;
  MoeRouting routing;
  // ... or given top-k ids (int32 [M, k]) and weights (fp32 [M, k]).
  std::vector<int64_t> topk_shape;
  std::string topk_ids, topk_weights;
  bool apply_router_weight_on_input = false;
  // Routed from router_logits (else by a given top-k).
  bool by_logits() const { return !router_logits.empty() || !logits_shape.empty(); }
  // HostBytes::CheckIntact of hidden_states and router_logits (the tensors
  // that may be read in place from a client's window).
  absl::Status CheckIntact() const;
  MoeDeviceTensors device;    // tensors in client CUDA memory, if any
  MoeHostOutput host_output;  // the output into a client's POSIX window, if any
  // Every output row must come out as if its token ran alone, whatever the
  // other rows of the launch (coalesced calls, moe_coalesce.h): the GPU path
  // then picks its kernels without looking at M (MoeLayerArgs::
  // batch_invariant). The CPU reference is row-independent either way.
  bool batch_invariant = false;
  // The GPU path may run a small call as one CUDA graph of its uploads,
  // layer and download (server/moe/gpu_graphs.h); the server's --cuda_graphs.
  bool cuda_graph = false;
};

struct MoeRunOutput {
  std::string output;     // [M, H] in act_dtype; empty when in_place
  bool in_place = false;  // written into MoeRunInput::host_output instead
  int64_t num_tokens = 0;
  int top_k = 0;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  // The experts class that ran, where the layer picks it per call (the GPU
  // layer: GpuLayerExpertsKernel below); "" = the route's own.
  std::string experts_kernel;
};

// What the GPU layer (gpu_layer.cc EnqueueMoeLayer) runs for one call, as
// plain facts: its route depends on the call's slots (M * top_k), so the
// oracle's layer-level choice names it only for some calls.
struct GpuLayerFacts {
  bool quantised = false;  // fp8 / int8 / int4 weights
  // Unquantised: the wgmma kernels take these activations (FastPathFor).
  bool fast_path = false;
  // Quantised: QuantRouteOf for this call's slots (gpu_layer_emulation.h).
  kernels::cuda::MoeQuantRoute quant_route = kernels::cuda::MoeQuantRoute::kEmulation;
  // Quantised on kEmulation: the GEMMs are the e4m3 tensor-core ones (fp8
  // sets with Fp8OnTensorCores and 16-bit activations).
  bool fp8_tensor_cores = false;
};

// The experts class (resolve/oracle/experts.cc, kplan's rows) of what the
// GPU layer runs (here, not in the CUDA files, so that the naming is tested
// on a CPU): KplanExperts (bf16 / fp16 wgmma kernels), KplanFp8Experts
// (e4m3 tensor-core GEMMs), KplanDequantExperts (int weights dequantised:
// into a 16-bit copy for the 16-bit GEMMs, or inside the int4 GEMMs),
// KplanQuantDecodeExperts (the quantised decode
// kernels) or KplanEmulationExperts (the dequantising GEMM).
absl::string_view GpuLayerExpertsKernel(const GpuLayerFacts& facts);

// vLLM's RoutingMethodType names this server routes: Default, Renormalize,
// RenormalizeNaive, Sigmoid, SigmoidRenorm, DeepSeekV3, Llama4, DeepseekV4.
absl::StatusOr<moe::RoutingSpec> RoutingSpecFor(const MoeRouting& routing, int num_experts);

// What the input checks establish, for the CPU and the GPU path alike.
struct MoeRunShape {
  int64_t num_tokens = 0;
  int top_k = 0;
  bool by_logits = false;    // route router_logits, else use the given top-k
  moe::RoutingSpec routing;  // when by_logits; its bias points into the input
};

// Checks `input` against `spec`: shapes, byte sizes, dtypes of the routing
// inputs, top-k ids in range, apply_router_weight_on_input only with k == 1,
// hidden states read in place still there (HostBytes::CheckIntact).
// INVALID_ARGUMENT names the request field (hidden_states.shape,
// router_logits, routing.top_k, topk_ids, ...).
absl::StatusOr<MoeRunShape> CheckMoeRunInput(const ExpertsSpec& spec, const MoeRunInput& input);

// OK when `input` has no tensors in client CUDA memory; else
// FAILED_PRECONDITION naming the first reference: they run only on the GPU
// path, and `where` ("the CPU reference", ...) does not.
absl::Status RefuseDeviceTensors(const MoeRunInput& input, absl::string_view where);

// Checks the input (CheckMoeRunInput) and runs the layer on the CPU; past
// `deadline` the experts stop between row blocks and the answer is
// DEADLINE_EXCEEDED (the server passes the call's deadline). With
// input.host_output the combine writes the output into the window
// (in_place), once the experts ran and if Writable. Tensors in
// client CUDA memory are refused (RefuseDeviceTensors).
absl::StatusOr<MoeRunOutput> RunMoeOnCpu(const ExpertSet& experts, const MoeRunInput& input,
                                         absl::Time deadline = absl::InfiniteFuture());

}  // namespace kplan
