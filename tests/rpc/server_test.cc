// Integration tests: the real server in-process on 127.0.0.1:0, talked to
// through the generated stubs and kplan::Client, with deadlines.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <thread>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/plan/kernel_config.h"
#include "resolve/plan/vocabulary.h"
#include "resolve/proto/resolve.h"
#include "server/rpc/server.h"
#include "tests/rpc/ir_rpc_util.h"

namespace kplan::rpc {
namespace {

using ::testing::HasSubstr;

class FakeProber final : public DeviceProber {
 public:
  explicit FakeProber(std::vector<LocalDevice> devices) : devices_(std::move(devices)) {}
  absl::StatusOr<LocalRuntime> Probe() const override {
    LocalRuntime rt;
    rt.devices = devices_;
    rt.cuda_driver_version = devices_.empty() ? "" : "13.0";
    return rt;
  }

 private:
  std::vector<LocalDevice> devices_;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartWith({}); }

  void StartWith(std::vector<LocalDevice> devices) {
    server_.reset();
    prober_ = std::make_unique<FakeProber>(std::move(devices));
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.prober = prober_.get();
    absl::StatusOr<std::unique_ptr<KplanServer>> server = KplanServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    target_ = absl::StrCat("127.0.0.1:", server_->port());
    channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    stub_ = v1::KernelPlanService::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  static google::rpc::BadRequest BadRequestOf(const grpc::Status& status) {
    google::rpc::Status details;
    EXPECT_TRUE(details.ParseFromString(status.error_details()));
    EXPECT_EQ(details.code(), status.error_code());
    google::rpc::BadRequest bad;
    EXPECT_EQ(details.details_size(), 1);
    if (details.details_size() == 1) {
      EXPECT_TRUE(details.details(0).UnpackTo(&bad));
    }
    return bad;
  }

  std::unique_ptr<FakeProber> prober_;
  std::unique_ptr<KplanServer> server_;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelPlanService::Stub> stub_;
};

TEST_F(ServerTest, ResolvesForTheRequestedPlatform) {
  v1::ResolveKernelConfigRequest req;
  req.mutable_kernel_config()->set_moe_backend("Flashinfer-MoE-EP-CuteDSL");
  req.mutable_platform()->set_kind(v1::PLATFORM_KIND_CUDA);
  req.mutable_platform()->mutable_device_capability()->set_major(10);
  req.mutable_kernel_config()->mutable_ir_op_priority()->add_rms_norm("native, vllm_c");
  v1::ResolveKernelConfigResponse resp;
  grpc::Status s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.kernel_config().moe_backend(), "flashinfer_moe_ep_cutedsl");
  EXPECT_EQ(resp.parallel().all2all_backend(), "passthrough");
  EXPECT_THAT(resp.kernel_config().ir_op_priority().rms_norm(),
              ::testing::ElementsAre("native", "vllm_c"));
  EXPECT_THAT(resp.kernel_config().ir_op_priority().fused_add_rms_norm(),
              ::testing::ElementsAre("vllm_c", "native"));
  ASSERT_EQ(resp.config_hash().size(), 64u);
  ASSERT_EQ(resp.warnings_size(), 1);
  EXPECT_THAT(resp.warnings(0), HasSubstr("using all2all_backend='passthrough'"));

