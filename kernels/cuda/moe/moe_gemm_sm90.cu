// The grouped GEMM of the fused MoE layer on Hopper tensor cores (wgmma,
// sm_90a): LaunchMoeGroupedGemm of moe_experts.h.
//
// Shape. The GEMM is "swapped": the weights are wgmma's A operand and the
// gathered token rows its B operand, so the 64-row minimum of wgmma falls on
// the weight rows (always plentiful) and the token tile can be as narrow as
// the batch (16 slots for decode, 64, 128 or 256 for prefill). A CTA computes
// 128 weight rows (two warpgroups of 64) x block_m slots of one
// moe_align_block_size block (one expert), stepping K by 64 (or 128: Cfg's
// kWide) through a multi-stage cp.async pipeline. Both tiles are K-major rows
// of 128 bytes in the 128-byte swizzled layout wgmma reads through matrix
// descriptors (16-byte chunk c of row r at chunk c ^ (r % 8)); token rows
// are gathered from A[slot / a_row_div] while copying, so there is no
// gather pass.
//
// Why swapped and why split-K: at decode sizes the layer is a weight stream
// (every weight of a hit expert is read once for a handful of tokens), and
// the weight rows are what must be spread over the 132 SMs. When the grid has
// too few CTAs to keep every SM streaming (e.g. GEMM 2 of Mixtral for one
// token: 32 row tiles x 2 experts), K is split over `splits` CTAs that write
// fp32 partials, and a second small kernel sums them in split order (so the
// result is deterministic) and applies the rounding of the unsplit epilogue.
//
// Pipeline (per CTA, all 256 threads copy, each warpgroup multiplies):
//   iteration kt: wait for stage kt's copies; fence.proxy.async (cp.async
//   writes through the generic proxy, wgmma reads through the async proxy);
//   barrier; prefetch k-tile kt+S-2 into the stage that k-tile kt-2 used
//   (its wgmmas completed: every warpgroup waited for all but its latest
//   wgmma group before the barrier); issue 4 wgmma k16 steps (8 in the wide
//   form); commit; wait until at most one group is in flight.
// Epilogue: accumulators -> shared tile [slots][128] (rounded to T with the
// bias, or fp32 partials), then coalesced 16-byte row stores to C[slot].
//
// int4 weights (Int4W, MoeGroupedGemmArgs::int_w): the stage holds the
// packed k-tile (128 rows x 32 bytes, unswizzled) and the token tile as
// above; each consumer thread gathers its A fragment's nibbles from two
// rows, dequantises them with its rows' group scales (IntRows) and issues
// wgmma with A from registers (WgmmaRs), waiting for the group before its
// registers are reused. ncu on an H200 (docs/PERF.md, session 17): about 9
// instructions a weight, 2.5 of them the dequantisation, the rest the
// per-k-tile copy, scale and loop work that 32 weights a thread share.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "base/status.h"
#include "kernels/cuda/ir/ir_device_math.cuh"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_gemm_ws.h"
#include "kernels/cuda/moe/moe_kernel_switch.h"
#include "kernels/cuda/moe/moe_quant_gemm.h"
#include "kernels/cuda/moe/moe_quant_math.cuh"
#include "kernels/cuda/moe/moe_sm90_ptx.cuh"
#include "kernels/cuda/moe/moe_wgmma.cuh"
#include "kernels/cuda/moe/pdl.cuh"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/kernel_attrs.h"
#include "kernels/cuda/runtime/status.h"

