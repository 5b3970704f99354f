// KplanServer: builds, starts and drains the gRPC server that hosts
// KernelPlanService, the standard health service and reflection. main.cc and
// the integration tests both use it (tests on 127.0.0.1:0).
#pragma once

#include <grpcpp/server.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "resolve/platform/local.h"
#include "server/exec/task_pool.h"
#include "server/moe/moe_coalesce.h"
#include "server/rpc/ep_multihost.h"
#include "server/rpc/idle_watchdog.h"
#include "server/rpc/raw_service.h"
#include "server/rpc/service.h"

namespace kplan::rpc {

struct ServerOptions {
  std::string listen_address = "0.0.0.0:50051";
  int64_t max_message_bytes = 64 << 20;
  std::string devices = "all";    // "all", "none" or "0,1"
  int64_t max_queue_depth = 256;  // per device worker; beyond it RESOURCE_EXHAUSTED
  // Bytes that queued and running requests may hold, all devices together
  // (DeviceExecutor); beyond it RESOURCE_EXHAUSTED. 0: DerivedMaxQueuedBytes.
  int64_t max_queued_bytes = 0;
  // Resident expert weights, all sets, reserved when a load's header
  // arrives. 0: DerivedMaxExpertBytes.
  int64_t max_expert_bytes = 0;
  // The longest a unary request may run when its client set no sooner
  // deadline; queued work past it is dropped, the CPU path stops.
  absl::Duration max_request_time = absl::Seconds(60);
  // Failed-call warnings logged a second on average (in bursts of as many);
  // the rest are counted in the next line logged. 0: every one.
  double failed_call_log_rate = 20;
  // A LoadExperts stream that sends nothing this long is ended with
  // DEADLINE_EXCEEDED and its reservation released; zero: never.
  absl::Duration load_idle_timeout = absl::Seconds(60);
  // Tests: the host's memory in bytes (default: PhysicalMemoryBytes).
  std::function<int64_t()> host_memory_bytes;
  // Prometheus /metrics on its own address ("0.0.0.0:9464"); "" turns it off.
  std::string metrics_listen;
  // TLS: PEM certificate chain and key; both or neither. With a client CA,
  // clients must present a certificate it signed (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // A file holding the bearer token every KernelPlanService call must carry
  // (health and reflection stay open for probes).
  std::string auth_token_file;
  // Directories a request may load server-side files from (LoadExperts with
  // a safetensors path); each must exist. Empty: server-side loads are off.
  std::vector<std::string> model_roots;
  // Expert sets to load at start (preload.h), each within preload_timeout;
  // readiness turns SERVING once they are resident, and a failure stops the
  // start. Empty: none.
  std::string preload_file;
  absl::Duration preload_timeout = absl::Minutes(10);
  // Expert parallelism. With more than one GPU the GPUs form the group;
  // without GPUs, cpu_ep_ranks > 0 makes a group of that many CPU
  // thread-ranks (CI and demos). ep_timeout bounds joining a step and each
  // collective; a rank past it fails the request with DEADLINE_EXCEEDED.
  int cpu_ep_ranks = 0;
  absl::Duration ep_timeout = absl::Seconds(30);
  // A group across servers, one rank (one GPU) each: ep_size > 1. Rank 0
  // (no ep_coordinator) coordinates and waits up to ep_join_timeout for the
  // others at start; rank r >= 1 joins ep_coordinator (HOST:PORT) within
  // ep_join_timeout, telling it ep_advertise (HOST:PORT; "" = this server's
  // port on the address the coordinator sees).
  int ep_size = 0;
  int ep_rank = 0;
  std::string ep_coordinator;
  std::string ep_advertise;
  absl::Duration ep_join_timeout = absl::Seconds(60);
  // The servers of such a group reach each other over TLS when this server
  // serves TLS: it verifies the others' certificates with ep_peer_ca_file
  // (PEM; empty: the system roots) and presents its own tls_cert / tls_key as
  // its client certificate (it needs clientAuth besides serverAuth when the
  // others require client certificates).
  std::string ep_peer_ca_file;
  // Tests: the communicator and its ids across servers (default: NCCL).
  moe::ep::EpCommFactory ep_comm_factory;
  moe::ep::EpGroupIdSource ep_id_source;
  // Debug (--allow_skip_device): RunMoE honours skip_device, which takes the
  // whole request path but not the layer (bench/moe_rpc_bench's floor).
  bool allow_skip_device = false;
  // Small RunMoE calls (under DeviceExecutor::kLargeJobBytes) on a GPU whose
  // worker is idle run on the gRPC thread that received them, with no hand-
  // over to the worker and back (--inline_runs).
  bool inline_runs = true;
  // Small RunMoE calls on a GPU (up to kMoeGraphMaxTokens tokens, host
  // tensors) run as one CUDA graph per shape and thread, captured at the
  // shape's second call (--cuda_graphs).
  bool cuda_graphs = true;
  // Coalescing (server/moe/moe_coalesce.h): concurrent single-device RunMoE
  // calls that may share a launch wait up to coalesce_window for partners,
  // at most coalesce_max_tokens tokens a launch. Zero window: off.
  absl::Duration coalesce_window = absl::ZeroDuration();
  int64_t coalesce_max_tokens = 256;
  // RegisterSharedMemory and RunMoE's shared-memory tensor references
  // (--allow_shared_memory); off: FAILED_PRECONDITION.
  bool allow_shared_memory = false;
  // The regions' call channels (shm_channels.h): how many may be open, how
  // long each thread polls after an answer before it sleeps.
  int64_t max_shm_channels = 64;
  absl::Duration shm_channel_spin = absl::Microseconds(50);
  // Injected device query; null means the build's default prober.
  const DeviceProber* prober = nullptr;
};

// Memory of this host (sysconf pages x page size), or this process's cgroup
// memory limit when that is lower (containers); 0 if unknown.
int64_t PhysicalMemoryBytes();
// The default --max_queued_bytes: min(2 GiB, a quarter of host memory).
int64_t DerivedMaxQueuedBytes(int64_t host_memory_bytes);
// The default --max_expert_bytes. Every set keeps its host copy (the CPU
// path reads it), so at most half the host memory; with GPUs also at most
// 90% of the smallest device's memory per device (a set is spread over the
// group's GPUs, or copied to the first one). Without a known host memory,
// 64 GiB (the former fixed default).
int64_t DerivedMaxExpertBytes(int64_t host_memory_bytes, const std::vector<LocalDevice>& devices);

class KplanServer {
 public:
  // The health service name that turns NOT_SERVING while draining; "" (the
  // whole server) follows the same state.
  static constexpr char kReadinessService[] = "kplan.v1.KernelPlanService";

