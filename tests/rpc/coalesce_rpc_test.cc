// RunMoE coalescing through the server (--coalesce_window_us): concurrent
// clients with different random tokens on one set get, from one merged
// launch (the metrics prove it), the bits each gets alone on the same server,
// and the answer of a server without coalescing: bit for bit on the CPU
// path, within the layer's tolerance on a GPU (the merged and lone launches
// are batch-invariant there, the server without coalescing may take the
// decode kernels and split-K: another fp32 summation order).
//
// Built twice: rpc_coalesce_test on the CPU path (--devices none) and
// rpc_coalesce_gpu_test (KPLAN_COALESCE_ON_GPU) on cuda:0, which skips
// itself without a GPU.
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/float16.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe/moe_reference.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"
#include "tests/testing/tolerance.h"

namespace kplan::rpc {
namespace {

#if KPLAN_COALESCE_ON_GPU
constexpr bool kOnGpu = true;
#else
constexpr bool kOnGpu = false;
#endif

// Decode-sized on a GPU: one token of top-4 over 32 experts takes the decode
// kernels on a server without coalescing.
constexpr int kExperts = 32, kTopK = 4;
constexpr int64_t kHidden = 256, kInter = 128;
constexpr int kCallers = 12;
constexpr absl::Duration kWindow = absl::Seconds(3);

std::string RandomValues(int64_t n, v1::DType dtype, std::mt19937& rng, float sd) {
  std::normal_distribution<float> normal(0.f, sd);
  const kernels::DType d =
      dtype == v1::DTYPE_BFLOAT16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32;
  std::string out(static_cast<size_t>(n * kernels::DTypeSize(d)), '\0');
  for (int64_t i = 0; i < n; ++i) moe::StoreFloat(out.data(), d, i, normal(rng));
  return out;
}

struct Server {
  std::unique_ptr<KplanServer> server;
  std::unique_ptr<Client> client;
};

class CoalesceRpcTest : public ::testing::TestWithParam<v1::DType> {
 protected:
  void SetUp() override {
    on_ = Start(kWindow);
    if (on_.server == nullptr && kOnGpu) GTEST_SKIP() << "no GPU 0: " << start_error_;
    ASSERT_NE(on_.server, nullptr) << start_error_;
    off_ = Start(absl::ZeroDuration());
    ASSERT_NE(off_.server, nullptr) << start_error_;
  }

  // A server (cuda:0 or the CPU path) with a window (zero: off), holding one
  // random bf16 set.
  Server Start(absl::Duration window) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.devices = kOnGpu ? "0" : "none";
    options.coalesce_window = window;
    options.coalesce_max_tokens = tokens_;
    absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
    if (!s.ok()) {
      start_error_ = s.status().ToString();
      return {};
    }
    Server out;
    out.server = *std::move(s);
    ClientOptions client_options;
    client_options.deadline = absl::Seconds(60);
    client_options.max_attempts = 1;
    out.client = Client::Connect(absl::StrCat("127.0.0.1:", out.server->port()), client_options);
    v1::ExpertsHeader header;
    header.set_experts_id("coalesce");
    header.set_num_experts(kExperts);
    header.set_hidden_size(kHidden);
    header.set_intermediate_size(kInter);
    header.set_activation("silu");
    header.set_dtype(v1::DTYPE_BFLOAT16);
    std::vector<v1::TensorChunk> chunks;
    AppendTensorChunks("w13", v1::DTYPE_BFLOAT16, {kExperts, 2 * kInter, kHidden}, w13_, 1 << 20,
                       &chunks);
    AppendTensorChunks("w2", v1::DTYPE_BFLOAT16, {kExperts, kHidden, kInter}, w2_, 1 << 20,
                       &chunks);
    absl::StatusOr<v1::LoadExpertsResponse> loaded = out.client->LoadExperts(header, chunks);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (kOnGpu && loaded.ok()) {
      EXPECT_EQ(loaded->experts().placement_size(), 2);  // host + GPU
    }
    return out;
  }

  v1::RunMoERequest Request(int64_t m) {
    const v1::DType act = GetParam();
    v1::RunMoERequest r;
    r.set_experts_id("coalesce");
    *r.mutable_hidden_states() =
        testing::MakeTensor(act, {m, kHidden}, RandomValues(m * kHidden, act, rng_, 1.f));
    *r.mutable_router_logits() = testing::MakeTensor(
        v1::DTYPE_FLOAT32, {m, kExperts}, RandomValues(m * kExperts, v1::DTYPE_FLOAT32, rng_, 2.f));
    r.mutable_routing()->set_top_k(kTopK);
    r.set_return_routing(true);
    return r;
  }

  std::string Metrics(const Server& s) { return s.server->metrics()->Render(); }