namespace kplan::kernels::cuda {
namespace {

using detail::FromFloat;
using detail::ToFloat;
using detail::Wgmma;

constexpr int kRowsW = 128;     // weight rows per CTA (two warpgroups x 64)
constexpr int kFp8Block = 128;  // fp8 block scales: 128 x 128 (block_n = kRowsW)
constexpr int kThreads = 256;

// The weight operand "int4 with group scales" (MoeQuantWeights kInt4Packed,
// kGroup): the consumer threads dequantise each k-tile's packed weights from
// shared memory into wgmma's A registers (WgmmaRs), to the values
// LaunchMoeDequantWeights stores, so C is bit-identical to this GEMM on that
// 16-bit copy. The token operand is then T.
struct Int4W {};

inline constexpr int64_t kWideK = 4096;  // Cfg::kWide from this K

template <int BT, typename TIn, bool kWide = false>
struct Cfg {
  static constexpr bool kInt = std::is_same_v<TIn, Int4W>;
  static constexpr bool kFp8 = !kInt && sizeof(TIn) == 1;
  // kWide: 256 bytes of each row a stage, as two 128-byte sub-tiles (16-bit
  // weights in blocks of 16, K >= kWideK, K not split: 6 stages of 36 KiB,
  // one CTA a multiprocessor). Measured on an H200 (docs/PERF.md, session 24),
  // the layer, us, 128-byte stages against wide ones: faster for Mixtral-8x7B
  // at 16 tokens (K 4096 / 14336), 672.0, 671.5 against 653.4, 653.9; slower
  // for Qwen3-30B-A3B (K 2048 / 768), hence the K bound: 16 and 64 tokens 206
  // / 306 against 219 / 313, and in blocks of 64 (256, 512 tokens: hence
  // blocks of 16 only) 353 / 378 against 372 / 388. Unmeasured: grids of
  // 133-264 CTAs, which fit one wave at two CTAs a multiprocessor but not
  // at one (GEMM 2 of Mixtral at 3-12 tokens; 16 tokens has 256).
  static_assert(!kWide || (!kInt && !kFp8 && BT == 16), "wide k-tiles: 16-bit, blocks of 16");
  static constexpr int kSub = kWide ? 2 : 1;
  static constexpr int kElems16 = kInt ? 8 : 16 / sizeof(TIn);  // token elements per 16 bytes
  static constexpr int kBKe = 8 * kElems16 * kSub;  // K elements per stage (128 bytes a sub-tile)
  // int4: 8 stages of 6 / 12 / 20 KiB (the packed weights are a quarter of
  // the bytes, so more k-tiles are in flight); else 108 / 96 / 96 / 192 KiB.
  // 16-bit tokens in blocks of 128 take 3 stages so that two CTAs share a
  // multiprocessor (kMinBlocks), as blocks of 64 do: at 96 slots per hit
  // expert the layer took 7-10% less time than with one CTA and 4 stages
  // (docs/PERF.md, session 21).
  static constexpr bool kTwo128 = BT == 128 && !kInt && !kFp8;
  static constexpr int kStages = kInt ? 8 : BT == 16 ? 6 : kTwo128 ? 3 : 4;
  static constexpr int kWSub = kRowsW * (kInt ? 32 : 128);  // int4: 4 KiB unswizzled, else 16
  static constexpr int kTSub = BT * 128;
  static constexpr int kWBytes = kWSub * kSub;
  static constexpr int kTBytes = kTSub * kSub;
  // fp8 block scales: the k-tile's activation scale of each slot, then the
  // weight tile's scale, padded so that every stage stays 1024-byte aligned.
  static constexpr int kSBytes = kFp8 ? 1024 : 0;
  static_assert(!kFp8 || (BT + 1) * 4 <= kSBytes, "the stage's scales must fit");
  static constexpr int kStageBytes = kWBytes + kTBytes + kSBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kLdc = kRowsW + 8;               // epilogue T tile pitch (elements)
  static constexpr int kLdp = kRowsW + 4;               // epilogue fp32 tile pitch
  static constexpr int kSmemBytes = kPipeBytes + 1024;  // + room to align to 1024
  static constexpr int kMinBlocks = kWide ? 1 : BT <= 64 || kTwo128 ? 2 : 1;
  static_assert(BT * kLdp * 4 <= kPipeBytes, "epilogue tile must fit the pipeline buffers");
};

using detail::CpAsync16;
using detail::CpAsync4;
using detail::CpAsyncCommit;
using detail::CpAsyncWait;
using detail::Desc;
using detail::FenceProxyAsync;
using detail::Swz;
using detail::WgmmaCommit;
using detail::WgmmaFence;
using detail::WgmmaWait;

struct GemmParams {
  const void* a;
  const void* w;
  const float* bias;
  void* c;
  float* partials;  // [splits][numel][N] when splits > 1
  const int32_t* sorted;
  const int32_t* expert_ids;
  const int32_t* post;
  int64_t numel, N, K;
  int a_row_div;
  int num_local_experts;
  int splits;
  bool reduce_in_consumer;
  // fp8 operands only (see MoeGroupedGemmArgs).
  MoeFp8WeightScale w_scale_kind;
  const float* w_scale;
  const float* a_scale;
  bool a_scale_per_block;  // [a_rows, ceil(K/128)], else [a_rows]
  // Int4W only: the weights, and their groups per row.
  MoeQuantWeights iw;
  int64_t groups;
  detail::quant::GroupDiv gdiv;
};

// A consumer thread's int4 weights: its rows r and r + 8 of the tile and
// their group dequantisers. The k-tile's two 32-k halves each lie in one
// group (group sizes are multiples of 32); a dequantiser is made when the
// group changes (every k-tile half for groups of 32, every other k-tile for
// 128), from scales and zero points loaded one group ahead, and the packed
// form is taken when it is exact for every lane (warp-uniform). Rows past N
// get scale 0 (finite weights, never stored); halves past K give +0, the
// zero-filled weights of the dequantised copy's GEMM.
template <typename T>
class IntRows {
 public:
  using Dq = detail::quant::IntGroupDequant<T, true>;

  // Rows n_r (and n_r + 8) of expert e; the first k-tile kt0.
  __device__ __forceinline__ IntRows(const GemmParams& p, int e, int64_t n_r, int kt0)
      : K_(static_cast<int>(p.K)),
        shift_(p.gdiv.shift),
        size_(p.gdiv.size),
        groups_(static_cast<int>(p.groups)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t n = n_r + 8 * i;
      const int64_t base = (static_cast<int64_t>(e) * p.N + n) * p.groups;
      s_[i] = n < p.N ? p.iw.scale + base : nullptr;
      z_[i] = n < p.N && p.iw.zero != nullptr ? p.iw.zero + base : nullptr;
    }
    next_ = Group(kt0 * 64);
    Fetch();
  }

