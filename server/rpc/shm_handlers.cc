// KernelPlanService's shared-memory RPCs: register, unregister and list the
// client regions RunMoE tensors may reference (server/moe/shm_regions.h),
// and open and close the regions' call channels (shm_channels.h).
// Off (FAILED_PRECONDITION) unless the server runs with --allow_shared_memory.
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/rpc/call.h"
#include "server/rpc/moe_convert.h"
#include "server/rpc/service.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

// Shared memory is this host's: only a client on it (a Unix socket, or the
// loopback) may name an object for the server to map.
bool LocalPeer(absl::string_view peer) {
  return absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "ipv4:127.") ||
         absl::StartsWith(peer, "ipv6:[::1]") || absl::StartsWith(peer, "ipv6:%5B::1%5D");
}

}  // namespace

grpc::ServerUnaryReactor* KernelPlanServiceImpl::RegisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
    v1::RegisterSharedMemoryResponse* /*response*/) {
  Call call(env_, context, "RegisterSharedMemory");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff("region"));
  if (!LocalPeer(context->peer())) {
    return call.FinishUnary(WithField(
        absl::PermissionDeniedError(absl::StrCat(
            "shared-memory regions are registered only by clients on this host (a Unix socket "
            "or the loopback), not from ",
            ClientText(context->peer()))),
        "region.key"));
  }
  const v1::SharedMemoryRegion& r = request->region();
  absl::Status s = env_.shm->Register(ShmRegionInfo{r.name(), r.key(), r.offset(), r.byte_size(),
                                                    r.cuda_ipc_handle(), r.device_id()});
  if (s.ok()) {
    spdlog::info("RegisterSharedMemory '{}': {} [{}, +{})", ClientText(r.name()),
                 r.cuda_ipc_handle().empty() ? ClientText(r.key())
                                             : absl::StrCat("CUDA IPC on cuda:", r.device_id()),
                 r.offset(), r.byte_size());
  }
  return call.FinishUnary(FieldOf(s) ? NestField(s, "region") : s);
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::UnregisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse* /*response*/) {
  Call call(env_, context, "UnregisterSharedMemory");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff("name"));
  // The region's channel stops and the region goes under the admin lock,
  // so that no channel opens on it in between; the channel's call in flight
  // is waited for outside the lock (other regions' admin calls go on), and
  // before the answer: the client may unmap its object once it has it.
  std::optional<ShmChannelServer::Closing> closing;
  absl::Status unregistered;
  {
    std::lock_guard<std::mutex> lock(shm_admin_mu_);
    closing.emplace(env_.shm_channels->BeginClose(request->name()));  // NOT_FOUND: it had none
    unregistered = env_.shm->Unregister(request->name());
  }
  (void)closing->Wait();
  return call.FinishUnary(unregistered);
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::ListSharedMemory(
    grpc::CallbackServerContext* context, const v1::ListSharedMemoryRequest* /*request*/,
    v1::ListSharedMemoryResponse* response) {
  Call call(env_, context, "ListSharedMemory");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff(""));
  for (const ShmRegionInfo& info : env_.shm->List()) {
    v1::SharedMemoryRegion* r = response->add_regions();
    r->set_name(info.name);
    r->set_key(info.key);
    r->set_offset(info.offset);
    r->set_byte_size(info.byte_size);
    // Not the CUDA IPC handle: a capability to map the memory (the proto).
    r->set_device_id(info.device_id);
  }
  return call.FinishUnary(absl::OkStatus());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::OpenShmChannel(
    grpc::CallbackServerContext* context, const v1::OpenShmChannelRequest* request,
    v1::OpenShmChannelResponse* response) {
  Call call(env_, context, "OpenShmChannel");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff("region"));
  std::lock_guard<std::mutex> lock(shm_admin_mu_);
  absl::StatusOr<ShmView> window = env_.shm->ResolveWindow(request->region(), "region");
  if (!window.ok()) return call.FinishUnary(window.status());
  absl::StatusOr<int64_t> capacity =
      env_.shm_channels->Open(request->region(), *std::move(window), request->request_capacity());
  if (!capacity.ok()) return call.FinishUnary(capacity.status());
  response->set_response_capacity(*capacity);
  spdlog::info("OpenShmChannel '{}': requests up to {} bytes, answers up to {}",
               ClientText(request->region()), request->request_capacity(), *capacity);
  return call.FinishUnary(absl::OkStatus());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::CloseShmChannel(
    grpc::CallbackServerContext* context, const v1::CloseShmChannelRequest* request,
    v1::CloseShmChannelResponse* /*response*/) {
  Call call(env_, context, "CloseShmChannel");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff("region"));
  return call.FinishUnary(env_.shm_channels->Close(request->region()));
}

}  // namespace kplan::rpc
