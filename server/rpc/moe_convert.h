// Conversion between kplan.v1.MoELayerConfig / MoEPlan and the oracle's
// MoeLayerSpec / MoePlan (field-for-field mirrors).
#pragma once

#include "kplan/v1/config.pb.h"
#include "kplan/v1/plan.pb.h"
#include "server/oracle/moe_plan.h"

namespace kplan::rpc {

MoeLayerSpec MoeLayerFromProto(const v1::MoELayerConfig& p);
void MoePlanToProto(const MoePlan& c, v1::MoEPlan* p);
MoePlan MoePlanFromProto(const v1::MoEPlan& p);

}  // namespace kplan::rpc