  // The A fragments of k-tile kt whose packed rows are at wrow (32 bytes a
  // row: byte b holds k 2b and 2b + 1) for lane quad q. Step s needs k
  // 16 s + 2 q (+1) and 16 s + 2 q + 8 (+9): byte q of words 2 s and 2 s + 1
  // of each row, gathered four words' bytes at a time into one word whose
  // pairs are (step 2 v, low k), (2 v, high k), (2 v + 1, low), (2 v + 1,
  // high) for half v.
  __device__ __forceinline__ void Fragments(int kt, uint32_t wrow, int q, uint32_t (&a)[4][4]) {
    uint32_t w[2][8];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 lo = detail::LdShared16(wrow + i * 256),
                  hi = detail::LdShared16(wrow + i * 256 + 16);
      const uint32_t row[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) w[i][j] = row[j];
    }
    const uint32_t sel = static_cast<uint32_t>(q) | (4u + q) << 4;
    Half(0, kt * 64, w, sel, a);
    // K is a multiple of 32: only the second half of the last k-tile can be
    // past K, where the copy's zero-filled weights are +0 (uniform branch).
    if (kt * 64 + 32 < K_) {
      Half(1, kt * 64 + 32, w, sel, a);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) a[2][j] = a[3][j] = 0u;
    }
  }

 private:
  // Half v (k from k) of the fragments from the rows' words w.
  __device__ __forceinline__ void Half(int v, int k, const uint32_t (&w)[2][8], uint32_t sel,
                                       uint32_t (&a)[4][4]) {
    Enter(Group(k));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t x = __byte_perm(__byte_perm(w[i][4 * v], w[i][4 * v + 1], sel),
                                     __byte_perm(w[i][4 * v + 2], w[i][4 * v + 3], sel), 0x5410);
      uint32_t o[4];
      dq_[i].Pairs(x, o, packed_);
      a[2 * v][i] = o[0];
      a[2 * v][2 + i] = o[1];
      a[2 * v + 1][i] = o[2];
      a[2 * v + 1][2 + i] = o[3];
    }
  }
  __device__ __forceinline__ int Group(int k) const {
    return shift_ >= 0 ? k >> shift_ : k / size_;
  }
  // Loads group next_'s scales and zero points (scale 0 past N or K).
  __device__ __forceinline__ void Fetch() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool ok = s_[i] != nullptr && next_ < groups_;
      ns_[i] = ok ? __ldg(s_[i] + next_) : 0.0f;
      nzb_[i] = detail::quant::BiasedZero(ok ? z_[i] : nullptr, next_, true);
    }
  }
  // Makes group g's dequantisers current (g is the current group or the
  // next: k grows 32 at a time). Warp-uniform: every lane has the same g.
  __device__ __forceinline__ void Enter(int g) {
    if (g == cur_) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) dq_[i] = Dq(ns_[i], nzb_[i]);
    packed_ = __all_sync(0xffffffffu, dq_[0].packed() && dq_[1].packed());
    cur_ = g;
    next_ = g + 1;
    Fetch();
  }

  int K_, shift_, size_, groups_;
  const float* s_[2];
  const uint8_t* z_[2];
  int cur_ = -1, next_ = 0;
  bool packed_ = false;
  float ns_[2] = {0.0f, 0.0f}, nzb_[2] = {0.0f, 0.0f};
  Dq dq_[2] = {Dq(0.0f, 0.0f), Dq(0.0f, 0.0f)};
};

// What the kernels of other weight types hold in IntRows' place.
struct NoIntRows {
  __device__ __forceinline__ NoIntRows(const GemmParams&, int, int64_t, int) {}
};

