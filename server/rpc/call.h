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
#include "absl/time/time.h"
#include "server/rpc/service.h"

namespace kplan::rpc {

class Call {
 public:
  // A unary call takes the context's default reactor here: gRPC allows that
  // once, from inside the handler. Streaming calls bring their own reactor.
  Call(const ServerEnvironment& env, grpc::CallbackServerContext* context, const char* method,
       bool unary = true);

  // UNAUTHENTICATED unless the call carries the configured bearer token.
  absl::Status Authorize() const;
  // Records the outcome (log, metrics) once and maps it to a gRPC status.
  grpc::Status Done(const absl::Status& status);
  // Done() and finish the call's default unary reactor, unless the call was
  // already finished (then nothing happens).
  grpc::ServerUnaryReactor* FinishUnary(const absl::Status& status);
  // True the first time only: whoever gets it finishes the call.
  bool Claim() { return !claimed_.exchange(true); }

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
  absl::Time start() const { return start_; }
  const ServerEnvironment& env() const { return env_; }

 private:
  const ServerEnvironment& env_;
  grpc::CallbackServerContext* context_;
  grpc::ServerUnaryReactor* reactor_;  // null for streaming calls
  const std::string method_;
  const absl::Time start_;
  absl::Time deadline_;
  std::atomic<bool> claimed_{false};
};

}  // namespace kplan::rpc
