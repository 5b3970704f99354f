// The `passthrough` / `kplan_ep` expert-parallel transport: kernels write the
// token rows straight into the peers' memory and the expert outputs straight
// back, through NCCL's device API (NCCL >= 2.28), with no host collective,
// no host synchronisation and no allocation per layer, so a whole layer
// (dispatch -> local experts -> return -> combine) is stream-ordered and can
// be captured in a CUDA graph.
//
// Memory: one symmetric window per rank (ncclMemAlloc +
// ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)), same layout on every
// rank, reached from the kernels through LSA (load/store accessible) peer
// pointers over NVLink/P2P. With n ranks, T = max_tokens_per_rank, k = top_k
// and H = hidden it holds
//   recv rows     [n * T, H]       token rows received, source s at rows [s*T, (s+1)*T)
//   recv ids      [n * T, k] int32 the LOCAL expert id of each (token, slot) pair, -1 where
//                                  this rank does not own the slot or no row arrived
//   recv tokens   [n] int32        the token count M of each source in the last Dispatch
//   result rows   [T * k, H]       expert outputs of this rank's own pairs, row m*k + j
// Everything else (NCCL's barrier state) lives in NCCL's resource window. No
// NVLink multicast (NVLS) is requested or used.
//
// Layout choices, and why they differ from "one row per (token, slot)":
//  * Positional, not compacted: token m of source s always lands in recv row
//    s*T + m. Nothing is counted or claimed (no atomics, no prefix sums), the
//    result is deterministic, and the return address of a pair is implicit
//    (source s, row m*k + j) so no source index travels as metadata.
//  * One row per (token, destination rank), not per (token, slot): a token
//    whose k experts sit on one rank is sent there once (DeepEP's
//    layout), which cuts the dispatched bytes by up to k. The receive side is
//    exactly the single-GPU expert input: hidden rows [n*T, H] plus ids
//    [n*T, k], so the grouped-GEMM pipeline (kernels/cuda/moe/moe_experts.h) runs
//    on it unchanged: moe_align_block_size over the n*T*k recv ids with
//    num_experts = the local expert count (-1 and other ids outside
//    [0, E_local) are skipped), GEMM 1 with a_row_div = k reading recv rows,
//    GEMM 2 writing Y [n*T*k, H]; Return(Y) sends row (s*T + m)*k + j back.
//  * Returns stay per pair ([T*k, H] at the source) so the source combines
//    with LaunchMoeCombine in slot order, bit-exact with moe::CombineTopK.
//
// Protocol, one round = Dispatch then Return, both collective (every rank
// calls both, in the same order, including ranks with no tokens):
//  Dispatch  one kernel: every warp takes (token, 2 KiB segment) units, loads
//            the segment once (16-byte loads) and stores it to every rank
//            owning one of the token's experts; the first segment's warp also
//            writes the token's k ids there. Pairs whose id is outside
//            [0, num_experts) go nowhere: their result row is zeroed locally,
//            so they add nothing in the combine. Then each CTA joins an LSA
//            barrier with the same CTA of every peer (release/acquire), so
//            when the kernel ends every peer's rows for this rank have arrived.
//  Return    one kernel: for every received token (tokens m < M_s of each
//            source s), each pair this rank owns is copied from Y to row
//            m*k + j of the result region on rank s, and the token's ids are
//            reset to -1 (re-arming the -1 invariant for the next Dispatch);
//            then the same LSA barrier. After it, every pair of this rank's
//            tokens holds its expert output (or zeros for an invalid id):
//            each pair is returned exactly once.
// Why no extra barrier at the start of a kernel: a source writes into a
// destination's recv region in Dispatch i+1 only after passing the barrier
// of Return i, which the destination joins after its experts (which read the
// recv region) and its reset; a peer writes into the result region in Return
// i only after the barrier of Dispatch i, which the source joins after its
// combine of round i-1 (same stream). So reads and writes of consecutive
// rounds never overlap, provided each rank keeps Dispatch, its expert
// kernels, Return and its combine in stream order (one stream, or events).
//
// Launch shape: a fixed grid of `num_ctas` CTAs of 512 threads on every rank
// (CTA j pairs with CTA j of the peers in the barrier, so the grid must be
// identical everywhere and must fit on the GPU at once; it never depends on
// M). The LSA barrier state is NCCL's (ncclDevCommRequirements.
// lsaBarrierCount = num_ctas).
//
// Failures: arguments are checked on the host before anything is launched
// (INVALID_ARGUMENT, e.g. num_tokens > max_tokens_per_rank); CUDA and NCCL
// errors come back with file:line and the library's message. A rank that
// skips a round (an error, a crash) leaves its peers spinning in the barrier:
// like an NCCL collective, the group is then lost (a device-side timeout is
// not implemented).
//
// NCCL version: the device API is header-inline code over NCCL's structs,
// whose layouts change between patch releases (2.28.3 -> 2.28.9 moved
// ncclDevCommRequirements.lsaBarrierCount and grew ncclWindow_vidmem), so
// Create refuses (FAILED_PRECONDITION) unless the NCCL loaded at run time is
// exactly the one whose headers the kernels were compiled with (CMake
// KPLAN_NCCL_DEVICE_INCLUDE picks them when they are not the toolkit's).
//
// Built only when NCCL is found (KPLAN_HAVE_NCCL), like NcclCommunicator. The
// header names no CUDA or NCCL type (streams are cudaStream_t as void*).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/comm/nccl_communicator.h"

