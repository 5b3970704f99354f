#include "server/rpc/service.h"

#include "absl/time/clock.h"
#include "base/status.h"
#include "server/moe/run_moe.h"
#include "resolve/plan/vocabulary.h"
#include "resolve/proto/convert.h"
#include "server/rpc/ir_convert.h"
#include "server/rpc/call.h"
#include "resolve/proto/resolve.h"
#include "server/rpc/status_mapping.h"

namespace kplan::rpc {
namespace {

// IR errors name vLLM parameters; tensors travel as `inputs` in the request
// ("x" -> "inputs.x", "x.data" -> "inputs.x.data") while scalars, `priority`,
// `device` and `op` keep their names.
absl::Status IrErrorWithRequestPath(absl::Status status) {
  std::optional<std::string> field = FieldOf(status);
  if (!field) return status;
  const absl::string_view param = absl::string_view(*field).substr(0, field->find('.'));
  if (param == "x" || param == "x_residual" || param == "weight") {
    return NestField(std::move(status), "inputs");
  }
  return status;
}

}  // namespace

grpc::ServerUnaryReactor* KernelPlanServiceImpl::ResolveKernelConfig(
    grpc::CallbackServerContext* context, const v1::ResolveKernelConfigRequest* request,
    v1::ResolveKernelConfigResponse* response) {
  Call call(env_, context, "ResolveKernelConfig");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  absl::StatusOr<v1::ResolveKernelConfigResponse> resolved =
      rpc::ResolveKernelConfig(*request, env_.platform);
  if (resolved.ok()) *response = std::move(*resolved);
  return call.FinishUnary(resolved.status());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest* /*request*/,
    v1::GetServerInfoResponse* response) {
  Call call(env_, context, "GetServerInfo");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  response->set_version(KPLAN_VERSION);
  *response->mutable_build() = MakeBuildInfo();
  for (const LocalDevice& d : env_.devices) {
    v1::Device* out = response->add_devices();
    out->set_index(d.index);
    out->set_name(d.name);
    out->mutable_capability()->set_major(d.capability.major);
    out->mutable_capability()->set_minor(d.capability.minor);
    out->set_total_memory_bytes(d.total_memory_bytes);
    out->set_multiprocessor_count(d.multiprocessor_count);
  }
  PlatformToProto(env_.platform, response->mutable_platform());
  response->mutable_limits()->set_max_message_bytes(env_.max_message_bytes);
  for (const std::string& b : ExecutableMoeBackends(env_)) response->add_executable_backends(b);
  response->set_cuda_driver_version(env_.runtime.cuda_driver_version);
  for (absl::string_view op : IrOpNames()) {
    std::vector<std::string> priority = DefaultPriorityFor(*env_.ir_registry, op);
    auto* list = MutablePriority(response->mutable_ir_op_priority(), op);
    for (std::string& p : priority) list->Add(std::move(p));
  }
  if (env_.ep_group != nullptr) {
    v1::EpGroupInfo* ep = response->mutable_ep_group();
    ep->set_size(env_.ep_group->size());
    for (std::string& d : env_.ep_group->Devices()) ep->add_devices(std::move(d));
    ep->set_communicator(std::string(env_.ep_group->kind().communicator()));
    for (absl::string_view s : {EpStrategyName(moe::ep::EpStrategy::kAllGatherReduceScatter),
                                EpStrategyName(moe::ep::EpStrategy::kAll2AllV)}) {
      ep->add_all2all_backends(std::string(s));
    }
    if (env_.ep_group->kind().runs_passthrough()) {  // moe_backend kplan_ep binds it
      ep->add_all2all_backends(std::string(EpStrategyName(moe::ep::EpStrategy::kPassthrough)));
    }
  }
  return call.FinishUnary(absl::OkStatus());
}

grpc::ServerUnaryReactor* KernelPlanServiceImpl::RunIrOp(grpc::CallbackServerContext* context,
                                                         const v1::RunIrOpRequest* request,
                                                         v1::RunIrOpResponse* response) {
  auto call = std::make_shared<Call>(env_, context, "RunIrOp");
  if (absl::Status auth = call->Authorize(); !auth.ok()) return call->FinishUnary(auth);
  // The request is ours until Finish; its tensor bytes move, not copy.
  absl::StatusOr<IrOpRequest> ir = IrOpRequestFromProto(*const_cast<v1::RunIrOpRequest*>(request));
  if (!ir.ok()) return call->FinishUnary(ir.status());
  absl::StatusOr<size_t> slot = env_.executor->Resolve(request->device(), "device");
  if (!slot.ok()) return call->FinishUnary(slot.status());
  // What the queued request holds: its inputs and outputs of their size
  // (out, and residual for fused_add_rms_norm).
  int64_t bytes = 0;
  for (const IrNamedTensor& t : ir->tensors) {
    bytes += 2 * static_cast<int64_t>(t.tensor.data.size());
  }
  DeviceExecutor::Work work = [this, call, response, ir = std::move(*ir)](
                                  const DeviceSlot& where, absl::Duration waited) mutable {
    if (env_.metrics) env_.metrics->ObserveQueue(call->method(), waited);
    if (where.cuda_device >= 0) {
      ir.device = IrDeviceSelection{IrDevice::Cuda(where.cuda_device), where.stream};
    }
    if (!where.status.ok()) {
      call->FinishUnary(WithField(where.status, "device"));
      return;
    }
    ir.deadline = call->deadline();
    const absl::Time start = absl::Now();
    absl::StatusOr<IrOpResult> result = kplan::RunIrOp(*env_.ir_registry, ir);
    if (env_.metrics) env_.metrics->ObserveDevice(call->method(), absl::Now() - start);
    if (result.ok()) {
      IrOpResultToProto(*result, response);
      response->set_device(where.name);
    }
    call->FinishUnary(IrErrorWithRequestPath(result.status()));
  };
  absl::Status queued = env_.executor->Submit(*slot, Call::UnaryJob(call, bytes, std::move(work)));
  if (!queued.ok()) return call->FinishUnary(queued);
  return call->reactor();
}

v1::BuildInfo MakeBuildInfo() {
  v1::BuildInfo b;
  b.set_version(KPLAN_VERSION);
  b.set_git_revision(KPLAN_GIT_REVISION);
  const MoeBuildFacts& facts = BuildFacts();
  b.set_cuda_version(facts.cuda_version);
  b.set_nccl_version(facts.nccl_version);
  b.set_cuda_architectures(facts.cuda_architectures);
  b.set_compiler(__VERSION__);
  return b;
}

}  // namespace kplan::rpc
