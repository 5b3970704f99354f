// RunIrOp's CPU path from the wire: bytes -> v1::RunIrOpRequest ->
// IrOpRequestFromProto -> RunIrOp on a builtin registry (the server's, on a
// host without GPUs), device always the CPU as the executor would pick.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "kplan/v1/service.pb.h"
#include "server/ir/builtin_ops.h"
#include "server/ir/run.h"
#include "server/rpc/ir_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kplan;
  static const IrRegistry* registry = [] {
    absl::StatusOr<std::unique_ptr<IrRegistry>> r = MakeBuiltinIrRegistry(IrBuiltinOptions{});
    if (!r.ok()) std::abort();
    return r->release();
  }();
  v1::RunIrOpRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<IrOpRequest> ir = rpc::IrOpRequestFromProto(request);
  if (!ir.ok()) return 0;
  ir->device = IrDeviceSelection{};  // the CPU
  (void)RunIrOp(*registry, *ir);
  return 0;
}
