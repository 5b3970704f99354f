// The router's candidate order as one unsigned 64-bit key per candidate, for
// the warp top-k that picks by integer maxima (moe_routing.cuh,
// WarpTopKRedux). Plain C++ callable from device code, so that the order is
// unit-tested on the CPU against the reference's (moe::TopKIndices,
// tests/kernels/moe_routing_key_test.cc). Internal to kernels/cuda/moe.
//
// The reference's order: NaN above every number (all NaNs alike), then the
// larger value (-0 and +0 alike), then the lower expert index. The key's
// high word is the value's bits made monotone (NaN the largest word), its
// low word ~index: the larger key is picked first. 0 stands for "no
// candidate": every candidate's key is larger (-inf's high word is
// 0x007fffff).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KPLAN_ROUTING_HD __host__ __device__
#else
#define KPLAN_ROUTING_HD
#endif

namespace kplan::kernels::cuda::detail::routing {

KPLAN_ROUTING_HD inline uint32_t OrderedBits(float v) {
  if (v != v) return 0xffffffffu;  // NaN
  uint32_t b = 0;
  if (v != 0.0f) std::memcpy(&b, &v, 4);  // -0 as +0
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

KPLAN_ROUTING_HD inline uint64_t CandidateKey(float v, int index) {
  return (static_cast<uint64_t>(OrderedBits(v)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(index));
}

// The expert index of a key (CandidateKey's low word).
KPLAN_ROUTING_HD inline int KeyIndex(uint32_t low_word) {
  return static_cast<int>(0xffffffffu - low_word);
}

}  // namespace kplan::kernels::cuda::detail::routing

#undef KPLAN_ROUTING_HD
