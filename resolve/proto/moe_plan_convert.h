// Conversion between kplan.v1.MoELayerConfig / MoEPlan and the oracle's
// MoeLayerSpec / MoePlan (field-for-field mirrors), and the DType wire names.
// Planning only: proto, oracle and plan, nothing of server/moe or kernels/, so
// the offline CLI links it (kplan_resolve) without the execution stack.
#pragma once

#include <string>

#include "kplan/v1/config.pb.h"
#include "kplan/v1/plan.pb.h"
#include "kplan/v1/service.pb.h"
#include "resolve/oracle/moe_config.h"
#include "resolve/oracle/moe_plan.h"

namespace kplan::rpc {

MoeLayerSpec MoeLayerFromProto(const v1::MoELayerConfig& p);
void MoePlanToProto(const MoePlan& c, v1::MoEPlan* p);
MoePlan MoePlanFromProto(const v1::MoEPlan& p);

// DType <-> the wire names of server/moe ("bfloat16", "float8_e4m3", ...);
// unknown values map to "" / DTYPE_UNSPECIFIED.
std::string WireFromProtoDType(v1::DType dtype);
v1::DType ProtoDTypeFromWire(const std::string& wire);

}  // namespace kplan::rpc
