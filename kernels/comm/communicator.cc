#include "kernels/comm/communicator.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace kplan::comm {

absl::Status ValidateAllToAllVSide(int size, const void* buffer, absl::Span<const int64_t> counts,
                                   absl::Span<const int64_t> displs, absl::string_view what) {
  if (static_cast<int>(counts.size()) != size || static_cast<int>(displs.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV: ", what, "_counts and ", what, "_displs need ", size,
                     " entries (one per rank), got ", counts.size(), " and ", displs.size()));
  }
  for (int p = 0; p < size; ++p) {
    if (counts[p] < 0 || displs[p] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("AllToAllV: ", what, "_counts[", p,
                                                     "] = ", counts[p], ", ", what, "_displs[", p,
                                                     "] = ", displs[p], " must not be negative"));
    }
    if (counts[p] > 0 && buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("AllToAllV: ", what, " buffer is null but ",
                                                     what, "_counts[", p, "] = ", counts[p]));
    }
  }
  return absl::OkStatus();
}

absl::Status ExchangeRows(Communicator& comm, const void* send, absl::Span<const int64_t> send_rows,
                          void* recv, absl::Span<const int64_t> recv_rows, int64_t width,
                          kernels::DType dtype) {
  const int n = comm.size();
  if (static_cast<int>(send_rows.size()) != n || static_cast<int>(recv_rows.size()) != n) {
    return absl::InvalidArgumentError("ExchangeRows: one row count per rank on each side");
  }
  std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
  int64_t so = 0, ro = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = send_rows[p] * width;
    sd[p] = so;
    so += sc[p];
    rc[p] = recv_rows[p] * width;
    rd[p] = ro;
    ro += rc[p];
  }
  return comm.AllToAllV(so > 0 ? send : nullptr, sc, sd, ro > 0 ? recv : nullptr, rc, rd, dtype);
}

}  // namespace kplan::comm
