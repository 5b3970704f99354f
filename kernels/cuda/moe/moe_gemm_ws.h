// The warp-specialised, persistent grouped GEMM of the fused MoE layer for
// sm_90a (moe_gemm_ws_sm90.cu): the large-M path of LaunchMoeGroupedGemm
// (moe_experts.h), same arguments and results (bf16 / fp16 output with the
// same rounding points; bit-identical to moe_gemm_sm90.cu's output in every
// GEMM measured), the default since session 5 (docs/PERF.md).
//
// Selection: LaunchMoeGroupedGemm calls LaunchMoeGroupedGemmWs when
// MoeGemmWsEnabled() and MoeGemmWsApplies(args): bf16 / fp16 operands (no
// fp8), no split-K, blocks of 128 or 256 slots (MoeGemmBlockMFor picks these
// from 65 slots per expert up) and at least 128 slots per expert on average,
// and the weights addressable by a TMA tensor map. The switch:
// SetMoeGemmWsMode(kOn / kOff), or with kFromEnv (the default) on unless the
// environment variable KPLAN_MOE_GEMM=old selects the cp.async kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace kplan::kernels::cuda {

enum class MoeGemmWsMode : int { kFromEnv = 0, kOff = 1, kOn = 2 };
void SetMoeGemmWsMode(MoeGemmWsMode mode);
bool MoeGemmWsEnabled();

bool MoeGemmWsApplies(const MoeGroupedGemmArgs& args);
// Args already validated by LaunchMoeGroupedGemm, MoeGemmWsApplies true.
// UNAVAILABLE, with nothing launched, when the driver gives no TMA tensor map
// for the weights (LaunchMoeGroupedGemm then takes the cp.async kernel).
absl::Status LaunchMoeGroupedGemmWs(const MoeGroupedGemmArgs& args, cudaStream_t stream);

}  // namespace kplan::kernels::cuda
