// vLLM's configuration vocabularies as data: the Literal value lists of
// vllm/config/kernel.py and vllm/config/parallel.py, the backend sets the
// seed names, and the IR ops with their known providers. One row per fact;
// update here when vLLM adds a value.
#pragma once

#include "absl/strings/string_view.h"
#include <vector>

namespace kplan {

// KernelConfig.moe_backend (MoEBackend Literal, seed kernel.py), followed by
// this server's own executable family (ARCHITECTURE.md "Vocabulary").
const std::vector<absl::string_view>& MoeBackendValues();
// KernelConfig.linear_backend (LinearBackend Literal).
const std::vector<absl::string_view>& LinearBackendValues();
// KernelConfig.sparse_indexer_topk_backend (SparseIndexerTopkBackend Literal).
const std::vector<absl::string_view>& SparseIndexerTopkBackendValues();
// ParallelConfig.all2all_backend (All2AllBackend Literal, in its order, the
// removed naive and pplx included), plus "passthrough" (set by binding, never
// offered on the CLI) and kplan's "kplan_all2allv".
const std::vector<absl::string_view>& All2AllBackendValues();
// All2all values vLLM removed and rewrites to allgather_reducescatter.
const std::vector<absl::string_view>& RemovedAll2AllBackends();
// ParallelConfig.use_sequence_parallel_moe's all2all backends.
const std::vector<absl::string_view>& SequenceParallelMoeAll2AllBackends();

inline constexpr absl::string_view kDefaultAll2AllBackend = "allgather_reducescatter";
inline constexpr absl::string_view kPassthroughAll2AllBackend = "passthrough";
inline constexpr absl::string_view kFlashinferMoeEpCutedsl = "flashinfer_moe_ep_cutedsl";
inline constexpr absl::string_view kFlashinferMoeEpDeepGemm = "flashinfer_moe_ep_mega_deep_gemm";

// FLASHINFER_MOE_EP_BACKENDS: backends that dispatch and combine themselves.
const std::vector<absl::string_view>& FlashinferMoeEpBackends();
// Every moe_backend that owns its expert-parallel communication and so binds
// all2all_backend=passthrough: vLLM's FlashInfer MoE-EP set plus kplan_ep.
bool DispatchesItself(absl::string_view moe_backend);
// FLASHINFER_MOE_EP_ARCHITECTURES.
const std::vector<absl::string_view>& FlashinferMoeEpArchitectures();

// IR ops in IrOpPriorityConfig declaration order.
const std::vector<absl::string_view>& IrOpNames();

// A provider an IR op may list in its priority. `uuid` stands in for vLLM's
// IrOpImpl.uuid() (the SHA-256 of the provider's Python source file, which a
// C++ service cannot reproduce): a stable string per (op, provider, version).
struct IrProviderInfo {
  absl::string_view op;
  absl::string_view provider;
  absl::string_view impl_version;
};
const std::vector<IrProviderInfo>& IrProviders();
// The uuid of (op, provider); empty when the provider is unknown for the op.
std::string IrProviderUuid(absl::string_view op, absl::string_view provider);
// The providers known for `op`, in table order.
std::vector<absl::string_view> IrProvidersOf(absl::string_view op);

bool Contains(const std::vector<absl::string_view>& values, absl::string_view v);

}  // namespace kplan
