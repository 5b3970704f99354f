// KernelPlanService's MoE execution RPCs: LoadExperts (a client stream),
// UnloadExperts, ListExperts and RunMoE. Loading and running happen on the
// device workers; handlers only convert and queue.
#include <exception>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/moe/ep/ep_group.h"
#include "server/moe/expert_loader.h"
#include "server/moe/model_files.h"
#include "server/moe/moe_runner.h"
#include "server/moe/run_moe.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/plan/vocabulary.h"
#include "server/rpc/call.h"
#include "server/rpc/ep_multihost.h"
#include "server/rpc/idle_watchdog.h"
#include "server/rpc/logging.h"
#include "server/rpc/moe_convert.h"
#include "server/rpc/preload.h"
#include "server/rpc/service.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

// Publishes expert usage per device to the metrics.
void UpdateExpertMetrics(const ServerEnvironment& env) {
  if (env.metrics == nullptr) return;
  env.metrics->SetExperts("cpu", 0, 0);
  for (const auto& [device, usage] : env.experts->UsageByDevice()) {
    env.metrics->SetExperts(device, usage.first, static_cast<double>(usage.second));
  }
  std::map<std::string, double> sets;
  for (const auto& set : env.experts->List()) {
    sets[set->spec().experts_id] = static_cast<double>(set->bytes());
  }
  env.metrics->SetExpertSets(sets);
}

void FillSpec(const ExpertsSpec& s, v1::ExpertsInfo* out) {
  out->set_experts_id(s.experts_id);
  out->set_num_experts(s.num_experts);
  out->set_hidden_size(static_cast<int32_t>(s.hidden));
  out->set_intermediate_size(static_cast<int32_t>(s.intermediate));
  out->set_activation(s.activation);
  out->set_dtype(ProtoDTypeFromWire(WireDTypeName(s.dtype)));
  out->set_quantization(s.quant.scheme);
}

// A load under way, as ListExperts shows it.
void FillLoading(const ExpertStore::Loading& load, v1::ExpertsInfo* out) {
  FillSpec(load.spec, out);
  out->set_bytes(load.bytes);
  out->set_state(v1::EXPERTS_STATE_LOADING);
  v1::ExpertsLoadProgress* p = out->mutable_progress();
  const LoadProgress::Done done = load.progress ? load.progress->done() : LoadProgress::Done();
  p->set_bytes_done(done.bytes);
  // The count bytes_done runs toward (the reservation until it is known).
  p->set_bytes_total(done.bytes_total > 0 ? done.bytes_total : load.bytes);
  p->set_experts_done(done.experts);
  p->set_experts_total(load.spec.num_experts);
  p->set_preload(load.preload);
}

void FillInfo(const ExpertSet& set, v1::ExpertsInfo* out) {
  FillSpec(set.spec(), out);
  out->set_bytes(set.bytes());
  out->set_state(v1::EXPERTS_STATE_READY);
  for (const ExpertsPlacement& p : set.placement()) {
    v1::ExpertsPlacement* o = out->add_placement();
    o->set_device(p.device);
    o->set_first_expert(p.first_expert);
    o->set_num_experts(p.num_experts);
    o->set_bytes(p.bytes);
  }
  if (const moe::ep::EpExperts* ep = moe::ep::EpExperts::Of(set)) {
    for (const moe::ep::EpShard& shard : ep->shards()) {
      v1::ExpertShard* o = out->add_shards();
      o->set_rank(shard.rank);
      o->set_device(shard.device);
      o->set_first_expert(shard.first_expert);
      o->set_num_experts(shard.num_experts);
      o->set_bytes(shard.bytes);
    }
  }
  if (const moe::ep::EpPeerExperts* peer = moe::ep::EpPeerExperts::Of(set)) {
    v1::ExpertShard* o = out->add_shards();
    o->set_rank(peer->rank());
    o->set_device(peer->device());
    o->set_first_expert(peer->placement().FirstExpert(peer->rank()));
    o->set_num_experts(peer->placement().NumLocalExperts(peer->rank()));
    o->set_bytes(peer->experts().bytes());
  }
}

