// A server with a CPU expert-parallel group (--cpu_ep_ranks 2 and 3) against
// the single-rank server, both in-process on 127.0.0.1:0: LoadExperts places
// the experts linearly and ListExperts shows the shards; RunMoE with each
// dispatch equals the single-rank output (bit for bit with kplan_all2allv;
// allgather_reducescatter re-associates fp32 sums when k > 2, so within
// rounding there, as ep_dispatch.h documents), for uneven token splits and a
// single token (ranks without tokens); all2all_backend is resolved as vLLM
// resolves it; a rank failure fails the request with a clear status and the
// next request succeeds on the rebuilt group.
#include <cmath>
#include <cstring>
#include <random>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kE = 5, kH = 16, kI = 8;

using testing::Bytes;
using testing::Chunk;
using testing::MakeTensor;
using testing::Random;

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::unique_ptr<KplanServer> StartServer(int cpu_ep_ranks) {
  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  options.cpu_ep_ranks = cpu_ep_ranks;
  options.ep_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<KplanServer>> server = KplanServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

class EpServerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ranks_ = GetParam();
    single_ = StartServer(0);
    ep_ = StartServer(ranks_);
    ClientOptions once;
    once.max_attempts = 1;  // see the group's failures, not a retry's success
    single_client_ = Client::Connect(absl::StrCat("127.0.0.1:", single_->port()), once);
    ep_client_ = Client::Connect(absl::StrCat("127.0.0.1:", ep_->port()), once);
    std::mt19937 rng(std::random_device{}());
    w13_ = Random(kE * 2 * kI * kH, rng, 0.3f);
    w2_ = Random(kE * kH * kI, rng, 0.3f);
    v1::ExpertsHeader h;
    h.set_experts_id("layer0");
    h.set_num_experts(kE);
    h.set_hidden_size(kH);
    h.set_intermediate_size(kI);
    h.set_activation("silu");
    h.set_dtype(v1::DTYPE_FLOAT32);
    const std::vector<v1::TensorChunk> chunks = {Chunk("w13", {kE, 2 * kI, kH}, Bytes(w13_)),
                                                 Chunk("w2", {kE, kH, kI}, Bytes(w2_))};
    absl::StatusOr<v1::LoadExpertsResponse> a = single_client_->LoadExperts(h, chunks);
    ASSERT_TRUE(a.ok()) << a.status();
    loaded_ = ep_client_->LoadExperts(h, chunks);
    ASSERT_TRUE(loaded_.ok()) << loaded_.status();
  }

  // A request over m random tokens: routed from logits (top_k) or, with
  // by_ids, with given ids and weights of k distinct experts per token.
  v1::RunMoERequest Request(int m, int top_k, bool by_ids, const std::string& all2all) {
    std::mt19937 rng(std::random_device{}());
    v1::RunMoERequest req;
    req.set_experts_id("layer0");
    *req.mutable_hidden_states() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, kH}, Bytes(Random(m * kH, rng, 1.f)));
    if (by_ids) {
      std::vector<int32_t> ids(m * top_k);
      std::vector<float> weights(m * top_k);
      for (int t = 0; t < m; ++t) {
        std::vector<int32_t> perm = {0, 1, 2, 3, 4};
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int j = 0; j < top_k; ++j) {
          ids[t * top_k + j] = perm[j];
          weights[t * top_k + j] = 0.1f + std::uniform_real_distribution<float>(0, 1)(rng);
        }
      }
      *req.mutable_topk_ids() =
          MakeTensor(v1::DTYPE_INT32, {m, top_k},
                     std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
      *req.mutable_topk_weights() = MakeTensor(v1::DTYPE_FLOAT32, {m, top_k}, Bytes(weights));
    } else {
      *req.mutable_router_logits() =
          MakeTensor(v1::DTYPE_FLOAT32, {m, kE}, Bytes(Random(m * kE, rng, 1.f)));
      req.mutable_routing()->set_top_k(top_k);
      req.mutable_routing()->set_routing_method("Renormalize");
    }
    req.mutable_parallel()->set_all2all_backend(all2all);
    return req;
  }

  // Runs `req` on both servers and compares the outputs.
  void ExpectSameAsSingleRank(const v1::RunMoERequest& req, bool exact) {
    absl::StatusOr<v1::RunMoEResponse> want = single_client_->RunMoE(req);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<v1::RunMoEResponse> got = ep_client_->RunMoE(req);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->plan().ep_size(), ranks_);
    EXPECT_EQ(got->plan().backend(), "emulation");
    EXPECT_EQ(got->plan().devices_size(), ranks_);
    EXPECT_EQ(want->plan().ep_size(), 0);
    EXPECT_EQ(want->plan().all2all_backend(), "");
    if (exact) {
      EXPECT_EQ(got->output().data(), want->output().data()) << "not bit-identical";
      return;
    }
    const std::vector<float> a = Floats(got->output().data()), b = Floats(want->output().data());
    ASSERT_EQ(a.size(), b.size());
    // The fp32 sum over ranks is re-associated: the error is a few ulps of
    // the summands, which for an output that cancels to near zero can be far
    // more than an ulp of the output itself; hence the rms term.
    double sq = 0;
    for (float v : b) sq += double(v) * v;
    const float rms = static_cast<float>(std::sqrt(sq / std::max<size_t>(b.size(), 1)));
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], b[i], 1e-5f * std::abs(b[i]) + 1e-6f * rms) << "element " << i;
    }
  }

  int ranks_ = 0;
  std::unique_ptr<KplanServer> single_, ep_;
  std::unique_ptr<Client> single_client_, ep_client_;
  std::vector<float> w13_, w2_;
  absl::StatusOr<v1::LoadExpertsResponse> loaded_;
};

