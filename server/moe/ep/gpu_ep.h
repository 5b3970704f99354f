// Expert-parallel MoE on GPUs: the device twin of RunMoeExpertParallel
// (ep_dispatch.h). Each rank is one GPU with its slice of the experts
// resident (GpuExperts::Create(set, device, first, count)), an
// NcclCommunicator on that device and a persistent device workspace; every
// rank calls RunMoeExpertParallelOnGpu from its own thread with its slice of
// the request's tokens (host buffers). The step uploads the slice, routes it
// on the GPU (or takes the given top-k), moves rows between the GPUs with
// NCCL collectives on the communicator's stream, runs the local experts with
// EnqueueMoeLayer (server/moe/gpu_layer.h) and downloads this rank's output.
// Everything between upload and download stays on the device.
//
// Strategies and numerics are the CPU strategies' (ep_dispatch.h):
//  allgather_reducescatter  all-gather of every rank's hidden rows, top-k ids
//      and weights (padded to the largest rank's token count; padding rows
//      carry id -1 and are never computed), the local experts on all tokens
//      (EnqueueMoeLayer with the rank's expert map, combine=false), this
//      rank's slots summed per token in fp32 (LaunchMoeEpCombineFp32),
//      reduce-scatter of the fp32 partials, one rounding to the activation
//      dtype. The combine is then exact for k <= 2 (two-term fp32 sums
//      commute, non-local slots add nothing); with more slots per token the
//      fp32 sum is re-associated (NCCL adds the ranks in its own order).
//  kplan_all2allv  the (token, slot) rows grouped by owning rank on the GPU
//      (LaunchMoeEpPartitionByRank), an all-gather of the per-peer row counts,
//      all-to-all-v of the rows and of their (expert id, weight) pairs, the
//      received rows run as top_k=1 rows (combine=false), all-to-all-v of the
//      unweighted rows back, put back in slot order and combined by
//      LaunchMoeCombine, the single-GPU layer's own combine in slot order.
//  passthrough  (moe_backend kplan_ep) no NCCL collective and no host
//      synchronisation inside the step: the rank's KplanEpTransport
//      (kernels/comm/kplan_ep_transport.h, held by its GpuEpCommunicator)
//      writes each token into the fixed-capacity receive buffer of every rank
//      owning one of its experts, together with the local expert ids of its
//      slots (-1 elsewhere); EnqueueMoeLayer runs the whole receive buffer as
//      n*T tokens of k slots over the local experts (no expert map, ids
//      outside [0, E_local) are skipped, combine=false), Return writes each
//      expert output row back into its source's result rows, and the source
//      combines them with LaunchMoeCombine in slot order. There is no token
//      count agreement: the capacity T (tokens per rank per step) is fixed per
//      transport, taken from the workspace reservation (ReserveGpuEpWorkspace
//      with kPassthrough; kDefaultPassthroughTokens without one), so every
//      rank must reserve the same T (an EpGroup does: its step options carry
//      the largest rank's token count). The only host wait is the final
//      download.
// Both strategies equal RunMoeOnGpu bit for bit (AG-RS: for k <= 2) when the
// rank's EnqueueMoeLayer call picks the same GEMM configuration as the
// single-GPU call: the GEMMs choose their block size and split-K from the
// call's slot count (gpu_layer.cc), and split-K changes the fp32 order of a
// row's dot products, so small calls (decode) may differ by the rounding
// flips another order gives (within moe_layer_gpu_test's bound).
//
// Failures (collective strategies), as on the CPU: every rank first all-gathers (token count,
// verdict on its inputs), so bad input on one rank fails every rank with the
// communicator still usable. After that any CUDA or NCCL error aborts the
// communicator (peers fail at their next collective or its timeout) and the
// caller must build a new group.
//
// Failures (passthrough): checks that depend only on the layer options (the
// same on every rank) fail every rank before anything is launched, the
// communicator untouched. Checks of this rank's own inputs and experts
// (tokens beyond the capacity T, null buffers, top-k ids out of range, an
// expert slice that does not match the placement) cannot reach the peers
// without a host collective, so a rank that fails them still takes part in
// the round with 0 tokens of its own: its peers do not hang in the device
// barrier, it still serves the peers' rows to its experts (or returns zero
// rows when its experts themselves are unusable), and it returns its error
// with the communicator usable. Its peers then return OK with their tokens'
// results; callers must treat the step as failed when any rank failed (an
// EpGroup does: one rank's error fails the step). A host-side failure of a
// rank during its step (an allocation, a refused launch) still completes the
// round, with zero rows from this rank, before the error is returned. A CUDA
// error or a rank that
// never reaches the round leaves the peers spinning in the transport's device
// barrier (no device-side timeout): the group is lost, as with a hung NCCL
// collective. Built only with CUDA and NCCL.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/kplan_ep_transport.h"
#include "kernels/comm/nccl_communicator.h"
#include "server/moe/ep/ep_dispatch.h"
#include "server/moe/ep/ep_placement.h"
#include "server/moe/gpu_runner.h"

