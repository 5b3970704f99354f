// Forwarding header: kernels/cuda/moe/moe_ep_ops.h's old path, kept only for
// server/moe/ep/gpu_ep.cc. Delete once it includes the new path.
#pragma once

#include "kernels/cuda/moe/moe_ep_ops.h"