struct ncclDevComm;        // NCCL's device communicator (nccl_device.h)
struct ncclWindow_vidmem;  // NCCL's window (ncclWindow_t is ncclWindow_vidmem*)

namespace kplan::comm {

inline constexpr int kKplanEpMaxRanks = 32;
inline constexpr int kKplanEpMaxTopK = 32;

struct KplanEpConfig {
  int64_t max_tokens_per_rank = 0;  // T: the largest M a Dispatch may carry
  int top_k = 0;                    // k, 1..32
  int64_t hidden = 0;               // H; H * elem_size must be a multiple of 16 bytes
  int elem_size = 2;                // bytes per element (bf16 / fp16: 2); rows are copied bitwise
  int num_experts = 0;              // E, global
  // Contiguous placement: rank r owns experts [rank_first_expert[r],
  // rank_first_expert[r + 1]); size() + 1 non-decreasing entries from 0 to E.
  // Empty: the linear placement of moe::ep::ExpertPlacement::Linear (rank r
  // owns E / n experts, plus one when r < E % n).
  std::vector<int> rank_first_expert;
  // CTAs of both kernels (and LSA barriers); identical on every rank and at
  // most the GPU's SM count (the barrier needs every CTA resident at once).
  int num_ctas = 64;
};

// Byte offsets of the regions in the window (identical on every rank).
struct KplanEpLayout {
  int64_t row_bytes = 0;      // H * elem_size
  int64_t ids_offset = 0;     // recv ids (recv rows start at 0)
  int64_t counts_offset = 0;  // recv tokens per source
  int64_t result_offset = 0;  // result rows
  int64_t total_bytes = 0;    // the window's size
};

namespace ep_internal {

// What both kernels need; filled once by KplanEpTransport, launched by
// kplan_ep_kernels.cu. Plain data: the launcher copies the device
// communicator into the kernel's parameters.
struct EpKernelParams {
  const ncclDevComm* dev_comm = nullptr;  // host copy
  ncclWindow_vidmem* window = nullptr;
  int rank = 0, size = 0, top_k = 0, num_experts = 0, num_ctas = 0;
  int64_t max_tokens = 0;
  KplanEpLayout layout;
  int first_expert[kKplanEpMaxRanks + 1] = {};
};

absl::Status LaunchEpDispatch(const EpKernelParams& p, const void* hidden,
                              const int32_t* topk_ids, int64_t num_tokens, void* stream);
absl::Status LaunchEpReturn(const EpKernelParams& p, const void* expert_out, void* stream);

}  // namespace ep_internal

class KplanEpTransport {
 public:
  // Collective over `comm`'s group (every rank calls it with the same
  // config): creates the device communicator, allocates and registers the
  // window, sets recv ids to -1 and synchronises the group once. `comm` must
  // outlive the transport. FAILED_PRECONDITION when some rank is not load/store
  // accessible (the group spans more than one NVLink/P2P domain).
  static absl::StatusOr<std::unique_ptr<KplanEpTransport>> Create(NcclCommunicator& comm,
                                                                  const KplanEpConfig& config);
  // Collective too (window deregistration): every rank destroys its transport.
  ~KplanEpTransport();
  // After the communicator was aborted (its NCCL state, the window
  // registration and the device communicator died with it): frees this
  // rank's window memory without calling into the communicator, so the
  // destructor then does nothing. Not collective. No kernel of the transport
  // may still run on this rank.
  void Abandon();
  KplanEpTransport(const KplanEpTransport&) = delete;
  KplanEpTransport& operator=(const KplanEpTransport&) = delete;

