// The server on the real device list (GPU label): GetServerInfo shows the
// GPUs, and RunIrOp on cuda:0 agrees with the CPU path on fresh random data.
// Skips itself where no GPU is visible.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace kplan::rpc
