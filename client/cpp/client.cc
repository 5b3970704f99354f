#include "client/cpp/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <thread>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "base/status.h"

namespace kplan {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  google::rpc::Status details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      google::rpc::BadRequest bad;
      if (any.UnpackTo(&bad) && bad.field_violations_size() > 0) {
        return WithField(std::move(out), bad.field_violations(0).field());
      }
    }
  }
  return out;
}

std::unique_ptr<Client> Client::Connect(const std::string& target, ClientOptions options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    ssl.pem_cert_chain = options.tls_client_cert;
    ssl.pem_private_key = options.tls_client_key;
    credentials = grpc::SslCredentials(ssl);
  }
  return std::make_unique<Client>(grpc::CreateCustomChannel(target, credentials, args), options);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::KernelPlanService::NewStub(channel_)),
      health_stub_(grpc::health::v1::Health::NewStub(channel_)),
      options_(options) {}

template <typename Call>
absl::Status Client::WithRetries(Call&& call) {
  const absl::Time deadline = absl::Now() + options_.deadline;
  absl::Duration backoff = options_.initial_backoff;
  absl::Status status;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(false);
    if (!options_.bearer_token.empty()) {
      context.AddMetadata("authorization", "Bearer " + options_.bearer_token);
    }
    status = FromGrpcStatus(call(&context));
    if (!absl::IsUnavailable(status) || attempt >= options_.max_attempts ||
        absl::Now() + backoff >= deadline) {
      return status;
    }
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(backoff));
    backoff *= 2;
  }
}

absl::StatusOr<v1::ResolveKernelConfigResponse> Client::ResolveKernelConfig(
    const v1::ResolveKernelConfigRequest& request) {
  v1::ResolveKernelConfigResponse response;
  absl::Status s = WithRetries([&](grpc::ClientContext* ctx) {
    return stub_->ResolveKernelConfig(ctx, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo() {
  v1::GetServerInfoResponse response;
  absl::Status s = WithRetries([&](grpc::ClientContext* ctx) {
    return stub_->GetServerInfo(ctx, v1::GetServerInfoRequest(), &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::LoadExpertsResponse> Client::LoadExperts(
    const v1::ExpertsHeader& header, const std::vector<v1::TensorChunk>& chunks) {
  v1::LoadExpertsResponse response;
  absl::Status s = WithRetries([&](grpc::ClientContext* ctx) {
    std::unique_ptr<grpc::ClientWriter<v1::LoadExpertsRequest>> writer =
        stub_->LoadExperts(ctx, &response);
    v1::LoadExpertsRequest msg;
    *msg.mutable_header() = header;
    bool ok = writer->Write(msg);
    for (size_t i = 0; ok && i < chunks.size(); ++i) {
      *msg.mutable_chunk() = chunks[i];
      ok = writer->Write(msg);
    }
    writer->WritesDone();
    return writer->Finish();  // carries the server's error if a write failed
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::UnloadExpertsResponse> Client::UnloadExperts(const std::string& experts_id) {
  v1::UnloadExpertsRequest request;
  request.set_experts_id(experts_id);
  v1::UnloadExpertsResponse response;
  absl::Status s = WithRetries(
      [&](grpc::ClientContext* ctx) { return stub_->UnloadExperts(ctx, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::ListExpertsResponse> Client::ListExperts() {
  v1::ListExpertsResponse response;
  absl::Status s = WithRetries([&](grpc::ClientContext* ctx) {
    return stub_->ListExperts(ctx, v1::ListExpertsRequest(), &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::RunMoEResponse> Client::RunMoE(const v1::RunMoERequest& request) {
  v1::RunMoEResponse response;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* ctx) { return stub_->RunMoE(ctx, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::RunIrOpResponse> Client::RunIrOp(const v1::RunIrOpRequest& request) {
  v1::RunIrOpResponse response;
  absl::Status s = WithRetries(
      [&](grpc::ClientContext* ctx) { return stub_->RunIrOp(ctx, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<bool> Client::Health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status s = WithRetries(
      [&](grpc::ClientContext* ctx) { return health_stub_->Check(ctx, request, &response); });
  if (!s.ok()) return s;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

void AppendTensorChunks(const std::string& name, v1::DType dtype, const std::vector<int64_t>& shape,
                        const std::string& data, int64_t chunk_bytes,
                        std::vector<v1::TensorChunk>* chunks) {
  const int64_t size = static_cast<int64_t>(data.size());
  for (int64_t offset = 0; offset < size; offset += chunk_bytes) {
    v1::TensorChunk& c = chunks->emplace_back();
    c.set_name(name);
    c.set_offset(offset);
    c.set_data(data.substr(offset, chunk_bytes));
    if (offset == 0) {
      c.set_dtype(dtype);
      for (int64_t d : shape) c.add_shape(d);
    }
  }
}

}  // namespace kplan
