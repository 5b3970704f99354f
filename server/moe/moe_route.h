// RunMoE's backend choice through the MoE kernel oracle (ARCHITECTURE.md
// "Vocabulary for what runs here"): the resident expert set and the request
// become the oracle's layer (LayerSpecOf), PlanMoeLayer runs the same
// selection loop as ResolveKernelConfig on the server's own platform,
// restricted to the backends this server executes (PlanOptions), and the
// chosen backend maps to the code path that runs it (ChooseMoeRoute).
//
// Why here: the mapping reads server/moe types (ExpertsSpec, MoeRunInput)
// and feeds resolve/oracle, and oracle must not depend on moe (ARCHITECTURE.md
// "Layout": moe -> oracle). It needs no gRPC, proto or CUDA: RunMoe
// (run_moe.h) passes what the device copy can do as plain facts
// (MoeResidency), so the whole choice is tested on a CPU.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/moe/expert_set.h"
#include "server/moe/moe_runner.h"
#include "resolve/oracle/moe_config.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/platform/platform.h"

namespace kplan {

// The oracle's MoE layer for running `input` on the resident set `spec`:
// E, top_k, H, I, activation, the routing (method, scoring, renormalize,
// groups, correction bias, scaling; "Custom" when the request brings its own
// top-k ids), in_dtype = the activations' dtype, router logits float32, bias,
// and the weight / activation QuantKeys of the set's quantization:
//   fp8_per_tensor   kFp8StaticTensorSym   x  activation rule below
//   fp8_per_channel  kFp8StaticChannelSym  x  activation rule below
//   fp8_block        kFp8Static128BlockSym x  kFp8Dynamic128Sym (every block
//                    size: vLLM names 128 x 128 only; the route checks the
//                    size the fast kernels take)
//   int8_group       kInt8Static (weight_bits 8; vLLM has no asymmetric int8
//                    WNA16 key, so zero points keep it)
//   int4_group       kInt4Static32[Asym] for group 32, else kInt4Static[Asym]
//                    (vLLM's per-group key for 128); Asym with zero points
//   unquantised      none x none
// Activation rule (fp8 per-tensor / per-channel): per_token ->
// kFp8DynamicTokenSym; per_tensor with a static a1 scale ->
// kFp8StaticTensorSym; per_tensor without one -> kFp8DynamicTensorSym.
// `shape` is CheckMoeRunInput's verdict on the request (by logits or by ids,
// top_k).
MoeLayerSpec LayerSpecOf(const ExpertsSpec& spec, const MoeRunInput& input,
                         const MoeRunShape& shape);

// What RunMoe knows about the set's single-GPU copy (never an
// expert-parallel group's), as plain facts.
struct MoeResidency {
  bool on_gpu = false;     // a single-GPU copy is resident
  bool fast_path = false;  // DeviceExperts::FastPathFor(the activations' dtype)
};

// The code path that runs a plan.
enum class MoeRouteKind {
  kGpuFast,        // RunMoeOnGpu, fast kplan kernels (wgmma)
  kGpuEmulation,   // RunMoeOnGpu, emulation route (dequantise in the GEMM)
  kCpuReference,   // RunMoeOnCpu
  kExpertParallel  // the expert-parallel group (kplan_ep, passthrough)
};
absl::string_view MoeRouteKindName(MoeRouteKind kind);

struct MoeRoute {
  MoePlan plan;  // the oracle's plan; candidates amended where the route deviates
  MoeRouteKind kind = MoeRouteKind::kCpuReference;
  std::string backend;         // the moe_backend that runs: kplan | emulation | kplan_ep
  std::string experts_kernel;  // the plan's experts class that runs
};

// The moe_backend string of a request as KernelConfig normalises it ("" ->
// auto; lower(), "-" -> "_"; pydantic's literal_error for unknown values,
// INVALID_ARGUMENT naming "moe_backend").
absl::StatusOr<std::string> NormalizeMoeBackend(absl::string_view moe_backend);

// Chooses how RunMoE runs `input` on `spec` for `moe_backend` (normalised):
// PlanMoeLayer on `platform` (the server's own) over `executable_backends`
// (GetServerInfo's list), then:
// The route is the layer's: on the GPU the experts class that runs may
// depend on the call's size (GpuLayerExpertsKernel in moe_runner.h,
// RouteThatRan).
//   KPLAN          -> kGpuFast when resident on a GPU with the fast path;
//                     otherwise the emulation route (on the GPU when resident,
//                     else the CPU reference), reported as EMULATION with the
//                     reason on the KPLAN candidate;
//   EMULATION      -> kGpuEmulation when resident on a GPU and the fast path
//                     does not apply (RunMoeOnGpu takes the emulation route
//                     for exactly those); otherwise kCpuReference;
//   KPLAN_EP       -> kExpertParallel (only an expert-parallel group runs it);
//   KPLAN_BATCHED  -> FAILED_PRECONDITION: RunMoE takes standard-format
//                     tokens and kplan's kernels are standard format
//                     (moe_align_block_size + grouped GEMM); the batched
//                     format belongs to batched dispatchers (DeepEP LL, NIXL)
//                     this server does not have, so no kernel maps to it.
// The request is checked first (CheckMoeRunInput: INVALID_ARGUMENT naming the
// request field). Plan errors are PlanMoeLayer's (FAILED_PRECONDITION "cannot run on this server;
// it runs: ..." for a backend outside `executable_backends`, vLLM's texts
// otherwise); the field is "moe_backend", or the MoELayerConfig field, for
// the caller to nest.
absl::StatusOr<MoeRoute> ChooseMoeRoute(const ExpertsSpec& spec, const MoeRunInput& input,
                                        absl::string_view moe_backend,
                                        const MoeResidency& residency, const Platform& platform,
                                        const std::vector<std::string>& executable_backends);

// The route as one call ran it: `chosen` when `ran` (the experts class the
// layer reports, MoeRunOutput::experts_kernel) is empty or chosen's own;
// otherwise backend and experts_kernel are what ran (emulation for
// KplanEmulationExperts, else kplan), the accepted candidate says why it did
// not run for these `num_tokens`, and the one that ran follows, accepted.
MoeRoute RouteThatRan(const MoeRoute& chosen, absl::string_view ran, int64_t num_tokens);

// Routes chosen before, so a RunMoE asks the oracle once per kind of call:
// per (experts_id, the set's instance, activation dtype, top_k, routing,
// moe_backend, residency, token bucket). A route is reused only for the very
// set it was chosen on (a set unloaded and loaded again under its id is a
// new instance, so it never meets the old one's routes); Invalidate drops
// an id's routes at unload. Bounded: beyond max_entries the oldest half
// goes. Thread-safe.
class MoeRouteCache {
 public:
  explicit MoeRouteCache(size_t max_entries = 4096) : max_entries_(max_entries) {}

  // ChooseMoeRoute's answer for `input` on `set`, from the cache when it
  // was chosen before (errors are not cached: they are chosen again).
  absl::StatusOr<std::shared_ptr<const MoeRoute>> Choose(
      const std::shared_ptr<const ExpertSet>& set, const MoeRunInput& input,
      absl::string_view moe_backend, const MoeResidency& residency, const Platform& platform,
      const std::vector<std::string>& executable_backends);
  // Drops every route of `experts_id` (UnloadExperts).
  void Invalidate(const std::string& experts_id);
  size_t size() const;
  // Choices that asked the oracle (misses), for tests and metrics.
  int64_t misses() const;

  // The power of two at or above `num_tokens` (0 for 0): the token bucket.
  static int64_t TokenBucket(int64_t num_tokens);

 private:
  struct Entry {
    std::weak_ptr<const ExpertSet> set;
    std::shared_ptr<const MoeRoute> route;
    uint64_t serial = 0;  // insertion order, for the bound
  };
  const size_t max_entries_;
  mutable std::mutex mu_;
  // By experts_id, then the rest of the key.
  std::map<std::string, std::map<std::string, Entry>> routes_ ABSL_GUARDED_BY(mu_);
  size_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kplan
