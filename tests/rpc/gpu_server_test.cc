// The server on the real device list (GPU label): GetServerInfo shows the
// GPUs, and RunIrOp on cuda:0 agrees with the CPU path on fresh random data.
// Skips itself where no GPU is visible.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "client/cpp/client.h"
#include "server/rpc/server.h"
#include "tests/rpc/ir_rpc_util.h"

namespace kplan::rpc {
namespace {

class GpuServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    if (server_->environment().devices.empty()) GTEST_SKIP() << "no GPU visible";
    if (server_->environment().devices.size() > 1) {
      // These tests are about one GPU; several would form an expert-parallel
      // group (tests/ep, scripts/ep-check.sh cover that).
      server_.reset();
      options.devices = "0";
      s = KplanServer::Start(options);
      ASSERT_TRUE(s.ok()) << s.status();
      server_ = std::move(*s);
    }
    grpc::ChannelArguments args;  // responses carry whole tensors
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = v1::KernelPlanService::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(), args));
  }
  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return ctx;
  }
  std::unique_ptr<KplanServer> server_;
  std::unique_ptr<v1::KernelPlanService::Stub> stub_;
};

TEST_F(GpuServerTest, InfoReportsTheGpusAndKplanFirst) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(Context().get(), {}, &info).ok());
  ASSERT_GT(info.devices_size(), 0);
  EXPECT_EQ(info.platform().kind(), v1::PLATFORM_KIND_CUDA);
  EXPECT_THAT(info.ir_op_priority().rms_norm(), ::testing::ElementsAre("kplan", "native"));
  std::printf("device 0: %s sm_%d%d, %lld MiB; driver %s\n", info.devices(0).name().c_str(),
              info.devices(0).capability().major(), info.devices(0).capability().minor(),
              static_cast<long long>(info.devices(0).total_memory_bytes() >> 20),
              info.cuda_driver_version().c_str());
}

TEST_F(GpuServerTest, RunIrOpOnTheGpuAgreesWithTheCpu) {
  std::mt19937 rng(std::random_device{}());
  for (int64_t hidden : {4096, 8192, 4099}) {
    for (v1::DType dtype : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT32}) {
      SCOPED_TRACE(absl::StrCat("hidden ", hidden, " dtype ", v1::DType_Name(dtype)));
      const int64_t rows = 129;
      std::vector<float> x = testing::RandomValues(rows * hidden, rng);
      std::vector<float> res = testing::RandomValues(rows * hidden, rng);
      std::vector<float> w = testing::RandomValues(hidden, rng, 0.5f, 1.5f);
      v1::RunIrOpRequest req;
      req.set_op("fused_add_rms_norm");
      *req.add_inputs() = testing::MakeTensor("x", {rows, hidden}, x, dtype);
      *req.add_inputs() = testing::MakeTensor("x_residual", {rows, hidden}, res, dtype);
      *req.add_inputs() = testing::MakeTensor("weight", {hidden}, w, dtype);
      req.set_epsilon(1e-6);
      v1::RunIrOpResponse gpu, cpu;
      req.set_device("cuda:0");
      grpc::Status sg = stub_->RunIrOp(Context().get(), req, &gpu);
      ASSERT_TRUE(sg.ok()) << sg.error_message();
      req.set_device("cpu");
      ASSERT_TRUE(stub_->RunIrOp(Context().get(), req, &cpu).ok());
      EXPECT_EQ(gpu.device(), "cuda:0");
      EXPECT_EQ(cpu.provider(), "native");
      std::printf("fused_add_rms_norm [%lld, %lld] %s: provider %s\n", (long long)rows,
                  (long long)hidden, v1::DType_Name(dtype).c_str(), gpu.provider().c_str());
      ASSERT_EQ(gpu.outputs_size(), 2);
      const double atol = dtype == v1::DTYPE_BFLOAT16 ? 1e-3 : 1e-5;
      const double rtol = dtype == v1::DTYPE_BFLOAT16 ? 1.6e-2 : 1.3e-6;
      for (int o = 0; o < 2; ++o) {
        std::vector<float> g = testing::Decode(gpu.outputs(o).tensor());
        std::vector<float> c = testing::Decode(cpu.outputs(o).tensor());
        ASSERT_EQ(g.size(), c.size());
        int bad = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          if (!(std::abs(g[i] - c[i]) <= atol + rtol * std::abs(c[i]))) ++bad;
        }
        EXPECT_EQ(bad, 0) << gpu.outputs(o).name();
      }
    }
  }
}

