// The GPU path of a fused MoE layer: a device-resident copy of an ExpertSet
// (GpuExperts) and RunMoeOnGpu, which runs the same layer as RunMoeOnCpu
// (moe_runner.h) with the launchers of kernels/cuda/moe/moe_ops.h (routing,
// moe_align_block_size) and kernels/cuda/moe/moe_experts.h (grouped GEMMs,
// activation, combine). Built only with CUDA (KPLAN_HAVE_CUDA); this header
// itself needs no CUDA headers (streams travel as void*).
//
// Scope: every weight / activation combination of the CPU reference:
// unquantised fp32 / fp16 / bf16 weights, fp8 e4m3 with per-tensor,
// per-channel or block scales (activations quantised per token, per tensor
// or per 1 x block_k group), int8 / int4 with group scales (with or without
// zero points); fp32, fp16 or bf16 activations. bf16 / fp16 weights with
// activations of their dtype run the fast kplan kernels (moe_experts.h);
// everything else the emulation route (moe_quant_gemm.h: weights resident
// in their stored form, dequantised in the GEMM; for quantised sets with
// bf16 / fp16 activations the decode kernels at decode sizes, or for int8 /
// int4 at larger batches the hit experts dequantised into the workspace for
// the fast kernels: kernels/cuda/moe/moe_quant_route.h). Optional biases, every
// activation of the CPU reference with default ActivationParams, routing
// from logits (every method of RoutingSpecFor) or given top-k ids / weights,
// apply_router_weight_on_input (top_k = 1), no expert map (all experts local).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_runner.h"

namespace kplan {

// Device copy of an ExpertSet's w13 / w2 (and biases) on one device. Owns
// the memory; freed on destruction.
class GpuExperts final : public DeviceExperts {
 public:
  // Copies the set's tensors to `device` (synchronously), quantised ones as
  // stored. FAILED_PRECONDITION for what the GPU path does not run (hidden or
  // intermediate not a multiple of 8, or a quantisation the CPU reference
  // rejects, such as fp8 block scales with per-token activation scales: the
  // CPU path then reports it per request); INVALID_ARGUMENT for a set missing a
  // tensor; RESOURCE_EXHAUSTED when the device is out of memory (everything
  // allocated so far is freed).
  static absl::StatusOr<std::unique_ptr<GpuExperts>> Create(const ExpertSet& set, int device);
  // Copies only experts [first_expert, first_expert + num_experts) of the set:
  // one expert-parallel rank's slice (server/moe/ep/gpu_ep.h). spec().num_experts
  // is then num_experts and local expert i is the set's first_expert + i.
  // INVALID_ARGUMENT for a range outside the set.
  static absl::StatusOr<std::unique_ptr<GpuExperts>> Create(const ExpertSet& set, int device,
                                                            int first_expert, int num_experts);
  ~GpuExperts();
  GpuExperts(const GpuExperts&) = delete;
  GpuExperts& operator=(const GpuExperts&) = delete;

  const ExpertsSpec& spec() const { return spec_; }
  moe::MoeActivation activation() const { return activation_; }
  int device() const { return device_; }
  int first_expert() const { return first_expert_; }  // in the ExpertSet; 0 unless a slice
  int64_t n13() const;  // rows of w13 per expert: 2I gated, I for _no_mul
  int64_t bytes() const { return bytes_; }
  std::string device_name() const override;
  int64_t device_bytes() const override { return bytes_; }
  // Device pointers.
  const void* w13() const { return w13_; }
  const void* w2() const { return w2_; }
  const float* b13() const { return b13_; }  // null without bias
  const float* b2() const { return b2_; }
  // Quantised sets: w13 / w2 stay in their stored form (fp8 / int8 / packed
  // int4 bytes) beside their fp32 scales and, for int8 / int4 with zero
  // points, uint8 zero points, shaped as ExpectedTensors says. Null otherwise.
  const float* w13_scale() const { return w13_scale_; }
  const float* w2_scale() const { return w2_scale_; }
  const uint8_t* w13_zero() const { return w13_zero_; }
  const uint8_t* w2_zero() const { return w2_zero_; }
  // True when activations of `act_dtype` run on kplan's kernels (moe_backend
  // kplan): unquantised bf16 / fp16 weights with activations in their dtype
  // (moe_experts.h, wgmma), fp8 sets with bf16 / fp16 activations where
  // Fp8OnTensorCores(), and int8 / int4 sets with bf16 / fp16 activations
  // that the decode kernels or the dequant route take (IntKernelsApply);
  // every other combination runs the emulation route (kernels/cuda/moe/
  // moe_quant_gemm.h: dequantise in the GEMM). Which kernels run a call
  // depends on its size too (GpuLayerFactsOf).
  bool FastPathFor(kernels::DType act_dtype) const override;
  // RunMoeOnGpu(*this, input, stream).
  absl::StatusOr<MoeRunOutput> Run(const MoeRunInput& input, void* stream) const override;
  // fp8 per-tensor / per-channel, or 128 x 128 block scales, with hidden and
  // intermediate multiples of 16: the GEMMs multiply e4m3 on tensor cores.
  bool Fp8OnTensorCores() const;

