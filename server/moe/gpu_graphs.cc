#include "server/moe/gpu_graphs.h"

#include <algorithm>

namespace kplan {

namespace {

bool SameRouting(const kernels::cuda::MoeRoutingParams& a,
                 const kernels::cuda::MoeRoutingParams& b) {
  return a.num_experts == b.num_experts && a.top_k == b.top_k && a.method == b.method &&
         a.scoring == b.scoring && a.renormalize == b.renormalize &&
         a.e_score_correction_bias == b.e_score_correction_bias &&
         a.routed_scaling_factor == b.routed_scaling_factor &&
         a.num_expert_group == b.num_expert_group && a.topk_group == b.topk_group;
}

bool SameLayer(const MoeLayerArgs& a, const MoeLayerArgs& b) {
  return a.num_tokens == b.num_tokens && a.top_k == b.top_k && a.num_experts == b.num_experts &&
         a.hidden == b.hidden && a.act_dtype == b.act_dtype && a.router_logits == b.router_logits &&
         SameRouting(a.routing, b.routing) && a.topk_ids == b.topk_ids &&
         a.topk_weights == b.topk_weights && a.expert_map == b.expert_map &&
         a.apply_router_weight_on_input == b.apply_router_weight_on_input &&
         a.combine == b.combine && a.output == b.output && a.allow_decode == b.allow_decode &&
         a.batch_invariant == b.batch_invariant && a.slots_local == b.slots_local;
}

}  // namespace

bool MoeGraphKey::operator==(const MoeGraphKey& o) const {
  return experts == o.experts && SameLayer(layer, o.layer) && workspace == o.workspace &&
         workspace_capacity == o.workspace_capacity && host == o.host &&
         host_capacity == o.host_capacity && quant_route == o.quant_route &&
         stage_by_sm == o.stage_by_sm;
}

MoeGraphCache::Use MoeGraphCache::Lookup(const MoeGraphKey& key, cudaGraphExec_t* exec) {
  *exec = nullptr;
  ++clock_;
  for (Entry& e : entries_) {
    if (!(e.key == key)) continue;
    e.last_use = clock_;
    if (e.refused) return Use::kEager;
    if (e.exec == nullptr) return Use::kCapture;  // seen once
    *exec = e.exec;
    return Use::kReplay;
  }
  if (entries_.size() == kMaxEntries) {
    auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& x, const Entry& y) { return x.last_use < y.last_use; });
    if (oldest->exec != nullptr) cudaGraphExecDestroy(oldest->exec);
    entries_.erase(oldest);
  }
  entries_.push_back(Entry{key, nullptr, false, clock_});
  return Use::kEager;
}

void MoeGraphCache::Store(const MoeGraphKey& key, cudaGraphExec_t exec) {
  for (Entry& e : entries_) {
    if (!(e.key == key)) continue;
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
    e.exec = exec;
    e.refused = exec == nullptr;
    return;
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);  // evicted meanwhile: cannot happen
}

void MoeGraphCache::Clear() {
  for (Entry& e : entries_) {
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  }
  entries_.clear();
}

}  // namespace kplan