  // The hash is the core's hash of the resolved config.
  KernelConfig core;
  core.moe_backend = "flashinfer_moe_ep_cutedsl";
  core.ir_op_priority.of("rms_norm") = {"native", "vllm_c"};
  core.ir_op_priority.of("fused_add_rms_norm") = {"vllm_c", "native"};
  core.ir_op_priority.of("gelu_and_mul_sparse") = {"triton", "native"};
  EXPECT_EQ(resp.config_hash(), ComputeHash(core));
}

TEST_F(ServerTest, AbsentPlatformMeansTheServersOwn) {
  v1::ResolveKernelConfigResponse on_cpu;
  ASSERT_TRUE(stub_->ResolveKernelConfig(Context().get(), {}, &on_cpu).ok());
  EXPECT_EQ(on_cpu.platform().kind(), v1::PLATFORM_KIND_CPU);
  EXPECT_THAT(on_cpu.kernel_config().ir_op_priority().rms_norm(), ::testing::ElementsAre("native"));

  StartWith({LocalDevice{0, "NVIDIA H200", {9, 0}, 141LL << 30, 132}});
  v1::ResolveKernelConfigResponse on_gpu;
  ASSERT_TRUE(stub_->ResolveKernelConfig(Context().get(), {}, &on_gpu).ok());
  EXPECT_EQ(on_gpu.platform().kind(), v1::PLATFORM_KIND_CUDA);
  EXPECT_EQ(on_gpu.platform().device_name(), "NVIDIA H200");
  EXPECT_THAT(on_gpu.kernel_config().ir_op_priority().rms_norm(),
              ::testing::ElementsAre("vllm_c", "native"));
  EXPECT_NE(on_gpu.config_hash(), on_cpu.config_hash());
}

TEST_F(ServerTest, ServerAndOfflineResolutionAgree) {
  v1::ResolveKernelConfigRequest req;
  req.mutable_kernel_config()->set_moe_backend("triton");
  req.mutable_kernel_config()->set_linear_backend("marlin");
  (*req.mutable_env())["VLLM_USE_OINK_OPS"] = "1";
  req.mutable_parallel()->set_all2all_backend("naive");
  req.mutable_platform()->set_kind(v1::PLATFORM_KIND_CUDA);
  req.mutable_platform()->mutable_device_capability()->set_major(9);
  v1::ResolveKernelConfigResponse remote;
  ASSERT_TRUE(stub_->ResolveKernelConfig(Context().get(), req, &remote).ok());
  absl::StatusOr<v1::ResolveKernelConfigResponse> local =
      ResolveKernelConfig(req, server_->environment().platform);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(remote.SerializeAsString(), local->SerializeAsString());
  EXPECT_EQ(remote.parallel().all2all_backend(), "allgather_reducescatter");
  EXPECT_THAT(remote.kernel_config().ir_op_priority().rms_norm(),
              ::testing::ElementsAre("oink", "vllm_c", "native"));
}

struct ErrorCase {
  std::string name;
  std::function<void(v1::ResolveKernelConfigRequest&)> mutate;
  grpc::StatusCode code;
  std::string field;
  std::string message_part;
};

TEST_F(ServerTest, EachErrorHasItsCodeAndNamesTheField) {
  const std::vector<ErrorCase> cases = {
      {"unknown moe backend",
       [](auto& r) { r.mutable_kernel_config()->set_moe_backend("tritonn"); },
       grpc::StatusCode::INVALID_ARGUMENT, "kernel_config.moe_backend", "Input should be 'auto'"},
      {"env value int() refuses",
       [](auto& r) { (*r.mutable_env())["VLLM_USE_DEEP_GEMM"] = "true"; },
       grpc::StatusCode::INVALID_ARGUMENT, "env.VLLM_USE_DEEP_GEMM",
       "invalid literal for int() with base 10: 'true'"},
      {"unknown linear backend",
       [](auto& r) { r.mutable_kernel_config()->set_linear_backend("x"); },
       grpc::StatusCode::INVALID_ARGUMENT, "kernel_config.linear_backend", "input_value='x'"},
      {"unknown ir provider",
       [](auto& r) { r.mutable_kernel_config()->mutable_ir_op_priority()->add_rms_norm("nope"); },
       grpc::StatusCode::INVALID_ARGUMENT, "kernel_config.ir_op_priority.rms_norm",
       "All providers in priority must be registered implementations."},
      {"bad per-quant backend",
       [](auto& r) {
         (*r.mutable_kernel_config()->mutable_linear_backend_per_quant())["fp8"] = "warp";
       },
       grpc::StatusCode::INVALID_ARGUMENT, "kernel_config.linear_backend_per_quant.fp8",
       "input_value='warp'"},
      {"passthrough without self-dispatch",
       [](auto& r) { r.mutable_parallel()->set_all2all_backend("passthrough"); },
       grpc::StatusCode::INVALID_ARGUMENT, "parallel.all2all_backend",
       "all2all_backend='passthrough' is only valid with a moe_backend that dispatches and "
       "combines itself (['flashinfer_moe_ep_cutedsl', 'flashinfer_moe_ep_mega_deep_gemm']), got "
       "moe_backend='auto'."},
      {"mega deep gemm on llama",
       [](auto& r) {
         r.mutable_kernel_config()->set_moe_backend("flashinfer_moe_ep_mega_deep_gemm");
         r.mutable_model()->add_architectures("LlamaForCausalLM");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "kernel_config.moe_backend",
       "is only supported for DeepSeek-V4 models"},
      {"unknown all2all", [](auto& r) { r.mutable_parallel()->set_all2all_backend("x"); },
       grpc::StatusCode::INVALID_ARGUMENT, "parallel.all2all_backend", "'deepep_v2'"},
      {"negative tp", [](auto& r) { r.mutable_parallel()->set_tp_size(-2); },
       grpc::StatusCode::INVALID_ARGUMENT, "parallel.tp_size", "tp_size must be at least 1"},
      {"platform without kind", [](auto& r) { r.mutable_platform()->set_device_name("mystery"); },
       grpc::StatusCode::INVALID_ARGUMENT, "platform.kind", "platform.kind must be one of"},
      {"cuda without capability",
       [](auto& r) { r.mutable_platform()->set_kind(v1::PLATFORM_KIND_CUDA); },
       grpc::StatusCode::INVALID_ARGUMENT, "platform.device_capability", "device_capability"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    v1::ResolveKernelConfigRequest req;
    c.mutate(req);
    v1::ResolveKernelConfigResponse resp;
    grpc::Status s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
    EXPECT_EQ(s.error_code(), c.code);
    EXPECT_THAT(s.error_message(), HasSubstr(c.message_part));
    google::rpc::BadRequest bad = BadRequestOf(s);
    ASSERT_EQ(bad.field_violations_size(), 1);
    EXPECT_EQ(bad.field_violations(0).field(), c.field);
    EXPECT_EQ(bad.field_violations(0).description(), s.error_message());
  }
  // The server keeps serving after errors.
  v1::ResolveKernelConfigResponse ok;
  EXPECT_TRUE(stub_->ResolveKernelConfig(Context().get(), {}, &ok).ok());
}

v1::MoELayerConfig Mixtral() {
  v1::MoELayerConfig moe;
  moe.set_name("layers.0.mlp");
  moe.set_num_experts(8);
  moe.set_experts_per_token(2);
  moe.set_hidden_dim(4096);
  moe.set_intermediate_size(14336);
  moe.set_scoring_func("softmax");
  moe.set_renormalize(true);
  return moe;
}

TEST_F(ServerTest, PlansEveryMoeLayerOfTheModel) {
  v1::ResolveKernelConfigRequest req;
  req.mutable_platform()->set_kind(v1::PLATFORM_KIND_CUDA);
  req.mutable_platform()->mutable_device_capability()->set_major(9);
  *req.mutable_model()->mutable_moe() = Mixtral();
  v1::MoELayerConfig fp8 = Mixtral();
  fp8.set_name("layers.1.mlp");
  fp8.set_weight_quant("kFp8Static128BlockSym");
  fp8.set_activation_quant("kFp8Dynamic128Sym");
  *req.mutable_model()->add_moe_layers() = fp8;
  v1::ResolveKernelConfigResponse resp;
  grpc::Status s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.moe_plan().layer(), "layers.0.mlp");
  EXPECT_EQ(resp.moe_plan().scheme(), "unquantized");
  EXPECT_EQ(resp.moe_plan().backend(), "TRITON");  // SM90 moves FlashInfer to the back
  EXPECT_EQ(resp.moe_plan().experts_kernel(), "TritonExperts");
  ASSERT_EQ(resp.moe_layer_plans_size(), 1);
  EXPECT_EQ(resp.moe_layer_plans(0).scheme(), "fp8");
  EXPECT_EQ(resp.moe_layer_plans(0).backend(), "TRITON");
  EXPECT_GT(resp.moe_plan().candidates_size(), 0);

  // On SM100 without FlashInfer installed: still Triton; with it: FlashInfer TRT-LLM.
  req.mutable_platform()->mutable_device_capability()->set_major(10);
  ASSERT_TRUE(stub_->ResolveKernelConfig(Context().get(), req, &resp).ok());
  EXPECT_EQ(resp.moe_plan().backend(), "TRITON");
  req.mutable_platform()->add_libraries("flashinfer");
  ASSERT_TRUE(stub_->ResolveKernelConfig(Context().get(), req, &resp).ok());
  EXPECT_EQ(resp.moe_plan().backend(), "FLASHINFER_TRTLLM");
}

TEST_F(ServerTest, OracleErrorsKeepVllmsCodesAndFields) {
  v1::ResolveKernelConfigRequest req;
  req.mutable_platform()->set_kind(v1::PLATFORM_KIND_CUDA);
  req.mutable_platform()->mutable_device_capability()->set_major(9);
  *req.mutable_model()->mutable_moe() = Mixtral();
  v1::ResolveKernelConfigResponse resp;

  // A backend that unquantized MoE does not have: vLLM's ValueError.
  req.mutable_kernel_config()->set_moe_backend("deep_gemm");
  grpc::Status s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("moe_backend='deep_gemm' is not supported for "
                                           "unquantized MoE. Expected one of"));
  EXPECT_EQ(BadRequestOf(s).field_violations(0).field(), "kernel_config.moe_backend");

  // Nothing supports int8 W8A8 on ROCm: vLLM's NotImplementedError.
  req.mutable_kernel_config()->clear_moe_backend();
  req.mutable_platform()->set_kind(v1::PLATFORM_KIND_ROCM);
  req.mutable_platform()->set_gcn_arch_name("gfx942");
  req.mutable_model()->mutable_moe()->set_weight_quant("kInt8StaticChannelSym");
  req.mutable_model()->mutable_moe()->set_activation_quant("kInt8DynamicTokenSym");
  s = stub_->ResolveKernelConfig(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "No Int8 MoE backend supports the deployment configuration.");

  // A bad layer field is named under model.moe / model.moe_layers[i].
  v1::ResolveKernelConfigRequest layered;
  *layered.mutable_model()->add_moe_layers() = Mixtral();
  *layered.mutable_model()->add_moe_layers() = Mixtral();
  layered.mutable_model()->mutable_moe_layers(1)->set_activation("swish");
  s = stub_->ResolveKernelConfig(Context().get(), layered, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(BadRequestOf(s).field_violations(0).field(), "model.moe_layers[1].activation");
}

TEST_F(ServerTest, RunIrOpOnTheCpuMatchesTheFormula) {
  std::mt19937 rng(std::random_device{}());
  const int64_t rows = 3, hidden = 37;
  std::vector<float> x = testing::RandomValues(rows * hidden, rng);
  std::vector<float> w = testing::RandomValues(hidden, rng, 0.5f, 1.5f);
  v1::RunIrOpRequest req;
  req.set_op("rms_norm");
  *req.add_inputs() = testing::MakeTensor("x", {rows, hidden}, x, v1::DTYPE_FLOAT32);
  *req.add_inputs() = testing::MakeTensor("weight", {hidden}, w, v1::DTYPE_FLOAT32);
  req.set_epsilon(1e-6);
  v1::RunIrOpResponse resp;
  grpc::Status s = stub_->RunIrOp(Context().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.provider(), "native");
  EXPECT_EQ(resp.device(), "cpu");
  EXPECT_EQ(resp.provider_uuid(), IrProviderUuid("rms_norm", "native"));
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).name(), "out");
  std::vector<float> out = testing::Decode(resp.outputs(0).tensor());
  std::vector<double> ref = testing::RmsNormReference(x, w, rows, hidden, 1e-6);
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_NEAR(out[i], ref[i], 1e-5 + 1.3e-6 * std::abs(ref[i]));

