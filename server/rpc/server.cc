#include "server/rpc/server.h"
#include "server/rpc/status_mapping.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/checked_size.h"
#include "base/status.h"
#include "server/ir/builtin_ops.h"
#include "server/moe/model_files.h"
#include "server/moe/run_moe.h"
#include "server/rpc/preload.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

// Threads answering RunMoE calls run on a device worker (server.h,
// answers_): at least four (on one H200 four answered 50k coalesced calls/s
// at 39% of 16 cores busy; docs/PERF.md, session 14), one per GPU past
// that; answers queued past kAnswerQueue run on their worker.
constexpr int kAnswerThreads = 4;
constexpr size_t kAnswerQueue = 256;

absl::StatusOr<std::string> ReadFileForFlag(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidField(flag, absl::StrCat("cannot read ", flag, " file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return InvalidField(options.tls_cert_file.empty() ? "tls_cert" : "tls_key",
                        "TLS needs both --tls_cert and --tls_key");
  }
  if (options.tls_cert_file.empty()) {
    if (!options.tls_client_ca_file.empty()) {
      return InvalidField("tls_client_ca", "--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  KPLAN_ASSIGN_OR_RETURN(pair.cert_chain, ReadFileForFlag(options.tls_cert_file, "tls_cert"));
  KPLAN_ASSIGN_OR_RETURN(pair.private_key, ReadFileForFlag(options.tls_key_file, "tls_key"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    KPLAN_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                           ReadFileForFlag(options.tls_client_ca_file, "tls_client_ca"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// How this server reaches the other servers of its expert-parallel group:
// TLS when it serves TLS itself (see ServerOptions.ep_peer_ca_file).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakePeerCredentials(
    const ServerOptions& options) {
  if (options.tls_cert_file.empty()) {
    if (!options.ep_peer_ca_file.empty()) {
      return InvalidField("ep_peer_ca",
                          "--ep_peer_ca needs --tls_cert and --tls_key: the servers of a group "
                          "reach each other over TLS only when they serve TLS");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.ep_peer_ca_file.empty()) {
    KPLAN_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                           ReadFileForFlag(options.ep_peer_ca_file, "ep_peer_ca"));
  }
  KPLAN_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFileForFlag(options.tls_cert_file, "tls_cert"));
  KPLAN_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFileForFlag(options.tls_key_file, "tls_key"));
  return grpc::SslCredentials(ssl);
}

// A socket file left by a server that did not exit cleanly would make the
// bind fail; remove it, but never a file that is not a socket, and never the
// socket of a server that still answers there (it would silently lose its
// clients to this one).
absl::Status RemoveStaleUnixSocket(const std::string& address) {
  absl::string_view path = address;
  if (!absl::ConsumePrefix(&path, "unix:")) return absl::OkStatus();
  absl::ConsumePrefix(&path, "//");
  struct stat st;
  std::string p(path);
  if (lstat(p.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return InvalidField("listen", absl::StrCat(p, " exists and is not a socket"));
  }
  sockaddr_un addr{};
  if (p.size() >= sizeof(addr.sun_path)) {
    return InvalidField("listen", absl::StrCat("the socket path ", p, " is too long"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, p.data(), p.size());
  // Non-blocking: a live server whose backlog is full answers EAGAIN
  // instead of holding this start forever; that is a live server too.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const bool live =
      fd >= 0 && (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
                  errno == EAGAIN || errno == EINPROGRESS);
  if (fd >= 0) close(fd);
  if (live) {
    return WithField(
        absl::FailedPreconditionError(absl::StrCat("another server is listening on ", address,
                                                   "; stop it or choose another --listen")),
        "listen");
  }
  unlink(p.c_str());
  return absl::OkStatus();
}

// The expert-parallel group of this server, or null: the GPUs when there are
// several, else --cpu_ep_ranks CPU ranks.
// What computes this server's one rank of a group across servers: its GPU
// (a GPU kind whose every rank is that device), or the CPU when the test
// injected a communicator. Also checks the --ep_* flags.
absl::StatusOr<std::unique_ptr<moe::ep::EpRankKind>> MakeLocalRankKind(
    const ServerOptions& options, const std::vector<LocalDevice>& devices) {
  if (options.ep_rank < 0 || options.ep_rank >= options.ep_size) {
    return InvalidField("ep_rank", absl::StrCat("ep_rank must be in [0, ", options.ep_size,
                                                "), got ", options.ep_rank));
  }
  if (options.ep_rank == 0 && !options.ep_coordinator.empty()) {
    return InvalidField("ep_coordinator",
                        "rank 0 is the coordinator; --ep_coordinator is for ranks >= 1");
  }
  if (options.ep_rank > 0 && options.ep_coordinator.empty()) {
    return InvalidField("ep_coordinator",
                        absl::StrCat("rank ", options.ep_rank,
                                     " needs --ep_coordinator=HOST:PORT (rank 0's address)"));
  }
  if (options.cpu_ep_ranks > 0) {
    return InvalidField("ep_size",
                        "--ep_size (a group across servers) and --cpu_ep_ranks exclude "
                        "each other");
  }
  if (options.ep_join_timeout <= absl::ZeroDuration()) {
    return InvalidField("ep_join_timeout", "ep_join_timeout must be positive");
  }
  if (devices.size() > 1) {
    return InvalidField("devices", absl::StrCat("a server of a group across servers owns one GPU "
                                                "(its rank); got ",
                                                devices.size(), " (use --devices=N)"));
  }
  if (devices.empty()) {
    if (!options.ep_comm_factory || !options.ep_id_source) {
      return InvalidField("ep_size",
                          "a group across servers needs one GPU per server (--devices=N) and NCCL");
    }
    return moe::ep::MakeCpuEpRanks(options.ep_size);
  }
  if (!moe::ep::HaveGpuEpRanks()) {
    return InvalidField("ep_size", "this build has no GPU expert-parallel step (CUDA and NCCL)");
  }
  return moe::ep::MakeGpuEpRanks(std::vector<int>(options.ep_size, devices.front().index));
}

absl::StatusOr<std::unique_ptr<moe::ep::EpGroup>> MakeEpGroup(
    const ServerOptions& options, const std::vector<LocalDevice>& devices,
    std::shared_ptr<EpCoordinator> coordinator) {
  if (options.cpu_ep_ranks < 0) {
    return InvalidField("cpu_ep_ranks", absl::StrCat("cpu_ep_ranks must not be negative, got ",
                                                     options.cpu_ep_ranks));
  }
  if (options.ep_timeout <= absl::ZeroDuration()) {
    return InvalidField("ep_timeout", "ep_timeout must be positive");
  }
  moe::ep::EpGroupOptions group_options;
  group_options.join_timeout = options.ep_timeout;
  group_options.comm_timeout = options.ep_timeout;
  group_options.step_timeout = std::max(absl::Minutes(5), 4 * options.ep_timeout);
  group_options.max_queue_depth = static_cast<size_t>(options.max_queue_depth);
  std::unique_ptr<moe::ep::EpRankKind> kind;
  if (options.ep_size > 1) {
    if (options.ep_rank != 0) return nullptr;  // a peer: MakeEpPeer
    KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<moe::ep::EpRankKind> local,
                           MakeLocalRankKind(options, devices));
    kind = moe::ep::MakeProcessEpRanks(
        std::move(local), options.ep_size, coordinator,
        options.ep_comm_factory ? options.ep_comm_factory
                                : moe::ep::MakeNcclCommFactory(devices.front().index),
        options.ep_id_source ? options.ep_id_source : moe::ep::MakeNcclIdSource());
  } else if (options.cpu_ep_ranks > 0) {
    if (!devices.empty()) {
      return InvalidField(
          "cpu_ep_ranks",
          absl::StrCat("--cpu_ep_ranks makes a CPU expert-parallel group for the CPU path, but "
                       "this server owns ",
                       devices.size(),
                       " GPU(s); run with --devices=none (several GPUs form a group themselves)"));
    }
    kind = moe::ep::MakeCpuEpRanks(options.cpu_ep_ranks);
  } else if (devices.size() > 1) {
    if (!moe::ep::HaveGpuEpRanks()) {
      spdlog::warn(
          "{} GPUs but this build has no GPU expert-parallel step: RunMoE runs on "
          "cuda:{} alone",
          devices.size(), devices.front().index);
      return nullptr;
    }
    std::vector<int> indices;
    for (const LocalDevice& d : devices) indices.push_back(d.index);
    KPLAN_ASSIGN_OR_RETURN(kind, moe::ep::MakeGpuEpRanks(indices));
  } else {
    return nullptr;
  }
  KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<moe::ep::EpGroup> group,
                         moe::ep::EpGroup::Create(std::move(kind), group_options));
  spdlog::info("expert-parallel group: {} ranks on {} over {}", group->size(),
               absl::StrJoin(group->Devices(), ","), std::string(group->kind().communicator()));
  return group;
}

}  // namespace

namespace {

// The memory limit of this process's cgroup (v2 memory.max, v1
// memory.limit_in_bytes), or 0 when there is none: in a container the host's
// physical memory overstates what the server may use.
int64_t CgroupMemoryLimit() {
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text)) continue;
    int64_t limit = 0;
    if (absl::SimpleAtoi(text, &limit) && limit > 0) return limit;  // "max": no limit
  }
  return 0;
}

}  // namespace

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  int64_t bytes = CheckedMul(pages, page_size).value_or(INT64_MAX);
  if (const int64_t limit = CgroupMemoryLimit(); limit > 0) bytes = std::min(bytes, limit);
  return bytes;
}