template <int BT, typename TIn, typename T, bool kWide = false>
__global__ void __launch_bounds__(kThreads, (Cfg<BT, TIn, kWide>::kMinBlocks))
    WgmmaGroupedGemmKernel(GemmParams p) {
  using C = Cfg<BT, TIn, kWide>;
  extern __shared__ uint8_t smem_dyn[];
  __shared__ int64_t s_arow[BT];                // A row of each slot of the block, -1 for sentinels
  __shared__ int64_t s_slot[BT];                // output row, -1 for sentinels
  __shared__ float s_ascale[C::kFp8 ? BT : 1];  // fp8 per-row activation scale

  // x walks the blocks so that CTAs running together are mostly the same
  // expert and weight rows: each weight tile comes from HBM once and from L2
  // for the expert's other blocks.
  const int block = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kRowsW;
  const int split = blockIdx.z;
  detail::PdlWaitThenRelease();
  if (static_cast<int64_t>(block) * BT >= *p.post) return;
  const int e = p.expert_ids[block];
  const bool local = e >= 0 && e < p.num_local_experts;
  const int tid = threadIdx.x;
  if (!local && p.splits > 1 && !p.reduce_in_consumer) return;  // the reduction writes zeros
  if (tid < BT) {
    const int64_t slot = p.sorted[static_cast<int64_t>(block) * BT + tid];
    const bool valid = slot >= 0 && slot < p.numel;
    s_slot[tid] = valid ? slot : -1;
    s_arow[tid] = valid ? slot / p.a_row_div : -1;
    if constexpr (C::kFp8) {
      s_ascale[tid] = valid && !p.a_scale_per_block ? p.a_scale[slot / p.a_row_div] : 0.0f;
    }
  }
  __syncthreads();
  const int64_t N = p.N, K = p.K;
  T* Cg = static_cast<T*>(p.c);

  if (!local) {  // an expert of another rank: its slots get zero rows (or partials)
    for (int i = tid; i < BT * (kRowsW / 8); i += kThreads) {
      const int r = i / (kRowsW / 8);
      const int64_t n = n0 + (i % (kRowsW / 8)) * 8;
      if (s_slot[r] < 0 || n >= N) continue;
      if (p.splits == 1) {
        *reinterpret_cast<uint4*>(Cg + s_slot[r] * N + n) = uint4{};
      } else {
        float4* dst = reinterpret_cast<float4*>(
            p.partials + (static_cast<int64_t>(split) * p.numel + s_slot[r]) * N + n);
        dst[0] = float4{};
        dst[1] = float4{};
      }
    }
    return;
  }

  // 1024-aligned pipeline base (the swizzle pattern repeats every 1024 bytes).
  const uint32_t smem_base =
      (static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn)) + 1023u) & ~1023u;
  uint8_t* smem_gen =
      smem_dyn + (smem_base - static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn)));

  using TA = std::conditional_t<C::kInt, T, TIn>;  // the token operand's type
  const TA* A = static_cast<const TA*>(p.a);
  const TA* W = C::kInt ? nullptr : static_cast<const TA*>(p.w) + static_cast<int64_t>(e) * N * K;
  const uint8_t* Wq =
      C::kInt ? static_cast<const uint8_t*>(p.iw.data) + static_cast<int64_t>(e) * N * (K / 2)
              : nullptr;

  // K range of this split, in k-tiles of 128 bytes (64 bf16 / 128 fp8; wide:
  // 256 bytes, 128 bf16).
  const int64_t ktiles_all = (K + C::kBKe - 1) / C::kBKe;
  const int64_t kt_begin = ktiles_all * split / p.splits;
  const int64_t kt_end = ktiles_all * (split + 1) / p.splits;
  const int nk = static_cast<int>(kt_end - kt_begin);

  // Int4W: this thread's 16-byte chunk of every packed k-tile (row tid / 2)
  // and of every token tile (slot (tid + i * kThreads) / 8, chunk tid % 8;
  // null: a sentinel slot), computed once.
  const bool wq_row_ok = C::kInt && n0 + (tid >> 1) < N;
  const uint8_t* wq_src = wq_row_ok ? Wq + (n0 + (tid >> 1)) * (K / 2) + (tid & 1) * 16 : Wq;
  constexpr int kTChunks = (BT * 8 + kThreads - 1) / kThreads;
  const TA* t_src[kTChunks];
  uint32_t t_dst[kTChunks];
  if constexpr (C::kInt) {
#pragma unroll
    for (int i = 0; i < kTChunks; ++i) {
      const int idx = tid + i * kThreads, r = (idx >> 3) % BT, c = idx & 7;
      t_src[i] = s_arow[r] >= 0 ? A + s_arow[r] * K + c * 8 : nullptr;
      t_dst[i] = Swz(r, c);
    }
  }
  const bool block_scaled = C::kFp8 && p.w_scale_kind == MoeFp8WeightScale::kBlock;
  // Copy assignment: W 128 rows x 8 chunks (4 per thread), tokens BT x 8,
  // per sub-tile (two in the wide form); with fp8 block scales the slots'
  // activation scales of the k-tile.
  auto load_stage = [&](int stage, int64_t kt) {
    const uint32_t w_base = smem_base + stage * C::kStageBytes;
    const uint32_t t_base = w_base + C::kWBytes;
    const int64_t k0 = kt * C::kBKe;
    if constexpr (C::kInt) {
      // The packed tile: 128 rows x 32 bytes (64 k), a 16-byte chunk (32 k)
      // a thread; the token chunks from their precomputed rows. 32-bit k.
      const int k0i = static_cast<int>(k0), Ki = static_cast<int>(K);
      const bool ok = wq_row_ok && k0i + (tid & 1) * 32 < Ki;
      CpAsync16(w_base + tid * 16, ok ? wq_src + k0i / 2 : Wq, ok);
#pragma unroll
      for (int i = 0; i < kTChunks; ++i) {
        if (tid + i * kThreads < BT * 8) {
          const bool tok = t_src[i] != nullptr && k0i + ((tid & 7) << 3) < Ki;
          CpAsync16(t_base + t_dst[i], tok ? t_src[i] + k0i : A, tok);
        }
      }
    } else {
#pragma unroll
      for (int sub = 0; sub < C::kSub; ++sub) {
#pragma unroll
        for (int i = 0; i < (kRowsW * 8) / kThreads; ++i) {
          const int idx = tid + i * kThreads;
          const int r = idx >> 3, c = idx & 7;
          const int64_t n = n0 + r, k = k0 + (sub * 8 + c) * C::kElems16;
          const bool ok = n < N && k < K;
          CpAsync16(w_base + sub * C::kWSub + Swz(r, c), ok ? W + n * K + k : W, ok);
        }
      }
#pragma unroll
      for (int sub = 0; sub < C::kSub; ++sub) {
#pragma unroll
        for (int i = 0; i < (BT * 8 + kThreads - 1) / kThreads; ++i) {
          const int idx = tid + i * kThreads;
          if (idx < BT * 8) {
            const int r = idx >> 3, c = idx & 7;
            const int64_t row = s_arow[r], k = k0 + (sub * 8 + c) * C::kElems16;
            const bool ok = row >= 0 && k < K;
            CpAsync16(t_base + sub * C::kTSub + Swz(r, c), ok ? A + row * K + k : A, ok);
          }
        }
      }
      if (C::kFp8 && block_scaled) {
        const int64_t kblocks = (K + kFp8Block - 1) / kFp8Block;
        if (tid < BT) {
          const int64_t row = s_arow[tid];
          CpAsync4(t_base + C::kTBytes + tid * 4,
                   row >= 0 ? p.a_scale + row * kblocks + kt : p.a_scale, row >= 0);
        } else if (tid == kThreads - 1) {
          // The weight tile's scale rides with the stage: read from global
          // after the k-tile's wgmma wait it cost a dependent round trip per
          // k-tile (fp8 block 1.3x per-tensor at 64 tokens: docs/PERF.md, session 15).
          const int64_t nblocks = (N + kFp8Block - 1) / kFp8Block;
          CpAsync4(t_base + C::kTBytes + BT * 4,
                   p.w_scale + (static_cast<int64_t>(e) * nblocks + n0 / kFp8Block) * kblocks + kt,
                   true);
        }
      }
    }
  };

  constexpr int S = C::kStages, P = S - 2;  // prefetch distance
  float acc[BT / 2];
#pragma unroll
  for (int i = 0; i < BT / 2; ++i) acc[i] = 0.0f;
  // Accumulator fragment of m64nBT: register i of thread (warp w, lane l)
  // holds row 16*(w%4) + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2.
  const int warp = (tid >> 5) & 3, lane = tid & 31;
  const int wg_row0 = (tid >> 7) * 64 + warp * 16 + (lane >> 2);
  const int col_base = 2 * (lane & 3);
  const int wg = tid >> 7;  // warpgroup: weight rows [wg*64, wg*64+64) of the tile

  // Int4W: this thread's rows wg_row0 and wg_row0 + 8 of the tile.
  std::conditional_t<C::kInt, IntRows<T>, NoIntRows> irows(p, e, n0 + wg_row0,
                                                           static_cast<int>(kt_begin));

