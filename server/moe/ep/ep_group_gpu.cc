// GPU ranks of an EpGroup (built with CUDA, NCCL and gpu_ep.h): one rank per
// CUDA device, an NcclCommunicator per rank (a fresh unique id per
// communicator generation), the rank's experts as a GpuExperts slice on its
// device and RunMoeExpertParallelOnGpu as the step, with one persistent
// GpuEpWorkspace per rank so steady traffic allocates nothing. Each rank's
// communicator is a GpuEpCommunicator, so the passthrough transports of a
// generation live and die with that generation's NCCL communicator.
#include <cuda_runtime.h>

#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "kernels/comm/nccl_communicator.h"
#include "kernels/cuda/runtime/status.h"
#include "base/status.h"
#include "server/moe/ep/ep_group.h"
#include "server/moe/ep/ep_process.h"
#include "server/moe/ep/gpu_ep.h"
#include "server/moe/gpu_runner.h"

namespace kplan::moe::ep {
namespace {

absl::Status BindDevice(int device) {
  KPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

class GpuRankExperts final : public EpRankExperts {
 public:
  explicit GpuRankExperts(std::unique_ptr<GpuExperts> experts) : experts_(std::move(experts)) {}
  int64_t bytes() const override { return experts_ ? experts_->bytes() : 0; }
  int64_t resident_bytes() const override { return bytes(); }
  const GpuExperts* experts() const { return experts_.get(); }

 private:
  std::unique_ptr<GpuExperts> experts_;  // null on a rank that owns no expert
};

class GpuEpRanks final : public EpRankKind {
 public:
  explicit GpuEpRanks(std::vector<int> devices)
      : devices_(std::move(devices)), workspaces_(devices_.size()) {}

  int size() const override { return static_cast<int>(devices_.size()); }
  std::string Device(int rank) const override { return absl::StrCat("cuda:", devices_[rank]); }
  absl::string_view communicator() const override { return "nccl"; }
  absl::string_view moe_backend() const override { return "kplan"; }
  absl::string_view experts_kernel() const override { return "KplanFusedMoeExperts"; }
  bool runs_passthrough() const override { return true; }

  absl::Status NewCommunicators(absl::Duration comm_timeout) override {
    KPLAN_ASSIGN_OR_RETURN(std::string id, comm::NcclCommunicator::CreateUniqueId());
    kplan::MutexLock lock(&mu_);
    unique_id_ = std::move(id);
    timeout_ = comm_timeout;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> JoinCommunicator(int rank) override {
    std::string id;
    comm::NcclOptions options;
    {
      kplan::MutexLock lock(&mu_);
      id = unique_id_;
      options.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_));
    }
    KPLAN_RETURN_IF_ERROR(BindDevice(devices_[rank]));
    KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> comm,
                           comm::NcclCommunicator::Create(rank, size(), id, devices_[rank],
                                                          /*stream=*/nullptr, options));
    return std::unique_ptr<comm::Communicator>(new GpuEpCommunicator(std::move(comm)));
  }

  absl::StatusOr<std::unique_ptr<EpRankExperts>> PlaceExperts(
      int rank, const ExpertSet& set, const ExpertPlacement& placement) override {
    KPLAN_RETURN_IF_ERROR(BindDevice(devices_[rank]));
    const int count = placement.NumLocalExperts(rank);
    std::unique_ptr<GpuExperts> experts;
    if (count > 0) {
      KPLAN_ASSIGN_OR_RETURN(
          experts, GpuExperts::Create(set, devices_[rank], placement.FirstExpert(rank), count));
    }
    return std::unique_ptr<EpRankExperts>(new GpuRankExperts(std::move(experts)));
  }

  absl::Status RunMoe(int rank, const ExpertSet& set, const EpRankExperts& experts,
                      const ExpertPlacement& placement, const EpMoeOptions& options,
                      const MoeInputsForThisRank& inputs, comm::Communicator& comm) override {
    KPLAN_RETURN_IF_ERROR(BindDevice(devices_[rank]));
    // Only this rank's thread touches its workspace.
    if (workspaces_[rank] == nullptr) {
      workspaces_[rank] = std::make_unique<GpuEpWorkspace>(devices_[rank]);
    }
    GpuEpLayer layer;
    FillEpLayer(set, placement, options, layer);
    layer.local_experts = static_cast<const GpuRankExperts&>(experts).experts();
    layer.workspace = workspaces_[rank].get();
    if (options.strategy == EpStrategy::kPassthrough) {
      // The transport capacity follows the largest step so far, rounded up
      // to a power of two so growth is rare; every rank sees the same
      // options, so every rank takes the same (collective) decision.
      int64_t capacity = kDefaultPassthroughTokens;
      while (capacity < options.max_tokens_per_rank) capacity *= 2;
      KPLAN_RETURN_IF_ERROR(ReserveGpuEpWorkspace(layer, size(), capacity, options.strategy));
    }
    return RunMoeExpertParallelOnGpu(layer, inputs, comm, options.strategy);
  }

 private:
  const std::vector<int> devices_;
  std::vector<std::unique_ptr<GpuEpWorkspace>> workspaces_;
  kplan::Mutex mu_;
  std::string unique_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(30);
};

}  // namespace

absl::StatusOr<std::unique_ptr<EpRankKind>> MakeGpuEpRanks(const std::vector<int>& cuda_devices) {
  if (cuda_devices.empty()) {
    return absl::InvalidArgumentError("a GPU expert-parallel group needs at least one device");
  }
  // ARCHITECTURE.md: never NVLink multicast; NCCL reads this when a communicator
  // is created, so before the first one.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  return std::unique_ptr<EpRankKind>(new GpuEpRanks(cuda_devices));
}

bool HaveGpuEpRanks() { return true; }

EpCommFactory MakeNcclCommFactory(int device) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);  // ARCHITECTURE.md: never NVLS
  return [device](absl::string_view id, int rank, int size,
                  absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    KPLAN_RETURN_IF_ERROR(BindDevice(device));
    comm::NcclOptions options;
    options.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
    KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> comm,
                           comm::NcclCommunicator::Create(rank, size, id, device,
                                                          /*stream=*/nullptr, options));
    return std::unique_ptr<comm::Communicator>(std::move(comm));
  };
}

EpGroupIdSource MakeNcclIdSource() {
  return [] { return comm::NcclCommunicator::CreateUniqueId(); };
}

}  // namespace kplan::moe::ep
