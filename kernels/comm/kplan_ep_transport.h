// The `passthrough` / `kplan_ep` expert-parallel transport: kernels write the
// token rows straight into the peers' memory and the expert outputs straight
// back, through NCCL's device API (NCCL >= 2.28, symmetric windows, LSA
// pointers and barriers; never NVLS), with no host collective, host
// synchronisation or allocation per layer, so a whole layer is stream-ordered
// and can be captured in a CUDA graph. One round is Dispatch then Return, both
// collective on every rank, in stream order with the expert kernels and the
// combine. docs/EP.md ("The kplan_ep transport") has the window layout, the
// protocol and why it needs no extra barrier, the launch shape, the failure
// semantics and the exact-NCCL-version check. Built only when NCCL is found
// (KPLAN_HAVE_NCCL); the header names no CUDA or NCCL type.
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

absl::Status LaunchEpDispatch(const EpKernelParams& p, const void* hidden, const int32_t* topk_ids,
                              int64_t num_tokens, void* stream);
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
  void* recv_rows() const;                 // [recv_tokens(), H]
  const int32_t* recv_expert_ids() const;  // [recv_tokens(), k]: local id or -1
  const int32_t* recv_num_tokens() const;  // [size]: M of every source, last Dispatch
  void* result_rows() const;               // [max_tokens_per_rank * k, H]

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
