// Forwarding header: the old name of kernels/cuda/runtime/status.h, kept only
// for server/moe/ep/gpu_ep.cc (KPLAN_EP_CUDA). Delete once it includes
// kernels/cuda/runtime/status.h and uses KPLAN_CUDA_RETURN_IF_ERROR.
#pragma once

#include "kernels/cuda/runtime/status.h"

#define KPLAN_IR_CUDA_RETURN_IF_ERROR(expr) KPLAN_CUDA_RETURN_IF_ERROR(expr)