int64_t DerivedMaxQueuedBytes(int64_t host_memory_bytes) {
  constexpr int64_t kCap = int64_t{2} << 30;
  if (host_memory_bytes <= 0) return kCap;
  return std::max<int64_t>(1, std::min(kCap, host_memory_bytes / 4));
}

int64_t DerivedMaxExpertBytes(int64_t host_memory_bytes, const std::vector<LocalDevice>& devices) {
  int64_t budget = host_memory_bytes > 0 ? host_memory_bytes / 2 : int64_t{64} << 30;
  if (!devices.empty()) {
    int64_t smallest = INT64_MAX;
    for (const LocalDevice& d : devices) smallest = std::min(smallest, d.total_memory_bytes);
    if (smallest > 0) {
      const int64_t per_device = static_cast<int64_t>(static_cast<double>(smallest) * 0.9);
      budget = std::min(
          budget, CheckedMul(per_device, static_cast<int64_t>(devices.size())).value_or(INT64_MAX));
    }
  }
  return std::max<int64_t>(budget, 1);
}

absl::StatusOr<std::unique_ptr<KplanServer>> KplanServer::Start(const ServerOptions& options) {
  if (options.max_message_bytes <= 0 || options.max_message_bytes > INT32_MAX) {
    return InvalidField("max_message_bytes",
                        absl::StrCat("max_message_bytes must be in [1, ", INT32_MAX, "], got ",
                                     options.max_message_bytes));
  }
  if (options.max_queue_depth < 1) {
    return InvalidField("max_queue_depth", absl::StrCat("max_queue_depth must be at least 1, got ",
                                                        options.max_queue_depth));
  }
  std::unique_ptr<KplanServer> server(new KplanServer());
  server->prober_ = options.prober;
  if (server->prober_ == nullptr) {
    server->owned_prober_ = MakeDefaultDeviceProber();
    server->prober_ = server->owned_prober_.get();
  }
  const DeviceProber* prober = server->prober_;
  KPLAN_ASSIGN_OR_RETURN(server->environment_.runtime, prober->Probe());
  KPLAN_ASSIGN_OR_RETURN(server->environment_.devices,
                         SelectDevices(server->environment_.runtime.devices, options.devices));
  server->environment_.platform = LocalPlatform(
      server->environment_.devices, /*have_cuda_kernels=*/BuildFacts().have_cuda_kernels);
  server->environment_.max_message_bytes = options.max_message_bytes;
  KPLAN_ASSIGN_OR_RETURN(server->environment_.model_roots,
                         CanonicalModelRoots(options.model_roots));
  if (!options.auth_token_file.empty()) {
    KPLAN_ASSIGN_OR_RETURN(std::string token,
                           ReadFileForFlag(options.auth_token_file, "auth_token_file"));
    server->environment_.auth_token = std::string(absl::StripAsciiWhitespace(token));
    if (server->environment_.auth_token.empty()) {
      return InvalidField("auth_token_file", "the bearer token file is empty");
    }
  }
  if (!options.metrics_listen.empty()) {
    server->metrics_ = std::make_unique<Metrics>(BuildLabels{
        KPLAN_VERSION, KPLAN_GIT_REVISION, BuildFacts().cuda_version, BuildFacts().nccl_version});
    KPLAN_RETURN_IF_ERROR(server->metrics_->Serve(options.metrics_listen));
    server->metrics_->SetExperts("cpu", 0, 0);
    server->environment_.metrics = server->metrics_.get();
  }
  KPLAN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                         MakeCredentials(options));
  KPLAN_RETURN_IF_ERROR(RemoveStaleUnixSocket(options.listen_address));
  KPLAN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> peer_credentials,
                         MakePeerCredentials(options));
  if (options.ep_size > 1) {
    KPLAN_RETURN_IF_ERROR(MakeLocalRankKind(options, server->environment_.devices).status());
    if (options.ep_rank == 0) {
      server->ep_coordinator_ = std::make_shared<EpCoordinator>(
          options.ep_size, server->environment_.auth_token,
          std::max(absl::Minutes(5), 4 * options.ep_timeout), peer_credentials);
      server->environment_.ep_coordinator = server->ep_coordinator_.get();
    } else {
      KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<moe::ep::EpRankKind> local,
                             MakeLocalRankKind(options, server->environment_.devices));
      server->ep_peer_ = std::make_unique<moe::ep::EpPeerRank>(
          std::move(local), options.ep_rank, options.ep_size,
          options.ep_comm_factory
              ? options.ep_comm_factory
              : moe::ep::MakeNcclCommFactory(server->environment_.devices.front().index),
          options.ep_timeout);
      server->environment_.ep_peer = server->ep_peer_.get();
    }
  }
  KPLAN_ASSIGN_OR_RETURN(server->ep_group_, MakeEpGroup(options, server->environment_.devices,
                                                        server->ep_coordinator_));
  server->environment_.ep_group = server->ep_group_.get();
  if (server->ep_coordinator_) server->ep_coordinator_->SetGroup(server->ep_group_.get());
  if (options.max_queued_bytes < 0) {
    return InvalidField("max_queued_bytes", "max_queued_bytes must not be negative (0: derive)");
  }
  if (options.max_request_time < absl::ZeroDuration()) {
    return InvalidField("max_request_time", "max_request_time must not be negative (0: no cap)");
  }
  if (options.load_idle_timeout < absl::ZeroDuration()) {
    return InvalidField("load_idle_timeout", "load_idle_timeout must not be negative (0: never)");
  }
  if (!(options.failed_call_log_rate >= 0)) {  // NaN too
    return InvalidField("failed_call_log_rate",
                        "failed_call_log_rate must not be negative (0: log every failed call)");
  }
  const int64_t host_memory =
      options.host_memory_bytes ? options.host_memory_bytes() : PhysicalMemoryBytes();
  DeviceExecutor::Options executor_options;
  executor_options.max_queue_depth = static_cast<size_t>(options.max_queue_depth);
  executor_options.max_queued_bytes =
      options.max_queued_bytes > 0 ? options.max_queued_bytes : DerivedMaxQueuedBytes(host_memory);
  KPLAN_ASSIGN_OR_RETURN(server->executor_,
                         DeviceExecutor::Create(server->environment_.devices, executor_options));
  server->environment_.executor = server->executor_.get();
  server->answers_ = std::make_unique<TaskPool>(
      std::max(kAnswerThreads, static_cast<int>(server->environment_.devices.size())),
      "kplan-answer", kAnswerQueue);
  server->environment_.answers = server->answers_.get();
  if (options.coalesce_window < absl::ZeroDuration()) {
    return InvalidField("coalesce_window_us", "coalesce_window_us must not be negative (0: off)");
  }
  if (options.coalesce_window > absl::ZeroDuration()) {
    Metrics* metrics = server->metrics_.get();
    KPLAN_ASSIGN_OR_RETURN(
        server->coalescer_,
        MoeCoalescer::Create(
            *server->executor_,
            {options.coalesce_window, options.coalesce_max_tokens, server->answers_.get()},
            [metrics](int members) {
              if (metrics != nullptr) metrics->ObserveMoeLaunch(members);
            }));
    server->environment_.coalescer = server->coalescer_.get();
    spdlog::info("RunMoE coalescing: window {}, at most {} tokens a launch",
                 absl::FormatDuration(options.coalesce_window), options.coalesce_max_tokens);
  }
  server->environment_.max_request_time = options.max_request_time;
  if (options.failed_call_log_rate > 0) {
    server->failed_call_logs_ = std::make_unique<LogRateLimiter>(options.failed_call_log_rate);
    server->environment_.failed_call_logs = server->failed_call_logs_.get();
  }
  if (options.load_idle_timeout > absl::ZeroDuration()) {
    // Checked a few times per timeout (at least every second), so a stream
    // ends at most a quarter timeout late.
    const absl::Duration tick =
        std::clamp(options.load_idle_timeout / 4, absl::Milliseconds(10), absl::Seconds(1));
    server->load_watchdog_ = std::make_unique<IdleWatchdog>(options.load_idle_timeout, tick);
    server->environment_.load_idle_timeout = options.load_idle_timeout;
    server->environment_.load_watchdog = server->load_watchdog_.get();
  }
  IrBuiltinOptions ir_options;
  ir_options.kplan_supported =
      BuildFacts().have_cuda_kernels && !server->environment_.devices.empty();
  KPLAN_ASSIGN_OR_RETURN(server->ir_registry_, MakeBuiltinIrRegistry(ir_options));
  server->environment_.ir_registry = server->ir_registry_.get();
  if (options.max_expert_bytes < 0) {
    return InvalidField("max_expert_bytes", "max_expert_bytes must not be negative (0: derive)");
  }
  const int64_t max_expert_bytes =
      options.max_expert_bytes > 0
          ? options.max_expert_bytes
          : DerivedMaxExpertBytes(host_memory, server->environment_.devices);
  spdlog::info(
      "limits: {} bytes of experts, {} bytes of queued requests, {} per request, {} idle "
      "per LoadExperts stream",
      max_expert_bytes, executor_options.max_queued_bytes,
      absl::FormatDuration(options.max_request_time),
      absl::FormatDuration(options.load_idle_timeout));
  // The preload file is checked before anything listens.
  std::vector<v1::ExpertsHeader> preload;
  if (!options.preload_file.empty()) {
    KPLAN_ASSIGN_OR_RETURN(preload, ReadPreloadFile(options.preload_file));
  }
  server->experts_ = std::make_unique<ExpertStore>(max_expert_bytes);
  server->environment_.experts = server->experts_.get();
  if (!preload.empty()) {  // before anything listens: no client takes these ids
    KPLAN_RETURN_IF_ERROR(HoldPreloadSets(*server->experts_, preload));
    server->environment_.preload_token = MakePreloadToken();
  }
  server->routes_ = std::make_unique<MoeRouteCache>();
  server->environment_.routes = server->routes_.get();
  server->environment_.allow_skip_device = options.allow_skip_device;
  server->environment_.inline_runs = options.inline_runs;
  server->environment_.cuda_graphs = options.cuda_graphs;
  if (options.allow_shared_memory) {
    std::vector<int> gpus;  // where CUDA regions may be
    for (const LocalDevice& d : server->environment_.devices) gpus.push_back(d.index);
    server->shm_ = std::make_unique<ShmRegistry>(256, std::move(gpus));
    server->environment_.shm = server->shm_.get();
    if (options.max_shm_channels < 0) {
      return InvalidField("max_shm_channels", "max_shm_channels must not be negative");
    }
    if (options.shm_channel_spin < absl::ZeroDuration()) {
      return InvalidField("shm_channel_spin", "shm_channel_spin must not be negative");
    }
    ShmChannelServer::Options channels;
    channels.max_channels = static_cast<size_t>(options.max_shm_channels);
    channels.spin = options.shm_channel_spin;
    channels.max_call_time = options.max_request_time;
    channels.error_bytes = StatusProtoBytes;
    channels.max_area_bytes = options.max_message_bytes;
    KplanServer* self = server.get();  // a channel opens (over gRPC) after the service exists
    server->shm_channels_ = std::make_unique<ShmChannelServer>(
        channels, [self](ShmChannelServer::Request request, ShmChannelServer::Answer answer) {
          self->service_->RunMoeFromChannel(std::move(request), std::move(answer));
        });
    server->environment_.shm_channels = server->shm_channels_.get();
  }
  server->service_ = std::make_unique<KernelPlanServiceImpl>(server->environment_);
  server->raw_service_ = std::make_unique<RawKernelPlanService>(*server->service_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this a second server on the same TCP port shares it with the
  // first (SO_REUSEPORT) and takes half its clients; with it the bind fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen_address, credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(server->raw_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return WithField(absl::UnavailableError(absl::StrCat(
                         "could not listen on ", options.listen_address,
                         " (is another server using it, or is the address not this host's?)")),
                     "listen");
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  // Readiness waits for the preloaded sets (below); liveness does not.
  health->SetServingStatus(kReadinessService, preload.empty());
  if (server->metrics_) server->metrics_->SetReady(preload.empty());
  spdlog::info(
      "kplan-server {} listening on {} (port {}{}{}); platform: {}; {} device(s)", KPLAN_VERSION,
      options.listen_address, server->port_, options.tls_cert_file.empty() ? "" : ", TLS",
      options.tls_client_ca_file.empty() ? "" : " with client certificates",
      DescribePlatform(server->environment_.platform), server->environment_.devices.size());
  spdlog::info("server-side loads: {}",
               server->environment_.model_roots.empty()
                   ? std::string("off (no --model_root)")
                   : absl::StrCat("under ", absl::StrJoin(server->environment_.model_roots, ", ")));
  if (server->ep_coordinator_) {
    spdlog::info(
        "expert-parallel group across servers: rank 0 of {}; waiting up to {} for the "
        "other ranks to join",
        options.ep_size, absl::FormatDuration(options.ep_join_timeout));
    KPLAN_RETURN_IF_ERROR(server->ep_coordinator_->WaitForPeers(options.ep_join_timeout));
    spdlog::info("expert-parallel group formed: {}",
                 absl::StrJoin(server->ep_group_->Devices(), ", "));
  } else if (server->ep_peer_) {
    EpPeerJoin join;
    join.coordinator = options.ep_coordinator;
    join.address =
        options.ep_advertise.empty() ? absl::StrCat(":", server->port_) : options.ep_advertise;
    join.device = server->ep_peer_->Device();
    join.rank = options.ep_rank;
    join.size = options.ep_size;
    join.auth_token = server->environment_.auth_token;
    join.credentials = peer_credentials;
    join.timeout = options.ep_join_timeout;
    KPLAN_ASSIGN_OR_RETURN(v1::JoinEpGroupResponse joined, JoinEpGroupAtStart(join));
    spdlog::info("joined the expert-parallel group at {} as rank {} of {} (generation {})",
                 options.ep_coordinator, options.ep_rank, options.ep_size, joined.generation());
  }
  if (!preload.empty()) {
    spdlog::info("preloading {} expert set(s) from {}", preload.size(), options.preload_file);
    KPLAN_RETURN_IF_ERROR(Preload(*server->server_->InProcessChannel(grpc::ChannelArguments()),
                                  preload, server->environment_.auth_token,
                                  server->environment_.preload_token, options.preload_timeout));
    health->SetServingStatus(kReadinessService, true);
    if (server->metrics_) server->metrics_->SetReady(true);
  }
  if (server->metrics_) {
    spdlog::info("metrics on {} (port {})", options.metrics_listen, server->metrics_->port());
    if (!server->environment_.devices.empty()) {
      server->refresher_ = std::thread([s = server.get()] { s->RefreshDeviceMetrics(); });
    }
  }
  return server;
}

