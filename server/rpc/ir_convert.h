// Conversion between kplan.v1.RunIrOpRequest/Response and server/ir's
// IrOpRequest/IrOpResult. Tensor bytes are moved as raw buffers.
#pragma once

#include "absl/status/statusor.h"
#include "kplan/v1/service.pb.h"
#include "server/ir/run.h"

namespace kplan::rpc {

// Checks dtypes (fp32, fp16, bf16 for IR ops); field paths name the input
// ("inputs[1].tensor.dtype").
absl::StatusOr<IrOpRequest> IrOpRequestFromProto(v1::RunIrOpRequest& p);
void IrOpResultToProto(IrOpResult& r, v1::RunIrOpResponse* p);

}  // namespace kplan::rpc
