// The element tolerance of a bfloat16 / float16 MoE layer output against
// another computation of the same layer (the CPU reference, a single-GPU run,
// an expert-parallel run), shared by the GPU layer and expert-parallel checks.
//
// Why it is absolute in the output's RMS and not only relative to the
// element: an output element is a sum over the intermediate size I (up to
// 14336) of products with 16-bit-rounded intermediates. Another fp32
// summation order (CPU vs GPU, another GEMM block size or split-K) rounds
// some intermediates one ulp the other way, and each such flip moves the
// output by w * ulp(h): an error on the scale of the terms, i.e. of the
// output's RMS, whatever the element's own size, and heavy-tailed. Measured:
// Mixtral-8x7B (H=4096, I=14336) at 4096 tokens, 16.7M outputs, reaches 1.7%
// of the RMS on one element (GPU vs CPU). The relative part covers the final
// rounding of both sides. A wrong row, expert or weight moves elements by
// O(RMS), far beyond it.
#pragma once

#include <cmath>

namespace kplan::test_util {

inline double MoeLayerElementTolerance(double ref, double ref_rms) {
  return std::ldexp(std::fabs(ref), -7) + std::ldexp(ref_rms, -5);
}

}  // namespace kplan::test_util
