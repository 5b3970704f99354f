// CUDA graphs of small RunMoeOnGpu calls (gpu_runner.h). A decode-sized
// call is a handful of short kernels between one upload and one download;
// launched one by one, the host's launch overhead and the gaps between them
// are a large part of its device time. A graph of the whole call (upload,
// layer, download) replays it with one launch.
//
// A graph bakes in every pointer and size of the call it was captured from,
// so it is keyed by everything the enqueued work depends on: the experts, M,
// top_k, how the call is routed, the dtype, the modes of the layer, and the
// addresses and size of the thread's device workspace and pinned staging
// buffer. The cache is per thread and device (like the workspace it points
// into), so no lock; it is cleared whenever that workspace is freed or
// regrown and whenever any GpuExperts is destroyed (its weights' addresses
// may come back for another set).
//
// A key's first call runs eagerly (module loading and kernel attributes
// happen outside any capture; a one-off size costs no capture), its second
// is captured and replayed, later ones replay. A capture the runtime refuses
// marks the key eager for good.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/moe/moe_quant_route.h"
#include "server/moe/gpu_layer.h"

namespace kplan {

// Calls of at most this many tokens are graphed (the decode sizes, where
// launch overhead is a visible part of the call).
inline constexpr int64_t kMoeGraphMaxTokens = 64;

// Everything a graphed call's enqueued work depends on: EnqueueMoeLayer's
// arguments (the experts, the layer's arguments, its workspace) and the
// copies' (the pinned buffer), and the quantised-route override it reads.
struct MoeGraphKey {
  const GpuExperts* experts = nullptr;
  MoeLayerArgs layer;
  const void* workspace = nullptr;  // the thread's whole block
  int64_t workspace_capacity = 0;
  const void* host = nullptr;  // the thread's pinned buffer
  int64_t host_capacity = 0;
  kernels::cuda::MoeQuantRouteMode quant_route = kernels::cuda::MoeQuantRouteMode::kAuto;
  bool stage_by_sm = false;  // GpuRunOptions::stage_by_sm

  bool operator==(const MoeGraphKey& o) const;
};

class MoeGraphCache {
 public:
  enum class Use { kEager, kCapture, kReplay };

  MoeGraphCache() = default;
  ~MoeGraphCache() { Clear(); }
  MoeGraphCache(const MoeGraphCache&) = delete;
  MoeGraphCache& operator=(const MoeGraphCache&) = delete;

  // What this call does for `key`; *exec is the graph to launch for kReplay.
  Use Lookup(const MoeGraphKey& key, cudaGraphExec_t* exec);
  // The outcome of a kCapture: the instantiated graph, or null when the
  // capture was refused (the key then stays eager).
  void Store(const MoeGraphKey& key, cudaGraphExec_t exec);
  // Destroys every graph (their workspace is about to go).
  void Clear();

 private:
  struct Entry {
    MoeGraphKey key;
    cudaGraphExec_t exec = nullptr;
    bool refused = false;
    uint64_t last_use = 0;
  };
  static constexpr size_t kMaxEntries = 32;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace kplan
