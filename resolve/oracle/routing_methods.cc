#include "resolve/oracle/routing_methods.h"

namespace kplan {

using R = RoutingMethodType;
using K = RouterKind;

const std::vector<RoutingMethodInfo>& RoutingMethods() {
  // RoutingMethodType (fused_moe/config.py, mirroring FlashInfer runner.h).
  static const auto* rows = new std::vector<RoutingMethodInfo>{
      // softmax -> top-k
      {.type = R::kDefault, .name = "Default", .router = K::kTopK},
      // top-k -> softmax
      {.type = R::kRenormalize,
       .name = "Renormalize",
       .renormalize = true,
       .router = K::kTopKThenSoftmax},
      // sigmoid -> bias -> top-2 in group -> top-k groups -> top-k experts
      {.type = R::kDeepSeekV3,
       .name = "DeepSeekV3",
       .scoring = "sigmoid",
       .renormalize = true,
       .router = K::kGroupedTopK,
       .grouped = true},
      // top-1 -> sigmoid
      {.type = R::kLlama4, .name = "Llama4", .scoring = "sigmoid", .router = K::kLlama4},
      // softmax -> top-k -> renormalize
      {.type = R::kRenormalizeNaive,
       .name = "RenormalizeNaive",
       .renormalize = true,
       .router = K::kTopK},
      {.type = R::kTopK, .name = "TopK"},
      {.type = R::kSigmoidRenorm,
       .name = "SigmoidRenorm",
       .scoring = "sigmoid",
       .renormalize = true,
       .router = K::kTopK},
      // sigmoid + bias -> top-k -> scaled-sum normalise: not routed here.
      {.type = R::kMiniMax2, .name = "MiniMax2"},
      {.type = R::kSigmoid, .name = "Sigmoid", .scoring = "sigmoid", .router = K::kTopK},
      {.type = R::kUnspecified, .name = "Unspecified"},
      // sqrtsoftplus + bias -> top-k -> normalise
      {.type = R::kDeepseekV4,
       .name = "DeepseekV4",
       .scoring = "sqrtsoftplus",
       .renormalize = true,
       .router = K::kTopK},
      {.type = R::kCustom, .name = "Custom"},
      {.type = R::kSimulated, .name = "Simulated"},
  };
  return *rows;
}

const RoutingMethodInfo* FindRoutingMethod(absl::string_view name) {
  for (const RoutingMethodInfo& m : RoutingMethods()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const RoutingMethodInfo& RoutingMethodOf(RoutingMethodType type) {
  for (const RoutingMethodInfo& m : RoutingMethods()) {
    if (m.type == type) return m;
  }
  return *FindRoutingMethod("Unspecified");
}

}  // namespace kplan
