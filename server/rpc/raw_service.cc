#include "server/rpc/raw_service.h"

#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <exception>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "server/rpc/call.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

// A protobuf varint.
void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

template <typename Message>
absl::Status PlainSerialize(const Message& m, grpc::ByteBuffer* out) {
  bool own = false;
  grpc::Status s = grpc::SerializationTraits<Message>::Serialize(m, out, &own);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("could not serialize the response: ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SerializeRunMoeResponse(v1::RunMoEResponse& response, grpc::ByteBuffer* out) {
  std::string* data = response.mutable_output()->mutable_data();
  if (data->size() < kZeroCopyOutputBytes) return PlainSerialize(response, out);
  auto* bytes = new std::string(std::move(*data));
  response.mutable_output()->clear_data();
  // Field 1 (output, length-delimited) holding field 3 (data) of Tensor.
  constexpr uint32_t kOutputTag = (1 << 3) | 2, kDataTag = (3 << 3) | 2;
  const size_t n = bytes->size();
  const size_t inner = VarintSize(kDataTag) + VarintSize(n) + n;
  std::string head = response.SerializeAsString();
  AppendVarint(kOutputTag, &head);
  AppendVarint(inner, &head);
  AppendVarint(kDataTag, &head);
  AppendVarint(n, &head);
  grpc::Slice slices[2] = {
      grpc::Slice(head.data(), head.size()),  // the small part: copied
      grpc::Slice(
          bytes->data(), n, [](void* s) { delete static_cast<std::string*>(s); }, bytes)};
  grpc::ByteBuffer buffer(slices, 2);
  out->Swap(&buffer);
  return absl::OkStatus();
}

namespace {

// One call's typed messages; the response is serialized into gRPC's buffer
// when the call succeeds.
template <typename Request, typename Response>
class TypedMessages final : public ResponseSink {
 public:
  explicit TypedMessages(grpc::ByteBuffer* out) : out_(out) {}
  absl::Status Serialize() override {
    if constexpr (std::is_same_v<Response, v1::RunMoEResponse>) {
      return SerializeRunMoeResponse(response, out_);
    } else {
      return PlainSerialize(response, out_);
    }
  }
  Request request;
  Response response;

 private:
  grpc::ByteBuffer* out_;
};

// Answers a call whose handler threw (an allocation, most likely) unless it
// had answered already; the reactor returned is the one gRPC must see.
grpc::ServerUnaryReactor* AnswerAfterThrow(const ServerEnvironment& env,
                                           grpc::CallbackServerContext* context, ResponseSink& sink,
                                           const char* method, absl::Status status) {
  spdlog::error("{}: the handler threw: {}", method, std::string(status.message()));
  grpc::ServerUnaryReactor* reactor =
      sink.reactor != nullptr ? sink.reactor : context->DefaultReactor();
  if (!sink.finished.exchange(true)) {
    const grpc::Status answer = ToGrpcStatus(status);
    // The Call that counted the call as started is gone with the throw.
    if (sink.counted && env.metrics != nullptr) {
      env.metrics->RequestFinished(method, GrpcCodeName(answer.error_code()), absl::ZeroDuration());
    }
    reactor->Finish(answer);
  }
  return reactor;
}

// Parses `bytes` and calls `handler` with the typed messages, or answers
// INVALID_ARGUMENT (after the token check: garbage from a caller without the
// token is UNAUTHENTICATED like anything else from it). No exception leaves:
// one thrown by the handler's synchronous part answers the call.
template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* Dispatch(const ServerEnvironment& env,
                                   grpc::CallbackServerContext* context, const char* method,
                                   bool default_reactor, const grpc::ByteBuffer* bytes,
                                   grpc::ByteBuffer* out, Handler handler) {
  auto messages = std::make_shared<TypedMessages<Request, Response>>(out);
  if (default_reactor) messages->reactor = context->DefaultReactor();
  try {
    grpc::ByteBuffer copy(*bytes);  // the reader consumes its buffer; slices are shared
    grpc::Status parsed =
        grpc::SerializationTraits<Request>::Deserialize(&copy, &messages->request);
    if (!parsed.ok()) {
      ScopedResponseSink scope(messages);
      Call call(env, context, method, /*unary=*/true);
      if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
      return call.FinishUnary(absl::InvalidArgumentError(
          absl::StrCat("the request is not a valid ", Request::descriptor()->full_name(), " (",
                       bytes->Length(), " bytes)")));
    }
    Request* request = &messages->request;
    Response* response = &messages->response;
    ScopedResponseSink scope(messages);
    return handler(context, request, response);
  } catch (const std::exception&) {  // std::bad_alloc included
    return AnswerAfterThrow(env, context, *messages, method,
                            StatusOfCurrentException("while handling the call", "internal error"));
  }
}

// Every unary handler answers on the context's default reactor except
// RunEpStep, which brings a reactor that notices rank 0's cancellation.
bool DefaultReactorFor(absl::string_view method) { return method != "RunEpStep"; }

}  // namespace

#define KPLAN_RAW_UNARY(Method)                                                                \
  grpc::ServerUnaryReactor* RawKernelPlanService::Method(grpc::CallbackServerContext* context, \
                                                         const grpc::ByteBuffer* request,      \
                                                         grpc::ByteBuffer* response) {         \
    return Dispatch<v1::Method##Request, v1::Method##Response>(                                \
        typed_.environment(), context, #Method, DefaultReactorFor(#Method), request, response, \
        [this](grpc::CallbackServerContext* c, const v1::Method##Request* req,                 \
               v1::Method##Response* resp) { return typed_.Method(c, req, resp); });           \
  }

KPLAN_RAW_UNARY(ResolveKernelConfig)
KPLAN_RAW_UNARY(GetServerInfo)
KPLAN_RAW_UNARY(RunIrOp)
KPLAN_RAW_UNARY(UnloadExperts)
KPLAN_RAW_UNARY(ListExperts)
KPLAN_RAW_UNARY(RunMoE)
KPLAN_RAW_UNARY(JoinEpGroup)
KPLAN_RAW_UNARY(RunEpStep)
KPLAN_RAW_UNARY(RegisterSharedMemory)
KPLAN_RAW_UNARY(UnregisterSharedMemory)
KPLAN_RAW_UNARY(ListSharedMemory)
KPLAN_RAW_UNARY(OpenShmChannel)
KPLAN_RAW_UNARY(CloseShmChannel)

#undef KPLAN_RAW_UNARY

// The stream's reactor parses each message itself; its Call serializes the
// typed response, as for the unary methods.
grpc::ServerReadReactor<grpc::ByteBuffer>* RawKernelPlanService::LoadExperts(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  // A reactor that answers at once: what a stream whose reactor could not
  // be made (out of memory) gets instead of an exception into gRPC.
  class Refused final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
   public:
    explicit Refused(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  try {
    auto messages =
        std::make_shared<TypedMessages<v1::LoadExpertsRequest, v1::LoadExpertsResponse>>(response);
    v1::LoadExpertsResponse* typed = &messages->response;
    ScopedResponseSink scope(std::move(messages));
    return typed_.LoadExpertsStream(context, typed);
  } catch (const std::exception& e) {
    spdlog::error("LoadExperts: could not start the stream: {}", e.what());
    return new Refused(
        ToGrpcStatus(absl::ResourceExhaustedError("out of memory starting LoadExperts")));
  }
}

}  // namespace kplan::rpc
