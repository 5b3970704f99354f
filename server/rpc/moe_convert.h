// Conversion between kplan.v1's execution messages (LoadExperts header,
// RunMoE request and response) and server/moe's types. The planning
// conversions (MoELayerConfig, MoEPlan, DType wire names) are in
// moe_plan_convert.h, included here for the callers that use both.
#pragma once

#include <functional>
#include <optional>

#include "absl/status/statusor.h"
#include "kplan/v1/config.pb.h"
#include "kplan/v1/plan.pb.h"
#include "kplan/v1/service.pb.h"
#include "server/moe/expert_set.h"
#include "server/moe/expert_store.h"
#include "server/moe/moe_runner.h"
#include "server/moe/run_moe.h"
#include "server/moe/shm_regions.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/proto/moe_plan_convert.h"

namespace kplan::rpc {

// The LoadExperts header as an ExpertsSpec (not yet validated).
absl::StatusOr<ExpertsSpec> ExpertsSpecFromProto(const v1::ExpertsHeader& h);
// RunMoE's tensors, moved out of `p`. Field paths are request paths.
absl::StatusOr<MoeRunInput> MoeRunInputFromProto(v1::RunMoERequest& p);
// The output is [num_tokens, hidden] (the set's hidden size: [0, H] for an
// empty batch); its bytes are moved out of `out`.
void MoeRunOutputToProto(MoeRunOutput& out, kernels::DType act_dtype, int64_t hidden,
                         bool return_routing, v1::RunMoEResponse* p);

// RunMoE's request as the core takes it (run_moe.h): the set from `store`
// (NOT_FOUND naming experts_id), the input (MoeRunInputFromProto; its bytes
// are moved out of `p`), kernel_config.moe_backend normalised
// (NormalizeMoeBackend; errors nested under kernel_config),
// parallel.all2all_backend when set, return_routing.
absl::StatusOr<RunMoeRequest> RunMoeRequestFromProto(const ExpertStore& store,
                                                     v1::RunMoERequest& p);
// FAILED_PRECONDITION: shared-memory regions are off (no --allow_shared_memory),
// naming `field` when it is not empty.
absl::Status SharedMemoryOff(absl::string_view field);

// What ResolveRunMoeShm found in POSIX regions: the hidden states' and the
// router logits' windows, which the run reads in place, and the output's.
struct RunMoeShm {
  std::optional<ShmView> hidden_states;
  std::optional<ShmView> router_logits;
  std::optional<ShmView> output;  // output_shm (a CUDA region's too)
};

// RunMoE's shared-memory references (Tensor.shm, output_shm) against
// `regions` (null: shared memory is off, and any reference is
// SharedMemoryOff naming it), bounds-checked, errors naming
// `<tensor>.shm.*`: hidden_states and router_logits in a POSIX region are
// returned as views to read in place (AttachRunMoeShm; copying the logits
// out was most of decode, docs/PERF.md session 29); a given top-k, which
// indexes memory once checked, is copied into the request as its data (a
// client writing its window meanwhile cannot change it). The output window
// is returned when the request names one, and must be exactly as large as
// hidden_states (the output's size), else INVALID_ARGUMENT naming
// output_shm.byte_size. References into CUDA regions go to `device` instead
// (hidden_states, router_logits, the output: read and written
// device-to-device by the GPU path; all on one GPU, else INVALID_ARGUMENT
// naming the later one); a given top-k in a CUDA region is copied to the
// host, where the ids are checked. A given top-k's reference must hold
// exactly the bytes of its shape (4 a slot), at most kMaxTopKShmBytes, else
// INVALID_ARGUMENT naming <tensor>.shm.byte_size (or <tensor>.shape): it is
// checked before anything is copied.
inline constexpr int64_t kMaxTopKShmBytes = int64_t{64} << 20;  // 16 Mi slots
absl::StatusOr<RunMoeShm> ResolveRunMoeShm(const ShmRegistry* regions, v1::RunMoERequest& p,
                                           MoeDeviceTensors* device);

// Gives `in` the POSIX windows of `shm`: the hidden states and logits read
// in place, and the output written in place (MoeRunInput::host_output,
// asking `cancelled` before the write) unless its window overlaps an
// input's (then the output comes back in the result and
// RunMoeResultToProto copies it after the run: never an input overwritten
// while it is read).
void AttachRunMoeShm(const RunMoeShm& shm, std::function<bool()> cancelled, MoeRunInput* in);

// What the answer needs of its request, kept while the layer runs.
struct RunMoeAnswer {
  kernels::DType act_dtype = kernels::DType::kBFloat16;
  int64_t hidden = 0;  // the set's
  bool return_routing = false;
  absl::Time arrival;  // the request's bytes arrived (Call::start)
  absl::Time decoded;  // the request converted
  // Where the output goes instead of the response (output_shm), and the
  // reference the response names.
  std::optional<ShmView> output_shm;
  v1::SharedMemoryRef output_ref;
};

// The core's answer into `response`: output (MoeRunOutputToProto; moved out
// of `result`), plan, and timing (MoETiming: the durations and each hop's
// time since `answer.arrival`, encoded_at_us and total_us taken last). With
// output_shm the output goes into the client's region instead (the path
// wrote it there already when result.output.in_place): FAILED_PRECONDITION
// naming output_shm.region if it was truncated meanwhile.
absl::Status RunMoeResultToProto(RunMoeResult& result, const MoeRunTiming& timing,
                                 const RunMoeAnswer& answer, v1::RunMoEResponse* response);

}  // namespace kplan::rpc
