// Shared pieces of the libFuzzer targets: one small fixed expert set (E=4,
// H=16, I=32, bf16 weights from a fixed seed) and the splitting of one fuzzer
// input into several messages (a client stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/moe/expert_set.h"

namespace kplan::fuzz {

inline constexpr int kNumExperts = 4;
inline constexpr int64_t kHidden = 16;
inline constexpr int64_t kIntermediate = 32;

// Separates the messages of a stream in one fuzzer input (also in the
// dictionaries of the corpus generator).
inline constexpr char kDelimiter[] = "\xf0KPLAN\xf1";
inline constexpr size_t kDelimiterSize = sizeof(kDelimiter) - 1;

// The spec of SmallExpertSet() ("fuzz", silu, bfloat16).
ExpertsSpec SmallSpec();
// Built once, never freed.
const ExpertSet& SmallExpertSet();

// `data` cut at every kDelimiter; at most `max_parts` parts (the rest stays
// in the last one).
std::vector<std::string> SplitMessages(const uint8_t* data, size_t size, size_t max_parts = 64);

}  // namespace kplan::fuzz