  static absl::StatusOr<std::unique_ptr<KplanServer>> Start(const ServerOptions& options);
  ~KplanServer();

  // The bound TCP port (useful with port 0); 0 for a Unix socket.
  int port() const { return port_; }
  // The metrics port, 0 when metrics are off.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  Metrics* metrics() { return metrics_.get(); }
  const ServerEnvironment& environment() const { return environment_; }

  // Marks health NOT_SERVING, lets in-flight calls finish for up to `timeout`,
  // then cancels what is left and stops. Safe to call more than once.
  void Shutdown(absl::Duration timeout);
  // Blocks until the server has stopped.
  void Wait();

 private:
  KplanServer() = default;
  // Publishes device memory in use every few seconds while metrics are on.
  void RefreshDeviceMetrics();
  ServerEnvironment environment_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<LogRateLimiter> failed_call_logs_;  // --failed_call_log_rate > 0
  // Destroyed last of the call machinery: jobs still queued when the server
  // stops may hold references to the service's environment.
  std::unique_ptr<KernelPlanServiceImpl> service_;
  std::unique_ptr<RawKernelPlanService> raw_service_;  // what gRPC calls; parses, then service_
  std::unique_ptr<IdleWatchdog> load_watchdog_;
  // Destroyed after the server has drained (members die in reverse order):
  // first the workers, then the registry their work used.
  std::unique_ptr<IrRegistry> ir_registry_;
  std::unique_ptr<ExpertStore> experts_;
  std::unique_ptr<MoeRouteCache> routes_;
  std::unique_ptr<ShmRegistry> shm_;  // --allow_shared_memory; regions go with it
  // Closed at Shutdown, before the regions go and while the executor still
  // answers their calls in flight.
  std::unique_ptr<ShmChannelServer> shm_channels_;
  // After the executor (whose work submits steps to it), before the experts.
  std::shared_ptr<EpCoordinator> ep_coordinator_;  // outlives the group (its kind calls it)
  std::unique_ptr<moe::ep::EpGroup> ep_group_;
  std::unique_ptr<moe::ep::EpPeerRank> ep_peer_;
  // Answers what the executor's jobs and the coalescer's launches ran:
  // destroyed after both (it runs every answer still queued), before the
  // service the answers call into.
  std::unique_ptr<TaskPool> answers_;
  std::unique_ptr<DeviceExecutor> executor_;
  std::unique_ptr<MoeCoalescer> coalescer_;  // before the executor it submits to
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
  std::unique_ptr<DeviceProber> owned_prober_;
  const DeviceProber* prober_ = nullptr;
  std::mutex refresh_mu_;
  std::condition_variable refresh_cv_;
  bool refresh_stop_ = false;
  std::thread refresher_;
};

}  // namespace kplan::rpc