  std::mt19937 rng_{std::random_device{}()};
  std::string start_error_;
  // The set, drawn once for both servers.
  std::string w13_ = RandomValues(kExperts * 2 * kInter * kHidden, v1::DTYPE_BFLOAT16, rng_,
                                  1.f / std::sqrt(static_cast<float>(kHidden)));
  std::string w2_ = RandomValues(kExperts * kHidden * kInter, v1::DTYPE_BFLOAT16, rng_,
                                 1.f / std::sqrt(static_cast<float>(kInter)));
  // The callers' tokens: 1, 2, 3, 1, ...; the cap is their sum, so the
  // concurrent calls make one launch that goes once full.
  std::vector<int64_t> sizes_ = [] {
    std::vector<int64_t> v;
    for (int c = 0; c < kCallers; ++c) v.push_back(1 + c % 3);
    return v;
  }();
  int64_t tokens_ = 2 * kCallers;
  Server on_, off_;
};

double Element(const v1::Tensor& t, int64_t i) {
  if (t.dtype() == v1::DTYPE_FLOAT32) {
    float f;
    std::memcpy(&f, t.data().data() + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, t.data().data() + i * 2, 2);
  return Bf16ToFloat(h);
}

TEST_P(CoalesceRpcTest, ConcurrentCallersGetTheirLoneAnswersFromOneLaunch) {
  std::vector<v1::RunMoERequest> requests;
  for (int64_t m : sizes_) requests.push_back(Request(m));
  // Alone on the coalescing server: a deadline before the window ends sends
  // a call's group at once, so each runs alone (batch-invariant) without
  // waiting for the window.
  std::vector<v1::RunMoEResponse> alone, off;
  {
    ClientOptions quick;
    quick.deadline = kWindow / 2;
    quick.max_attempts = 1;
    auto client = Client::Connect(absl::StrCat("127.0.0.1:", on_.server->port()), quick);
    for (const v1::RunMoERequest& r : requests) {
      absl::StatusOr<v1::RunMoEResponse> a = client->RunMoE(r);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->timing().coalesced_requests(), 1);  // through the coalescer, alone
      alone.push_back(*std::move(a));
      absl::StatusOr<v1::RunMoEResponse> o = off_.client->RunMoE(r);
      ASSERT_TRUE(o.ok()) << o.status();
      EXPECT_EQ(o->timing().coalesced_requests(), 0);  // coalescing off
      off.push_back(*std::move(o));
    }
  }
  EXPECT_THAT(Metrics(on_), ::testing::HasSubstr("kplan_moe_coalesced_launches_total 0"));
  // All at once, each on its own channel.
  std::vector<absl::StatusOr<v1::RunMoEResponse>> merged(kCallers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&, c] {
      ClientOptions options;
      options.deadline = absl::Seconds(60);
      options.max_attempts = 1;
      grpc::ChannelArguments args;
      args.SetInt("coalesce_test_client", c);  // a channel (connection) of its own
      std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
          absl::StrCat("127.0.0.1:", on_.server->port()), grpc::InsecureChannelCredentials(), args);
      // Connected first (a loaded host may refuse a first connect): a call
      // that never arrived would leave the launch short of full.
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30));
      Client client(channel, options);
      merged[c] = client.RunMoE(requests[c]);
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string metrics = Metrics(on_);
  EXPECT_THAT(metrics, ::testing::HasSubstr("kplan_moe_coalesced_launches_total 1"));
  EXPECT_THAT(metrics, ::testing::HasSubstr(absl::StrCat(
                           "kplan_moe_coalesce_requests_per_launch_count ", kCallers + 1)));
  EXPECT_THAT(metrics, ::testing::HasSubstr(absl::StrCat(
                           "kplan_moe_coalesce_requests_per_launch_bucket{le=\"8\"} ", kCallers)));
  for (int c = 0; c < kCallers; ++c) {
    SCOPED_TRACE(absl::StrCat("caller ", c, ", ", sizes_[c], " tokens"));
    ASSERT_TRUE(merged[c].ok()) << merged[c].status();
    const v1::RunMoEResponse& got = *merged[c];
    EXPECT_EQ(got.plan().devices(0), kOnGpu ? "cuda:0" : "cpu");
    EXPECT_EQ(got.plan().backend(), alone[c].plan().backend());
    ASSERT_EQ(got.output().data().size(), alone[c].output().data().size());
    EXPECT_TRUE(got.output().data() == alone[c].output().data()) << "not the lone bits";
    EXPECT_EQ(got.topk_ids().data(), alone[c].topk_ids().data());
    EXPECT_EQ(got.topk_weights().data(), alone[c].topk_weights().data());
    // Shared by the launch's members; the caller's own wait, which went
    // once the launch was full, before the window's end.
    EXPECT_EQ(got.timing().device_us(), merged[0]->timing().device_us());
    EXPECT_EQ(got.timing().coalesced_requests(), kCallers);
    EXPECT_LT(got.timing().queue_us(), absl::ToDoubleMicroseconds(kWindow));
    std::printf("caller %d: queue %.0f us, device %.0f us, total %.0f us\n", c,
                got.timing().queue_us(), got.timing().device_us(), got.timing().total_us());
    if (!kOnGpu) {
      EXPECT_TRUE(got.output().data() == off[c].output().data()) << "not coalescing-off's bits";
      continue;
    }
    // A GPU without coalescing: the same routing, outputs within tolerance.
    EXPECT_EQ(got.topk_ids().data(), off[c].topk_ids().data());
    const int64_t n = sizes_[c] * kHidden;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += Element(off[c].output(), i) * Element(off[c].output(), i);
    const double rms = std::sqrt(ss / n);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = Element(off[c].output(), i), have = Element(got.output(), i);
      if (!(std::fabs(have - want) <= test_util::MoeLayerElementTolerance(want, rms))) ++bad;
    }
    EXPECT_EQ(bad, 0) << "of " << n << " elements";
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, CoalesceRpcTest,
                         ::testing::Values(v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT32),
                         [](const ::testing::TestParamInfo<v1::DType>& info) {
                           return info.param == v1::DTYPE_BFLOAT16 ? std::string("bf16")
                                                                   : std::string("fp32");
                         });

}  // namespace
}  // namespace kplan::rpc
