#include "client/cpp/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

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
  auto client =
      std::make_unique<Client>(grpc::CreateCustomChannel(target, credentials, args), options);
  client->target_ = target;
  return client;
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
      if (absl::IsUnavailable(status) && !target_.empty() &&
          channel_->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        // Not the server's UNAVAILABLE (draining): nothing answered.
        return absl::UnavailableError(absl::StrCat(
            status.message(), "; no kplan-server answered at ", target_,
            options_.tls_root_certs.empty()
                ? " over plaintext (is it running there? one serving TLS needs its CA as "
                  "the TLS root certificates: --tls-ca in the CLI)"
                : " over TLS (is it running there, serving TLS with a certificate for this "
                  "name signed by the CA given? one asking for client certificates needs "
                  "them: --tls-cert / --tls-key in the CLI)"));
      }
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

namespace {

// The chunks of a vector, for the vector overload.
class VectorChunkSource final : public ChunkSource {
 public:
  explicit VectorChunkSource(const std::vector<v1::TensorChunk>& chunks) : chunks_(chunks) {}
  absl::StatusOr<bool> Next(v1::TensorChunk* chunk) override {
    if (next_ == chunks_.size()) return false;
    *chunk = chunks_[next_++];
    return true;
  }
  absl::Status Rewind() override {
    next_ = 0;
    return absl::OkStatus();
  }

 private:
  const std::vector<v1::TensorChunk>& chunks_;
  size_t next_ = 0;
};

}  // namespace

absl::Status ChunkSource::Rewind() {
  return absl::UnimplementedError("this chunk source cannot start over");
}

TensorChunkSource::TensorChunkSource(std::vector<StreamedTensor> tensors, int64_t chunk_bytes,
                                     std::function<absl::Status()> rewind)
    : tensors_(std::move(tensors)), chunk_bytes_(chunk_bytes), rewind_(std::move(rewind)) {}

absl::StatusOr<bool> TensorChunkSource::Next(v1::TensorChunk* chunk) {
  while (tensor_ < tensors_.size() && offset_ >= tensors_[tensor_].bytes) {
    ++tensor_;
    offset_ = 0;
  }
  if (tensor_ == tensors_.size()) return false;
  const StreamedTensor& t = tensors_[tensor_];
  const int64_t n = std::min(chunk_bytes_, t.bytes - offset_);
  chunk->Clear();
  chunk->set_name(t.name);
  chunk->set_offset(offset_);
  if (offset_ == 0) {
    chunk->set_dtype(t.dtype);
    for (int64_t d : t.shape) chunk->add_shape(d);
  }
  std::string* data = chunk->mutable_data();
  data->resize(static_cast<size_t>(n));
  KPLAN_RETURN_IF_ERROR(t.read(offset_, n, data->data()));
  offset_ += n;
  return true;
}

absl::Status TensorChunkSource::Rewind() {
  tensor_ = 0;
  offset_ = 0;
  return rewind_ ? rewind_() : absl::OkStatus();
}

absl::StatusOr<StreamedTensor> RawFileTensor(const std::string& name, v1::DType dtype,
                                             std::vector<int64_t> shape, int64_t element_bytes,
                                             const std::string& path, const std::string& field) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return WithField(
        absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno))),
        field);
  }
  auto file = std::shared_ptr<int>(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st;
  int64_t bytes = element_bytes;
  for (int64_t d : shape) bytes *= d;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != bytes) {
    return InvalidField(field, absl::StrCat("'", path, "' must be a regular file of ", bytes,
                                            " bytes (", name, " as raw row-major data), got ",
                                            S_ISREG(st.st_mode) ? absl::StrCat(st.st_size, " bytes")
                                                                : std::string("no regular file")));
  }
  StreamedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes = bytes;
  t.read = [file, path](int64_t offset, int64_t n, char* out) -> absl::Status {
    while (n > 0) {
      const ssize_t got = ::pread(*file, out, static_cast<size_t>(n), offset);
      if (got <= 0) {
        return absl::DataLossError(
            absl::StrCat("reading '", path, "' at byte ", offset, ": ",
                         got == 0 ? "unexpected end" : std::strerror(errno)));
      }
      out += got;
      offset += got;
      n -= got;
    }
    return absl::OkStatus();
  };
  return t;
}

absl::StatusOr<v1::LoadExpertsResponse> Client::LoadExperts(
    const v1::ExpertsHeader& header, const std::vector<v1::TensorChunk>& chunks) {
  VectorChunkSource source(chunks);
  return LoadExperts(header, source);
}