KplanServer::~KplanServer() {
  Shutdown(absl::ZeroDuration());
  {
    std::lock_guard<std::mutex> lock(refresh_mu_);
    refresh_stop_ = true;
  }
  refresh_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
}

void KplanServer::RefreshDeviceMetrics() {
  std::unique_lock<std::mutex> lock(refresh_mu_);
  while (!refresh_stop_) {
    for (const LocalDevice& d : environment_.devices) {
      absl::StatusOr<int64_t> used = prober_->MemoryUsed(d.index);
      if (used.ok()) {
        metrics_->SetDeviceMemoryUsed(absl::StrCat("cuda:", d.index), static_cast<double>(*used));
      }
    }
    refresh_cv_.wait_for(lock, std::chrono::seconds(5), [this] { return refresh_stop_; });
  }
}

void KplanServer::Shutdown(absl::Duration timeout) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // NOT_SERVING first, so load balancers stop routing here while we drain.
  server_->GetHealthCheckService()->Shutdown();
  if (metrics_) metrics_->SetReady(false);
  spdlog::info("draining: waiting up to {} for in-flight calls", absl::FormatDuration(timeout));
  server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
  server_->Wait();
  if (shm_channels_ != nullptr) shm_channels_->CloseAll();  // their calls answered first
  if (shm_ != nullptr) shm_->UnregisterAll();               // calls still running keep their views
  spdlog::info("server stopped");
}

void KplanServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace kplan::rpc
