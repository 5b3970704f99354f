// KplanServer: builds, starts and drains the gRPC server that hosts
// KernelPlanService, the standard health service and reflection. main.cc and
// the integration tests both use it (tests on 127.0.0.1:0).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/platform/local.h"
#include "server/rpc/service.h"

namespace kplan::rpc {

struct ServerOptions {
  std::string listen_address = "0.0.0.0:50051";
  int64_t max_message_bytes = 64 << 20;
  std::string devices = "all";  // "all", "none" or "0,1"
  // Injected device query; null means the build's default prober.
  const DeviceProber* prober = nullptr;
};

class KplanServer {
 public:
  // The health service name that turns NOT_SERVING while draining; "" (the
  // whole server) follows the same state.
  static constexpr char kReadinessService[] = "kplan.v1.KernelPlanService";

  static absl::StatusOr<std::unique_ptr<KplanServer>> Start(const ServerOptions& options);
  ~KplanServer();

  // The bound TCP port (useful with port 0); 0 for a Unix socket.
  int port() const { return port_; }
  const ServerEnvironment& environment() const { return environment_; }

  // Marks health NOT_SERVING, lets in-flight calls finish for up to `timeout`,
  // then cancels what is left and stops. Safe to call more than once.
  void Shutdown(absl::Duration timeout);
  // Blocks until the server has stopped.
  void Wait();

 private:
  KplanServer() = default;
  ServerEnvironment environment_;
  std::unique_ptr<KernelPlanServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace kplan::rpc
