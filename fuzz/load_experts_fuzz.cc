// LoadExperts from the wire, as moe_handlers.cc reads the stream: the input
// is cut at fuzz::kDelimiter into v1::LoadExpertsRequest messages; the header
// goes through ExpertsSpecFromProto + ValidateExpertsSpec and the byte total
// (the handler's ExpectedBytes and Reserve, here with a 256 MiB
// --max_expert_bytes), chunks through ExpertsLoader::AddChunk, then Finish. Safetensors sources are
// not opened (safetensors_fuzz covers the parser).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "fuzz/fuzz_util.h"
#include "kplan/v1/service.pb.h"
#include "server/moe/expert_loader.h"
#include "server/moe/expert_store.h"
#include "server/rpc/moe_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kplan;
  static ExpertStore* store = new ExpertStore(int64_t{256} << 20);
  std::unique_ptr<ExpertsLoader> loader;
  std::optional<absl::StatusOr<ExpertStore::Reservation>> reservation;
  bool header_seen = false;
  for (std::string& bytes : fuzz::SplitMessages(data, size)) {
    v1::LoadExpertsRequest request;
    if (!request.ParseFromString(bytes)) return 0;  // the stream fails there
    if (request.has_header()) {
      if (header_seen) return 0;
      header_seen = true;
      absl::StatusOr<ExpertsSpec> spec = rpc::ExpertsSpecFromProto(request.header());
      if (!spec.ok() || !ValidateExpertsSpec(*spec).ok()) return 0;
      absl::StatusOr<int64_t> total = ExpectedBytes(*spec);
      if (!total.ok()) return 0;
      // Held for this input only: released when it goes out of scope.
      reservation = store->Reserve(*spec, *total);
      if (!reservation->ok()) return 0;
      if (request.header().has_safetensors()) return 0;
      loader = std::make_unique<ExpertsLoader>(*spec);
      continue;
    }
    if (!loader) return 0;
    v1::TensorChunk& c = *request.mutable_chunk();
    std::string wire = c.dtype() == v1::DTYPE_UNSPECIFIED ? "" : rpc::WireFromProtoDType(c.dtype());
    if (!loader
             ->AddChunk(c.name(), wire, std::vector<int64_t>(c.shape().begin(), c.shape().end()),
                        c.offset(), std::move(*c.mutable_data()))
             .ok()) {
      return 0;
    }
  }
  if (loader) (void)loader->Finish();
  return 0;
}
