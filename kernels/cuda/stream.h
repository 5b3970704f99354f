// Forwarding header: the old home of the stream helpers and DeviceScope,
// kept only for server/moe/ep/gpu_ep.cc. Delete once it includes
// kernels/cuda/runtime/device_guard.h and uses cuda::DeviceGuard.
#pragma once

#include "kernels/cuda/runtime/device_guard.h"
#include "kernels/cuda/runtime/stream.h"

namespace kplan::kernels {
using DeviceScope = cuda::DeviceGuard;
}  // namespace kplan::kernels