namespace kplan::moe::ep {

// Passthrough capacity (tokens per rank per step) when the workspace was
// not reserved for passthrough: a decode-sized batch.
inline constexpr int64_t kDefaultPassthroughTokens = 128;

// A rank's NcclCommunicator together with the passthrough transports built
// on it. Why a wrapper: a KplanEpTransport owns NCCL resources of its
// communicator (a registered window, a device communicator), so it must be
// released before that communicator, and never through an aborted one; the
// wrapper sees every Abort and every failed call, so it destroys its
// transports first while the communicator is healthy and abandons them (their
// NCCL state died with the communicator; only their window memory is freed)
// once it was aborted. One transport per layer configuration (capacity, k, H, E,
// placement), created on the first passthrough step that needs it; creation
// and destruction are collective, and every rank takes the same decisions
// because they depend only on the step's shared layer options and
// reservation. Destroy the ranks' wrappers concurrently (one thread per
// rank), as the collective strategies' communicators are.
class GpuEpCommunicator final : public comm::Communicator {
 public:
  explicit GpuEpCommunicator(std::unique_ptr<comm::NcclCommunicator> nccl);
  ~GpuEpCommunicator() override;

  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  absl::string_view backend() const override { return nccl_->backend(); }
  absl::Status AllGather(const void* send, void* recv, int64_t count,
                         comm::CommDType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, int64_t recv_count,
                             comm::CommDType dtype, comm::ReduceOp op) override;
  absl::Status AllToAllV(const void* send, absl::Span<const int64_t> send_counts,
                         absl::Span<const int64_t> send_displs, void* recv,
                         absl::Span<const int64_t> recv_counts,
                         absl::Span<const int64_t> recv_displs, comm::CommDType dtype) override;
  absl::Status Barrier() override;
  void Abort(absl::string_view reason) override;

  comm::NcclCommunicator& nccl() { return *nccl_; }
  bool aborted() const { return aborted_; }
  // The transport for `config` (identical on every rank), created (a
  // collective) when missing or smaller; a transport of the same shape but a
  // smaller capacity is replaced.
  absl::StatusOr<comm::KplanEpTransport*> Transport(const comm::KplanEpConfig& config);
  int64_t transports_created() const { return transports_created_; }

 private:
  absl::Status Track(absl::Status st);

  std::unique_ptr<comm::NcclCommunicator> nccl_;
  std::vector<std::unique_ptr<comm::KplanEpTransport>> transports_;
  int64_t transports_created_ = 0;
  std::atomic<bool> aborted_{false};  // set by the rank thread or by an abort from another
};

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

  struct Impl;  // gpu_ep.cc

 private:
  friend Impl& WorkspaceImpl(GpuEpWorkspace& ws);
  int device_;
  std::unique_ptr<Impl> impl_;
};

// The layer as one GPU rank sees it: EpLayer's fields, this rank's experts on
// its device and its workspace. The activation and act_dtype must be the
// experts' (the GPU layer runs the ExpertSet's activation with default
// ActivationParams and activations in the weights' dtype).
struct GpuEpLayer {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int num_experts = 0;       // E, global
  int top_k = 0;
  MoeDType act_dtype = MoeDType::kBFloat16;
  MoeActivation activation = MoeActivation::kSilu;
  bool apply_router_weight_on_input = false;  // k must be 1
  ExpertPlacement placement;
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
