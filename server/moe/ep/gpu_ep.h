// Expert-parallel MoE on GPUs: the device twin of RunMoeExpertParallel
// (ep_dispatch.h). Each rank is one GPU with its slice of the experts
// resident (GpuExperts), a GpuEpCommunicator (or NcclCommunicator) on that
// device and a persistent GpuEpWorkspace; every rank calls
// RunMoeExpertParallelOnGpu from its own thread with its slice of the
// request's tokens (host buffers), and everything between upload and
// download stays on the device. The strategies are the CPU ones
// (allgather_reducescatter, kplan_all2allv) plus passthrough over the
// kplan_ep transport, one file each (gpu_ep_<strategy>.cc). docs/EP.md
// ("GPU strategies", "Failures") has their numerics and failure semantics.
// Built only with CUDA and NCCL.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/comm/nccl_communicator.h"
#include "server/moe/ep/ep_dispatch.h"
#include "server/moe/ep/ep_placement.h"
#include "server/moe/ep/gpu_ep_communicator.h"
#include "server/moe/gpu_runner.h"

namespace kplan::moe::ep {

// Passthrough capacity (tokens per rank per step) when the workspace was
// not reserved for passthrough: a decode-sized batch.
inline constexpr int64_t kDefaultPassthroughTokens = 128;

// The device buffers of one rank's steps: inputs, gathered / exchanged rows,
// the layer's workspace, output, events. Each buffer grows (cudaMalloc, after
// the device is idle) when a step needs more than it holds and is kept, so a
// steady stream of steps no larger than the largest seen allocates nothing.
// Reserve() sizes everything up front for a token bound. One per rank and
// device; not thread-safe (a rank's steps are sequential).
class GpuEpWorkspace {
 public:
  explicit GpuEpWorkspace(int device);
  ~GpuEpWorkspace();
  GpuEpWorkspace(const GpuEpWorkspace&) = delete;
  GpuEpWorkspace& operator=(const GpuEpWorkspace&) = delete;

  int device() const { return device_; }
  int64_t bytes() const;    // allocated now
  int allocations() const;  // cudaMalloc calls so far

  struct Impl;  // gpu_ep_step.h

 private:
  friend Impl& WorkspaceImpl(GpuEpWorkspace& ws);
  int device_;
  std::unique_ptr<Impl> impl_;
};

// The layer as one GPU rank sees it: EpLayer's shape and options (hidden,
// intermediate, num_experts, top_k, act_dtype, activation,
// apply_router_weight_on_input, placement), this rank's experts on its device
// and its workspace. The activation and act_dtype must be the experts' (the
// GPU layer runs the ExpertSet's activation with default ActivationParams and
// activations in the weights' dtype); EpLayer's CPU fields (act_params,
// local_weights, num_threads) are not read.
struct GpuEpLayer : EpLayer {
  // Experts [placement.FirstExpert(rank), +NumLocalExperts(rank)) resident on
  // this rank's device; null on a rank that owns none.
  const GpuExperts* local_experts = nullptr;
  GpuEpWorkspace* workspace = nullptr;  // required; its device is the rank's
};

// Sizes `layer.workspace` for steps of up to max_tokens_per_rank tokens on
// every rank with `strategy` (worst case: every slot of every rank routed to
// this rank), so such steps allocate nothing. Optional for the collective
// strategies. For passthrough it also sets the transport capacity T of later
// steps to the largest max_tokens_per_rank reserved so far (every rank must
// reserve the same; without a reservation T = kDefaultPassthroughTokens).
absl::Status ReserveGpuEpWorkspace(const GpuEpLayer& layer, int num_ranks,
                                   int64_t max_tokens_per_rank, EpStrategy strategy);

// What one step did on this rank. Times are CUDA events on the
// communicator's stream in ms; the NCCL calls synchronise the host, so the
// host's work between them is inside the stage times.
struct GpuEpStats {
  float prologue_ms = 0;  // header exchange, uploads, routing
  float dispatch_ms = 0;  // rows to the experts' ranks (and the counts / layout work)
  float experts_ms = 0;   // EnqueueMoeLayer on the local rows
  float combine_ms = 0;   // results back to the tokens' owners, combine, cast
  float download_ms = 0;  // output to the host
  float total_ms = 0;
  // Payload bytes this rank sent to other ranks (not to itself) in the
  // dispatch and the combine collectives; received likewise. Passthrough
  // counts from this rank's own top-k ids: dispatch_bytes_sent (one row plus
  // k ids per token and remote destination rank) and combine_bytes_received
  // (one row per remote slot); the other two stay 0 (they depend on the
  // peers' ids, which the host never sees).
  int64_t dispatch_bytes_sent = 0, dispatch_bytes_received = 0;
  int64_t combine_bytes_sent = 0, combine_bytes_received = 0;
  int64_t rows_computed = 0;  // rows (token slots) given to EnqueueMoeLayer
  int64_t workspace_bytes = 0;
  int workspace_allocations = 0;  // cumulative, for the steady-state check
};

// Runs one MoE layer step on this rank. `comm` must be an NcclCommunicator
// or a GpuEpCommunicator on layer.workspace->device() (passthrough needs the
// latter; INVALID_ARGUMENT otherwise, after aborting it so peers do not
// wait); `inputs` holds host pointers (this rank's tokens;
// routing.e_score_correction_bias is a host pointer too). Writes
// inputs.output. Every rank passes the same layer options and strategy.
absl::Status RunMoeExpertParallelOnGpu(const GpuEpLayer& layer_on_this_rank,
                                       const MoeInputsForThisRank& inputs, comm::Communicator& comm,
                                       EpStrategy strategy, GpuEpStats* stats = nullptr);

}  // namespace kplan::moe::ep
