// The KernelPlanService that the server registers: every unary method takes
// the request as raw bytes and parses it itself, so bytes that are not a
// valid message answer INVALID_ARGUMENT naming the message type (gRPC's own
// parse answers UNIMPLEMENTED with no text, and no handler ever sees the
// call to count it). Parsed requests go to KernelPlanServiceImpl's typed
// handlers; their Call serializes the typed response (ResponseSink).
#pragma once

#include "kplan/v1/service.grpc.pb.h"
#include "server/rpc/service.h"

namespace kplan::rpc {

using RawKernelPlanServiceBase = v1::KernelPlanService::WithRawCallbackMethod_OpenShmChannel<
    v1::KernelPlanService::WithRawCallbackMethod_CloseShmChannel<
        v1::KernelPlanService::WithRawCallbackMethod_RegisterSharedMemory<
            v1::KernelPlanService::WithRawCallbackMethod_UnregisterSharedMemory<
                v1::KernelPlanService::WithRawCallbackMethod_ListSharedMemory<
                    v1::KernelPlanService::WithRawCallbackMethod_ResolveKernelConfig<
                        v1::KernelPlanService::WithRawCallbackMethod_GetServerInfo<
                            v1::KernelPlanService::WithRawCallbackMethod_RunIrOp<
                                v1::KernelPlanService::WithRawCallbackMethod_UnloadExperts<
                                    v1::KernelPlanService::WithRawCallbackMethod_ListExperts<
                                        v1::KernelPlanService::WithRawCallbackMethod_RunMoE<
                                            v1::KernelPlanService::
                                                WithRawCallbackMethod_JoinEpGroup<
                                                    v1::KernelPlanService::
                                                        WithRawCallbackMethod_RunEpStep<
                                                            v1::KernelPlanService::
                                                                WithRawCallbackMethod_LoadExperts<
                                                                    v1::KernelPlanService::
                                                                        Service>>>>>>>>>>>>>>;

// RunMoE's answer as gRPC's bytes without copying the output's bytes: the
// response less output.data is serialized as usual, then output.data
// follows as a second occurrence of field `output` (protobuf merges it)
// whose bytes are a slice that owns the moved-out string. Small outputs
// (under kZeroCopyOutputBytes) are serialized plainly. `response` loses
// its output data.
inline constexpr size_t kZeroCopyOutputBytes = 64 << 10;
absl::Status SerializeRunMoeResponse(v1::RunMoEResponse& response, grpc::ByteBuffer* out);

class RawKernelPlanService final : public RawKernelPlanServiceBase {
 public:
  explicit RawKernelPlanService(KernelPlanServiceImpl& typed) : typed_(typed) {}

  grpc::ServerUnaryReactor* ResolveKernelConfig(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RunIrOp(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnloadExperts(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListExperts(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RunMoE(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* JoinEpGroup(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RunEpStep(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* LoadExperts(grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RegisterSharedMemory(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnregisterSharedMemory(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSharedMemory(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* OpenShmChannel(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CloseShmChannel(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;

 private:
  KernelPlanServiceImpl& typed_;
};

}  // namespace kplan::rpc
