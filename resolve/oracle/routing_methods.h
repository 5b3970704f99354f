// The routing-method table: vLLM's RoutingMethodType members (the names
// that travel on the wire) and how each routes. One row per member, used by
// planning (name <-> member), by the RunMoE route (the scoring function and
// renormalisation a layer routed this way declares) and by the layer runner
// (which router kernel runs it). Adding a routing method the server runs is
// one row here plus, for a new router kind, its kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "resolve/oracle/moe_config.h"

namespace kplan {

// The router this server runs for a method (kernels/cpu/moe RoutingMethod).
enum class RouterKind : uint8_t {
  kNone,             // not routed here (RunMoE rejects it)
  kTopK,             // fused_topk(_bias): score, top-k, optional renormalise
  kTopKThenSoftmax,  // Renormalize: top-k on the logits, softmax over the k
  kGroupedTopK,      // grouped_topk (DeepSeek-V2/V3)
  kLlama4,           // top-k on the logits, weight = sigmoid(logit)
};

struct RoutingMethodInfo {
  RoutingMethodType type;
  absl::string_view name;  // the member name: "Renormalize"
  // The layer a method describes, as get_routing_method_type() derives it
  // back: scoring_func ("softmax", "sigmoid", "sqrtsoftplus") and renormalize.
  absl::string_view scoring = "softmax";
  bool renormalize = false;
  RouterKind router = RouterKind::kNone;
  bool grouped = false;  // takes num_expert_group / topk_group
};

// Every RoutingMethodType member, in enum order.
const std::vector<RoutingMethodInfo>& RoutingMethods();
// The row of a member name; nullptr when unknown.
const RoutingMethodInfo* FindRoutingMethod(absl::string_view name);
// The row of a member.
const RoutingMethodInfo& RoutingMethodOf(RoutingMethodType type);

}  // namespace kplan