#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (s < nk) load_stage(s, kt_begin + s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    CpAsyncWait<P - 1>();
    FenceProxyAsync();
    __syncthreads();
    if (kt + P < nk) load_stage((kt + P) % S, kt_begin + kt + P);
    CpAsyncCommit();

    const uint32_t w_base = smem_base + (kt % S) * C::kStageBytes;
    const uint32_t a_desc_base = w_base + wg * 64 * 128;
    const uint32_t b_desc_base = w_base + C::kWBytes;
    if constexpr (C::kInt) {
      uint32_t a[4][4];
      irows.Fragments(static_cast<int>(kt_begin) + kt, w_base + wg_row0 * 32, lane & 3, a);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        detail::WgmmaRs<BT, T>::Run(acc, a[kk], Desc(b_desc_base + kk * 32), 1);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      // The wgmmas read a[] asynchronously: keep it live (its registers
      // unreused) until they have completed.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        asm volatile("" : "+r"(a[kk][0]), "+r"(a[kk][1]), "+r"(a[kk][2]), "+r"(a[kk][3]));
      }
    } else if constexpr (C::kFp8) {
      // DeepGEMM-style promotion: fp8 tensor cores accumulate with reduced
      // precision, so each k-tile (128 of K: one 128 x 128 scale block) goes
      // into its own accumulators and is added to the fp32 sum here, times
      // a_scale · w_scale with block scales (else the scales apply once, in
      // the epilogue).
      float tile[BT / 2];
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        Wgmma<BT, TIn>::Run(tile, Desc(a_desc_base + kk * 32), Desc(b_desc_base + kk * 32), kk > 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      if (block_scaled) {
        const float* sa = reinterpret_cast<const float*>(smem_gen + (kt % S) * C::kStageBytes +
                                                         C::kWBytes + C::kTBytes);
        const float ws = sa[BT];
#pragma unroll
        for (int i = 0; i < BT / 2; ++i) {
          const int t = 8 * (i >> 2) + col_base + (i & 1);
          acc[i] += tile[i] * (sa[t] * ws);
        }
      } else {
#pragma unroll
        for (int i = 0; i < BT / 2; ++i) acc[i] += tile[i];
      }
    } else {
      WgmmaFence();
#pragma unroll
      for (int sub = 0; sub < C::kSub; ++sub) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          Wgmma<BT, TIn>::Run(acc, Desc(a_desc_base + sub * C::kWSub + kk * 32),
                              Desc(b_desc_base + sub * C::kTSub + kk * 32), 1);
        }
      }
      WgmmaCommit();
      WgmmaWait<1>();
    }
  }
  WgmmaWait<0>();
  CpAsyncWait<0>();
  __syncthreads();  // every warpgroup is done with the pipeline buffers

  const int row_base = wg_row0;
  if constexpr (C::kFp8) {
    // Per-tensor / per-channel weight scales and per-row activation scales
    // apply once, to the whole sum (block scales were applied per k-tile).
    if (!block_scaled) {
#pragma unroll
      for (int i = 0; i < BT / 2; ++i) {
        const int r = row_base + 8 * ((i >> 1) & 1);
        const int t = 8 * (i >> 2) + col_base + (i & 1);
        const float ws = p.w_scale_kind == MoeFp8WeightScale::kPerTensor ? p.w_scale[e]
                         : n0 + r < N ? p.w_scale[static_cast<int64_t>(e) * N + n0 + r]
                                      : 0.0f;
        acc[i] = acc[i] * (s_ascale[t] * ws);
      }
    }
  }
  if (p.splits == 1) {
    T* Cs = reinterpret_cast<T*>(smem_gen);  // [BT][kLdc]
    const float* bias = p.bias != nullptr ? p.bias + static_cast<int64_t>(e) * N : nullptr;
#pragma unroll
    for (int i = 0; i < BT / 2; ++i) {
      const int r = row_base + 8 * ((i >> 1) & 1);
      const int t = 8 * (i >> 2) + col_base + (i & 1);
      T v = FromFloat<T>(acc[i]);
      if (bias != nullptr && n0 + r < N) {
        v = FromFloat<T>(ToFloat(v) + ToFloat(FromFloat<T>(bias[n0 + r])));
      }
      Cs[t * C::kLdc + r] = v;
    }
    __syncthreads();
    for (int i = tid; i < BT * (kRowsW / 8); i += kThreads) {
      const int t = i / (kRowsW / 8), c8 = (i % (kRowsW / 8)) * 8;
      const int64_t slot = s_slot[t];
      if (slot < 0 || n0 + c8 >= N) continue;
      *reinterpret_cast<uint4*>(Cg + slot * N + n0 + c8) =
          *reinterpret_cast<const uint4*>(Cs + t * C::kLdc + c8);
    }
  } else {
    float* Ps = reinterpret_cast<float*>(smem_gen);  // [BT][kLdp]
#pragma unroll
    for (int i = 0; i < BT / 2; ++i) {
      const int r = row_base + 8 * ((i >> 1) & 1);
      const int t = 8 * (i >> 2) + col_base + (i & 1);
      Ps[t * C::kLdp + r] = acc[i];
    }
    __syncthreads();
    float* Pg = p.partials + static_cast<int64_t>(split) * p.numel * N;
    for (int i = tid; i < BT * (kRowsW / 4); i += kThreads) {
      const int t = i / (kRowsW / 4), c4 = (i % (kRowsW / 4)) * 4;
      const int64_t slot = s_slot[t];
      if (slot < 0 || n0 + c4 >= N) continue;
      *reinterpret_cast<float4*>(Pg + slot * N + n0 + c4) =
          *reinterpret_cast<const float4*>(Ps + t * C::kLdp + c4);
    }
  }
}

