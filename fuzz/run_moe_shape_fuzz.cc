// RunMoeOnCpu with the fuzzer choosing shapes directly (the structured
// variant of run_moe_fuzz): the first bytes pick dtype, the dims of
// hidden_states, the routing inputs and their dims (mostly small, sometimes
// any int64), the rest fills the tensors, so that inputs whose byte sizes
// agree with their shapes (the deep code) are frequent.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "server/moe/moe_runner.h"

namespace {

using kplan::fuzz::kHidden;
using kplan::fuzz::kNumExperts;

// KPLAN_FUZZ_SMALL_DIMS=1 keeps every dim in [-2, 64], to look past the
// overflow of huge dims (found at once) while its fix is pending.
bool SmallDims() {
  static const bool small = [] {
    const char* v = std::getenv("KPLAN_FUZZ_SMALL_DIMS");
    return v != nullptr && v[0] == '1';
  }();
  return small;
}

int64_t Dim(FuzzedDataProvider& in, int64_t usual) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      if (SmallDims()) return in.ConsumeIntegralInRange<int64_t>(-2, 64);
      return in.ConsumeIntegral<int64_t>();  // anything
    case 1:
      return in.ConsumeIntegralInRange<int64_t>(-2, 2);
    case 2:
      return in.ConsumeIntegralInRange<int64_t>(0, 64);
    default:
      return usual;
  }
}

std::vector<int64_t> Shape(FuzzedDataProvider& in, int64_t d0, int64_t d1) {
  const int rank =
      in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegralInRange<int>(0, 4) : 2;
  std::vector<int64_t> shape;
  for (int i = 0; i < rank; ++i) shape.push_back(Dim(in, i == 0 ? d0 : d1));
  return shape;
}

// Bytes for `shape` with elements of `esize` bytes: the exact size when the
// product is small (zero-padded), else whatever is left, capped.
std::string Data(FuzzedDataProvider& in, const std::vector<int64_t>& shape, int64_t esize) {
  __int128 n = esize;
  for (int64_t d : shape) {
    n *= d;
    if (n > 1 << 16 || n < -(1 << 16)) break;
  }
  const bool exact = n >= 0 && n <= 4096 && in.ConsumeIntegralInRange<int>(0, 7) != 0;
  if (exact) {
    std::string s = in.ConsumeBytesAsString(static_cast<size_t>(n));
    s.resize(static_cast<size_t>(n), '\0');
    return s;
  }
  return in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 4096));
}

const char* const kMethods[] = {"",           "Default",       "Renormalize", "RenormalizeNaive",
                                "Sigmoid",    "SigmoidRenorm", "DeepSeekV3",  "Llama4",
                                "DeepseekV4", "Magic"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kplan;
  FuzzedDataProvider in(data, size);
  MoeRunInput input;
  const kernels::DType dtypes[] = {kernels::DType::kFloat32, kernels::DType::kFloat16,
                                   kernels::DType::kBFloat16};
  input.act_dtype = in.PickValueInArray(dtypes);
  const int64_t m = in.ConsumeIntegralInRange<int64_t>(0, 16);
  const bool by_logits = in.ConsumeBool();
  input.apply_router_weight_on_input = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  const int k = in.ConsumeIntegralInRange<int>(0, 7) == 0 && !SmallDims()
                    ? in.ConsumeIntegral<int>()
                    : in.ConsumeIntegralInRange<int>(0, 5);
  input.hidden_shape = Shape(in, m, kHidden);
  const int64_t esize = kernels::DTypeSize(input.act_dtype);
  if (by_logits) {
    input.routing.top_k = k;
    input.routing.routing_method = in.PickValueInArray(kMethods);
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      input.routing.num_expert_group = in.ConsumeIntegralInRange<int>(-1, 5);
      input.routing.topk_group = in.ConsumeIntegralInRange<int>(-1, 5);
    }
    if (in.ConsumeBool()) input.routing.routed_scaling_factor = in.ConsumeFloatingPoint<float>();
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      const int n = in.ConsumeIntegralInRange<int>(0, kNumExperts + 1);
      for (int i = 0; i < n; ++i)
        input.routing.e_score_correction_bias.push_back(in.ConsumeFloatingPoint<float>());
    }
    input.logits_shape = Shape(in, m, kNumExperts);
  } else {
    input.topk_shape = Shape(in, m, k);
  }
  input.hidden_states = Data(in, input.hidden_shape, esize);
  if (by_logits) {
    input.router_logits = Data(in, input.logits_shape, 4);
  } else {
    input.topk_weights = Data(in, input.topk_shape, 4);
    // Ids mostly in range, so that the experts run.
    std::string ids = Data(in, input.topk_shape, 4);
    if (in.ConsumeIntegralInRange<int>(0, 3) != 0) {
      for (size_t i = 0; i + 3 < ids.size(); i += 4) {
        ids[i] = static_cast<char>(static_cast<uint8_t>(ids[i]) % kNumExperts);
        ids[i + 1] = ids[i + 2] = ids[i + 3] = 0;
      }
    }
    input.topk_ids = std::move(ids);
  }
  (void)RunMoeOnCpu(fuzz::SmallExpertSet(), input);
  return 0;
}
