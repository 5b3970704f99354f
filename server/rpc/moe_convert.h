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
#include "server/moe/expert_store.h"
#include "server/moe/moe_runner.h"
#include "server/moe/run_moe.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/proto/moe_plan_convert.h"

namespace kplan::rpc {

// The LoadExperts header as an ExpertsSpec (not yet validated).
absl::StatusOr<ExpertsSpec> ExpertsSpecFromProto(const v1::ExpertsHeader& h);
// RunMoE's tensors, moved out of `p`. Field paths are request paths.
absl::StatusOr<MoeRunInput> MoeRunInputFromProto(v1::RunMoERequest& p);
void MoeRunOutputToProto(MoeRunOutput& out, kernels::DType act_dtype, bool return_routing,
                         v1::RunMoEResponse* p);

// RunMoE's request as the core takes it (run_moe.h): the set from `store`
// (NOT_FOUND naming experts_id), the input (MoeRunInputFromProto; its bytes
// are moved out of `p`), kernel_config.moe_backend normalised
// (NormalizeMoeBackend; errors nested under kernel_config),
// parallel.all2all_backend when set, return_routing.
absl::StatusOr<RunMoeRequest> RunMoeRequestFromProto(const ExpertStore& store,
                                                     v1::RunMoERequest& p);
// The core's answer into `response`: output (MoeRunOutputToProto; moved out
// of `result`), plan, and timing, with `total` the call's whole time.
void RunMoeResultToProto(RunMoeResult& result, const MoeRunTiming& timing, kernels::DType act_dtype,
                         bool return_routing, absl::Duration total, v1::RunMoEResponse* response);

}  // namespace kplan::rpc
