// Host side both warp-specialised grouped GEMM launchers share
// (moe_gemm_ws_sm90.cu, moe_gemm_ws_fp8_sm90.cu): their integer knobs from the environment, the
// setup before a launch and the shapes the tile schedule (moe_ws_schedule.h) takes. Internal to
// kernels/cuda/moe.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_kernel_switch.h"
#include "kernels/cuda/moe/moe_ws_schedule.h"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/kernel_attrs.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda::ws {

// True unless environment variable `name` is "old" (which selects the
// kernel the warp-specialised one replaced).
inline bool WsEnvNotOld(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "old") != 0;
}

// A launcher's measurement knobs (its benchmark sets them): debug flag bits
// from `debug_var` (default 0), the units per group of the schedule from
// `group_var` (default kWsAutoGroup) and, for a fused GEMM 1, from
// `act_group_var` (default: the other).
struct WsKnobs {
  int debug_flags, group, act_group;
};
// Debug bits make wrong outputs by design (skipped stores or MMAs): a
// process that has them says so on stderr, once per launcher.
inline WsKnobs WsKnobsFromEnv(const char* debug_var, const char* group_var,
                              const char* act_group_var = nullptr) {
  const int group = detail::EnvInt(group_var, kWsAutoGroup);
  const WsKnobs k{detail::EnvInt(debug_var, 0), group,
                  act_group_var != nullptr ? detail::EnvInt(act_group_var, group) : group};
  if (k.debug_flags != 0) {
    std::fprintf(stderr,
                 "kplan: %s=%d: measurement variants of the MoE GEMMs, outputs may be wrong\n",
                 debug_var, k.debug_flags);
  }
  return k;
}

// Before a launch of kKernel with `smem_bytes` of dynamic shared memory on
// the current device, in clusters of `cluster` CTAs of `threads` threads:
// the CTAs that run at once into *resident_ctas (the multiprocessors, or the
// clusters that fit times `cluster`), and the kernel's dynamic
// shared-memory opt-in (RaiseDynamicSmemOnce), both set up once per device.
template <auto kKernel>
absl::Status WsLaunchSetup(int smem_bytes, int* resident_ctas, int cluster = 1,
                           int threads = kWsThreads) {
  int device = 0;
  KPLAN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KPLAN_ASSIGN_OR_RETURN(const int sms, MultiprocessorCount(device));
  KPLAN_RETURN_IF_ERROR(RaiseDynamicSmemOnce<kKernel>(smem_bytes));
  // The CTAs that fit, found once per device below 64 (past that: every launch).
  static std::atomic<int> resident[64];  // 0: not known yet, -1: no cluster fits
  const bool cached = device < 64;
  *resident_ctas = sms;
  if (cluster <= 1) return absl::OkStatus();
  int n = cached ? resident[device].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(sms / cluster * cluster));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) != cudaSuccess) {
      cudaGetLastError();  // no answer: taken as no cluster fitting (the caller falls back)
      clusters = 0;
    }
    n = clusters > 0 ? clusters * cluster : -1;
    if (cached) resident[device].store(n, std::memory_order_relaxed);
  }
  if (n < 0) return absl::UnavailableError("moe_grouped_gemm_ws: no cluster of the kernel fits");
  *resident_ctas = n;
  return absl::OkStatus();
}

// The shapes the tile schedule takes: blocks of 128 or 256 slots (however
// few of them are filled: MoeGemmBlockMFor picks blocks of 128 where this
// kernel pays), or of 192 (the tall tiles: 16-bit bf16 weights only), the
// weight rows and the slots addressable by int32.
inline bool WsTilesApply(const MoeGroupedGemmArgs& g) {
  const bool tall =
      g.block_m == kWsTallTileT && g.dtype == DType::kBFloat16 && g.int_w == nullptr && !g.fp8;
  if (g.block_m != 128 && g.block_m != 256 && !tall) return false;
  const int64_t rows = static_cast<int64_t>(g.num_local_experts) * g.N;
  return rows + kWsTileN < (int64_t{1} << 31) && g.num_blocks * g.block_m < (int64_t{1} << 31);
}

}  // namespace kplan::kernels::cuda::ws
