// kplan.v1.KernelPlanService on gRPC's callback API. Every handler converts
// the request, calls the core and maps the result through ToGrpcStatus; no
// handler blocks a gRPC thread on device work.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kplan/v1/service.grpc.pb.h"
#include "server/exec/device_executor.h"
#include "server/exec/task_pool.h"
#include "server/ir/registry.h"
#include "server/moe/ep/ep_group.h"
#include "server/moe/ep/ep_process.h"
#include "server/moe/expert_store.h"
#include "server/moe/moe_coalesce.h"
#include "server/moe/moe_route.h"
#include "server/moe/shm_regions.h"
#include "server/moe/moe_runner.h"
#include "resolve/platform/local.h"
#include "resolve/platform/platform.h"
#include "server/rpc/logging.h"
#include "server/rpc/metrics.h"
#include "server/rpc/shm_channels.h"

namespace kplan::rpc {

class Call;           // call.h
class IdleWatchdog;   // idle_watchdog.h
class EpCoordinator;  // ep_multihost.h

// What the service knows about the process it runs in.
struct ServerEnvironment {
  Platform platform;                 // the local platform as the oracles see it
  LocalRuntime runtime;              // runtime versions and all devices found
  std::vector<LocalDevice> devices;  // the devices this server was given (--devices)
  int64_t max_message_bytes = 0;
  // The longest a request may run when its client set no (sooner) deadline
  // (--max_request_time); zero: no cap.
  absl::Duration max_request_time = absl::ZeroDuration();
  // --load_idle_timeout: LoadExperts streams that send nothing this long end.
  absl::Duration load_idle_timeout = absl::ZeroDuration();
  IdleWatchdog* load_watchdog = nullptr;  // null: streams are not watched
  // When set, every KernelPlanService call must carry "authorization: Bearer <token>".
  std::string auth_token;
  // The secret the --preload's own LoadExperts calls carry (preload.h);
  // empty without a preload.
  std::string preload_token;
  // --model_root, canonical: the only directories server-side files are read
  // from (server/moe/model_files.h); empty: server-side loads are refused.
  std::vector<std::string> model_roots;
  Metrics* metrics = nullptr;  // may be null (metrics off)
  // --failed_call_log_rate: failed calls' warnings (LogFailedCall); null:
  // every one is logged.
  LogRateLimiter* failed_call_logs = nullptr;
  DeviceExecutor* executor = nullptr;  // device workers (CPU + each GPU)
  const IrRegistry* ir_registry = nullptr;
  ExpertStore* experts = nullptr;
  // The expert-parallel group serving RunMoE: the GPUs when there are more
  // than one, or --cpu_ep_ranks CPU ranks; null otherwise.
  moe::ep::EpGroup* ep_group = nullptr;
  // A group across servers (--ep_size): on rank 0 its registry of peers, on
  // a peer its rank; both null otherwise.
  EpCoordinator* ep_coordinator = nullptr;
  moe::ep::EpPeerRank* ep_peer = nullptr;
  // RunMoE's routes chosen before (dropped at UnloadExperts); null: none kept.
  MoeRouteCache* routes = nullptr;
  // --allow_skip_device: RunMoE honours its skip_device debug flag.
  bool allow_skip_device = false;
  // --inline_runs: small RunMoE calls on an idle GPU run on the gRPC thread.
  bool inline_runs = false;
  // --cuda_graphs: small RunMoE calls on a GPU replay a CUDA graph.
  bool cuda_graphs = false;
  // --coalesce_window_us: RunMoE calls that may share a launch go through
  // it; null: coalescing off.
  MoeCoalescer* coalescer = nullptr;
  // Answers RunMoE calls whose layer ran on a device worker, and the
  // members of coalesced launches (RunMoeEnv::answers).
  TaskPool* answers = nullptr;
  // --allow_shared_memory: the client regions RunMoE tensors may reference;
  // null when shared memory is off.
  ShmRegistry* shm = nullptr;
  // The regions' call channels (OpenShmChannel); null when shared memory
  // is off.
  ShmChannelServer* shm_channels = nullptr;
};

class KernelPlanServiceImpl final : public v1::KernelPlanService::CallbackService {
 public:
  explicit KernelPlanServiceImpl(ServerEnvironment env) : env_(std::move(env)) {}
  const ServerEnvironment& environment() const { return env_; }