// Sums the split-K partials of every listed slot in split order and applies
// the unsplit epilogue's rounding and bias; zero rows for non-local experts.
// One CTA per (block, 128 columns); thread = 8 columns of one slot.
template <typename T>
__global__ void SplitKReduceKernel(GemmParams p, int bt) {
  const int block = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kRowsW;
  detail::PdlWaitThenRelease();
  if (static_cast<int64_t>(block) * bt >= *p.post) return;
  const int e = p.expert_ids[block];
  const bool local = e >= 0 && e < p.num_local_experts;
  const int64_t N = p.N;
  T* Cg = static_cast<T*>(p.c);
  const float* bias = local && p.bias != nullptr ? p.bias + static_cast<int64_t>(e) * N : nullptr;
  for (int i = threadIdx.x; i < bt * (kRowsW / 8); i += blockDim.x) {
    const int t = i / (kRowsW / 8);
    const int64_t n = n0 + (i % (kRowsW / 8)) * 8;
    const int64_t slot = p.sorted[static_cast<int64_t>(block) * bt + t];
    if (slot < 0 || slot >= p.numel || n >= N) continue;
    alignas(16) T out[8];
    if (!local) {
      *reinterpret_cast<uint4*>(Cg + slot * N + n) = uint4{};
      continue;
    }
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int z = 0; z < p.splits; ++z) {
      const float* src = p.partials + (static_cast<int64_t>(z) * p.numel + slot) * N + n;
      const float4 lo = *reinterpret_cast<const float4*>(src);
      const float4 hi = *reinterpret_cast<const float4*>(src + 4);
      s[0] += lo.x, s[1] += lo.y, s[2] += lo.z, s[3] += lo.w;
      s[4] += hi.x, s[5] += hi.y, s[6] += hi.z, s[7] += hi.w;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      T v = FromFloat<T>(s[j]);
      if (bias != nullptr) v = FromFloat<T>(ToFloat(v) + ToFloat(FromFloat<T>(bias[n + j])));
      out[j] = v;
    }
    *reinterpret_cast<uint4*>(Cg + slot * N + n) = *reinterpret_cast<const uint4*>(out);
  }
}

// The wide form's switch (SetMoeGemmWideMode): on unless
// KPLAN_MOE_CP_WIDE=0.
detail::KernelSwitch g_wide([] { return detail::EnvOnOff("KPLAN_MOE_CP_WIDE", true); });

template <int BT, typename TIn, typename T, bool kWide = false>
absl::Status Launch(const GemmParams& p, int64_t num_blocks, cudaStream_t stream) {
  if constexpr (!kWide && BT == 16 && !Cfg<BT, TIn>::kInt && !Cfg<BT, TIn>::kFp8) {
    // Unsplit only: MoeGemmSplitsFor counts two CTAs a multiprocessor.
    if (p.K >= kWideK && p.splits == 1 && g_wide.On()) {
      return Launch<BT, TIn, T, true>(p, num_blocks, stream);
    }
  }
  using C = Cfg<BT, TIn, kWide>;
  KPLAN_RETURN_IF_ERROR(
      (RaiseDynamicSmemOnce<WgmmaGroupedGemmKernel<BT, TIn, T, kWide>>(C::kSmemBytes)));
  const dim3 grid(static_cast<unsigned>(num_blocks),
                  static_cast<unsigned>((p.N + kRowsW - 1) / kRowsW),
                  static_cast<unsigned>(p.splits));
  KPLAN_CUDA_RETURN_IF_ERROR(detail::LaunchPdl(WgmmaGroupedGemmKernel<BT, TIn, T, kWide>, grid,
                                               dim3(kThreads), C::kSmemBytes, stream, p));
  if (p.splits > 1 && !p.reduce_in_consumer) {
    const dim3 rgrid(grid.x, grid.y);
    KPLAN_CUDA_RETURN_IF_ERROR(
        detail::LaunchPdl(SplitKReduceKernel<T>, rgrid, dim3(256), 0, stream, p, BT));
  }
  return absl::OkStatus();
}

// The kernel instantiation for a block size (validated by the caller; fp8
// has no 256-slot blocks: two accumulator sets would not fit).
template <typename TIn, typename T>
absl::Status LaunchForBlockM(int block_m, const GemmParams& p, int64_t num_blocks,
                             cudaStream_t stream) {
  if constexpr (Cfg<16, TIn>::kInt) {
    if (block_m == 16) return Launch<16, TIn, T>(p, num_blocks, stream);
    if (block_m == 64) return Launch<64, TIn, T>(p, num_blocks, stream);
    if (block_m == 128) return Launch<128, TIn, T>(p, num_blocks, stream);
    return absl::InvalidArgumentError(
        "moe_grouped_gemm: int4 weights on the cp.async kernel take block_m 16, 64 or 128");
  } else {
    switch (block_m) {
      case 16:
        return Launch<16, TIn, T>(p, num_blocks, stream);
      case 64:
        return Launch<64, TIn, T>(p, num_blocks, stream);
      case 128:
        return Launch<128, TIn, T>(p, num_blocks, stream);
      default:
        if constexpr (sizeof(TIn) == 1) {
          return absl::InvalidArgumentError("moe_grouped_gemm: fp8 takes block_m 16, 64 or 128");
        } else {
          return Launch<256, TIn, T>(p, num_blocks, stream);
        }
    }
  }
}

std::atomic<int64_t> int_launches{0};

detail::KernelSwitch g_int([] { return detail::EnvOnOff("KPLAN_MOE_INT_GEMM", true); });

}  // namespace

void detail::NoteMoeGemmIntLaunch() { int_launches.fetch_add(1, std::memory_order_relaxed); }

bool MoeIntWeightsApply(const MoeQuantWeights& w, int64_t K) {
  // K < 2^31: the kernels index k in 32 bits.
  return w.kind == DType::kInt4Packed && w.scale_kind == MoeWeightScale::kGroup &&
         w.data != nullptr && w.scale != nullptr && Aligned16(w.data) && K > 0 &&
         K < (int64_t{1} << 31) && K % 32 == 0 && w.group_size > 0 && w.group_size % 32 == 0 &&
         K % w.group_size == 0;
}