TEST_P(EpServerTest, LoadAndListShowTheLinearPlacement) {
  absl::StatusOr<v1::ListExpertsResponse> list = ep_client_->ListExperts();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->experts_size(), 1);
  const v1::ExpertsInfo& info = list->experts(0);
  ASSERT_EQ(info.shards_size(), ranks_);
  const int64_t per_expert = (2 * kI * kH + kH * kI) * 4;
  int next = 0;
  for (int r = 0; r < ranks_; ++r) {
    const v1::ExpertShard& s = info.shards(r);
    EXPECT_EQ(s.rank(), r);
    EXPECT_EQ(s.device(), "cpu");
    EXPECT_EQ(s.first_expert(), next);
    // Linear: E / n each, the first E % n ranks one more.
    EXPECT_EQ(s.num_experts(), kE / ranks_ + (r < kE % ranks_ ? 1 : 0));
    EXPECT_EQ(s.bytes(), s.num_experts() * per_expert);
    next += s.num_experts();
  }
  EXPECT_EQ(next, kE);
  // The host copy, and the group as a whole (views: no extra bytes).
  ASSERT_EQ(info.placement_size(), 2);
  EXPECT_EQ(info.placement(0).device(), "cpu");
  EXPECT_EQ(info.placement(1).device(), ranks_ == 2 ? "ep:cpu,cpu" : "ep:cpu,cpu,cpu");
  EXPECT_EQ(info.placement(1).bytes(), 0);
  EXPECT_EQ(loaded_->experts().shards_size(), ranks_);

  absl::StatusOr<v1::GetServerInfoResponse> server = ep_client_->GetServerInfo();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->ep_group().size(), ranks_);
  EXPECT_EQ(server->ep_group().communicator(), "in_process");
  EXPECT_THAT(server->ep_group().all2all_backends(),
              ElementsAre("allgather_reducescatter", "kplan_all2allv"));
  EXPECT_FALSE(single_client_->GetServerInfo()->has_ep_group());
}

TEST_P(EpServerTest, EachDispatchEqualsTheSingleRankServer) {
  for (int m : {7, 1, 2 * ranks_ + 1}) {
    for (bool by_ids : {false, true}) {
      SCOPED_TRACE(absl::StrCat("m=", m, by_ids ? " given ids" : " routed"));
      // kplan_all2allv is exact for any k; allgather_reducescatter for k <= 2.
      ExpectSameAsSingleRank(Request(m, 3, by_ids, "kplan_all2allv"), /*exact=*/true);
      ExpectSameAsSingleRank(Request(m, 2, by_ids, "allgather_reducescatter"), /*exact=*/true);
      ExpectSameAsSingleRank(Request(m, 3, by_ids, "allgather_reducescatter"), /*exact=*/false);
    }
  }
}

TEST_P(EpServerTest, PlanReportsTheDispatchAndTheGroup) {
  struct Case {
    std::string asked, ran, dispatch;
  };
  for (const Case& c :
       {Case{"", "allgather_reducescatter", "MoEPrepareAndFinalizeNaiveDPEPModular"},
        Case{"naive", "allgather_reducescatter", "MoEPrepareAndFinalizeNaiveDPEPModular"},
        Case{"kplan_all2allv", "kplan_all2allv", "KplanAll2AllVPrepareAndFinalize"}}) {
    v1::RunMoERequest req = Request(4, 2, false, c.asked);
    req.set_return_routing(true);
    absl::StatusOr<v1::RunMoEResponse> run = ep_client_->RunMoE(req);
    ASSERT_TRUE(run.ok()) << c.asked << ": " << run.status();
    EXPECT_EQ(run->plan().all2all_backend(), c.ran);
    EXPECT_EQ(run->plan().dispatch(), c.dispatch);
    EXPECT_EQ(run->plan().experts_kernel(), "KplanCpuReferenceExperts");
    EXPECT_EQ(run->plan().ep_size(), ranks_);
    EXPECT_EQ(run->topk_ids().shape(1), 2);
    EXPECT_GT(run->timing().device_us(), 0);
    EXPECT_GE(run->timing().total_us(), run->timing().device_us());
  }
}