// LoadExperts: the header, then chunks (or nothing, for a safetensors file).
// Nothing reaches the store until the whole set is complete and checked.
//
// What a client can hold is bounded: the header reserves the set's bytes and
// its id in the store (ExpertStore::Reserve) before any chunk is buffered; a
// stream that sends nothing for --load_idle_timeout is ended by the server's
// IdleWatchdog; a client that cancels, or whose deadline passes, even after
// its last chunk while the set is being built, leaves nothing behind (the
// commit checks before it stores). Whatever ends the call first finishes it
// (finished_), and releases the reservation before the client hears back.
//
// Threads: gRPC's reactions (OnReadDone, OnCancel), the watchdog (Expire)
// and the device workers (the commit jobs) all reach this object; mu_
// serialises them. Jobs and placement callbacks keep it alive (pending_)
// past OnDone, so a commit still queued when the call ended finds it.
// Lock order: the watchdog's lock, then mu_; nothing calls the watchdog
// while holding mu_.
//
// Messages arrive as raw bytes (raw_service.h) and are parsed here: a message
// that does not parse ends the load with INVALID_ARGUMENT naming its index.
absl::Status LoadCancelled() {
  return absl::CancelledError("the client cancelled LoadExperts; nothing was loaded");
}

class LoadExpertsReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  LoadExpertsReactor(const ServerEnvironment& env, grpc::CallbackServerContext* context,
                     v1::LoadExpertsResponse* response)
      : call_(env, context, "LoadExperts", /*unary=*/false),
        context_(context),
        response_(response),
        watchdog_(env.load_watchdog) {
    if (absl::Status auth = call_.Authorize(); !auth.ok()) {
      watchdog_ = nullptr;
      std::lock_guard<std::mutex> lock(mu_);
      FinishLocked(auth);
      return;
    }
    if (watchdog_ != nullptr) watch_ = watchdog_->Watch([this] { Expire(); });
    StartRead(&raw_request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side (commit), or the call ended
      StopWatching();
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      if (context_->IsCancelled()) {
        FinishLocked(LoadCancelled());
        return;
      }
      CommitLocked();
      return;
    }
    if (watchdog_ != nullptr) watchdog_->Touch(watch_);
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;  // expired meanwhile
    absl::Status s;
    // Chunks size buffers the client chose (bounded by the reservation); no
    // exception may leave a gRPC thread.
    try {
      if (grpc::SerializationTraits<v1::LoadExpertsRequest>::Deserialize(&raw_request_, &request_)
              .ok()) {
        s = HandleLocked();
      } else {
        s = absl::InvalidArgumentError(absl::StrCat(
            "message ", messages_, " of the stream is not a valid kplan.v1.LoadExpertsRequest"));
      }
      ++messages_;
    } catch (const std::exception&) {  // std::bad_alloc included
      s = StatusOfCurrentException(
          absl::StrCat("buffering experts '", ClientText(spec_ ? spec_->experts_id : ""), "'"),
          "LoadExperts failed");
    }
    if (!s.ok()) {
      FinishLocked(s);
      return;
    }
    StartRead(&raw_request_);
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(LoadCancelled());
  }

  void OnDone() override {
    StopWatching();
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      last = pending_ == 0;
    }
    if (last) delete this;
  }

 private:
  // The watchdog: nothing arrived for --load_idle_timeout.
  void Expire() {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(absl::DeadlineExceededError(
        absl::StrCat("LoadExperts sent nothing for ", absl::FormatDuration(watchdog_->timeout()),
                     " (--load_idle_timeout); the load was dropped")));
  }

  void StopWatching() {
    if (watchdog_ != nullptr) {
      watchdog_->Unwatch(watch_);
      watchdog_ = nullptr;
    }
  }

  absl::Status HandleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (request_.has_header()) {
      if (spec_) return InvalidField("header", "the header must come once, first");
      KPLAN_ASSIGN_OR_RETURN(ExpertsSpec spec, ExpertsSpecFromProto(request_.header()));
      KPLAN_RETURN_IF_ERROR(ValidateExpertsSpec(spec));
      KPLAN_ASSIGN_OR_RETURN(const int64_t bytes, ExpectedBytes(spec));
      if (request_.header().has_safetensors()) {
        const v1::SafetensorsSource& st = request_.header().safetensors();
        safetensors_path_ = st.path();
        names_ = SafetensorsNames{st.w13(), st.w2(), st.gate_proj(), st.up_proj(), st.down_proj()};
        if (safetensors_path_.empty()) {
          return InvalidField("header.safetensors.path", "the safetensors path is empty");
        }
        // Refused at once rather than on the worker: nothing is opened.
        if (call_.env().model_roots.empty()) {
          return WithField(absl::PermissionDeniedError(kServerSideLoadsOff),
                           "header.safetensors.path");
        }
      }
      // Before any buffer exists: the budget and the id are held from here.
      KPLAN_ASSIGN_OR_RETURN(reservation_,
                             call_.env().experts->Reserve(
                                 spec, bytes, FromPreload(*context_, call_.env().preload_token)));
      progress_ = reservation_.progress();
      if (!request_.header().has_safetensors()) {
        loader_ = std::make_unique<ExpertsLoader>(spec, progress_);
      }
      spdlog::info(
          "LoadExperts '{}': {} experts, H={}, I={}, {} bytes from {}", ClientText(spec.experts_id),
          spec.num_experts, spec.hidden, spec.intermediate, bytes,
          safetensors_path_.empty() ? std::string("the stream") : ClientText(safetensors_path_));
      spec_ = std::move(spec);
      return absl::OkStatus();
    }
    if (!spec_) return InvalidField("header", "the first message must be the header");
    if (!loader_) {
      return InvalidField("chunk", "experts loaded from a safetensors file take no chunks");
    }
    v1::TensorChunk& c = *request_.mutable_chunk();
    std::string wire = c.dtype() == v1::DTYPE_UNSPECIFIED ? "" : WireFromProtoDType(c.dtype());
    return loader_->AddChunk(c.name(), wire,
                             std::vector<int64_t>(c.shape().begin(), c.shape().end()), c.offset(),
                             std::move(*c.mutable_data()));
  }

  // A device job of this load: the call's deadline and cancellation, and
  // keeping this object alive until it ran or was dropped. Its bytes are
  // the reservation's, already counted, so it charges the queue nothing.
  DeviceExecutor::Job JobLocked(std::function<void(const DeviceSlot&)> work)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    DeviceExecutor::Job job;
    job.large = true;  // reading or copying a whole set: never ahead of small requests
    job.deadline = call_.deadline();
    job.cancelled = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      return finished_ || context_->IsCancelled();
    };
    job.fail = [this](const absl::Status& status) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        FinishLocked(status);
      }
      Unhold();
    };
    job.work = [this, work = std::move(work)](const DeviceSlot& where, absl::Duration) {
      work(where);
      Unhold();  // last: it may delete this
    };
    return job;
  }

  // Queues `job` with this object held for it; on refusal finishes the call.
  void SubmitLocked(size_t slot, DeviceExecutor::Job job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++pending_;
    absl::Status queued = call_.env().executor->Submit(slot, std::move(job));
    if (!queued.ok()) {
      --pending_;  // never last: gRPC has not called OnDone before Finish
      FinishLocked(queued);
    }
  }

  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_;
  }

  // One job or callback less; deletes this when it was the last and the
  // call is done.
  void Unhold() {
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --pending_ == 0 && done_;
    }
    if (last) delete this;
  }

  void CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!spec_) {
      FinishLocked(InvalidField("header", "the stream ended before the header"));
      return;
    }
    // Reading a file or copying a large set is device-side work: build the
    // host set on the CPU worker, then copy it on the first GPU's worker.
    SubmitLocked(0, JobLocked([this](const DeviceSlot&) { Build(); }));
  }

  // On the CPU worker. The loader and the spec are this job's alone now.
  void Build() {
    absl::StatusOr<std::unique_ptr<ExpertSet>> set =
        loader_ ? loader_->Finish()
                : LoadSafetensors(*spec_, safetensors_path_, names_, call_.env().model_roots,
                                  progress_.get());
    loader_.reset();  // its buffers moved into the set (or are not needed)
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!set.ok()) {
        FinishLocked(set.status());
        return;
      }
      if (finished_) return;  // cancelled or expired while building: drop it
    }
    std::shared_ptr<ExpertSet> shared(std::move(*set));
    if (call_.env().ep_group != nullptr) {
      PlaceOnGroup(*call_.env().ep_group, shared);
      return;
    }
    if (call_.env().ep_peer != nullptr) {
      PlaceOnPeer(*call_.env().ep_peer, shared);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (call_.env().executor->size() < 2) {
      StoreLocked(shared);
      return;
    }
    auto copy = [this, shared](const DeviceSlot& where) {
      absl::Status s = where.status.ok() ? AttachGpuCopy(*shared, where.cuda_device) : where.status;
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok()) {
        FinishLocked(s);
        return;
      }
      StoreLocked(shared);
    };
    SubmitLocked(1, JobLocked(std::move(copy)));
  }

  // Places the set linearly over the expert-parallel group (each rank takes
  // its slice on its own thread), then stores it. A set the group's ranks
  // cannot run (e.g. fp32 weights on GPU ranks) stays on the CPU path.
  void PlaceOnGroup(moe::ep::EpGroup& group, std::shared_ptr<ExpertSet> set) {
    Hold();
    absl::Status queued = group.PlaceExperts(
        set, [this, set](absl::StatusOr<std::unique_ptr<moe::ep::EpExperts>> placed) {
          AttachAndStore(set, std::move(placed));
          Unhold();
        });
    if (!queued.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        FinishLocked(queued);
      }
      Unhold();
    }
  }

  // A peer rank of a group across servers keeps its own slice resident
  // (rank 0 streamed it the whole set); the host copy stays too.
  void PlaceOnPeer(moe::ep::EpPeerRank& peer, std::shared_ptr<ExpertSet> set) {
    Hold();
    peer.PlaceExperts(set,
                      [this, set](absl::StatusOr<std::unique_ptr<moe::ep::EpPeerExperts>> placed) {
                        AttachAndStore(set, std::move(placed));
                        Unhold();
                      });
  }

  // Attaches a placement as the set's device copy and stores the set; a
  // placement the ranks cannot run (FAILED_PRECONDITION) leaves the set on
  // the CPU path.
  template <typename Placed>
  void AttachAndStore(const std::shared_ptr<ExpertSet>& set,
                      absl::StatusOr<std::unique_ptr<Placed>> placed) {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::IsFailedPrecondition(placed.status())) {
      spdlog::info("LoadExperts '{}': stays on the CPU path: {}",
                   ClientText(set->spec().experts_id), std::string(placed.status().message()));
    } else if (!placed.ok()) {
      FinishLocked(placed.status());
      return;
    } else {
      set->AttachDeviceCopy(std::move(*placed));
    }
    StoreLocked(set);
  }

  // Commits the complete set to the store and answers, unless the call
  // ended meanwhile: then the set is dropped and the reservation was released.
  void StoreLocked(std::shared_ptr<const ExpertSet> set) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (context_->IsCancelled()) {
      FinishLocked(LoadCancelled());
      return;
    }
    if (absl::Now() >= call_.deadline()) {
      FinishLocked(absl::DeadlineExceededError(
          "the deadline of LoadExperts passed before the experts were stored; nothing was loaded"));
      return;
    }
    if (absl::Status added = call_.env().experts->Commit(reservation_, set); !added.ok()) {
      FinishLocked(added);
      return;
    }
    UpdateExpertMetrics(call_.env());
    spdlog::info("LoadExperts '{}': loaded, {} bytes, on {}", ClientText(spec_->experts_id),
                 set->bytes(),
                 set->device_copy() ? set->device_copy()->device_name() : std::string("cpu"));
    FillInfo(*set, response_->mutable_experts());
    finished_ = true;
    Finish(call_.Done(absl::OkStatus()));
  }

  // Finishes the call with `status` unless it is finished already; releases
  // the reservation first, so a retry after the answer never finds the id
  // still held.
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    reservation_.Release();
    absl::Status s = status;
    if (FieldOf(s) && !absl::StartsWith(*FieldOf(s), "header") &&
        !absl::StartsWith(*FieldOf(s), "chunk")) {
      s = NestField(s, "header");  // spec fields: header.num_experts, ...
    }
    Finish(call_.Done(s));
  }

  Call call_;
  grpc::CallbackServerContext* const context_;  // not touched once finished_
  v1::LoadExpertsResponse* response_;
  IdleWatchdog* watchdog_;  // null when not watched (or no longer)
  IdleWatchdog::Id watch_ = 0;
  std::mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  int pending_ ABSL_GUARDED_BY(mu_) = 0;    // jobs and callbacks that hold this
  ExpertStore::Reservation reservation_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer raw_request_;
  v1::LoadExpertsRequest request_;  // raw_request_ parsed
  int64_t messages_ = 0;            // parsed so far
  std::optional<ExpertsSpec> spec_;
  std::unique_ptr<ExpertsLoader> loader_;
  // The reservation's, set with it at the header: the loader adds to it
  // (on the CPU worker for a safetensors file) while ListExperts reads it.
  std::shared_ptr<LoadProgress> progress_;
  std::string safetensors_path_;
  SafetensorsNames names_;
};

}  // namespace

