// The router's candidate order as one unsigned 64-bit key per candidate, and
// the lane steps of the warp top-k that picks by integer maxima
// (moe_routing.cuh, WarpTopK). Plain C++ callable from device code, so
// that the order and the steps are unit-tested on the CPU against the
// reference (moe::TopKIndices, tests/kernels/moe_routing_key_test.cc).
// Internal to kernels/cuda/moe.
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
#if defined(__CUDA_ARCH__)  // the device pass: keep the lane's arrays in registers
#define KPLAN_ROUTING_UNROLL _Pragma("unroll")
#else
#define KPLAN_ROUTING_UNROLL
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

// The candidates per lane of the routing step's instantiation for E experts
// (moe_routing.cuh: every loop over a lane's candidates is kN long, so a
// router of few experts runs the smallest kN in {1, 4, 8, 16} with
// E <= 32 * kN). Host code (the launcher).
constexpr int PerLaneFor(int num_experts) {
  return num_experts <= 32 ? 1 : num_experts <= 128 ? 4 : num_experts <= 256 ? 8 : 16;
}

// One lane's part of a warp top-k over E candidates (lane l holds experts
// l, l + 32, ...; kN per lane): its keys and the best of them (its head).
// The warp's pick is the largest head: the largest high word over the lanes,
// then the largest low word (the lowest index) among the lanes that hold it.
// WarpTopK (moe_routing.cuh) does those two maxima with redux.sync; the test emulates
// them over 32 lanes with these same lane steps.
template <int kN>
KPLAN_ROUTING_HD inline uint64_t LaneCandidates(const float (&key)[kN], int E, int lane,
                                                uint64_t (&ck)[kN]) {
  uint64_t head = 0;
  KPLAN_ROUTING_UNROLL
  for (int s = 0; s < kN; ++s) {
    const int e = lane + 32 * s;
    ck[s] = e < E ? CandidateKey(key[s], e) : 0;
    head = ck[s] > head ? ck[s] : head;
  }
  return head;
}

// The payload of the lane's head.
template <int kN>
KPLAN_ROUTING_HD inline float HeadPayload(const uint64_t (&ck)[kN], uint64_t head,
                                          const float (&pay)[kN]) {
  float p = 0.0f;
  KPLAN_ROUTING_UNROLL
  for (int s = 0; s < kN; ++s) p = ck[s] == head ? pay[s] : p;
  return p;
}

// The winning lane drops candidate `id` (its head); returns its new head.
template <int kN>
KPLAN_ROUTING_HD inline uint64_t DropCandidate(uint64_t (&ck)[kN], int lane, int id) {
  uint64_t head = 0;
  KPLAN_ROUTING_UNROLL
  for (int s = 0; s < kN; ++s) {
    if (lane + 32 * s == id) ck[s] = 0;
    head = ck[s] > head ? ck[s] : head;
  }
  return head;
}

}  // namespace kplan::kernels::cuda::detail::routing

#undef KPLAN_ROUTING_HD
#undef KPLAN_ROUTING_UNROLL
