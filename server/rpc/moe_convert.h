// Conversion between kplan.v1's execution messages (LoadExperts header,
// RunMoE request and response) and server/moe's types. The planning
// conversions (MoELayerConfig, MoEPlan, DType wire names) are in
// moe_plan_convert.h, included here for the callers that use both.
#pragma once

#include "absl/status/statusor.h"
#include "kplan/v1/config.pb.h"
#include "kplan/v1/plan.pb.h"
#include "kplan/v1/service.pb.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_runner.h"
#include "server/oracle/moe_plan.h"
#include "server/rpc/moe_plan_convert.h"

namespace kplan::rpc {

// The LoadExperts header as an ExpertsSpec (not yet validated).
absl::StatusOr<ExpertsSpec> ExpertsSpecFromProto(const v1::ExpertsHeader& h);
// RunMoE's tensors, moved out of `p`. Field paths are request paths.
absl::StatusOr<MoeRunInput> MoeRunInputFromProto(v1::RunMoERequest& p);
void MoeRunOutputToProto(MoeRunOutput& out, moe::MoeDType act_dtype, bool return_routing,
                         v1::RunMoEResponse* p);

}  // namespace kplan::rpc
