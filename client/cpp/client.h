// kplan::Client: a thin C++ client of kplan.v1.KernelPlanService. Every call
// carries a deadline; UNAVAILABLE (server starting, draining, restarting) is
// retried with exponential backoff inside that deadline. Errors come back as
// absl::Status with the server's message and, where the server named a
// request field, that field attached (kplan::FieldOf).
#pragma once

#include <grpcpp/channel.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kplan/v1/service.grpc.pb.h"

namespace kplan {

// Where LoadExperts' chunks come from, one at a time, so that a client never
// holds the whole set: Next fills `chunk` and returns true, or returns false
// after the last one. An error ends the load: the call is cancelled (the
// server keeps nothing) and the error is LoadExperts' answer. Rewind starts
// over, for a retry of UNAVAILABLE; a source that cannot start over answers
// an error, and the load then answers the UNAVAILABLE it got.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  virtual absl::StatusOr<bool> Next(v1::TensorChunk* chunk) = 0;
  virtual absl::Status Rewind();
};

// One tensor of a TensorChunkSource: its name, dtype and shape as the first
// chunk carries them, its size, and `read`, which writes `n` bytes of the
// tensor from `offset` into `out`. Reads come in order of offset, from 0,
// each offset once per pass (a Rewind starts a new pass).
struct StreamedTensor {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  std::function<absl::Status(int64_t offset, int64_t n, char* out)> read;
};

// Chunks of at most `chunk_bytes` of each tensor in turn, read when asked
// for: the memory held is one chunk. `rewind` (may be null: nothing to do)
// runs at Rewind, e.g. to reseed a generator.
class TensorChunkSource final : public ChunkSource {
 public:
  TensorChunkSource(std::vector<StreamedTensor> tensors, int64_t chunk_bytes,
                    std::function<absl::Status()> rewind = nullptr);
  absl::StatusOr<bool> Next(v1::TensorChunk* chunk) override;
  absl::Status Rewind() override;

 private:
  std::vector<StreamedTensor> tensors_;
  int64_t chunk_bytes_;
  std::function<absl::Status()> rewind_;
  size_t tensor_ = 0;   // the tensor being sent
  int64_t offset_ = 0;  // its next byte
};

// A tensor whose bytes are the whole raw file at `path` (row-major,
// little-endian, as numpy's tofile writes them): INVALID_ARGUMENT naming
// `field` when the file is not exactly `element_bytes` * product(shape)
// bytes long, NOT_FOUND when it cannot be opened. The file is read chunk by
// chunk (pread) while the load streams.
absl::StatusOr<StreamedTensor> RawFileTensor(const std::string& name, v1::DType dtype,
                                             std::vector<int64_t> shape, int64_t element_bytes,
                                             const std::string& path, const std::string& field);

struct ClientOptions {
  absl::Duration deadline = absl::Seconds(10);  // per call, retries included
  int max_attempts = 4;                         // for UNAVAILABLE
  absl::Duration initial_backoff = absl::Milliseconds(50);
  int64_t max_message_bytes = 64 << 20;
  // TLS: when tls_root_certs (PEM) is set the channel uses TLS; a client
  // certificate and key add mutual TLS.
  std::string tls_root_certs;
  std::string tls_client_cert;
  std::string tls_client_key;
  // Sent as "authorization: Bearer <token>" when set.
  std::string bearer_token;
};

class Client {
 public:
  // Connects lazily to `target` ("localhost:50051", "unix:/run/kplan.sock").
  // A call whose channel never reached a server (UNAVAILABLE, the channel in
  // TRANSIENT_FAILURE) says so, naming `target` and whether TLS was used.
  static std::unique_ptr<Client> Connect(const std::string& target,
                                         ClientOptions options = ClientOptions());
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  absl::StatusOr<v1::ResolveKernelConfigResponse> ResolveKernelConfig(
      const v1::ResolveKernelConfigRequest& request);
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo();
  // Streams `header` then `chunks` (none for a safetensors header); all or nothing.
  absl::StatusOr<v1::LoadExpertsResponse> LoadExperts(const v1::ExpertsHeader& header,
                                                      const std::vector<v1::TensorChunk>& chunks);
  // Streams `header` then the chunks of `source` as it produces them.
  absl::StatusOr<v1::LoadExpertsResponse> LoadExperts(const v1::ExpertsHeader& header,
                                                      ChunkSource& source);
  absl::StatusOr<v1::UnloadExpertsResponse> UnloadExperts(const std::string& experts_id);
  absl::StatusOr<v1::ListExpertsResponse> ListExperts();
  absl::StatusOr<v1::RunMoEResponse> RunMoE(const v1::RunMoERequest& request);
  absl::StatusOr<v1::RunIrOpResponse> RunIrOp(const v1::RunIrOpRequest& request);
  // Shared-memory regions (servers with --allow_shared_memory).
  absl::Status RegisterSharedMemory(const v1::SharedMemoryRegion& region);
  absl::Status UnregisterSharedMemory(const std::string& name);
  absl::StatusOr<v1::ListSharedMemoryResponse> ListSharedMemory();
  // A region's call channel (client/cpp/shm_channel.h opens and uses one).
  absl::StatusOr<v1::OpenShmChannelResponse> OpenShmChannel(const std::string& region,
                                                            int64_t request_capacity);
  absl::Status CloseShmChannel(const std::string& region);

  const ClientOptions& options() const { return options_; }

  // grpc.health.v1 Check for `service` ("" = the whole server): true when SERVING.
  absl::StatusOr<bool> Health(const std::string& service = "");

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  friend class LoadWatch;
  template <typename Call>
  absl::Status WithRetries(Call&& call);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelPlanService::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  ClientOptions options_;
  std::string target_;  // Connect's, for the error of a server that never answered
};

// Watches a load under way from another thread: every `interval` while it
// lives, asks ListExperts for the set `experts_id` and, while it is LOADING,
// calls `on_progress` with it (state, progress; on the watcher's thread).
// Errors of the poll are skipped. Made before the LoadExperts call and
// dropped after it:
//   LoadWatch watch(*client, "layer0", [](const v1::ExpertsInfo& e) { ... });
//   auto loaded = client->LoadExperts(header, source);
class LoadWatch {
 public:
  LoadWatch(Client& client, std::string experts_id,
            std::function<void(const v1::ExpertsInfo&)> on_progress,
            absl::Duration interval = absl::Milliseconds(200));
  ~LoadWatch();  // stops the thread (after a poll under way)
  LoadWatch(const LoadWatch&) = delete;
  LoadWatch& operator=(const LoadWatch&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Converts a gRPC status to absl::Status, keeping the BadRequest field name.
absl::Status FromGrpcStatus(const grpc::Status& status);

// A whole tensor (`data`, row-major `shape`) as LoadExperts chunks named
// `name` of at most `chunk_bytes` each, appended to `chunks`; the first
// chunk carries the dtype and shape.
void AppendTensorChunks(const std::string& name, v1::DType dtype, const std::vector<int64_t>& shape,
                        const std::string& data, int64_t chunk_bytes,
                        std::vector<v1::TensorChunk>* chunks);

}  // namespace kplan
