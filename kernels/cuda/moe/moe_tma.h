// Host side of the TMA tensor maps of the warp-specialised grouped GEMMs
// (moe_gemm_ws_sm90.cu, moe_gemm_ws_fp8_sm90.cu). Internal to kernels/cuda/moe.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: no -lcuda)

#include <cstdint>

#include "absl/status/status.h"

namespace kplan::kernels::cuda::detail {

// A 2-D tensor map over `rows` rows of `inner` elements of `type`, rows
// `row_bytes` apart, boxes of box_rows x box_inner, 128-byte swizzle (or
// `swizzle`), zero fill out of bounds. UNAVAILABLE when the driver has no
// cuTensorMapEncodeTiled or it refuses the map (`what` names the caller).
absl::Status EncodeTma2d(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                         uint64_t inner, uint64_t rows, uint64_t row_bytes, uint32_t box_inner,
                         uint32_t box_rows, const char* what,
                         CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

}  // namespace kplan::kernels::cuda::detail
