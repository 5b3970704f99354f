// Facts of a CUDA device that stay fixed while the process runs, queried once
// per device ordinal and cached: the one place the build asks for them.
#pragma once

#include "absl/status/statusor.h"

namespace kplan::kernels::cuda {

// The multiprocessors of `device` (cudaDevAttrMultiProcessorCount).
// Thread-safe: the first callers for a device may each query it, and all
// store the same value; a failed query (an error of CudaStatus's) is not
// cached. Ordinals outside [0, 64) are queried every time.
absl::StatusOr<int> MultiprocessorCount(int device);

}  // namespace kplan::kernels::cuda
