#include "fuzz/fuzz_util.h"

#include <cstdlib>
#include <map>
#include <random>
#include <string_view>

#include "kernels/cpu/moe/moe_reference.h"

namespace kplan::fuzz {

ExpertsSpec SmallSpec() {
  ExpertsSpec spec;
  spec.experts_id = "fuzz";
  spec.num_experts = kNumExperts;
  spec.hidden = kHidden;
  spec.intermediate = kIntermediate;
  spec.activation = "silu";
  spec.dtype = kernels::DType::kBFloat16;
  return spec;
}

const ExpertSet& SmallExpertSet() {
  static const ExpertSet* set = [] {
    ExpertsSpec spec = SmallSpec();
    if (!ValidateExpertsSpec(spec).ok()) std::abort();
    std::mt19937 rng(1234);
    std::normal_distribution<float> dist(0.f, 0.3f);
    std::map<std::string, std::string> tensors;
    for (const TensorSpec& t : ExpectedTensors(spec)) {
      std::string bytes(static_cast<size_t>(t.bytes()), '\0');
      for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
        const uint16_t b = moe::FloatToBf16(dist(rng));
        bytes[i] = static_cast<char>(b & 0xff);
        bytes[i + 1] = static_cast<char>(b >> 8);
      }
      tensors[t.name] = std::move(bytes);
    }
    return new ExpertSet(std::move(spec), std::move(tensors));
  }();
  return *set;
}

std::vector<std::string> SplitMessages(const uint8_t* data, size_t size, size_t max_parts) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  const std::string_view delim(kDelimiter, kDelimiterSize);
  std::vector<std::string> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = rest.find(delim);
    if (at == std::string_view::npos) break;
    parts.emplace_back(rest.substr(0, at));
    rest.remove_prefix(at + delim.size());
  }
  parts.emplace_back(rest);
  return parts;
}

}  // namespace kplan::fuzz
