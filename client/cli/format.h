// Human-readable rendering of kplan responses for the CLI; --json prints the
// messages as protobuf JSON instead.
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "kplan/v1/service.pb.h"
#include "server/oracle/moe_plan.h"

namespace kplan::cli {

std::string FormatResolve(const v1::ResolveKernelConfigResponse& r);
// The MoE plans of a response, model.moe first, as the oracle's structs.
std::vector<MoePlan> MoePlansOf(const v1::ResolveKernelConfigResponse& r);
// Two resolutions of one request on two platforms: the config rows that
// differ, then each MoE layer's plans side by side (ComparePlans).
std::string FormatComparison(const v1::ResolveKernelConfigResponse& a,
                             const v1::ResolveKernelConfigResponse& b);
std::string FormatServerInfo(const v1::GetServerInfoResponse& r);
// protobuf JSON with the proto field names, pretty-printed.
std::string ToJson(const google::protobuf::Message& m);

}  // namespace kplan::cli
