// RunMoE's decision and execution, without gRPC (ARCHITECTURE.md "RunMoE"):
// which path runs a request on a resident expert set (the expert-parallel
// group, or the oracle's route: the GPU fast kernels, the GPU emulation
// route, the CPU reference), the group's dispatch strategy as vLLM resolves
// parallel.all2all_backend, the queueing on the device workers, and the
// execution plan and timing of the answer. The RPC handler converts the
// request into a RunMoeRequest, calls RunMoe, and converts the RunMoeResult
// back; metrics stay with the handler (RunMoe reports the durations).
//
// Device-specific work goes through the set's DeviceExperts interface
// (FastPathFor, Run), so this file and its callers need no device types.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/exec/device_executor.h"
#include "server/exec/task_pool.h"
#include "server/moe/ep/ep_group.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_route.h"
#include "server/moe/moe_runner.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/platform/platform.h"

namespace kplan {

class MoeCoalescer;  // moe_coalesce.h

// What this server needs to run a RunMoE (borrowed; outlives every call).
struct RunMoeEnv {
  DeviceExecutor* executor = nullptr;
  // The expert-parallel group serving RunMoE; null when there is none.
  moe::ep::EpGroup* ep_group = nullptr;
  const Platform* platform = nullptr;  // the server's own, as the oracle sees it
  // The moe_backend values this server runs (ExecutableMoeBackends).
  std::vector<std::string> executable_backends;
  // Routes chosen before (moe_route.h); null: every call asks the oracle.
  MoeRouteCache* routes = nullptr;
  // Small runs on a GPU (on the CPU) may run on the calling thread when the
  // device's worker is idle (DeviceExecutor::Job::inline_ok): `done` has
  // then been called when RunMoe returns.
  bool inline_gpu = false;
  bool inline_cpu = false;
  // Small GPU runs as CUDA graphs (MoeRunInput::cuda_graph).
  bool cuda_graphs = false;
  // Single-device calls that may share a launch go through it (never
  // inline); null: coalescing off.
  MoeCoalescer* coalescer = nullptr;
  // Answers (encode, send) calls whose layer ran on a device worker, so
  // the worker takes its next job at once; null: the worker answers. It
  // must outlive the executor's queued work.
  TaskPool* answers = nullptr;
};

// A request, converted and resolved: the set it runs on (from the store),
// the input, kernel_config.moe_backend as NormalizeMoeBackend made it, the
// request's parallel config (only all2all_backend is read: left at its
// default when the request set none), and whether the routing comes back.
struct RunMoeRequest {
  std::shared_ptr<const ExpertSet> experts;
  MoeRunInput input;
  std::string moe_backend = "auto";
  ParallelConfig parallel;
  bool return_routing = false;
  // The oracle's candidates and their reasons in the plan (the request's
  // `explain`); left out otherwise.
  bool explain = false;
  // Take the whole path but leave the layer out: zeros of [M, H] after the
  // input checks (the request's skip_device; the caller decides whether it
  // is honoured). Not on the expert-parallel group.
  bool skip_device = false;
};

// The call's side of a device job (DeviceExecutor::Job): its deadline, a
// predicate for the caller having given up, and `fail`, which finishes the
// call when a queued job is dropped or throws (`done` is then not called).
struct RunMoeCall {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;
  std::function<void(const absl::Status&)> fail;
  // The calling thread may be held for the whole run (a shared-memory
  // channel's own thread): an idle GPU runs a large call of up to
  // kInlineLargeMaxBytes (RunMoeHeldBytes; 512 tokens of Qwen3-30B-A3B are
  // ~5 MB) there too (DeviceExecutor::Job::inline_large_ok) instead of
  // waking its worker. That thread then keeps the call's workspace (see
  // run_moe.cc).
  bool caller_may_block = false;
  static constexpr int64_t kInlineLargeMaxBytes = int64_t{16} << 20;
};

// How the answer ran, as RunMoEResponse.plan reports it.
struct MoeExecutionPlan {
  std::string backend;         // kplan | emulation | kplan_ep | the group's
  std::string experts_kernel;  // the experts class that ran
  std::string dispatch;        // the prepare/finalize class
  std::vector<std::string> devices;
  std::vector<MoeCandidate> candidates;  // the oracle's (single-device path only)
  std::string all2all_backend;           // the group's strategy; "" on one device
  int ep_size = 0;                       // the group's size; 0 on one device
};

// Where the time went: waiting in the queue, then running; and when each
// hop happened (InfinitePast for one not taken): routed and queued, taken by
// a worker, the output on the host.
struct MoeRunTiming {
  absl::Duration queue = absl::ZeroDuration();
  absl::Duration device = absl::ZeroDuration();
  absl::Time queued = absl::InfinitePast();
  absl::Time device_start = absl::InfinitePast();
  absl::Time device_end = absl::InfinitePast();
  // The requests of the launch it ran in (the coalescer: 1 alone, n > 1
  // merged); 0 when it did not go through the coalescer.
  int coalesced_requests = 0;
};

struct RunMoeResult {
  MoeRunOutput output;
  MoeExecutionPlan plan;
};

// Called once the layer ran (or failed where it ran), from a device worker or
// a group thread, with the durations of that run either way.
using RunMoeDone = std::function<void(absl::StatusOr<RunMoeResult>, const MoeRunTiming&)>;

// Runs `request` (see the file comment). Errors found before anything is
// queued (the request's placement, backend and input checks, a full queue)
// return here and `done` is never called; otherwise `done` gets the result.
// Experts placed on env.ep_group run there when moe_backend is auto, kplan_ep
// or the group's own backend and the activations fit; experts that are a
// peer rank's slice of a group across servers are FAILED_PRECONDITION; the
// rest take ChooseMoeRoute on env.platform over env.executable_backends.
// Field names are the RunMoERequest's (kernel_config.moe_backend, experts_id,
// parallel.all2all_backend, ...).
absl::Status RunMoe(const RunMoeEnv& env, RunMoeRequest request, RunMoeCall call, RunMoeDone done);

// The moe_backend values this server runs: "kplan" when the build has the
// CUDA kernels and the server was given devices, and "emulation".
std::vector<std::string> ExecutableMoeBackends(bool have_devices);

// The dispatch of an expert-parallel RunMoE: parallel.all2all_backend as
// vLLM resolves it (Literal check, the removed values' fallback, the
// passthrough binding of self-dispatching backends), then what a group of
// `kind` runs. kplan_all2allv is accepted before the vLLM vocabulary check,
// since it is ours. passthrough runs only as the binding of moe_backend
// kplan_ep, on a group whose ranks have the device transport (GPU ranks of
// one process). FAILED_PRECONDITION naming parallel.all2all_backend
// otherwise; vLLM's errors nest under "parallel".
absl::StatusOr<moe::ep::EpStrategy> ResolveEpStrategy(const ParallelConfig& parallel,
                                                      absl::string_view moe_backend,
                                                      const moe::ep::EpRankKind& kind);

// The prepare/finalize class each expert-parallel dispatch stands for, as
// the plan reports it: the oracle's row for the strategy's all2all backend
// (ChoosePrepareFinalize: vLLM's name for vLLM's strategy, ours for ours).
std::string EpDispatchClass(moe::ep::EpStrategy strategy);

// What a queued RunMoE holds, for the executor's queued-bytes budget.
int64_t RunMoeHeldBytes(const MoeRunInput& input);

// Makes the set resident on `device` too (LoadExperts, on that device's
// worker), when the GPU path can run it (every combination the CPU reference
// runs, with hidden and intermediate multiples of 8); a set it cannot run
// stays on the CPU (OK, logged). Without CUDA in the build: OK, nothing done.
absl::Status AttachGpuCopy(ExpertSet& set, int device);

// Whether this build has the CUDA kernels, and the toolkit facts the server
// reports (GetServerInfo's BuildInfo); "" without CUDA / NCCL.
struct MoeBuildFacts {
  bool have_cuda_kernels = false;
  std::string cuda_version;
  std::string nccl_version;
  std::string cuda_architectures;
};
const MoeBuildFacts& BuildFacts();

}  // namespace kplan
