// Human-readable rendering of kplan responses for the CLI; --json prints the
// messages as protobuf JSON instead.
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "kplan/v1/service.pb.h"

namespace kplan::cli {

std::string FormatResolve(const v1::ResolveKernelConfigResponse& r);
std::string FormatServerInfo(const v1::GetServerInfoResponse& r);
// protobuf JSON with the proto field names, pretty-printed.
std::string ToJson(const google::protobuf::Message& m);

}  // namespace kplan::cli