bool MoeGemmIntApplies(const MoeGroupedGemmArgs& g) {
  if (g.int_w == nullptr || g.fp8 || !MoeIntWeightsApply(*g.int_w, g.K)) return false;
  if (g.block_m == 16 || g.block_m == 64 || g.block_m == 128) return true;
  return MoeGemmWsEnabled() && MoeGemmWsApplies(g);  // which refuses split K
}

void SetMoeGemmIntMode(MoeKernelMode mode) { g_int.Set(mode); }

void SetMoeGemmWideMode(MoeKernelMode mode) { g_wide.Set(mode); }

bool MoeGemmIntEnabled() { return g_int.On(); }

int64_t MoeGemmIntLaunches() { return int_launches.load(std::memory_order_relaxed); }

int MoeGemmBlockMFor(int64_t numel, int num_experts, int64_t ws_k, bool ping_pong,
                     bool tall_tiles) {
  const int64_t per_expert = MoeSlotsPerExpert(numel, num_experts);
  // 16-slot blocks only while the average fills half of one: past that the
  // busier experts take two blocks and their weights stream twice
  // (Mixtral-8x7B at 64 tokens, 16 slots per expert on average: blocks of 64
  // took 761.6 us against 848.8 bf16 and 463.8 against 645.5 fp8 block;
  // docs/PERF.md, session 15).
  if (per_expert <= 8) return 16;
  // Blocks of 128 take the warp-specialised kernel, which streams an
  // expert's weights once for up to 128 slots; blocks of 64 stream them once
  // per block. Measured, us per layer, blocks of 64 against 128 (docs/PERF.md,
  // session 22): at 64 slots per hit expert Mixtral-8x7B 256 tokens 1063 /
  // 817, Qwen3-30B-A3B 1024 541 / 464, DeepSeek-V3 2048 8759 / 6208; at
  // 16-48 slots DeepSeek-V3 (K 7168 / 2048) 512-1536 tokens 6177-7075 /
  // 5623-5966 and fp8 block Mixtral-8x7B 64-192 tokens 454-516 / 419-458,
  // bf16 Mixtral-8x7B 96-192 tokens even and 64 tokens (16 slots) 748 / 773,
  // but Qwen3-30B-A3B (K 2048 / 768) 256-768 tokens 365-417 / 430-447.
  // With the ping-pong form (session 26), Qwen3-30B-A3B on blocks of 128
  // against 64: 256 / 384 / 512 / 768 tokens (16 / 24 / 32 / 48 slots) 353 /
  // 356 / 361 / 389 against 358-370 / 366 / 379 / 403 us; at 192 (12 slots)
  // even (351 against 350).
  const bool long_k = ws_k >= kMoeGemmWsLongK;
  if (per_expert < (long_k || ping_pong ? 16 : 64)) return 64;
  if (tall_tiles && !ping_pong && ws_k > 0) return kMoeGemmTallBlockM;  // moe_gemm_ws.h
  // Blocks of 256 from 128 slots (two tiles of one expert a cluster) were
  // slower: Qwen3-30B-A3B 2048 tokens 599 -> 707 us, DeepSeek-V3 4096 8599
  // -> 9460, Mixtral-8x7B 512 1103 -> 1148 (session 22).
  if (per_expert < 512) return 128;
  return 256;
}

int MoeGemmSplitsFor(int64_t numel, int64_t num_blocks, int64_t N, int64_t K, int num_sms,
                     int block_m, int elem_bytes) {
  // Non-empty blocks are at most one per slot; the CTAs that stream weights
  // are (row tiles) x (blocks). When they do not fill one wave of resident
  // CTAs, split K as far as the wave allows: a split that spills into a
  // second, mostly idle wave would double the time of a weight stream. At
  // least 4 k-tiles per split, at most 8 splits.
  const int64_t blocks = std::max<int64_t>(1, std::min(num_blocks, numel));
  const int64_t ctas = (N + kRowsW - 1) / kRowsW * blocks;
  // Cfg<>::kMinBlocks; 1 for every block of 128 (the 16-bit kernel fits 2
  // since session 21: the wave is underestimated there, which only splits
  // less). Blocks of 16 fit 2 unless wide, and the wide form is never split.
  const int per_sm = block_m <= 64 ? 2 : 1;
  const int64_t wave = static_cast<int64_t>(per_sm) * std::max(num_sms, 1);
  if (2 * ctas > wave) return 1;
  const int64_t ktiles = (K * elem_bytes + 127) / 128;  // 128-byte k-tiles
  const int64_t by_k = std::max<int64_t>(1, ktiles / 4);
  return static_cast<int>(std::clamp<int64_t>(wave / ctas, 1, std::min<int64_t>(8, by_k)));
}

int64_t MoeGemmPartialsBytes(int splits, int64_t numel, int64_t N) {
  return splits > 1 ? static_cast<int64_t>(splits) * numel * N * 4 : 0;
}

