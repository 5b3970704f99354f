// Inline PTX of the sm_90a grouped GEMMs (moe_gemm_sm90.cu, moe_gemm_ws_sm90.cu,
// moe_gemm_ws_fp8_sm90.cu) and the one-kernel decode layer
// (moe_decode_layer.cu), cp.async for the quantised decode kernels
// (moe_quant_decode.cu, moe_quant_matvec.cu): cp.async, proxy fences, wgmma groups, the
// 128-byte-swizzle shared-memory matrix descriptor, mbarriers, TMA and bulk
// loads (multicast to a cluster), cluster barriers, setmaxnreg and the
// warp-specialised kernels' 16-byte fragment stores.
// Internal to kernels/cuda/moe.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: no -lcuda)

#include <cstdint>
#include <cstring>

#include "kernels/cuda/ir/ir_device_math.cuh"

namespace kplan::kernels::cuda::detail {

__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void CpAsync4(uint32_t smem, const void* gmem, bool valid) {
  const int src_size = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Byte offset of 16-byte chunk `c` of row `r` in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t Swz(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups
// 1024 bytes apart (SBO), LBO unused for this layout (1 by convention).
__device__ __forceinline__ uint64_t Desc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// --- mbarriers, TMA, register reallocation (the warp-specialised GEMMs) ---

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nMBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Arrives on `bar` once every cp.async this thread issued so far completed.
__device__ __forceinline__ void CpAsyncArriveNoinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// TmaLoad2d into the same shared-memory offset of every CTA of the cluster
// in `cta_mask`, completing the bytes on the mbarrier at `bar`'s offset in each.
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
// --- thread-block clusters ---
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));  // fixed for the CTA: may be reused
  return r;
}
// Every thread of the cluster: what each did before is visible to all after.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
// The mbarrier inits of this thread visible to the cluster (before a ClusterSync).
__device__ __forceinline__ void FenceMbarInitCluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives on the mbarrier at `bar`'s offset in the shared memory of CTA
// `cta` of the cluster, with the default CTA-scope release (as CUTLASS's
// cluster barrier arrives). A consumer's "stage read" relies on its wgmma
// reads having completed at wgmma.wait_group, not on this release, whose
// scope does not formally cover the other CTA; a .release.cluster arrive
// made the layers it ran in 37-45% slower (docs/PERF.md, session 19).
__device__ __forceinline__ void MbarArriveRemote(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// One contiguous copy of `bytes` (a multiple of 16; both addresses 16-byte
// aligned) from global to shared memory by the bulk copy engine, completing
// `bytes` of transactions on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
template <int R>
__device__ __forceinline__ void SetMaxNRegInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void SetMaxNRegDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

// 16 bytes from / to shared address a (st / ld .shared.v4; "memory": not
// moved across the barriers that order them with other threads' accesses).
__device__ __forceinline__ uint4 LdShared16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void StShared16(uint32_t a, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

// a[i] / a[i] = v for a run-time i in [0, 4), without indexing the array.
__device__ __forceinline__ uint32_t Pick4(const uint32_t (&a)[4], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}
__device__ __forceinline__ void Put4(uint32_t (&a)[4], int i, uint32_t v) {
  a[0] = i == 0 ? v : a[0];
  a[1] = i == 1 ? v : a[1];
  a[2] = i == 2 ? v : a[2];
  a[3] = i == 3 ? v : a[3];
}

// The 4 x 4 transposes of two sets of 4-byte pieces in a quad: lane q gets
// in oa[t] / ob[t] the piece pa[q] / pb[q] of the quad's lane t. All 32
// lanes must call it.
__device__ __forceinline__ void QuadTranspose2(const uint32_t (&pa)[4], const uint32_t (&pb)[4],
                                               int lane, uint32_t (&oa)[4], uint32_t (&ob)[4]) {
  const int q = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Round i: send piece (q - i) & 3, receive lane (q + i) & 3's piece q.
    const int send = (q - i) & 3, from = (q + i) & 3;
    const uint32_t ra = __shfl_sync(0xffffffffu, Pick4(pa, send), (lane & ~3) | from);
    const uint32_t rb = __shfl_sync(0xffffffffu, Pick4(pb, send), (lane & ~3) | from);
    Put4(oa, from, ra);
    Put4(ob, from, rb);
  }
}

// Per 32 columns of two rows: lane q of a quad holds pieces pa[jj] / pb[jj]
// (4 bytes: 2 columns, of j = 4m + jj). A 4 x 4 transpose in the quad gives
// lane q the 8 columns of j = 4m + q, stored as 16 bytes to dst0 / dst1
// (null: not stored). All 32 lanes must call it.
__device__ __forceinline__ void QuadStore16(const uint32_t (&pa)[4], const uint32_t (&pb)[4],
                                            int lane, void* dst0, void* dst1) {
  uint32_t oa[4], ob[4];
  QuadTranspose2(pa, pb, lane, oa, ob);
  if (dst0 != nullptr) *static_cast<uint4*>(dst0) = make_uint4(oa[0], oa[1], oa[2], oa[3]);
  if (dst1 != nullptr) *static_cast<uint4*>(dst1) = make_uint4(ob[0], ob[1], ob[2], ob[3]);
}

// The same for 1-byte values (fp8), 64 columns of two rows: piece wa[jj]
// holds columns 8 j + 2 q and + 1 of j = jj (the first 32 columns), wb[jj]
// those of j = 4 + jj (the second 32), row r0's two bytes in the low half
// and row r0 + 8's in the high half. Lane q stores 8 bytes of each row at columns 8 q and 32 + 8
// q of dst0 / dst1 (null: not stored).
__device__ __forceinline__ void QuadStore8x2(const uint32_t (&wa)[4], const uint32_t (&wb)[4],
                                             int lane, uint8_t* dst0, uint8_t* dst1) {
  uint32_t oa[4], ob[4];
  QuadTranspose2(wa, wb, lane, oa, ob);
  const int q = lane & 3;
  if (dst0 != nullptr) {
    *reinterpret_cast<uint2*>(dst0 + 8 * q) =
        make_uint2(__byte_perm(oa[0], oa[1], 0x5410), __byte_perm(oa[2], oa[3], 0x5410));
    *reinterpret_cast<uint2*>(dst0 + 32 + 8 * q) =
        make_uint2(__byte_perm(ob[0], ob[1], 0x5410), __byte_perm(ob[2], ob[3], 0x5410));
  }
  if (dst1 != nullptr) {
    *reinterpret_cast<uint2*>(dst1 + 8 * q) =
        make_uint2(__byte_perm(oa[0], oa[1], 0x7632), __byte_perm(oa[2], oa[3], 0x7632));
    *reinterpret_cast<uint2*>(dst1 + 32 + 8 * q) =
        make_uint2(__byte_perm(ob[0], ob[1], 0x7632), __byte_perm(ob[2], ob[3], 0x7632));
  }
}

// The warp-specialised kernels' epilogue for one consumer warp: rows r0 and
// r0 + 8 of a 64 x kCols fp32 accumulator tile (register i: row
// r0 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2) into row0 /
// row1 (a row of C, null: not stored), columns n0 .. n0 + kCols - 1 below N.
// value(j, n, v) writes the values of registers 4j .. 4j + 3 (columns n and
// n + 1, n = n0 + 8j + 2 (lane % 4); rows r0, r0, r0 + 8, r0 + 8); each is
// rounded to T, then with bias round(round(v) + round(bias[n])).
template <typename T, int kCols, typename F>
__device__ __forceinline__ void WsStoreRows(F&& value, const float* bias, int64_t n0, int64_t N,
                                            int lane, T* row0, T* row1) {
  const int q = lane & 3;
#pragma unroll
  for (int m = 0; m < kCols / 32; ++m) {
    uint32_t pa[4], pb[4];  // rows r0, r0 + 8: the pieces of j = 4m .. 4m + 3
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * m + jj;
      const int64_t n = n0 + 8 * j + 2 * q;
      float v[4];
      value(j, n, v);
#pragma unroll
      for (int x = 0; x < 4; ++x) v[x] = ToFloat(FromFloat<T>(v[x]));
      if (bias != nullptr && n < N) {
        const float b0 = ToFloat(FromFloat<T>(bias[n])), b1 = ToFloat(FromFloat<T>(bias[n + 1]));
        v[0] += b0, v[1] += b1, v[2] += b0, v[3] += b1;
      }
      pa[jj] = Pack2<T>(v[0], v[1]);
      pb[jj] = Pack2<T>(v[2], v[3]);
    }
    const int64_t n = n0 + 8 * (4 * m + q);
    QuadStore16(pa, pb, lane, row0 != nullptr && n < N ? row0 + n : nullptr,
                row1 != nullptr && n < N ? row1 + n : nullptr);
  }
}

}  // namespace kplan::kernels::cuda::detail
