// Programmatic dependent launch (sm_90) for the kernels of the fused MoE
// layer. A layer is a chain of short kernels (routing, align, GEMM, ...);
// at decode sizes each runs for a few microseconds, so the gap between one
// kernel's end and the next one's start is a large share of the layer.
// Launched with LaunchPdl, a kernel may be scheduled while its predecessor
// is still running; it must call PdlWaitThenRelease() before it reads
// anything a previous kernel wrote (griddepcontrol.wait returns once the
// predecessor grid has completed and its writes are visible), which then
// lets its own successor be scheduled. Every CTA of every kernel here waits
// before it releases or exits (a CTA's exit releases too), so when a kernel
// starts, everything before its predecessor is complete: the one-token
// matvec's GEMM 2 with the combine (moe_quant_matvec.cu's
// PairCombineKernel) reads the routing's ids through the L2 and issues its
// first weight loads before its wait, and only its predecessor's output
// after it, with coherent loads (LoadProduced). Launched plainly, both
// instructions are no-ops, so the kernels stay correct in any stream order.
// KPLAN_PDL=0 makes every LaunchPdl* launch plain (read once; for A/B runs
// and for telling an ordering fault from a kernel's; the one-kernel decode
// layer has its own switch). Internal to kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/moe/moe_kernel_switch.h"

namespace kplan::kernels::cuda::detail {

__device__ __forceinline__ void PdlWaitThenRelease() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Whether LaunchPdl* set the PDL attribute: unless KPLAN_PDL is "0".
inline bool PdlEnabled() {
  static const bool on = EnvOnOff("KPLAN_PDL", true);
  return on;
}

// A load of something an earlier kernel of the chain wrote, after the PDL
// wait. kEarlyWork (the matvec combine, which issues loads before its
// wait): coherent, ld.global.cg. A read-only load (__ldg, ld.global.nc)
// declares its data unchanging for the kernel's whole life, which under PDL
// it is not, and ptxas may schedule one above griddepcontrol.wait: in the
// combine it did, and its first activation load read the buffer before the
// kernel before it wrote it (docs/PERF.md, session 51). Otherwise the
// read-only path, as every other kernel here still reads its predecessor's
// output: those wait first thing and pass every test, but the same move is
// not ruled out there; no audit of their SASS has been made.
template <bool kEarlyWork, typename V>
__device__ __forceinline__ V LoadProduced(const V* p) {
  if constexpr (kEarlyWork) {
    return __ldcg(p);
  } else {
    return __ldg(p);
  }
}

// `cluster`: CTAs per thread-block cluster along x (1: no cluster attribute).
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdlCluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, unsigned cluster, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  const int pdl = PdlEnabled() ? 1 : 0;
  cfg.attrs = attr + (1 - pdl);
  cfg.numAttrs = pdl + (cluster > 1 ? 1 : 0);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  // Returned here; cleared from the thread's last-error state so that it is
  // not reported again by the next launcher that checks cudaGetLastError().
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  return LaunchPdlCluster(kernel, grid, block, smem, stream, 1, std::forward<Args>(args)...);
}

}  // namespace kplan::kernels::cuda::detail
