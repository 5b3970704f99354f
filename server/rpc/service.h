// kplan.v1.KernelPlanService on gRPC's callback API. Every handler converts
// the request, calls the core and maps the result through ToGrpcStatus; no
// handler blocks a gRPC thread on device work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kplan/v1/service.grpc.pb.h"
#include "server/exec/device_executor.h"
#include "server/ir/registry.h"
#include "server/rpc/metrics.h"
#include "server/platform/local.h"
#include "server/platform/platform.h"

namespace kplan::rpc {

// What the service knows about the process it runs in.
struct ServerEnvironment {
  Platform platform;                // the local platform as the oracles see it
  LocalRuntime runtime;             // runtime versions and all devices found
  std::vector<LocalDevice> devices;  // the devices this server was given (--devices)
  int64_t max_message_bytes = 0;
  // When set, every KernelPlanService call must carry "authorization: Bearer <token>".
  std::string auth_token;
  Metrics* metrics = nullptr;  // may be null (metrics off)
  DeviceExecutor* executor = nullptr;     // device workers (CPU + each GPU)
  const IrRegistry* ir_registry = nullptr;
};

class KernelPlanServiceImpl final : public v1::KernelPlanService::CallbackService {
 public:
  explicit KernelPlanServiceImpl(ServerEnvironment env) : env_(std::move(env)) {}
  const ServerEnvironment& environment() const { return env_; }

  grpc::ServerUnaryReactor* ResolveKernelConfig(
      grpc::CallbackServerContext* context, const v1::ResolveKernelConfigRequest* request,
      v1::ResolveKernelConfigResponse* response) override;

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;

  grpc::ServerUnaryReactor* RunIrOp(grpc::CallbackServerContext* context,
                                    const v1::RunIrOpRequest* request,
                                    v1::RunIrOpResponse* response) override;

 private:
  const ServerEnvironment env_;
};

// The build facts reported by GetServerInfo.
v1::BuildInfo MakeBuildInfo();

}  // namespace kplan::rpc
