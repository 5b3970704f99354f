#include "kernels/comm/kplan_ep_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime/buffers.h"
#include "kernels/cuda/runtime/device_info.h"
#include "kernels/cuda/runtime/status.h"
#include "base/status.h"

namespace kplan::comm {
namespace {

constexpr int64_t kRegionAlign = 4096;           // NCCL_WIN_REQUIRED_ALIGNMENT
constexpr int64_t kWindowGranularity = 2 << 20;  // cuMem allocation granularity

int64_t AlignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Makes `device` current for the calling thread until the guard dies.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~CurrentDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

absl::Status ValidateConfig(const KplanEpConfig& c, int size) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("KplanEpTransport: ", parts...));
  };
  if (size < 1 || size > kKplanEpMaxRanks) {
    return invalid("group size ", size, " not in [1, ", kKplanEpMaxRanks, "]");
  }
  if (c.max_tokens_per_rank < 1 || c.max_tokens_per_rank * size > (int64_t{1} << 30)) {
    return invalid("max_tokens_per_rank ", c.max_tokens_per_rank, " not in [1, 2^30 / size]");
  }
  if (c.top_k < 1 || c.top_k > kKplanEpMaxTopK) {
    return invalid("top_k ", c.top_k, " not in [1, ", kKplanEpMaxTopK, "]");
  }
  if (c.hidden < 1 || c.elem_size < 1 || (c.hidden * c.elem_size) % 16 != 0) {
    return invalid("hidden ", c.hidden, " x elem_size ", c.elem_size,
                   " must be a positive multiple of 16 bytes");
  }
  if (c.num_experts < 1) return invalid("num_experts ", c.num_experts, " must be positive");
  if (!c.rank_first_expert.empty()) {
    if (static_cast<int>(c.rank_first_expert.size()) != size + 1 ||
        c.rank_first_expert.front() != 0 || c.rank_first_expert.back() != c.num_experts) {
      return invalid("rank_first_expert must have size + 1 = ", size + 1,
                     " entries from 0 to num_experts = ", c.num_experts);
    }
    for (int r = 0; r < size; ++r) {
      if (c.rank_first_expert[r] > c.rank_first_expert[r + 1]) {
        return invalid("rank_first_expert must be non-decreasing (rank ", r, ")");
      }
    }
  }
  if (c.num_ctas < 1 || c.num_ctas > 1024) {
    return invalid("num_ctas ", c.num_ctas, " not in [1, 1024]");
  }
  return absl::OkStatus();
}

using kernels::cuda::Aligned16;

}  // namespace

KplanEpTransport::KplanEpTransport(NcclCommunicator& comm, KplanEpConfig config)
    : comm_(comm),
      rank_(comm.rank()),
      size_(comm.size()),
      device_(comm.device()),
      config_(std::move(config)),
      dev_comm_(std::make_unique<ncclDevComm>()) {}

absl::StatusOr<std::unique_ptr<KplanEpTransport>> KplanEpTransport::Create(
    NcclCommunicator& comm, const KplanEpConfig& config) {
  KPLAN_RETURN_IF_ERROR(ValidateConfig(config, comm.size()));
  std::unique_ptr<KplanEpTransport> t(new KplanEpTransport(comm, config));
  KPLAN_RETURN_IF_ERROR(t->Init());
  return t;
}