 private:
  GpuExperts() = default;
  ExpertsSpec spec_;
  moe::MoeActivation activation_ = moe::MoeActivation::kSilu;
  int device_ = 0;
  int first_expert_ = 0;
  int64_t bytes_ = 0;
  void* w13_ = nullptr;
  void* w2_ = nullptr;
  float* b13_ = nullptr;
  float* b2_ = nullptr;
  float* w13_scale_ = nullptr;
  float* w2_scale_ = nullptr;
  uint8_t* w13_zero_ = nullptr;
  uint8_t* w2_zero_ = nullptr;
};

struct GpuRunOptions {
  // Fill the whole per-call workspace (intermediates and output) with 0xff
  // (NaN in bf16 / fp16) before running: any element the kernels fail to
  // write, or that reads an unwritten one, comes back as NaN. For tests.
  bool poison_workspace = false;
  // A graph-sized call (MoeRunInput::cuda_graph) with no tensor in client
  // device memory moves its upload and download by SM copy kernels through
  // the pinned buffer's device mapping (kernels::cuda::LaunchMoeStageCopy)
  // instead of the copy engines: same bits, faster on an H200
  // (bench/moe_hop_bench, docs/PERF.md session 29). false: the copy engines
  // (the A/B).
  bool stage_by_sm = true;
};

struct GpuRunStats {
  // Device time from after the uploads to before the downloads (routing,
  // align, GEMMs, activation, combine), by CUDA events.
  float device_ms = 0.0f;
  int64_t workspace_bytes = 0;
  // What the layer ran (GpuLayerFactsOf): the quantised route among them,
  // which the experts kernel's name does not tell apart (matvec and decode
  // tiles are both KplanQuantDecodeExperts).
  GpuLayerFacts layer;
};

// Runs the layer on experts.device() on `stream` (a cudaStream_t; null = the
// legacy default stream): upload of hidden states and logits (or ids and
// weights), routing, moe_align_block_size (block MoeGemmBlockMFor), GEMM 1,
// activation, GEMM 2, combine, download of the output and the routing; one
// synchronisation at the end (two when the output goes to client memory:
// it is written there only once the layer ran and the call stands; a POSIX
// window the server pinned is read and written by DMA, an unpinned one
// through the pinned staging buffer). Input errors are those of RunMoeOnCpu
// (INVALID_ARGUMENT naming the request field); act_dtype is fp32, fp16 or
// bf16 whatever the weights' dtype. The workspace and the pinned staging
// buffer are the calling thread's, kept across calls and grown on demand;
// with input.cuda_graph, a call of up to kMoeGraphMaxTokens tokens with host
// tensors, on a stream other than the legacy one and without `stats`, runs
// as one CUDA graph per shape (gpu_graphs.h), captured at its second call.
absl::StatusOr<MoeRunOutput> RunMoeOnGpu(const GpuExperts& experts, const MoeRunInput& input,
                                         void* stream, const GpuRunOptions& options = {},
                                         GpuRunStats* stats = nullptr);

// How many RunMoeOnGpu calls of the calling thread replayed a CUDA graph
// (tests: that the graphed path ran, not only that results agree).
int64_t MoeGraphLaunchesOnThisThread();

}  // namespace kplan