absl::Status LaunchMoeGroupedGemm(const MoeGroupedGemmArgs& g, cudaStream_t stream) {
  if (absl::Status s = CheckHalfDType(g.dtype, "moe_grouped_gemm"); !s.ok()) return s;
  if (g.N <= 0 || g.N % 8 != 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: N must be a positive multiple of 8");
  }
  if (g.K <= 0 || g.K % 8 != 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: K must be a positive multiple of 8");
  }
  if (g.a_row_div <= 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: a_row_div must be positive");
  }
  if (g.num_local_experts <= 0) {
    return absl::InvalidArgumentError("moe_grouped_gemm: num_local_experts must be positive");
  }
  const bool tall = g.block_m == kMoeGemmTallBlockM;
  if (g.block_m != 16 && g.block_m != 64 && g.block_m != 128 && !tall && g.block_m != 256) {
    return absl::InvalidArgumentError("moe_grouped_gemm: block_m must be 16, 64, 128, 192 or 256");
  }
  if (tall && (g.dtype != DType::kBFloat16 || g.fp8 || g.int_w != nullptr || g.splits != 1 ||
               !MoeGemmWsEnabled())) {
    return absl::InvalidArgumentError(
        "moe_grouped_gemm: block_m 192 takes bf16 weights, no split K, on the "
        "warp-specialised kernel");
  }
  if (g.splits < 1 || g.splits > 64) {
    return absl::InvalidArgumentError("moe_grouped_gemm: splits must be in [1, 64]");
  }
  if (g.numel < 0 || g.num_blocks < 0 || g.numel > INT32_MAX) {
    return absl::InvalidArgumentError("moe_grouped_gemm: numel / num_blocks out of range");
  }
  if (g.num_blocks == 0 || g.numel == 0) return absl::OkStatus();
  if (g.a == nullptr || (g.w == nullptr && g.int_w == nullptr) || g.c == nullptr ||
      g.sorted_token_ids == nullptr || g.expert_ids == nullptr ||
      g.num_tokens_post_padded == nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm: null pointer");
  }
  if (g.splits > 1 && g.partials == nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm: splits > 1 needs a partials workspace");
  }
  if (g.reduce_in_consumer && g.bias != nullptr) {
    return absl::InvalidArgumentError("moe_grouped_gemm: reduce_in_consumer takes no bias");
  }
  if (!Aligned16(g.a) || (g.int_w == nullptr && !Aligned16(g.w)) || !Aligned16(g.c) ||
      (g.partials != nullptr && !Aligned16(g.partials))) {
    return absl::InvalidArgumentError("moe_grouped_gemm: buffers must be 16-byte aligned");
  }
  if (g.num_blocks > INT32_MAX || (g.N + kRowsW - 1) / kRowsW > 65535) {
    return absl::InvalidArgumentError("moe_grouped_gemm: grid too large");
  }
  if (g.fp8) {
    if (g.K % 16 != 0) {
      return absl::InvalidArgumentError("moe_grouped_gemm: fp8 needs K a multiple of 16");
    }
    if (g.block_m == 256) {
      return absl::InvalidArgumentError("moe_grouped_gemm: fp8 takes block_m 16, 64 or 128");
    }
    if (g.w_scale == nullptr || g.a_scale == nullptr) {
      return absl::InvalidArgumentError("moe_grouped_gemm: fp8 needs w_scale and a_scale");
    }
  }
  if (g.int_w != nullptr) {
    if (!MoeGemmIntApplies(g)) {
      return absl::InvalidArgumentError(
          "moe_grouped_gemm: int4 weights not taken by the int4 GEMMs (MoeGemmIntApplies)");
    }
    if (MoeGemmWsEnabled() && MoeGemmWsApplies(g)) {
      const absl::Status st = LaunchMoeGroupedGemmWs(g, stream);
      // No tensor map: the cp.async kernel where it takes the block.
      if (!absl::IsUnavailable(st) || g.block_m > 128) return st;
    }
  }
  // The warp-specialised kernel of blocks of 128, 192 and 256, behind its switch (moe_gemm_ws.h).
  if (!g.fp8 && g.int_w == nullptr && MoeGemmWsEnabled() && MoeGemmWsApplies(g)) {
    const absl::Status st = LaunchMoeGroupedGemmWs(g, stream);
    // Else no tensor map: the kernel below, which takes no blocks of 192.
    if (!absl::IsUnavailable(st) || tall) return st;
  }
  if (tall) {
    return absl::InvalidArgumentError(
        "moe_grouped_gemm: block_m 192 needs the warp-specialised kernel (MoeGemmWsApplies)");
  }
  const GemmParams p{g.a,
                     g.w,
                     g.bias,
                     g.c,
                     g.partials,
                     g.sorted_token_ids,
                     g.expert_ids,
                     g.num_tokens_post_padded,
                     g.numel,
                     g.N,
                     g.K,
                     g.a_row_div,
                     g.num_local_experts,
                     g.splits,
                     g.splits > 1 && g.reduce_in_consumer,
                     g.w_scale_kind,
                     g.w_scale,
                     g.a_scale,
                     g.fp8 && g.w_scale_kind == MoeFp8WeightScale::kBlock,
                     g.int_w != nullptr ? *g.int_w : MoeQuantWeights{},
                     g.int_w != nullptr ? g.K / g.int_w->group_size : 0,
                     detail::quant::GroupDiv::For(g.int_w != nullptr ? g.int_w->group_size : 1)};
  if (g.int_w != nullptr) {
    const absl::Status st =
        g.dtype == DType::kBFloat16
            ? LaunchForBlockM<Int4W, __nv_bfloat16>(g.block_m, p, g.num_blocks, stream)
            : LaunchForBlockM<Int4W, __half>(g.block_m, p, g.num_blocks, stream);
    if (st.ok()) detail::NoteMoeGemmIntLaunch();
    return st;
  }
  using F8 = __nv_fp8_e4m3;
  if (g.dtype == DType::kBFloat16) {
    return g.fp8
               ? LaunchForBlockM<F8, __nv_bfloat16>(g.block_m, p, g.num_blocks, stream)
               : LaunchForBlockM<__nv_bfloat16, __nv_bfloat16>(g.block_m, p, g.num_blocks, stream);
  }
  return g.fp8 ? LaunchForBlockM<F8, __half>(g.block_m, p, g.num_blocks, stream)
               : LaunchForBlockM<__half, __half>(g.block_m, p, g.num_blocks, stream);
}

}  // namespace kplan::kernels::cuda
