#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "server/base/status.h"

namespace kplan::rpc {

absl::StatusOr<std::unique_ptr<KplanServer>> KplanServer::Start(const ServerOptions& options) {
  if (options.max_message_bytes <= 0 || options.max_message_bytes > INT32_MAX) {
    return InvalidField("max_message_bytes",
                        absl::StrCat("max_message_bytes must be in [1, ", INT32_MAX, "], got ",
                                     options.max_message_bytes));
  }
  std::unique_ptr<DeviceProber> default_prober;
  const DeviceProber* prober = options.prober;
  if (prober == nullptr) {
    default_prober = MakeDefaultDeviceProber();
    prober = default_prober.get();
  }
  std::unique_ptr<KplanServer> server(new KplanServer());
  KPLAN_ASSIGN_OR_RETURN(server->environment_.runtime, prober->Probe());
  KPLAN_ASSIGN_OR_RETURN(server->environment_.devices,
                         SelectDevices(server->environment_.runtime.devices, options.devices));
  server->environment_.platform =
      LocalPlatform(server->environment_.devices, /*have_cuda_kernels=*/KPLAN_HAVE_CUDA_KERNELS);
  server->environment_.max_message_bytes = options.max_message_bytes;
  server->service_ = std::make_unique<KernelPlanServiceImpl>(server->environment_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return WithField(absl::UnavailableError(absl::StrCat("could not listen on ",
                                                         options.listen_address)),
                     "listen");
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(kReadinessService, true);
  spdlog::info("kplan-server {} listening on {} (port {}); platform: {}; {} device(s)",
               KPLAN_VERSION, options.listen_address, server->port_,
               DescribePlatform(server->environment_.platform),
               server->environment_.devices.size());
  return server;
}

KplanServer::~KplanServer() { Shutdown(absl::ZeroDuration()); }

void KplanServer::Shutdown(absl::Duration timeout) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // NOT_SERVING first, so load balancers stop routing here while we drain.
  server_->GetHealthCheckService()->Shutdown();
  spdlog::info("draining: waiting up to {} for in-flight calls", absl::FormatDuration(timeout));
  server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
  server_->Wait();
  spdlog::info("server stopped");
}

void KplanServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace kplan::rpc