// LoadExperts puts bf16 experts on the GPU; RunMoE with auto runs them there
// (kplan) and agrees with the CPU reference path (emulation) on the same input.
TEST_F(GpuServerTest, RunMoeOnTheGpuAgreesWithTheCpuPath) {
  auto client = kplan::Client::Connect(absl::StrCat("127.0.0.1:", server_->port()));
  std::mt19937 rng(std::random_device{}());
  const int e = 16, k = 4, h = 1024, i = 512;
  std::vector<float> w13 = testing::RandomValues(size_t(e) * 2 * i * h, rng, -0.05f, 0.05f);
  std::vector<float> w2 = testing::RandomValues(size_t(e) * h * i, rng, -0.05f, 0.05f);
  v1::ExpertsHeader header;
  header.set_experts_id("gpu-layer");
  header.set_num_experts(e);
  header.set_hidden_size(h);
  header.set_intermediate_size(i);
  header.set_dtype(v1::DTYPE_BFLOAT16);
  std::vector<v1::TensorChunk> chunks;
  for (auto [name, values, shape] :
       {std::tuple<const char*, std::vector<float>*, std::vector<int64_t>>{
            "w13", &w13, {e, 2 * i, h}},
        {"w2", &w2, {e, h, i}}}) {
    v1::NamedTensor t = testing::MakeTensor(name, shape, *values, v1::DTYPE_BFLOAT16);
    v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(v1::DTYPE_BFLOAT16);
    for (int64_t d : shape) c.add_shape(d);
    c.set_data(t.tensor().data());
    chunks.push_back(c);
  }
  absl::StatusOr<v1::LoadExpertsResponse> loaded = client->LoadExperts(header, chunks);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->experts().placement_size(), 2);
  EXPECT_EQ(loaded->experts().placement(1).device(), "cuda:0");

  // Each size against the CPU path: the worker's workspace grows (33, 200),
  // is reused by smaller calls (1, 7), and an empty batch is [0, H].
  auto check = [&](int m) {
    SCOPED_TRACE(absl::StrCat("M=", m));
    std::vector<float> x = testing::RandomValues(size_t(m) * h, rng);
    std::vector<float> logits = testing::RandomValues(size_t(m) * e, rng);
    v1::RunMoERequest req;
    req.set_experts_id("gpu-layer");
    *req.mutable_hidden_states() = testing::MakeTensor("x", {m, h}, x, v1::DTYPE_BFLOAT16).tensor();
    *req.mutable_router_logits() =
        testing::MakeTensor("logits", {m, e}, logits, v1::DTYPE_FLOAT32).tensor();
    req.mutable_routing()->set_top_k(k);
    req.mutable_routing()->set_routing_method("RenormalizeNaive");
    absl::StatusOr<v1::RunMoEResponse> gpu = client->RunMoE(req);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(gpu->plan().backend(), "kplan");
    EXPECT_THAT(gpu->plan().devices(), ::testing::ElementsAre("cuda:0"));
    EXPECT_THAT(gpu->output().shape(), ::testing::ElementsAre(m, h));
    req.mutable_kernel_config()->set_moe_backend("emulation");
    absl::StatusOr<v1::RunMoEResponse> cpu = client->RunMoE(req);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    EXPECT_EQ(cpu->plan().backend(), "emulation");
    std::vector<float> g = testing::Decode(gpu->output()), c = testing::Decode(cpu->output());
    ASSERT_EQ(g.size(), c.size());
    if (m == 0) return;
    double num = 0, den = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      ASSERT_TRUE(std::isfinite(g[j])) << j;
      num += (g[j] - c[j]) * double(g[j] - c[j]);
      den += double(c[j]) * c[j];
    }
    const double rel = std::sqrt(num / den);
    std::printf(
        "RunMoE E=%d k=%d H=%d I=%d M=%d: kplan (GPU) vs emulation (CPU) rel error %.2e; "
        "device us %.1f vs %.1f\n",
        e, k, h, i, m, rel, gpu->timing().device_us(), cpu->timing().device_us());
    EXPECT_LT(rel, 1e-2);
  };
  for (int m : {33, 1, 200, 7, 0}) check(m);
  // After an unload the workspace shrinks to the next call's need; a set
  // loaded again runs right.
  ASSERT_TRUE(client->UnloadExperts("gpu-layer").ok());
  ASSERT_TRUE(client->LoadExperts(header, chunks).ok());
  for (int m : {5, 64}) check(m);
  EXPECT_TRUE(client->UnloadExperts("gpu-layer").ok());
}

}  // namespace
}  // namespace kplan::rpc
