// Conversion between the kplan.v1 messages and the core models of
// resolve/plan and resolve/platform. Defaults of absent proto fields are filled
// here (empty backend = "auto", size 0 = 1); validation stays in the core.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kplan/v1/config.pb.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/platform/platform.h"

namespace kplan::rpc {

// The priority list of IR op `op` inside `p`; null for an unknown op.
google::protobuf::RepeatedPtrField<std::string>* MutablePriority(v1::IrOpPriorityConfig* p,
                                                                 absl::string_view op);

KernelConfig KernelConfigFromProto(const v1::KernelConfig& p);
void KernelConfigToProto(const KernelConfig& c, v1::KernelConfig* p);

ParallelConfig ParallelConfigFromProto(const v1::ParallelConfig& p);
void ParallelConfigToProto(const ParallelConfig& c, v1::ParallelConfig* p);

// Unknown library names are kept (vendors add libraries) but reported in `warnings`.
absl::StatusOr<Platform> PlatformFromProto(const v1::Platform& p,
                                           std::vector<std::string>* warnings);
void PlatformToProto(const Platform& c, v1::Platform* p);

}  // namespace kplan::rpc