absl::Status KplanEpTransport::Init() {
  // The kernels inline NCCL's device code over NCCL's structs (ncclDevComm,
  // ncclWindow_vidmem, ncclDevCommRequirements), whose layouts differ even
  // between 2.28 patch releases: only the version compiled against is safe.
  int runtime_version = 0;
  KPLAN_NCCL_RETURN_IF_ERROR(ncclGetVersion(&runtime_version));
  if (runtime_version != NCCL_VERSION_CODE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KplanEpTransport: built against NCCL ", NCCL_VERSION_CODE, " device headers but NCCL ",
        runtime_version,
        " is loaded; the device API is inline code over NCCL's structs, so "
        "rebuild with that NCCL's headers (CMake KPLAN_NCCL_DEVICE_INCLUDE) or load the NCCL "
        "the build used"));
  }
  CurrentDevice guard(device_);
  int sms = 0;
  KPLAN_ASSIGN_OR_RETURN(sms, kernels::cuda::MultiprocessorCount(device_));
  if (config_.num_ctas > sms) {
    return absl::InvalidArgumentError(absl::StrCat("KplanEpTransport: num_ctas ", config_.num_ctas,
                                                   " exceeds the ", sms, " SMs of device ", device_,
                                                   " (every CTA must be resident)"));
  }
  if (config_.rank_first_expert.empty()) {  // moe::ep::ExpertPlacement::Linear
    const int base = config_.num_experts / size_, extra = config_.num_experts % size_;
    for (int r = 0; r <= size_; ++r) {
      config_.rank_first_expert.push_back(r * base + (r < extra ? r : extra));
    }
  }

  const int64_t T = config_.max_tokens_per_rank, k = config_.top_k;
  KplanEpLayout& L = params_.layout;
  L.row_bytes = config_.hidden * config_.elem_size;
  L.ids_offset = AlignUp(size_ * T * L.row_bytes, kRegionAlign);
  L.counts_offset = AlignUp(L.ids_offset + size_ * T * k * 4, kRegionAlign);
  L.result_offset = AlignUp(L.counts_offset + kKplanEpMaxRanks * 4, kRegionAlign);
  L.total_bytes = AlignUp(L.result_offset + T * k * L.row_bytes, kWindowGranularity);

  ncclComm_t comm = comm_.nccl_comm();
  // Collective, in the same order on every rank: window, then device comm.
  void* base = nullptr;
  KPLAN_NCCL_RETURN_IF_ERROR(ncclMemAlloc(&base, static_cast<size_t>(L.total_bytes)));
  base_ = static_cast<char*>(base);
  KPLAN_NCCL_RETURN_IF_ERROR(ncclCommWindowRegister(comm, base_, static_cast<size_t>(L.total_bytes),
                                                    &window_, NCCL_WIN_COLL_SYMMETRIC));
  window_registered_ = true;

  ncclDevCommRequirements reqs{};  // zero: no multimem (NVLS), no GIN
  reqs.lsaMultimem = false;
  reqs.lsaBarrierCount = config_.num_ctas;
  KPLAN_NCCL_RETURN_IF_ERROR(ncclDevCommCreate(comm, &reqs, dev_comm_.get()));
  dev_comm_created_ = true;
  if (dev_comm_->lsaSize != size_ || dev_comm_->nRanks != size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KplanEpTransport: kplan_ep needs every rank load/store accessible from every other "
        "(one NVLink/P2P domain); NCCL's LSA team has ",
        dev_comm_->lsaSize, " of ", dev_comm_->nRanks, " ranks"));
  }

  params_.dev_comm = dev_comm_.get();
  params_.window = window_;
  params_.rank = rank_;
  params_.size = size_;
  params_.top_k = config_.top_k;
  params_.num_experts = config_.num_experts;
  params_.num_ctas = config_.num_ctas;
  params_.max_tokens = T;
  for (int r = 0; r <= size_; ++r) params_.first_expert[r] = config_.rank_first_expert[r];

  // The -1 invariant of recv ids, zero token counts; then one host barrier so
  // that no peer writes here before the reset landed.
  auto stream = static_cast<cudaStream_t>(comm_.stream());
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(base_ + L.ids_offset, 0xff, static_cast<size_t>(size_ * T * k * 4), stream));
  KPLAN_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(base_ + L.counts_offset, 0, kKplanEpMaxRanks * 4, stream));
  return comm_.Barrier();
}

void KplanEpTransport::Abandon() {
  dev_comm_created_ = false;
  window_registered_ = false;
  if (base_ != nullptr) {
    CurrentDevice guard(device_);
    (void)ncclMemFree(base_);
    base_ = nullptr;
  }
}

KplanEpTransport::~KplanEpTransport() {
  if (!dev_comm_created_ && !window_registered_ && base_ == nullptr) return;  // abandoned
  CurrentDevice guard(device_);
  (void)cudaDeviceSynchronize();
  ncclComm_t comm = comm_.nccl_comm();
  if (dev_comm_created_) (void)ncclDevCommDestroy(comm, dev_comm_.get());
  if (window_registered_) (void)ncclCommWindowDeregister(comm, window_);
  if (base_ != nullptr) (void)ncclMemFree(base_);
}

absl::Status KplanEpTransport::Dispatch(void* stream, const void* hidden, const int32_t* topk_ids,
                                        int64_t num_tokens) {
  if (num_tokens < 0 || num_tokens > config_.max_tokens_per_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("KplanEpTransport::Dispatch: num_tokens ", num_tokens, " not in [0, ",
                     config_.max_tokens_per_rank, "] (max_tokens_per_rank)"));
  }
  if (num_tokens > 0 && (hidden == nullptr || topk_ids == nullptr)) {
    return absl::InvalidArgumentError(
        "KplanEpTransport::Dispatch: hidden and topk_ids must be device pointers");
  }
  if (!Aligned16(hidden)) {
    return absl::InvalidArgumentError("KplanEpTransport::Dispatch: hidden must be 16-byte aligned");
  }
  CurrentDevice guard(device_);
  return ep_internal::LaunchEpDispatch(params_, hidden, topk_ids, num_tokens, stream);
}

absl::Status KplanEpTransport::Return(void* stream, const void* expert_out) {
  if (!Aligned16(expert_out)) {
    return absl::InvalidArgumentError(
        "KplanEpTransport::Return: expert_out must be a 16-byte aligned device pointer");
  }
  CurrentDevice guard(device_);
  return ep_internal::LaunchEpReturn(params_, expert_out, stream);
}

void* KplanEpTransport::recv_rows() const { return base_; }
const int32_t* KplanEpTransport::recv_expert_ids() const {
  return reinterpret_cast<const int32_t*>(base_ + params_.layout.ids_offset);
}
const int32_t* KplanEpTransport::recv_num_tokens() const {
  return reinterpret_cast<const int32_t*>(base_ + params_.layout.counts_offset);
}
void* KplanEpTransport::result_rows() const { return base_ + params_.layout.result_offset; }

}  // namespace kplan::comm
