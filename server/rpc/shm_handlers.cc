// KernelPlanService's shared-memory RPCs: register, unregister and list the
// client regions RunMoE tensors may reference (server/moe/shm_regions.h).
// Off (FAILED_PRECONDITION) unless the server runs with --allow_shared_memory.
#include "absl/strings/str_cat.h"
#include "base/client_text.h"
#include "base/status.h"
#include "server/rpc/call.h"
#include "server/rpc/moe_convert.h"
#include "server/rpc/service.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {

grpc::ServerUnaryReactor* KernelPlanServiceImpl::RegisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
    v1::RegisterSharedMemoryResponse* /*response*/) {
  Call call(env_, context, "RegisterSharedMemory");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff("region"));
  const v1::SharedMemoryRegion& r = request->region();
  absl::Status s = env_.shm->Register(ShmRegionInfo{r.name(), r.key(), r.offset(), r.byte_size()});
  if (s.ok()) {
    spdlog::info("RegisterSharedMemory '{}': {} [{}, +{})", ClientText(r.name()),
                 ClientText(r.key()), r.offset(), r.byte_size());
  }
  return call.FinishUnary(FieldOf(s) ? NestField(s, "region") : s);
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::UnregisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse* /*response*/) {
  Call call(env_, context, "UnregisterSharedMemory");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.shm == nullptr) return call.FinishUnary(SharedMemoryOff("name"));
  return call.FinishUnary(env_.shm->Unregister(request->name()));
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
  }
  return call.FinishUnary(absl::OkStatus());
}

}  // namespace kplan::rpc