std::vector<std::string> ExecutableMoeBackends(const ServerEnvironment& env) {
  return kplan::ExecutableMoeBackends(!env.devices.empty());
}

grpc::ServerReadReactor<grpc::ByteBuffer>* KernelPlanServiceImpl::LoadExpertsStream(
    grpc::CallbackServerContext* context, v1::LoadExpertsResponse* response) {
  return new LoadExpertsReactor(env_, context, response);
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::UnloadExperts(
    grpc::CallbackServerContext* context, const v1::UnloadExpertsRequest* request,
    v1::UnloadExpertsResponse* response) {
  Call call(env_, context, "UnloadExperts");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  absl::StatusOr<int64_t> freed = env_.experts->Remove(request->experts_id());
  if (freed.ok() && env_.routes != nullptr) env_.routes->Invalidate(request->experts_id());
  // Rank 0 of a group across servers unloads the peers' copies too.
  if (freed.ok() && env_.ep_coordinator != nullptr) {
    env_.ep_coordinator->UnloadOnPeers(request->experts_id());
  }
  if (freed.ok()) {
    response->set_bytes_freed(*freed);
    UpdateExpertMetrics(env_);
    spdlog::info("UnloadExperts '{}': {} bytes freed", request->experts_id(), *freed);
  }
  return call.FinishUnary(freed.status());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::ListExperts(
    grpc::CallbackServerContext* context, const v1::ListExpertsRequest* /*request*/,
    v1::ListExpertsResponse* response) {
  Call call(env_, context, "ListExperts");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  for (const auto& set : env_.experts->List()) FillInfo(*set, response->add_experts());
  for (const ExpertStore::Loading& load : env_.experts->Loads()) {
    FillLoading(load, response->add_experts());
  }
  return call.FinishUnary(absl::OkStatus());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::RunMoE(grpc::CallbackServerContext* context,
                                                        const v1::RunMoERequest* request,
                                                        v1::RunMoEResponse* response) {
  auto call = std::make_shared<Call>(env_, context, "RunMoE");
  if (absl::Status auth = call->Authorize(); !auth.ok()) return call->FinishUnary(auth);
  RunMoeSite site;
  site.method = call->method();
  site.start = call->start();
  site.deadline = call->deadline();
  site.cancelled = [call] { return call->IsCancelled(); };
  site.finish = [call](const absl::Status& status) { call->FinishUnary(status); };
  StartRunMoe(*const_cast<v1::RunMoERequest*>(request), response, std::move(site));
  return call->reactor();
}

void KernelPlanServiceImpl::RunMoeFromChannel(ShmChannelServer::Request request,
                                              ShmChannelServer::Answer answer) {
  static const std::string kMethod = "RunMoE.shm_channel";
  auto messages = std::make_shared<std::pair<v1::RunMoERequest, v1::RunMoEResponse>>();
  RunMoeSite site;
  site.method = kMethod;
  site.start = request.start;
  site.deadline = request.deadline;
  site.caller_may_block = true;  // the channel's own thread waits for the answer anyway
  site.cancelled = std::move(request.cancelled);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  site.finish = [this, messages, finished, answer = std::move(answer),
                 start = request.start](const absl::Status& status) {
    if (finished->exchange(true)) return;  // the first outcome answers
    // What the client reads: `status`, unless the answer did not fit.
    const absl::Status outcome = answer(status, &messages->second);
    // The one mapping, as Call::Done records a gRPC call's outcome.
    const std::string code = GrpcCodeName(ToGrpcCode(outcome.code()));
    if (!outcome.ok()) {
      LogFailedCall(env_.failed_call_logs, "RunMoE.shm_channel failed",
                    {{"method", kMethod},
                     {"code", code},
                     {"error", ClientText(outcome.message(), kMaxErrorMessageBytes)},
                     {"field", ClientText(FieldOf(outcome).value_or("-"))}});
    }
    if (env_.metrics) env_.metrics->RequestFinished(kMethod, code, absl::Now() - start);
  };
  // Counted from here on: every way out below finishes the call once.
  if (env_.metrics) env_.metrics->RequestStarted();
  const std::function<void(const absl::Status&)> finish = site.finish;
  try {
    if (!messages->first.ParseFromString(request.bytes)) {
      finish(absl::InvalidArgumentError(
          "the channel's request bytes are not a kplan.v1.RunMoERequest"));
      return;
    }
    StartRunMoe(messages->first, &messages->second, std::move(site));
  } catch (const std::bad_alloc&) {
    finish(absl::ResourceExhaustedError("out of memory running the channel's request"));
  } catch (const std::exception& e) {
    spdlog::error("RunMoE.shm_channel: {}", e.what());
    finish(absl::InternalError("the server failed on the channel's request"));
  }
}

void KernelPlanServiceImpl::StartRunMoe(v1::RunMoERequest& request, v1::RunMoEResponse* response,
                                        RunMoeSite site) {
  auto finish = std::make_shared<std::function<void(const absl::Status&)>>(std::move(site.finish));
  if (request.skip_device() && !env_.allow_skip_device) {
    return (*finish)(WithField(
        absl::FailedPreconditionError("skip_device is a debug flag honoured only by a server "
                                      "started with --allow_skip_device"),
        "skip_device"));
  }
  MoeDeviceTensors device;  // references into CUDA regions
  absl::StatusOr<RunMoeShm> shm = ResolveRunMoeShm(env_.shm, request, &device);
  if (!shm.ok()) return (*finish)(shm.status());
  absl::StatusOr<RunMoeRequest> core = RunMoeRequestFromProto(*env_.experts, request);
  if (!core.ok()) return (*finish)(core.status());
  if (device.any()) {
    device.cancelled = site.cancelled;
    core->input.device = std::move(device);
  }
  AttachRunMoeShm(*shm, site.cancelled, &core->input);
  RunMoeAnswer answer;
  answer.output_shm = std::move(shm->output);
  answer.output_ref = request.output_shm();
  answer.act_dtype = core->input.act_dtype;
  answer.hidden = core->experts->spec().hidden;
  answer.return_routing = core->return_routing;
  answer.arrival = site.start;
  answer.decoded = absl::Now();
  RunMoeEnv run_env;
  run_env.executor = env_.executor;
  run_env.ep_group = env_.ep_group;
  run_env.platform = &env_.platform;
  run_env.executable_backends = ExecutableMoeBackends(env_);
  run_env.routes = env_.routes;
  run_env.inline_gpu = env_.inline_runs;
  run_env.cuda_graphs = env_.cuda_graphs;
  // A skip_device call does no work on the CPU either: on the calling
  // thread, as on an idle GPU, so that the CPU path's service floor has no
  // hop the GPU's lacks. A real CPU run (milliseconds) keeps to the worker.
  run_env.inline_cpu = env_.inline_runs && request.skip_device();
  run_env.coalescer = env_.coalescer;
  run_env.answers = env_.answers;
  RunMoeCall hooks;
  hooks.deadline = site.deadline;
  hooks.cancelled = site.cancelled;
  hooks.fail = [finish](const absl::Status& status) { (*finish)(status); };
  hooks.caller_may_block = site.caller_may_block;
  absl::Status queued = kplan::RunMoe(
      run_env, *std::move(core), std::move(hooks),
      [this, finish, cancelled = site.cancelled, method = site.method, response, answer](
          absl::StatusOr<RunMoeResult> result, const MoeRunTiming& timing) {
        const absl::Time answering = absl::Now();  // on the thread that answers
        absl::Status status = result.status();
        if (result.ok() && answer.output_shm && !result->output.in_place && cancelled()) {
          // The client gave up (deadline, cancel) and may reuse
          // its region: a late result must not land there.
          status =
              absl::CancelledError("the call ended before its output was written to output_shm");
        } else if (result.ok()) {
          status = RunMoeResultToProto(*result, timing, answer, response);
        }
        if (Metrics* m = env_.metrics) {
          m->ObserveQueue(method, timing.queue);
          m->ObserveDevice(method, timing.device);
          m->ObserveHop(method, Metrics::Hop::kDecode, answer.decoded - answer.arrival);
          if (timing.queued != absl::InfinitePast()) {
            m->ObserveHop(method, Metrics::Hop::kRoute, timing.queued - answer.decoded);
          }
          m->ObserveHop(method, Metrics::Hop::kQueue, timing.queue);
          m->ObserveHop(method, Metrics::Hop::kDevice, timing.device);
          if (result.ok() && timing.device_end != absl::InfinitePast()) {
            m->ObserveHop(method, Metrics::Hop::kAnswerWait, answering - timing.device_end);
            m->ObserveHop(method, Metrics::Hop::kEncode, absl::Now() - answering);
          }
        }
        (*finish)(status);
      });
  if (!queued.ok()) (*finish)(queued);
}

}  // namespace kplan::rpc