absl::StatusOr<v1::LoadExpertsResponse> Client::LoadExperts(const v1::ExpertsHeader& header,
                                                            ChunkSource& source) {
  v1::LoadExpertsResponse response;
  bool first = true;
  absl::Status source_error;
  absl::Status s = WithRetries([&](grpc::ClientContext* ctx) -> grpc::Status {
    if (!first) {
      if (absl::Status rewound = source.Rewind(); !rewound.ok()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("the server was unavailable and the chunk source cannot "
                                         "start over: ",
                                         rewound.message()));
      }
    }
    first = false;
    std::unique_ptr<grpc::ClientWriter<v1::LoadExpertsRequest>> writer =
        stub_->LoadExperts(ctx, &response);
    v1::LoadExpertsRequest msg;
    *msg.mutable_header() = header;
    bool ok = writer->Write(msg);
    v1::TensorChunk* chunk = msg.mutable_chunk();  // one chunk held at a time
    while (ok) {
      absl::StatusOr<bool> more = source.Next(chunk);
      if (!more.ok()) {
        source_error = more.status();
        ctx->TryCancel();  // the server drops the load
        writer->Finish();
        return grpc::Status::OK;  // not retried; answered with source_error below
      }
      if (!*more) break;
      ok = writer->Write(msg);
    }
    writer->WritesDone();
    return writer->Finish();  // carries the server's error if a write failed
  });
  if (!source_error.ok()) return source_error;
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

absl::Status Client::RegisterSharedMemory(const v1::SharedMemoryRegion& region) {
  v1::RegisterSharedMemoryRequest request;
  *request.mutable_region() = region;
  v1::RegisterSharedMemoryResponse response;
  return WithRetries([&](grpc::ClientContext* ctx) {
    return stub_->RegisterSharedMemory(ctx, request, &response);
  });
}

absl::StatusOr<v1::OpenShmChannelResponse> Client::OpenShmChannel(const std::string& region,
                                                                  int64_t request_capacity) {
  v1::OpenShmChannelRequest request;
  request.set_region(region);
  request.set_request_capacity(request_capacity);
  v1::OpenShmChannelResponse response;
  KPLAN_RETURN_IF_ERROR(WithRetries(
      [&](grpc::ClientContext* ctx) { return stub_->OpenShmChannel(ctx, request, &response); }));
  return response;
}

absl::Status Client::CloseShmChannel(const std::string& region) {
  v1::CloseShmChannelRequest request;
  request.set_region(region);
  v1::CloseShmChannelResponse response;
  return WithRetries(
      [&](grpc::ClientContext* ctx) { return stub_->CloseShmChannel(ctx, request, &response); });
}

absl::Status Client::UnregisterSharedMemory(const std::string& name) {
  v1::UnregisterSharedMemoryRequest request;
  request.set_name(name);
  v1::UnregisterSharedMemoryResponse response;
  return WithRetries([&](grpc::ClientContext* ctx) {
    return stub_->UnregisterSharedMemory(ctx, request, &response);
  });
}

absl::StatusOr<v1::ListSharedMemoryResponse> Client::ListSharedMemory() {
  v1::ListSharedMemoryResponse response;
  absl::Status s = WithRetries([&](grpc::ClientContext* ctx) {
    return stub_->ListSharedMemory(ctx, v1::ListSharedMemoryRequest(), &response);
  });
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

struct LoadWatch::State {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};

LoadWatch::LoadWatch(Client& client, std::string experts_id,
                     std::function<void(const v1::ExpertsInfo&)> on_progress,
                     absl::Duration interval)
    : state_(std::make_unique<State>()) {
  interval = std::max(interval, absl::Milliseconds(10));  // never a busy poll
  state_->thread = std::thread([&client, state = state_.get(), id = std::move(experts_id),
                                on_progress = std::move(on_progress), interval] {
    std::unique_lock<std::mutex> lock(state->mu);
    while (!state->cv.wait_for(lock, absl::ToChronoNanoseconds(interval),
                               [state] { return state->stop; })) {
      lock.unlock();
      // One attempt, bounded by the interval's scale: a slow poll must not
      // hold the load's answer back.
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + std::max(interval * 5, absl::Seconds(1))));
      if (!client.options_.bearer_token.empty()) {
        context.AddMetadata("authorization", "Bearer " + client.options_.bearer_token);
      }
      v1::ListExpertsResponse list;
      if (client.stub_->ListExperts(&context, v1::ListExpertsRequest(), &list).ok()) {
        for (const v1::ExpertsInfo& e : list.experts()) {
          if (e.experts_id() == id && e.state() == v1::EXPERTS_STATE_LOADING) on_progress(e);
        }
      }
      lock.lock();
    }
  });
}

LoadWatch::~LoadWatch() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
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
