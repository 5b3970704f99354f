#include "server/moe/run_moe.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "server/moe/ep/ep_dispatch.h"
#include "server/moe/ep/ep_process.h"
#include "server/moe/moe_coalesce.h"
#include "resolve/oracle/moe_config.h"
#include "resolve/oracle/oracle.h"
#include "resolve/plan/vocabulary.h"
#include "spdlog/spdlog.h"
#if KPLAN_HAVE_CUDA
#include "server/moe/gpu_runner.h"
#endif

namespace kplan {
namespace {

// The plan of a run, for both paths: what ran, where, and for the group its
// strategy and size (ep_size 0 and no all2all_backend on one device).
MoeExecutionPlan MakePlan(std::string backend, std::string experts_kernel, std::string dispatch,
                          std::vector<std::string> devices, std::vector<MoeCandidate> candidates,
                          std::string all2all_backend, int ep_size) {
  MoeExecutionPlan plan;
  plan.backend = std::move(backend);
  plan.experts_kernel = std::move(experts_kernel);
  plan.dispatch = std::move(dispatch);
  plan.devices = std::move(devices);
  plan.candidates = std::move(candidates);
  plan.all2all_backend = std::move(all2all_backend);
  plan.ep_size = ep_size;
  return plan;
}

// A run whose layer is skipped (skip_device): the input checked as the
// runners check it, then zeros of [M, H] (into the host output window when
// there is one) and an empty top-k of [M, k].
absl::StatusOr<MoeRunOutput> SkippedRun(const ExpertsSpec& spec, const MoeRunInput& input) {
  KPLAN_ASSIGN_OR_RETURN(const MoeRunShape shape, CheckMoeRunInput(spec, input));
  const int64_t act_bytes = kernels::DTypeSize(input.act_dtype);
  MoeRunOutput out;
  out.num_tokens = shape.num_tokens;
  out.top_k = shape.top_k;
  const int64_t bytes = shape.num_tokens * spec.hidden * act_bytes;
  if (input.host_output.any()) {  // as the layer would: into the client's window
    KPLAN_RETURN_IF_ERROR(input.host_output.Writable(bytes));
    if (bytes > 0) std::memset(input.host_output.view.data, 0, static_cast<size_t>(bytes));
    out.in_place = true;
  } else {
    out.output.assign(bytes, '\0');
  }
  out.topk_ids.assign(shape.num_tokens * shape.top_k, 0);
  out.topk_weights.assign(shape.num_tokens * shape.top_k, 0.f);
  return out;
}

// The layer of a single-device route on `where`: the CPU reference, or the
// set's GPU copy on the slot's stream.
absl::StatusOr<MoeRunOutput> RunLayer(const ExpertSet& experts, const MoeRunInput& input,
                                      bool use_gpu, const DeviceSlot& where, absl::Time deadline) {
  if (!use_gpu) return RunMoeOnCpu(experts, input, deadline);
  if (!where.status.ok()) return where.status;
  return experts.device_copy()->Run(input, where.stream);
}

// Answers a single-device run with the plan of its route on `where`.
void Answer(absl::StatusOr<MoeRunOutput> out, const MoeRunTiming& timing, const MoeRoute& route,
            bool explain, const DeviceSlot& where, const RunMoeDone& done) {
  if (!out.ok()) {
    done(out.status(), timing);
    return;
  }
  RunMoeResult result;
  result.output = *std::move(out);
  const auto plan_of = [&](const MoeRoute& r) {
    return MakePlan(r.backend, r.experts_kernel, r.plan.prepare_finalize, {where.name},
                    explain ? r.plan.candidates : std::vector<MoeCandidate>{}, "", 0);
  };
  // The layer may have picked another experts class for this call's size.
  const std::string& ran = result.output.experts_kernel;
  result.plan = ran.empty() || ran == route.experts_kernel
                    ? plan_of(route)
                    : plan_of(RouteThatRan(route, ran, result.output.num_tokens));
  done(std::move(result), timing);
}

// RunMoE on the expert-parallel group.
absl::Status RunOnGroup(moe::ep::EpGroup& group, RunMoeRequest request, const RunMoeCall& call,
                        RunMoeDone done) {
  KPLAN_ASSIGN_OR_RETURN(const moe::ep::EpStrategy strategy,
                         ResolveEpStrategy(request.parallel, request.moe_backend, group.kind()));
  // The ranks read their slices on their own threads, each at its own time:
  // a window truncated meanwhile could fail one rank inside a collective the
  // others wait in. The group takes a copy instead (and its output goes to
  // the window through the caller).
  KPLAN_RETURN_IF_ERROR(request.input.CheckIntact());
  for (HostBytes* t : {&request.input.hidden_states, &request.input.router_logits}) {
    if (t->in_place()) *t = std::string(t->bytes());
  }
  const absl::Time queued = absl::Now();
  return group.RunMoe(
      std::move(request.experts), std::move(request.input), strategy, request.return_routing,
      [&group, strategy, queued, done = std::move(done)](
          absl::StatusOr<MoeRunOutput> out, absl::Duration waited, absl::Duration ran) {
        MoeRunTiming timing;
        timing.queue = waited;
        timing.device = ran;
        timing.queued = queued;
        timing.device_end = absl::Now();
        timing.device_start = timing.device_end - ran;
        if (!out.ok()) {
          spdlog::warn("RunMoE on the expert-parallel group: {}", out.status().ToString());
          done(out.status(), timing);
          return;
        }
        const bool passthrough = strategy == moe::ep::EpStrategy::kPassthrough;
        RunMoeResult result;
        result.output = *std::move(out);
        result.plan =
            MakePlan(passthrough ? "kplan_ep" : std::string(group.kind().moe_backend()),
                     passthrough ? "KplanEpExperts" : std::string(group.kind().experts_kernel()),
                     EpDispatchClass(strategy), group.Devices(), {},
                     std::string(moe::ep::EpStrategyName(strategy)), group.size());
        done(std::move(result), timing);
      },
      moe::ep::EpStepLimits{call.deadline, call.cancelled});
}

}  // namespace

int64_t RunMoeHeldBytes(const MoeRunInput& in) {
  // Its inputs, and the output it will make: [M, H] like hidden_states, plus
  // top-k ids and weights of [M, k] with k <= E, at most twice the fp32
  // [M, E] logits (or as large as the given ones). Inputs read in place
  // and an output written into the client's window count too: the
  // server still holds their size (the CPU path's copies, the GPU path's
  // staging and workspace, a coalesced launch's merged batch), and the size
  // of the work decides its lane and whether it may run inline. Sums of
  // received byte counts, so no term can overflow.
  const auto n = [](const auto& s) { return static_cast<int64_t>(s.size()); };
  const int64_t hidden = n(in.hidden_states);
  return 2 * hidden + 3 * n(in.router_logits) + 2 * (n(in.topk_ids) + n(in.topk_weights));
}

std::vector<std::string> ExecutableMoeBackends(bool have_devices) {
  std::vector<std::string> out;
  if (BuildFacts().have_cuda_kernels && have_devices) out.push_back("kplan");
  out.push_back("emulation");
  return out;
}

std::string EpDispatchClass(moe::ep::EpStrategy strategy) {
  // The oracle's prepare/finalize rows (all2all_utils.py): all2all kernels
  // for the group's strategies (an EP group with DP > 1), modular experts;
  // passthrough is the kplan_ep binding (kplan's own experts).
  FusedMoEParallelConfig pc;
  pc.use_ep = true;
  pc.dp_size = 2;
  pc.all2all_backend = std::string(moe::ep::EpStrategyName(strategy));
  ExpertsClass experts;
  experts.kplan_executable = strategy == moe::ep::EpStrategy::kPassthrough;
  absl::StatusOr<PrepareFinalizeChoice> pf = ChoosePrepareFinalize(pc, experts, QuantKey::kNone);
  return pf.ok() ? pf->cls : std::string();
}

absl::StatusOr<moe::ep::EpStrategy> ResolveEpStrategy(const ParallelConfig& requested,
                                                      absl::string_view moe_backend,
                                                      const moe::ep::EpRankKind& kind) {
  std::string runs =
      absl::StrCat(moe::ep::EpStrategyName(moe::ep::EpStrategy::kAllGatherReduceScatter), ", ",
                   moe::ep::EpStrategyName(moe::ep::EpStrategy::kAll2AllV));
  if (kind.runs_passthrough()) {
    absl::StrAppend(&runs, ", ", moe::ep::EpStrategyName(moe::ep::EpStrategy::kPassthrough),
                    " (with moe_backend kplan_ep)");
  }
  ParallelConfig parallel;
  parallel.all2all_backend = requested.all2all_backend;
  if (!DispatchesItself(moe_backend)) {
    if (absl::StatusOr<moe::ep::EpStrategy> s = moe::ep::ParseEpStrategy(parallel.all2all_backend);
        s.ok() && *s != moe::ep::EpStrategy::kPassthrough) {
      return s;
    }
  }
  absl::StatusOr<ParallelConfig> normalized = NormalizeParallelConfig(parallel, nullptr);
  if (!normalized.ok()) return NestField(normalized.status(), "parallel");
  parallel = *std::move(normalized);
  KPLAN_RETURN_IF_ERROR(BindPassthroughAll2AllBackend(moe_backend, parallel, nullptr));
  const std::string& a2a = parallel.all2all_backend;
  if (a2a == kPassthroughAll2AllBackend) {
    if (moe_backend == "kplan_ep" && kind.runs_passthrough()) {
      return moe::ep::EpStrategy::kPassthrough;
    }
    return WithField(
        absl::FailedPreconditionError(absl::StrCat(
            "all2all_backend 'passthrough' (moe_backend '", moe_backend, "') ",
            moe_backend == "kplan_ep"
                ? absl::StrCat("needs the kplan_ep device transport, which this server's "
                               "expert-parallel group (",
                               kind.communicator(), " ranks) does not have")
                : std::string("is the binding of a backend that dispatches itself; the "
                              "self-dispatching backend this server runs is kplan_ep"),
            "; its group runs all2all_backend ", runs)),
        "parallel.all2all_backend");
  }
  absl::StatusOr<moe::ep::EpStrategy> strategy = moe::ep::ParseEpStrategy(a2a);
  if (!strategy.ok()) {
    return WithField(absl::FailedPreconditionError(absl::StrCat(
                         "all2all_backend '", a2a,
                         "' cannot run on this server's expert-parallel group; it runs: ", runs)),
                     "parallel.all2all_backend");
  }
  return strategy;
}

absl::Status RunMoe(const RunMoeEnv& env, RunMoeRequest request, RunMoeCall call, RunMoeDone done) {
  const ExpertSet& set = *request.experts;
  const std::string& backend = request.moe_backend;
  if (const moe::ep::EpPeerExperts* peer = moe::ep::EpPeerExperts::Of(set)) {
    return WithField(
        absl::FailedPreconditionError(absl::StrCat(
            "experts '", set.spec().experts_id, "' are rank ", peer->rank(),
            "'s slice of an expert-parallel group across servers; send RunMoE to its rank 0")),
        "experts_id");
  }
  // Experts placed on the expert-parallel group run there.
  const moe::ep::EpExperts* ep = moe::ep::EpExperts::Of(set);
  if (ep != nullptr && ep->group() == env.ep_group && !request.skip_device) {
    const moe::ep::EpRankKind& kind = env.ep_group->kind();
    const bool fits =
        kind.moe_backend() == "emulation" || request.input.act_dtype == set.spec().dtype;
    // kplan_ep needs the same fit: refusing here is cheaper than every rank
    // failing its own check inside the step (which also rebuilds the group).
    const bool group_backend = backend == "kplan_ep" || backend == kind.moe_backend();
    if ((backend == "auto" || group_backend) && fits) {
      KPLAN_RETURN_IF_ERROR(RefuseDeviceTensors(request.input, "the expert-parallel group"));
      return RunOnGroup(*env.ep_group, std::move(request), call, std::move(done));
    }
    if (group_backend) {
      return WithField(
          absl::FailedPreconditionError(absl::StrCat(
              "moe_backend '", backend, "' runs experts '", set.spec().experts_id,
              "' with activations of the weights' dtype (", WireDTypeName(set.spec().dtype),
              "); got ", WireDTypeName(request.input.act_dtype))),
          "kernel_config.moe_backend");
    }
  }
  // The single-GPU copy, when there is one (never the group's).
  const DeviceExperts* device = ep != nullptr ? nullptr : set.device_copy();
  // The oracle loop on this server's platform over the backends it runs
  // (moe_route.h): KPLAN takes the fast kernels, EMULATION the GPU emulation
  // route or the CPU reference.
  MoeResidency residency;
  residency.on_gpu = device != nullptr;
  residency.fast_path = device != nullptr && device->FastPathFor(request.input.act_dtype);
  absl::StatusOr<std::shared_ptr<const MoeRoute>> route;
  if (env.routes != nullptr) {
    route = env.routes->Choose(request.experts, request.input, backend, residency, *env.platform,
                               env.executable_backends);
  } else if (absl::StatusOr<MoeRoute> chosen =
                 ChooseMoeRoute(set.spec(), request.input, backend, residency, *env.platform,
                                env.executable_backends);
             chosen.ok()) {
    route = std::make_shared<const MoeRoute>(*std::move(chosen));
  } else {
    route = chosen.status();
  }
  if (!route.ok()) {
    absl::Status s = route.status();
    if (FieldOf(s) == "moe_backend") s = NestField(s, "kernel_config");
    return s;
  }
  const MoeRoute& chosen = **route;
  if (chosen.kind == MoeRouteKind::kExpertParallel) {
    return WithField(
        absl::FailedPreconditionError(absl::StrCat(
            "moe_backend '", chosen.backend, "' runs on an expert-parallel group; experts '",
            set.spec().experts_id, "' are not placed on one")),
        "kernel_config.moe_backend");
  }
  const bool use_gpu =
      chosen.kind == MoeRouteKind::kGpuFast || chosen.kind == MoeRouteKind::kGpuEmulation;
  if (!use_gpu) KPLAN_RETURN_IF_ERROR(RefuseDeviceTensors(request.input, "the CPU reference"));
  // A skipped layer writes its zeros to the host: a CUDA output would keep
  // the client's stale bytes.
  if (request.skip_device) {
    KPLAN_RETURN_IF_ERROR(RefuseDeviceTensors(request.input, "skip_device (a debug run)"));
  }
  size_t slot = 0;
  if (use_gpu) {
    KPLAN_ASSIGN_OR_RETURN(slot, env.executor->Resolve(device->device_name(), "experts_id"));
    request.input.cuda_graph = env.cuda_graphs;
  }
  if (env.coalescer != nullptr && !request.skip_device) {
    std::optional<std::string> key =
        MoeCoalesceKey(set, chosen, request.input, slot, env.coalescer->options().max_tokens);
    if (key) {
      MoeCoalesceMember member;
      member.input = std::move(request.input);
      member.deadline = call.deadline;
      member.cancelled = std::move(call.cancelled);
      member.fail = std::move(call.fail);
      member.finish = [route = *route, explain = request.explain, done = std::move(done)](
                          absl::StatusOr<MoeRunOutput> out, const MoeRunTiming& timing,
                          const DeviceSlot& where) {
        Answer(std::move(out), timing, *route, explain, where, done);
      };
      env.coalescer->Add(
          *std::move(key), slot,
          [experts = std::move(request.experts), use_gpu](
              const DeviceSlot& where, const MoeRunInput& input, absl::Time deadline) {
            return RunLayer(*experts, input, use_gpu, where, deadline);
          },
          std::move(member));
      return absl::OkStatus();
    }
  }
  DeviceExecutor::Job job;
  job.bytes = RunMoeHeldBytes(request.input);
  job.deadline = call.deadline;
  job.cancelled = std::move(call.cancelled);
  job.fail = call.fail;
  job.inline_ok = use_gpu ? env.inline_gpu : env.inline_cpu;
  // A GPU run only (its kernels do not wait on the deadline, but a CPU run
  // of seconds would outlast the channel's grace for its answer), and at
  // most kInlineLargeMaxBytes: the device workspace and pinned staging are
  // the running thread's, so each channel's thread keeps buffers for the
  // largest call it ran inline (staging of about that size, and the layer's
  // workspace for its tokens, MoeLayerWorkspaceBytes: ~100 MB at Qwen3-30B-
  // A3B's 1700 tokens).
  job.inline_large_ok =
      call.caller_may_block && use_gpu && job.bytes <= RunMoeCall::kInlineLargeMaxBytes;
  // Only a small job's answer is handed over: a large output stays charged
  // to the executor's budget until its worker has sent it.
  TaskPool* answers = job.bytes < DeviceExecutor::kLargeJobBytes ? env.answers : nullptr;
  const absl::Time queued = absl::Now();
  job.work = [experts = std::move(request.experts), input = std::move(request.input),
              deadline = call.deadline, use_gpu, route = *std::move(route), queued,
              explain = request.explain, skip = request.skip_device, answers,
              fail = std::move(call.fail),
              done = std::move(done)](const DeviceSlot& where, absl::Duration waited) mutable {
    MoeRunTiming timing;
    timing.queue = waited;
    timing.queued = queued;
    timing.device_start = absl::Now();
    absl::StatusOr<MoeRunOutput> out = skip ? SkippedRun(experts->spec(), input)
                                            : RunLayer(*experts, input, use_gpu, where, deadline);
    timing.device_end = absl::Now();
    timing.device = timing.device_end - timing.device_start;
    experts.reset();  // the set is let go here, not on an answer thread
    // On a worker (not inline on the caller's thread) the answer goes to the
    // answer threads: sent from the worker it held the device ~30 us a call
    // (docs/PERF.md, session 14).
    if (answers == nullptr || !DeviceExecutor::OnWorkerThread()) {
      Answer(std::move(out), timing, *route, explain, where, done);
      return;
    }
    answers->Run([out = std::make_shared<absl::StatusOr<MoeRunOutput>>(std::move(out)), timing,
                  route, explain, slot = where,
                  done] { Answer(std::move(*out), timing, *route, explain, slot, done); },
                 fail);
  };
  return env.executor->Submit(slot, std::move(job));
}

absl::Status AttachGpuCopy(ExpertSet& set, int device) {
#if KPLAN_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<GpuExperts>> gpu = GpuExperts::Create(set, device);
  if (absl::IsFailedPrecondition(gpu.status())) {
    spdlog::info("LoadExperts '{}': stays on the CPU path: {}", set.spec().experts_id,
                 std::string(gpu.status().message()));
    return absl::OkStatus();
  }
  if (!gpu.ok()) return gpu.status();
  set.AttachDeviceCopy(std::move(*gpu));
#else
  (void)set;
  (void)device;
#endif
  return absl::OkStatus();
}

const MoeBuildFacts& BuildFacts() {
  static const MoeBuildFacts facts{
      .have_cuda_kernels = KPLAN_HAVE_CUDA_KERNELS != 0,
      .cuda_version = KPLAN_BUILD_CUDA_VERSION,
      .nccl_version = KPLAN_BUILD_NCCL_VERSION,
      .cuda_architectures = KPLAN_BUILD_CUDA_ARCHITECTURES,
  };
  return facts;
}

}  // namespace kplan