TEST_P(EpServerTest, All2AllBackendErrorsNameTheField) {
  struct Case {
    std::string moe_backend, all2all;
    absl::StatusCode code;
    std::string text;
  };
  for (const Case& c : {
           Case{"", "bogus", absl::StatusCode::kInvalidArgument, "literal_error"},
           Case{"", "passthrough", absl::StatusCode::kInvalidArgument,
                "only valid with a moe_backend that dispatches"},
           Case{"", "deepep_low_latency", absl::StatusCode::kFailedPrecondition,
                "allgather_reducescatter, kplan_all2allv"},
           Case{"kplan_ep", "", absl::StatusCode::kFailedPrecondition, "'passthrough'"},
           // vLLM's pairing error (or, before kplan_all2allv joins the
           // vocabulary, its literal error): INVALID_ARGUMENT either way.
           Case{"kplan_ep", "kplan_all2allv", absl::StatusCode::kInvalidArgument, ""},
       }) {
    SCOPED_TRACE(c.moe_backend + " / " + c.all2all);
    v1::RunMoERequest req = Request(3, 2, false, c.all2all);
    req.mutable_kernel_config()->set_moe_backend(c.moe_backend);
    absl::StatusOr<v1::RunMoEResponse> run = ep_client_->RunMoE(req);
    EXPECT_EQ(run.status().code(), c.code) << run.status();
    EXPECT_THAT(std::string(run.status().message()), HasSubstr(c.text));
    EXPECT_EQ(FieldOf(run.status()).value_or(""), "parallel.all2all_backend");
  }
  // Without a group parallel is not read: the single-rank server runs it.
  EXPECT_TRUE(single_client_->RunMoE(Request(3, 2, false, "bogus")).ok());
  // The backends that cannot run here at all are refused as before.
  v1::RunMoERequest req = Request(3, 2, false, "");
  req.mutable_kernel_config()->set_moe_backend("kplan");
  EXPECT_EQ(ep_client_->RunMoE(req).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(EpServerTest, RankFailureFailsTheRequestAndTheGroupIsRebuilt) {
  moe::ep::EpGroup* group = ep_->environment().ep_group;
  ASSERT_NE(group, nullptr);
  const v1::RunMoERequest req = Request(5, 2, false, "kplan_all2allv");
  absl::StatusOr<v1::RunMoEResponse> want = single_client_->RunMoE(req);
  ASSERT_TRUE(want.ok()) << want.status();

  const int victim = ranks_ - 1;
  // A transport failure on the last rank, a few collectives into the step.
  ASSERT_TRUE(group->InjectFault(victim, absl::UnavailableError("link down"), /*after_calls=*/1));
  absl::StatusOr<v1::RunMoEResponse> failed = ep_client_->RunMoE(req);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()),
              HasSubstr(absl::StrCat("rank ", victim, " (cpu) of ", ranks_)));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("link down"));

  // The server keeps serving, on fresh communicators.
  absl::StatusOr<v1::RunMoEResponse> again = ep_client_->RunMoE(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->output().data(), want->output().data());
  EXPECT_EQ(group->generation(), 2);

  // An internal error of a rank is INTERNAL, with the rank.
  ASSERT_TRUE(group->InjectFault(0, absl::InternalError("bad state")));
  failed = ep_client_->RunMoE(req);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("rank 0 (cpu)"));
  again = ep_client_->RunMoE(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->output().data(), want->output().data());

  // The default client retries UNAVAILABLE: one call succeeds on the rebuilt group.
  ASSERT_TRUE(group->InjectFault(victim, absl::UnavailableError("link down")));
  absl::StatusOr<v1::RunMoEResponse> retried =
      Client::Connect(absl::StrCat("127.0.0.1:", ep_->port()))->RunMoE(req);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->output().data(), want->output().data());
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpServerTest, ::testing::Values(2, 3),
                         [](const auto& info) { return absl::StrCat(info.param, "ranks"); });

TEST(EpServerStartTest, CpuRanksNeedTheCpuPath) {
  class OneGpu final : public DeviceProber {
   public:
    absl::StatusOr<LocalRuntime> Probe() const override {
      LocalRuntime rt;
      rt.devices.push_back(LocalDevice{0, "Fake GPU", {9, 0}, int64_t{1} << 30, 1});
      return rt;
    }
  } prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  options.cpu_ep_ranks = 2;
  absl::StatusOr<std::unique_ptr<KplanServer>> server = KplanServer::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(server.status()).value_or(""), "cpu_ep_ranks");
  options.cpu_ep_ranks = -1;
  options.devices = "none";
  EXPECT_EQ(KplanServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kplan::rpc
