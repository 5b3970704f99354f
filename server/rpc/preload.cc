#include "server/rpc/preload.h"

#include <fstream>
#include <set>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/client_text.h"
#include "base/status.h"
#include "kplan/v1/service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/rpc/moe_convert.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

constexpr char kPreloadMetadata[] = "kplan-preload";

// `status` about entry `i` of the preload file.
absl::Status AboutEntry(const absl::Status& status, size_t i, const std::string& id) {
  absl::Status out(status.code(), absl::StrCat("preload.experts[", i, "] ('", ClientText(id),
                                               "'): ", status.message()));
  const std::optional<std::string> field = FieldOf(status);
  return WithField(out, absl::StrCat("preload.experts[", i, "]", field ? "." + *field : ""));
}

}  // namespace

absl::StatusOr<std::vector<v1::ExpertsHeader>> ReadPreloadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidField("preload", absl::StrCat("cannot read ", ClientText(path)));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json file =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (file.is_discarded()) {
    return InvalidField("preload", absl::StrCat(ClientText(path), " is not valid JSON"));
  }
  if (!file.is_object() || !file.contains("experts") || !file["experts"].is_array() ||
      file.size() != 1) {
    return InvalidField("preload",
                        absl::StrCat(ClientText(path), " must be an object {\"experts\": [...]}"));
  }
  std::vector<v1::ExpertsHeader> headers;
  std::set<std::string> ids;
  for (size_t i = 0; i < file["experts"].size(); ++i) {
    const std::string field = absl::StrCat("preload.experts[", i, "]");
    v1::ExpertsHeader header;
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(file["experts"][i].dump(), &header);
    if (!parsed.ok()) {
      return InvalidField(
          field, absl::StrCat("not an ExpertsHeader: ", ClientText(std::string(parsed.message()))));
    }
    if (!header.has_safetensors()) {
      return InvalidField(field + ".safetensors",
                          "a preloaded set is read from a safetensors file under --model_root");
    }
    if (!ids.insert(header.experts_id()).second) {
      return InvalidField(field + ".experts_id",
                          absl::StrCat("'", ClientText(header.experts_id()), "' appears twice"));
    }
    headers.push_back(std::move(header));
  }
  return headers;
}

absl::Status HoldPreloadSets(ExpertStore& store, const std::vector<v1::ExpertsHeader>& headers) {
  for (size_t i = 0; i < headers.size(); ++i) {
    absl::Status held = [&]() -> absl::Status {
      KPLAN_ASSIGN_OR_RETURN(ExpertsSpec spec, ExpertsSpecFromProto(headers[i]));
      KPLAN_RETURN_IF_ERROR(ValidateExpertsSpec(spec));
      KPLAN_ASSIGN_OR_RETURN(const int64_t bytes, ExpectedBytes(spec));
      return store.HoldForPreload(spec, bytes);
    }();
    if (!held.ok()) return AboutEntry(held, i, headers[i].experts_id());
  }
  return absl::OkStatus();
}

std::string MakePreloadToken() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return "";  // no token: no call takes a hold
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
}

bool FromPreload(const grpc::ServerContextBase& context, const std::string& token) {
  if (token.empty()) return false;
  const auto& md = context.client_metadata();
  auto it = md.find(kPreloadMetadata);
  return it != md.end() && it->second.size() == token.size() &&
         CRYPTO_memcmp(it->second.data(), token.data(), token.size()) == 0;
}

absl::Status Preload(grpc::Channel& channel, const std::vector<v1::ExpertsHeader>& headers,
                     const std::string& auth_token, const std::string& preload_token,
                     absl::Duration per_set_timeout) {
  auto stub = v1::KernelPlanService::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  for (size_t i = 0; i < headers.size(); ++i) {
    const v1::ExpertsHeader& header = headers[i];
    const absl::Time start = absl::Now();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(start + per_set_timeout));
    if (!auth_token.empty()) context.AddMetadata("authorization", "Bearer " + auth_token);
    context.AddMetadata(kPreloadMetadata, preload_token);
    v1::LoadExpertsResponse response;
    auto writer = stub->LoadExperts(&context, &response);
    v1::LoadExpertsRequest request;
    *request.mutable_header() = header;
    writer->Write(request);
    writer->WritesDone();
    const absl::Status status = FromGrpcStatus(writer->Finish());
    if (!status.ok()) return AboutEntry(status, i, header.experts_id());
    spdlog::info("preloaded experts '{}' from {} in {}", header.experts_id(),
                 header.safetensors().path(), absl::FormatDuration(absl::Now() - start));
  }
  return absl::OkStatus();
}

}  // namespace kplan::rpc
