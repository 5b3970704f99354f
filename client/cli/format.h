// Human-readable rendering of kplan responses for the CLI; --json prints the
// messages as protobuf JSON instead.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/message.h"
#include "kplan/v1/service.pb.h"
#include "resolve/oracle/moe_plan.h"

namespace kplan::cli {

std::string FormatResolve(const v1::ResolveKernelConfigResponse& r);
// The MoE plans of a response, model.moe first, as the oracle's structs.
std::vector<MoePlan> MoePlansOf(const v1::ResolveKernelConfigResponse& r);
// Two resolutions of one request on two platforms: the config rows that
// differ, then each MoE layer's plans side by side (ComparePlans).
std::string FormatComparison(const v1::ResolveKernelConfigResponse& a,
                             const v1::ResolveKernelConfigResponse& b);
std::string FormatServerInfo(const v1::GetServerInfoResponse& r);
// Expert sets as a table: one row per set, then its expert-parallel shards.
std::string FormatExperts(const google::protobuf::RepeatedPtrField<v1::ExpertsInfo>& sets);

// What `kplan run-moe` reports: the plan of the last run and the timings
// (medians over the runs when there were several).
struct MoeRunSummary {
  std::string experts_id;
  int64_t tokens = 0;
  int runs = 0;
  v1::MoEExecution plan;
  v1::MoETiming timing;
  double round_trip_us = 0;  // measured by the client
};
std::string FormatMoeRun(const MoeRunSummary& s);
std::string MoeRunToJson(const MoeRunSummary& s);
// A JSON object of (key, JSON text) members, e.g. ToJson outputs, indented
// as ToJson indents.
std::string JsonObject(const std::vector<std::pair<std::string, std::string>>& members);
// A JSON array of JSON texts, indented as ToJson indents.
std::string JsonArray(const std::vector<std::string>& items);
// `s` as a JSON string (escaped as protobuf's JSON escapes it); null when
// `s` is not UTF-8.
std::string JsonString(const std::string& s);
// What `kplan explain --json` prints: one document with what the table
// shows, the MoE plans (model.moe first, then moe_layers, as MoePlansOf) and
// the warnings, in resolve --json's field names and words:
//   {"moe_plans": [MoEPlan...], "warnings": ["..."]}
std::string ExplainToJson(const v1::ResolveKernelConfigResponse& r);

// A byte count for people: "512 B", "6.0 KiB", "384.0 MiB".
std::string Bytes(int64_t bytes);

// protobuf JSON with the proto field names, pretty-printed; dtypes as the
// tables spell them (bfloat16).
std::string ToJson(const google::protobuf::Message& m);

}  // namespace kplan::cli
