// ResolveKernelConfig as a plain function over the API messages: the server
// and the offline CLI (`kplan resolve --offline`) both call it, so they give
// identical answers for the same request.
#pragma once

#include "absl/status/statusor.h"
#include "kplan/v1/service.pb.h"
#include "resolve/platform/platform.h"

namespace kplan::rpc {

// Resolves `request` for its platform, or `local_platform` when it names none.
absl::StatusOr<v1::ResolveKernelConfigResponse> ResolveKernelConfig(
    const v1::ResolveKernelConfigRequest& request, const Platform& local_platform);

}  // namespace kplan::rpc