  // The server's IR defaults without a GPU: native only.
  absl::StatusOr<v1::GetServerInfoResponse> info = Client::Connect(target_)->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->ir_op_priority().rms_norm(), ::testing::ElementsAre("native"));
}

TEST_F(ServerTest, RunIrOpErrorsNameTheField) {
  std::mt19937 rng(7);
  std::vector<float> x = testing::RandomValues(8, rng);
  auto base = [&] {
    v1::RunIrOpRequest r;
    r.set_op("rms_norm");
    *r.add_inputs() = testing::MakeTensor("x", {2, 4}, x, v1::DTYPE_FLOAT32);
    r.set_epsilon(1e-5);
    return r;
  };
  struct Case {
    std::string name;
    std::function<void(v1::RunIrOpRequest&)> mutate;
    grpc::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"unknown op", [](auto& r) { r.set_op("layer_norm"); }, grpc::StatusCode::NOT_FOUND, "op"},
      {"missing epsilon", [](auto& r) { r.clear_epsilon(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "epsilon"},
      {"int8 input",
       [](auto& r) { r.mutable_inputs(0)->mutable_tensor()->set_dtype(v1::DTYPE_INT8); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].tensor.dtype"},
      {"short data",
       [](auto& r) { r.mutable_inputs(0)->mutable_tensor()->mutable_data()->resize(4); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs.x.data"},
      {"unknown provider", [](auto& r) { r.add_priority("cuda_magic"); },
       grpc::StatusCode::INVALID_ARGUMENT, "priority"},
      {"absent gpu", [](auto& r) { r.set_device("cuda:3"); }, grpc::StatusCode::FAILED_PRECONDITION,
       "device"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::RunIrOpRequest req = base();
    c.mutate(req);
    v1::RunIrOpResponse resp;
    grpc::Status s = stub_->RunIrOp(Context().get(), req, &resp);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    google::rpc::BadRequest bad = BadRequestOf(s);
    ASSERT_EQ(bad.field_violations_size(), 1);
    EXPECT_EQ(bad.field_violations(0).field(), c.field);
  }
}

TEST_F(ServerTest, ClientLibraryCarriesTheFieldAndInfo) {
  auto client = Client::Connect(target_);
  v1::ResolveKernelConfigRequest req;
  req.mutable_kernel_config()->set_sparse_indexer_topk_backend("fastest");
  absl::StatusOr<v1::ResolveKernelConfigResponse> r = client->ResolveKernelConfig(req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(r.status()).value(), "kernel_config.sparse_indexer_topk_backend");

  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(info->platform().kind(), v1::PLATFORM_KIND_CPU);
  EXPECT_EQ(info->devices_size(), 0);
  EXPECT_EQ(info->limits().max_message_bytes(), 64 << 20);
}

TEST_F(ServerTest, ServerInfoListsTheGivenDevices) {
  StartWith({LocalDevice{0, "NVIDIA H200", {9, 0}, 141LL << 30, 132},
             LocalDevice{1, "NVIDIA H200", {9, 0}, 141LL << 30, 132}});
  absl::StatusOr<v1::GetServerInfoResponse> info = Client::Connect(target_)->GetServerInfo();
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->devices_size(), 2);
  EXPECT_EQ(info->devices(1).index(), 1);
  EXPECT_EQ(info->devices(1).capability().major(), 9);
  EXPECT_EQ(info->platform().device_capability().major(), 9);
  EXPECT_EQ(info->cuda_driver_version(), "13.0");
}

TEST_F(ServerTest, RejectsADeviceSelectionThatDoesNotExist) {
  FakeProber one({LocalDevice{0, "NVIDIA H200", {9, 0}, 1, 1}});
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &one;
  options.devices = "0,3";
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(FieldOf(s.status()).value(), "devices");
}

TEST_F(ServerTest, HealthServesOverallAndReadiness) {
  auto client = Client::Connect(target_);
  EXPECT_TRUE(client->Health("").value());
  EXPECT_TRUE(client->Health(KplanServer::kReadinessService).value());
  absl::StatusOr<bool> unknown = client->Health("no.such.Service");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerTest, ReflectionListsTheService) {
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  const google::protobuf::Descriptor* resp_desc =
      pool->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionResponse");
  ASSERT_NE(resp_desc, nullptr) << "gRPC's reflection messages are linked into the server";
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  auto ctx = Context();
  void* tag = nullptr;
  bool ok = false;
  auto call = generic.PrepareCall(
      ctx.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  // ServerReflectionRequest{list_services: "*"} (field 7, length-delimited).
  const std::string request("\x3a\x01*", 3);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  google::protobuf::DynamicMessageFactory factory(pool);
  std::unique_ptr<google::protobuf::Message> resp(factory.GetPrototype(resp_desc)->New());
  ASSERT_TRUE(resp->ParseFromString(bytes));
  std::vector<std::string> names;
  const auto* list_field = resp_desc->FindFieldByName("list_services_response");
  const google::protobuf::Message& list = resp->GetReflection()->GetMessage(*resp, list_field);
  const auto* service_field = list.GetDescriptor()->FindFieldByName("service");
  for (int i = 0; i < list.GetReflection()->FieldSize(list, service_field); ++i) {
    const auto& svc = list.GetReflection()->GetRepeatedMessage(list, service_field, i);
    names.push_back(
        svc.GetReflection()->GetString(svc, svc.GetDescriptor()->FindFieldByName("name")));
  }
  EXPECT_THAT(names, ::testing::Contains("kplan.v1.KernelPlanService"));
  EXPECT_THAT(names, ::testing::Contains("grpc.health.v1.Health"));
  call->WritesDone(reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  grpc::Status finish;
  call->Finish(&finish, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// Shutdown flips health to NOT_SERVING for a watcher that is already
// connected, drains it up to the timeout, then refuses new calls.
TEST_F(ServerTest, GracefulShutdownDrainsThenRefuses) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(KplanServer::kReadinessService);
  auto reader = health->Watch(&watch_ctx, req);
  grpc::health::v1::HealthCheckResponse update;
  ASSERT_TRUE(reader->Read(&update));
  EXPECT_EQ(update.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  const absl::Time start = absl::Now();
  std::thread stopper([&] { server_->Shutdown(absl::Seconds(1)); });
  ASSERT_TRUE(reader->Read(&update));
  EXPECT_EQ(update.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  while (reader->Read(&update)) {
  }
  stopper.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));  // the watcher was drained, not cut
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  v1::ResolveKernelConfigResponse resp;
  grpc::Status after = stub_->ResolveKernelConfig(Context().get(), {}, &resp);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace kplan::rpc
