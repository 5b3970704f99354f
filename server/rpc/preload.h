// Expert sets loaded at start (--preload): a JSON file that lists
// LoadExperts headers, each loaded from its safetensors source through the
// server's own LoadExperts (an in-process channel), so a preloaded set passes
// exactly the checks, limits and placement of a set a client loads. The
// server reports readiness only once every set is resident and does not
// start when one fails. Before the server listens, every listed id is held
// in the store (HoldPreloadSets): a client's LoadExperts of one is
// ALREADY_EXISTS until the server is ready (then the set is resident), so a
// client can neither take an id from the preload nor make it fail. The
// preload's own calls carry a per-process secret (metadata kplan-preload)
// that lets them take the holds over.
//
// The file: {"experts": [HEADER, ...]} where HEADER is an ExpertsHeader in
// protobuf's JSON mapping (field names as in service.proto or lowerCamelCase)
// and names a safetensors file under --model_root:
//   {"experts": [{"experts_id": "layer3", "num_experts": 64, "hidden_size": 2048,
//                 "intermediate_size": 1408, "dtype": "DTYPE_BFLOAT16",
//                 "activation": "silu", "safetensors": {"path": "m/model.safetensors.index.json",
//                 "gate_proj": "model.layers.3.mlp.experts.{e}.gate_proj.weight", ...}}]}
#pragma once

#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kplan/v1/service.pb.h"
#include "server/moe/expert_store.h"

namespace kplan::rpc {

// The headers of a preload file; INVALID_ARGUMENT naming "preload" (and the
// entry, "preload.experts[i]...") for a file that cannot be read or parsed,
// an entry that is not an ExpertsHeader, one without a safetensors source or
// an id given twice.
absl::StatusOr<std::vector<v1::ExpertsHeader>> ReadPreloadFile(const std::string& path);

// Holds each header's id and bytes in `store` (ExpertStore::HoldForPreload),
// checking the header as LoadExperts would; errors name
// "preload.experts[i]" and the id.
absl::Status HoldPreloadSets(ExpertStore& store, const std::vector<v1::ExpertsHeader>& headers);

// A fresh random secret for the preload's calls (32 hex digits).
std::string MakePreloadToken();

// True when the call carries `token` (non-empty) as its kplan-preload metadata.
bool FromPreload(const grpc::ServerContextBase& context, const std::string& token);

// Loads each header over `channel` (with `auth_token` when set, and
// `preload_token`), one after another, each within `per_set_timeout`. The
// first failure stops it: its status, with the entry's index and id in the
// message.
absl::Status Preload(grpc::Channel& channel, const std::vector<v1::ExpertsHeader>& headers,
                     const std::string& auth_token, const std::string& preload_token,
                     absl::Duration per_set_timeout);

}  // namespace kplan::rpc