  grpc::ServerUnaryReactor* ResolveKernelConfig(grpc::CallbackServerContext* context,
                                                const v1::ResolveKernelConfigRequest* request,
                                                v1::ResolveKernelConfigResponse* response) override;

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;

  grpc::ServerUnaryReactor* RunIrOp(grpc::CallbackServerContext* context,
                                    const v1::RunIrOpRequest* request,
                                    v1::RunIrOpResponse* response) override;

  // MoE execution (moe_handlers.cc).
  // LoadExperts reads raw messages (raw_service.h parses none of a stream);
  // its Call serializes `response`.
  grpc::ServerReadReactor<grpc::ByteBuffer>* LoadExpertsStream(grpc::CallbackServerContext* context,
                                                               v1::LoadExpertsResponse* response);
  grpc::ServerUnaryReactor* UnloadExperts(grpc::CallbackServerContext* context,
                                          const v1::UnloadExpertsRequest* request,
                                          v1::UnloadExpertsResponse* response) override;
  grpc::ServerUnaryReactor* ListExperts(grpc::CallbackServerContext* context,
                                        const v1::ListExpertsRequest* request,
                                        v1::ListExpertsResponse* response) override;
  grpc::ServerUnaryReactor* RunMoE(grpc::CallbackServerContext* context,
                                   const v1::RunMoERequest* request,
                                   v1::RunMoEResponse* response) override;

  // Between the servers of a multi-process expert-parallel group
  // (ep_multihost.cc).
  grpc::ServerUnaryReactor* JoinEpGroup(grpc::CallbackServerContext* context,
                                        const v1::JoinEpGroupRequest* request,
                                        v1::JoinEpGroupResponse* response) override;
  grpc::ServerUnaryReactor* RunEpStep(grpc::CallbackServerContext* context,
                                      const v1::RunEpStepRequest* request,
                                      v1::RunEpStepResponse* response) override;

  grpc::ServerUnaryReactor* RegisterSharedMemory(
      grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
      v1::RegisterSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterSharedMemory(
      grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
      v1::UnregisterSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* ListSharedMemory(grpc::CallbackServerContext* context,
                                             const v1::ListSharedMemoryRequest* request,
                                             v1::ListSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* OpenShmChannel(grpc::CallbackServerContext* context,
                                           const v1::OpenShmChannelRequest* request,
                                           v1::OpenShmChannelResponse* response) override;
  grpc::ServerUnaryReactor* CloseShmChannel(grpc::CallbackServerContext* context,
                                            const v1::CloseShmChannelRequest* request,
                                            v1::CloseShmChannelResponse* response) override;

  // A RunMoE request read from a shared-memory channel (shm_channels.h):
  // parsed, run and answered like one over gRPC, under the method label
  // "RunMoE.shm_channel".
  void RunMoeFromChannel(ShmChannelServer::Request request, ShmChannelServer::Answer answer);

 private:
  // What carries a RunMoE: gRPC's call or a shared-memory channel's.
  struct RunMoeSite {
    std::string method;  // the metrics' label
    absl::Time start;
    absl::Time deadline;
    std::function<bool()> cancelled;
    std::function<void(const absl::Status&)> finish;  // answers the call; only the first counts
    bool caller_may_block = false;                    // RunMoeCall::caller_may_block
  };
  // RunMoE on a parsed request; `request` and `response` live until
  // site.finish has been called.
  void StartRunMoe(v1::RunMoERequest& request, v1::RunMoEResponse* response, RunMoeSite site);

  // Serialises opening a channel with unregistering its region, so that no
  // channel outlives its region's registration.
  std::mutex shm_admin_mu_;
  const ServerEnvironment env_;
};

// The MoE backends RunMoE can run here (kplan::ExecutableMoeBackends:
// "kplan" with GPUs, "emulation").
std::vector<std::string> ExecutableMoeBackends(const ServerEnvironment& env);

// The build facts reported by GetServerInfo.
v1::BuildInfo MakeBuildInfo();

}  // namespace kplan::rpc
