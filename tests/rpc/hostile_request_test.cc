// Requests an attacker would send, through the real server in-process on
// 127.0.0.1:0: sizes whose products wrap int64, empty tensors with huge
// leading dims, bytes that are no message at all, client strings that would
// blow up error texts or forge log lines. Each case must get a clean status
// naming the field, and the server must keep serving after it.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/sync_stream.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using testing::Bytes;
using testing::Chunk;
using ::testing::HasSubstr;
using testing::MakeTensor;
using ::testing::Not;
using testing::Random;

constexpr int kE = 4, kH = 16, kI = 8;

class HostileRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static NoDeviceProber prober;
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    // KPLAN_TEST_REAL_DEVICES=1 (scripts/gpu-check.sh): the server's own
    // devices, so the sets go to the GPU and RunMoE takes the GPU path.
    const char* real = std::getenv("KPLAN_TEST_REAL_DEVICES");
    options.prober = real != nullptr && std::string(real) == "1" ? nullptr : &prober;
    server_ = std::move(KplanServer::Start(options).value());
    target_ = absl::StrCat("127.0.0.1:", server_->port());
    channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    stub_ = v1::KernelPlanService::NewStub(channel_);
    client_ = Client::Connect(target_);
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  static std::string FieldOf(const grpc::Status& status) {
    google::rpc::Status details;
    if (!details.ParseFromString(status.error_details()) || details.details_size() != 1) return "";
    google::rpc::BadRequest bad;
    if (!details.details(0).UnpackTo(&bad) || bad.field_violations_size() != 1) return "";
    return bad.field_violations(0).field();
  }

  // The server still answers, and correctly.
  void ExpectServing() {
    v1::GetServerInfoResponse info;
    grpc::Status s = stub_->GetServerInfo(Context().get(), {}, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(info.version().empty());
  }

  void LoadSmallSet(const std::string& id) {
    std::mt19937 rng(std::random_device{}());
    v1::ExpertsHeader h;
    h.set_experts_id(id);
    h.set_num_experts(kE);
    h.set_hidden_size(kH);
    h.set_intermediate_size(kI);
    h.set_dtype(v1::DTYPE_FLOAT32);
    ASSERT_TRUE(
        client_
            ->LoadExperts(
                h, {Chunk("w13", {kE, 2 * kI, kH}, Bytes(Random(kE * 2 * kI * kH, rng, 0.3f))),
                    Chunk("w2", {kE, kH, kI}, Bytes(Random(kE * kH * kI, rng, 0.3f)))})
            .ok());
  }

  std::unique_ptr<KplanServer> server_;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelPlanService::Stub> stub_;
  std::unique_ptr<Client> client_;
};

TEST_F(HostileRequestTest, BytesThatAreNoMessageAreInvalidArgument) {
  grpc::GenericStub generic(channel_);
  for (const char* method : {"RunMoE", "RunIrOp", "ResolveKernelConfig", "UnloadExperts"}) {
    SCOPED_TRACE(method);
    // A length-delimited field whose length runs past the end.
    grpc::Slice slice(std::string("\x0a\xff\xff\xff\x0f", 5));
    grpc::ByteBuffer request(&slice, 1), response;
    auto ctx = Context();
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(ctx.get(), absl::StrCat("/kplan.v1.KernelPlanService/", method), {}, &request,
                      &response, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("not a valid kplan.v1.", method, "Request")));
  }
  ExpectServing();
}

TEST_F(HostileRequestTest, AStreamMessageThatIsNoMessageIsInvalidArgument) {
  // LoadExperts through the generated stubs' own machinery, on raw bytes.
  grpc::internal::RpcMethod method("/kplan.v1.KernelPlanService/LoadExperts",
                                   grpc::internal::RpcMethod::CLIENT_STREAMING, channel_);
  auto ctx = Context();
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), method,
                                                                    ctx.get(), &response));
  grpc::Slice slice(std::string("\x0a\xff\xff\xff\x0f", 5));
  grpc::ByteBuffer garbage(&slice, 1);
  writer->Write(garbage);
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("message 0 of the stream is not a valid"));
  ExpectServing();
}

TEST_F(HostileRequestTest, RunMoeShapesWhoseBytesWrapAreRefused) {
  LoadSmallSet("w");
  // M = 2^61 with no data: M * H * 4 bytes wraps to 0.
  v1::RunMoERequest req;
  req.set_experts_id("w");
  *req.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {int64_t{1} << 61, kH}, "");
  *req.mutable_router_logits() = MakeTensor(v1::DTYPE_FLOAT32, {int64_t{1} << 61, kE}, "");
  req.mutable_routing()->set_top_k(2);
  v1::RunMoEResponse resp;
  grpc::Status s = stub_->RunMoE(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(FieldOf(s), "hidden_states.shape");

  // The topk_ids path: ids must not be read before their bytes are checked
  // (the range check once quoted heap memory back).
  v1::RunMoERequest ids;
  ids.set_experts_id("w");
  *ids.mutable_hidden_states() = MakeTensor(v1::DTYPE_FLOAT32, {int64_t{1} << 62, 0}, "");
  *ids.mutable_topk_ids() = MakeTensor(v1::DTYPE_INT32, {int64_t{1} << 62, 2}, "");
  *ids.mutable_topk_weights() = MakeTensor(v1::DTYPE_FLOAT32, {int64_t{1} << 62, 2}, "");
  s = stub_->RunMoE(Context().get(), ids, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), Not(HasSubstr("is not in")));
  ExpectServing();
}

