// Per-call bookkeeping every handler shares: the bearer-token check, the
// in-flight gauge, the code and latency metrics when the call finishes, and
// the call's deadline (the client's, capped by --max_request_time) and
// cancellation as the device workers see them. A call is finished once: the
// first FinishUnary wins, so a worker that drops a job and a job that already
// answered can never both finish it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/rpc/service.h"

namespace kplan::rpc {

// Where a method registered on raw bytes (raw_service.h) keeps the typed
// request and response of one call, and how the response becomes the bytes
// gRPC sends. The Call of that call owns it, so the messages live exactly as
// long as the handler's work does.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Serializes the typed response into gRPC's response buffer.
  virtual absl::Status Serialize() = 0;
  // The context's default reactor when the raw method took it for the
  // handler (null: the handler brings its own reactor).
  grpc::ServerUnaryReactor* reactor = nullptr;
  // Set by the first FinishUnary: a handler that throws after answering is
  // not answered twice.
  std::atomic<bool> finished{false};
  // Set when the handler's Call counted the call as started (metrics): the
  // answer to a throw then counts it as finished.
  bool counted = false;
  // When the request's bytes were handed over, before they were parsed:
  // the Call's start.
  const absl::Time arrival = absl::Now();
};

// Hands `sink` to the next Call constructed on this thread: the raw method
// sets it around its synchronous call into the typed handler, whose first
// act is to construct its Call.
class ScopedResponseSink {
 public:
  explicit ScopedResponseSink(std::shared_ptr<ResponseSink> sink);
  ~ScopedResponseSink();  // drops the sink if no Call took it
  ScopedResponseSink(const ScopedResponseSink&) = delete;
  ScopedResponseSink& operator=(const ScopedResponseSink&) = delete;
};

class Call {
 public:
  // A unary call takes the context's default reactor here: gRPC allows that
  // once, from inside the handler. Streaming calls bring their own reactor.
  Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method,
       bool unary = true);

  // UNAUTHENTICATED unless the call carries the configured bearer token.
  absl::Status Authorize() const;
  // Records the outcome (log, metrics) once and maps it to a gRPC status;
  // an OK outcome of a raw-registered call first serializes its response.
  grpc::Status Done(const absl::Status& status);
  // Done() and finish the call's default unary reactor, unless the call was
  // already finished (then nothing happens).
  grpc::ServerUnaryReactor* FinishUnary(const absl::Status& status);
  // True the first time only: whoever gets it finishes the call.
  bool Claim();

  // The client's deadline, or start + --max_request_time when that is sooner.
  absl::Time deadline() const { return deadline_; }
  // Whether the client cancelled (or its deadline expired in gRPC).
  bool IsCancelled() const;
  // A device job for this unary call: its deadline and cancellation, and a
  // `fail` that finishes the call when the job is dropped or throws.
  static DeviceExecutor::Job UnaryJob(const std::shared_ptr<Call>& call, int64_t bytes,
                                      DeviceExecutor::Work work);

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  const std::string& method() const { return method_; }
  // When the call arrived: for raw-registered calls, before the request
  // was parsed (ResponseSink::arrival).
  absl::Time start() const { return start_; }
  const ServerEnvironment& env() const { return env_; }

 private:
  const ServerEnvironment& env_;
  grpc::CallbackServerContext* context_;
  grpc::ServerUnaryReactor* reactor_;  // null for streaming calls
  const std::string method_;
  std::shared_ptr<ResponseSink> sink_;  // raw-registered calls only
  const absl::Time start_;
  absl::Time deadline_;
  std::atomic<bool> claimed_{false};  // when there is no sink
};

}  // namespace kplan::rpc
