// Per-call bookkeeping every handler shares: the bearer-token check, the
// in-flight gauge, and the code and latency metrics when the call finishes.
#pragma once

#include <grpcpp/grpcpp.h>

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
  // Done() and finish the call's default unary reactor.
  grpc::ServerUnaryReactor* FinishUnary(const absl::Status& status);

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
};

}  // namespace kplan::rpc
