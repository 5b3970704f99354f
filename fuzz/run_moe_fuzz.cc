// RunMoE's CPU path from the wire: bytes -> v1::RunMoERequest ->
// MoeRunInputFromProto -> RunMoeOnCpu against a small fixed expert set.
// Unparseable bytes are skipped (the server answers them INVALID_ARGUMENT /
// INTERNAL before any handler; server_fuzz covers that).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "kplan/v1/service.pb.h"
#include "server/moe/moe_runner.h"
#include "server/rpc/moe_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kplan;
  v1::RunMoERequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<MoeRunInput> input = rpc::MoeRunInputFromProto(request);
  if (!input.ok()) return 0;
  absl::StatusOr<MoeRunOutput> out = RunMoeOnCpu(fuzz::SmallExpertSet(), *input);
  if (out.ok() && out->output.empty() && out->num_tokens > 0) __builtin_trap();
  return 0;
}
