#include "kernels/cuda/runtime/status.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#if KPLAN_HAVE_NCCL
#include <nccl.h>
#endif

namespace kplan::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, const char* file, int line, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(file, ":", line, ": ", what, ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// ncclResult_t's values (nccl.h; stable since NCCL 2.0, ncclRemoteError since
// 2.12, ncclInProgress since 2.14). Static-asserted below where nccl.h is seen.
namespace {
constexpr int kNcclSuccess = 0;
constexpr int kNcclUnhandledCudaError = 1;
constexpr int kNcclSystemError = 2;
constexpr int kNcclInvalidArgument = 4;
constexpr int kNcclInvalidUsage = 5;
constexpr int kNcclRemoteError = 6;
constexpr int kNcclInProgress = 7;
}  // namespace

absl::StatusCode NcclStatusCode(int result, absl::string_view last_error) {
  switch (result) {
    case kNcclSuccess:
      return absl::StatusCode::kOk;
    case kNcclInvalidArgument:
    case kNcclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case kNcclRemoteError:
    case kNcclInProgress:
      return absl::StatusCode::kUnavailable;
    case kNcclUnhandledCudaError:
    case kNcclSystemError:
      // NCCL reports a failed cudaMalloc / cuMemCreate / malloc as one of
      // these two; only its last-error text tells out-of-memory apart.
      if (absl::StrContains(absl::AsciiStrToLower(last_error), "out of memory")) {
        return absl::StatusCode::kResourceExhausted;
      }
      return absl::StatusCode::kInternal;
    default:
      return absl::StatusCode::kInternal;
  }
}

#if KPLAN_HAVE_NCCL
static_assert(kNcclSuccess == ncclSuccess && kNcclUnhandledCudaError == ncclUnhandledCudaError &&
              kNcclSystemError == ncclSystemError && kNcclInvalidArgument == ncclInvalidArgument &&
              kNcclInvalidUsage == ncclInvalidUsage && kNcclRemoteError == ncclRemoteError &&
              kNcclInProgress == ncclInProgress);

absl::Status NcclStatus(int result, const char* file, int line, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(nullptr);
  const absl::string_view last_error = last != nullptr ? last : "";
  return absl::Status(NcclStatusCode(result, last_error),
                      absl::StrCat(file, ":", line, ": ", what, ": ",
                                   ncclGetErrorString(static_cast<ncclResult_t>(result)),
                                   last_error.empty() ? "" : absl::StrCat(" (", last_error, ")")));
}
#endif

}  // namespace kplan::kernels::cuda