TEST_F(HostileRequestTest, RunIrOpHugeAndEmptyTensors) {
  auto request = [](std::vector<int64_t> shape, std::string data) {
    v1::RunIrOpRequest r;
    r.set_op("rms_norm");
    r.set_epsilon(1e-6);
    v1::NamedTensor* x = r.add_inputs();
    x->set_name("x");
    *x->mutable_tensor() = MakeTensor(v1::DTYPE_FLOAT32, std::move(shape), std::move(data));
    return r;
  };
  v1::RunIrOpResponse resp;
  // [2^62, 4] with no data: the wrapped product once matched 0 bytes.
  grpc::Status s = stub_->RunIrOp(Context().get(), request({int64_t{1} << 62, 4}, ""), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(FieldOf(s), "inputs.x.shape");
  // [2^62, 0]: no elements, but 2^62 rows the worker once looped over forever.
  const auto start = std::chrono::steady_clock::now();
  s = stub_->RunIrOp(Context().get(), request({int64_t{1} << 62, 0}, ""), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // A plain empty tensor is fine: the output has its shape and no bytes.
  resp.Clear();
  s = stub_->RunIrOp(Context().get(), request({1 << 16, 0}, ""), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_THAT(resp.outputs(0).tensor().shape(), ::testing::ElementsAre(1 << 16, 0));
  EXPECT_TRUE(resp.outputs(0).tensor().data().empty());
  // Negative dims and too many dims name the field too.
  s = stub_->RunIrOp(Context().get(), request({4, -4}, ""), &resp);
  EXPECT_EQ(FieldOf(s), "inputs.x.shape");
  s = stub_->RunIrOp(Context().get(), request(std::vector<int64_t>(9, 1), std::string(4, 0)),
                     &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(FieldOf(s), "inputs.x.shape");
  ExpectServing();
}

TEST_F(HostileRequestTest, ExpertSetsWhoseBytesWrapAreRefused) {
  v1::ExpertsHeader h;
  h.set_experts_id("huge");
  h.set_num_experts(1 << 21);
  h.set_hidden_size(1 << 21);
  h.set_intermediate_size(1 << 21);
  h.set_dtype(v1::DTYPE_BFLOAT16);
  absl::StatusOr<v1::LoadExpertsResponse> r = client_->LoadExperts(h, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(kplan::FieldOf(r.status()), "header.num_experts");
  v1::ListExpertsResponse list;
  ASSERT_TRUE(stub_->ListExperts(Context().get(), {}, &list).ok());
  EXPECT_EQ(list.experts_size(), 0);
}

TEST_F(HostileRequestTest, ParallelSizesWhoseProductOverflowsAreRefused) {
  v1::ResolveKernelConfigRequest req;
  req.mutable_parallel()->set_tp_size(INT32_MAX);
  req.mutable_parallel()->set_dp_size(INT32_MAX);
  req.mutable_model()->mutable_moe()->set_num_experts(8);
  req.mutable_model()->mutable_moe()->set_experts_per_token(2);
  req.mutable_model()->mutable_moe()->set_hidden_dim(1024);
  req.mutable_model()->mutable_moe()->set_intermediate_size(1024);
  v1::ResolveKernelConfigResponse resp;
  grpc::Status s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(FieldOf(s), "parallel.tp_size");
}

TEST_F(HostileRequestTest, ClientStringsInErrorsAreShortAndEscaped) {
  // pydantic-core shortens a long input_value itself: 25 + "..." + 24 bytes.
  v1::ResolveKernelConfigRequest req;
  req.mutable_kernel_config()->set_moe_backend(std::string(5000, 'z'));
  v1::ResolveKernelConfigResponse resp;
  grpc::Status s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("input_value='" + std::string(24, 'z') + "..." +
                                           std::string(23, 'z') + "', input_type=str]"));
  EXPECT_LT(s.error_message().size(), 1500u);

  // Any other echo is bounded too: never RESOURCE_EXHAUSTED on metadata.
  v1::RunIrOpRequest ir;
  ir.set_op(std::string(10000, 'q') + "\n[fake] log line\x1b[31m");
  v1::RunIrOpResponse ir_resp;
  s = stub_->RunIrOp(Context().get(), ir, &ir_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_LT(s.error_message().size(), 600u);
  EXPECT_THAT(s.error_message(), Not(HasSubstr("\n")));

  // Ids appear in logs and metrics: printable and short only.
  v1::ExpertsHeader h;
  h.set_experts_id("layer0\n2026-12-01 [info] forged");
  h.set_num_experts(kE);
  h.set_hidden_size(kH);
  h.set_intermediate_size(kI);
  h.set_dtype(v1::DTYPE_FLOAT32);
  absl::StatusOr<v1::LoadExpertsResponse> r = client_->LoadExperts(h, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(kplan::FieldOf(r.status()), "header.experts_id");
  EXPECT_THAT(std::string(r.status().message()), Not(HasSubstr("\n")));
  ExpectServing();
}

}  // namespace
}  // namespace kplan::rpc