  // Enqueues the dispatch of this rank's `num_tokens` tokens on `stream`
  // (cudaStream_t as void*): hidden [num_tokens, H] (16-byte aligned rows) and
  // topk_ids int32 [num_tokens, k], both device pointers. num_tokens may be 0
  // (the kernel still runs: it takes part in the barrier).
  absl::Status Dispatch(void* stream, const void* hidden, const int32_t* topk_ids,
                        int64_t num_tokens);

  // Enqueues the return of the expert outputs on `stream`: expert_out is
  // Y [recv_pairs(), H] (device, 16-byte aligned), row (s*T + m)*k + j holding
  // the output of pair (token m of source s, slot j) wherever recv_expert_ids
  // is not -1 (other rows are not read). Afterwards result_rows() holds this
  // rank's pairs, ready for LaunchMoeCombine(result_rows(), topk_weights, M, k, H).
  // A null expert_out returns zero rows: the round of a rank whose experts
  // could not run still completes for its peers.
  absl::Status Return(void* stream, const void* expert_out);

  // Device pointers into this rank's window (valid for the transport's life).
  void* recv_rows() const;                // [recv_tokens(), H]
  const int32_t* recv_expert_ids() const;  // [recv_tokens(), k]: local id or -1
  const int32_t* recv_num_tokens() const;  // [size]: M of every source, last Dispatch
  void* result_rows() const;              // [max_tokens_per_rank * k, H]

  int rank() const { return rank_; }
  int size() const { return size_; }
  const KplanEpConfig& config() const { return config_; }
  int64_t recv_tokens() const { return size_ * config_.max_tokens_per_rank; }  // n * T
  int64_t recv_pairs() const { return recv_tokens() * config_.top_k; }         // n * T * k
  int first_local_expert() const { return config_.rank_first_expert[rank_]; }
  int num_local_experts() const {
    return config_.rank_first_expert[rank_ + 1] - config_.rank_first_expert[rank_];
  }
  const KplanEpLayout& layout() const { return params_.layout; }

 private:
  KplanEpTransport(NcclCommunicator& comm, KplanEpConfig config);
  absl::Status Init();

  NcclCommunicator& comm_;
  const int rank_, size_, device_;
  KplanEpConfig config_;
  char* base_ = nullptr;  // ncclMemAlloc'd: this rank's view of its window
  ncclWindow_vidmem* window_ = nullptr;
  bool window_registered_ = false;
  std::unique_ptr<ncclDevComm> dev_comm_;
  bool dev_comm_created_ = false;
  ep_internal::EpKernelParams params_;
};

}  // namespace kplan::comm
