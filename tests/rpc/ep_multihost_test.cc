// An expert-parallel group across servers (--ep_size), on a CPU: two
// in-process servers on 127.0.0.1, rank 0 coordinating and rank 1 joining it
// through JoinEpGroup, their ranks' communicators InProcessCommunicators
// shared through the injected EpCommFactory (the NCCL unique id is an opaque
// string here). Checks: formation (and its DEADLINE_EXCEEDED naming a rank
// that never joins), JoinEpGroup's field errors, LoadExperts reaching the
// peer (each rank keeps its slice), RunMoE forwarded to the peer equal to a
// single-rank server per dispatch, a killed peer failing the request with
// UNAVAILABLE naming it, the group re-forming with a new generation when
// the peer is back, and a failure on rank 0 releasing the peer at once
// (aborts are local here, as NCCL's are).
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <future>
#include <map>
#include <random>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/comm/in_process_communicator.h"
#include "server/rpc/server.h"
#include "tests/rpc/ep_comm_table.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using testing::Bytes;
using testing::Chunk;
using ::testing::HasSubstr;
using testing::MakeTensor;
using testing::Random;

constexpr int kE = 5, kH = 16, kI = 8;

// The "NCCL" of the test: one InProcessGroup per id, created by the first
// rank that asks for it.
ServerOptions BaseOptions() {
  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  options.ep_timeout = absl::Seconds(10);
  options.ep_join_timeout = absl::Seconds(20);
  return options;
}

class EpMultihostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    table_ = std::make_shared<CommTable>();
    single_ =
        absl::StatusOr<std::unique_ptr<KplanServer>>(KplanServer::Start(BaseOptions())).value();
    coordinator_port_ = FreePort();
    ServerOptions rank0 = BaseOptions();
    rank0.listen_address = absl::StrCat("127.0.0.1:", coordinator_port_);
    rank0.ep_size = 2;
    Inject(rank0, table_);
    // Rank 0's start waits for rank 1.
    auto started = std::async(std::launch::async, [rank0] { return KplanServer::Start(rank0); });
    peer_ = StartPeer();
    absl::StatusOr<std::unique_ptr<KplanServer>> r0 = started.get();
    ASSERT_TRUE(r0.ok()) << r0.status();
    rank0_ = std::move(*r0);
    ClientOptions once;
    once.max_attempts = 1;
    single_client_ = Client::Connect(absl::StrCat("127.0.0.1:", single_->port()), once);
    client_ = Client::Connect(absl::StrCat("127.0.0.1:", coordinator_port_), once);
    std::mt19937 rng(7);
    w13_ = Random(kE * 2 * kI * kH, rng, 0.3f);
    w2_ = Random(kE * kH * kI, rng, 0.3f);
  }

  std::unique_ptr<KplanServer> StartPeer() {
    ServerOptions peer = BaseOptions();
    peer.ep_size = 2;
    peer.ep_rank = 1;
    peer.ep_coordinator = absl::StrCat("127.0.0.1:", coordinator_port_);
    Inject(peer, table_);
    absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(peer);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  absl::Status Load(Client& client) {
    v1::ExpertsHeader h;
    h.set_experts_id("layer0");
    h.set_num_experts(kE);
    h.set_hidden_size(kH);
    h.set_intermediate_size(kI);
    h.set_dtype(v1::DTYPE_FLOAT32);
    (void)client.UnloadExperts("layer0");
    return client
        .LoadExperts(
            h, {Chunk("w13", {kE, 2 * kI, kH}, Bytes(w13_)), Chunk("w2", {kE, kH, kI}, Bytes(w2_))})
        .status();
  }

  v1::RunMoERequest Request(int m, int top_k, const std::string& all2all) {
    std::mt19937 rng(m * 31 + top_k);
    v1::RunMoERequest req;
    req.set_experts_id("layer0");
    *req.mutable_hidden_states() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, kH}, Bytes(Random(m * kH, rng, 1.f)));
    *req.mutable_router_logits() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, kE}, Bytes(Random(m * kE, rng, 1.f)));
    req.mutable_routing()->set_top_k(top_k);
    req.mutable_routing()->set_routing_method("Renormalize");
    req.mutable_parallel()->set_all2all_backend(all2all);
    return req;
  }

  void ExpectSameAsSingle(const v1::RunMoERequest& req) {
    absl::StatusOr<v1::RunMoEResponse> want = single_client_->RunMoE(req);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<v1::RunMoEResponse> got = client_->RunMoE(req);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->plan().ep_size(), 2);
    ASSERT_EQ(got->plan().devices_size(), 2);
    EXPECT_THAT(got->plan().devices(1), HasSubstr("/cpu"));
    // k <= 2: both dispatches are bit-identical to the single rank.
    EXPECT_EQ(got->output().data(), want->output().data());
  }

  grpc::Status Join(int rank, int size, const std::string& address, v1::JoinEpGroupResponse* out) {
    auto stub = v1::KernelPlanService::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", coordinator_port_), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::JoinEpGroupRequest req;
    req.set_rank(rank);
    req.set_size(size);
    req.set_address(address);
    req.set_device("cpu");
    req.set_instance("intruder");
    return stub->JoinEpGroup(&context, req, out);
  }

  std::shared_ptr<CommTable> table_;
  int coordinator_port_ = 0;
  std::unique_ptr<KplanServer> single_, rank0_, peer_;
  std::unique_ptr<Client> single_client_, client_;
  std::vector<float> w13_, w2_;
};

TEST_F(EpMultihostTest, LoadReachesThePeerAndRunMoeEqualsOneRank) {
  ASSERT_TRUE(Load(*single_client_).ok());
  ASSERT_TRUE(Load(*client_).ok());
  absl::StatusOr<v1::ListExpertsResponse> list = client_->ListExperts();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->experts(0).shards_size(), 2);
  EXPECT_EQ(list->experts(0).shards(0).num_experts(), 3);
  EXPECT_EQ(list->experts(0).shards(1).num_experts(), 2);
  EXPECT_EQ(list->experts(0).shards(1).first_expert(), 3);
  EXPECT_THAT(list->experts(0).shards(1).device(), HasSubstr("/cpu"));
  // The peer holds the set with its own slice.
  auto peer_client = Client::Connect(absl::StrCat("127.0.0.1:", peer_->port()));
  absl::StatusOr<v1::ListExpertsResponse> on_peer = peer_client->ListExperts();
  ASSERT_TRUE(on_peer.ok());
  ASSERT_EQ(on_peer->experts_size(), 1);
  ASSERT_EQ(on_peer->experts(0).shards_size(), 1);
  EXPECT_EQ(on_peer->experts(0).shards(0).rank(), 1);
  // RunMoE goes to rank 0; the peer says so.
  absl::StatusOr<v1::RunMoEResponse> direct = peer_client->RunMoE(Request(3, 2, ""));
  EXPECT_TRUE(absl::IsFailedPrecondition(direct.status())) << direct.status();

  for (int m : {7, 1, 4}) {
    for (const char* a2a : {"allgather_reducescatter", "kplan_all2allv"}) {
      SCOPED_TRACE(absl::StrCat("m=", m, " ", a2a));
      ExpectSameAsSingle(Request(m, 2, a2a));
    }
  }
  absl::StatusOr<v1::GetServerInfoResponse> info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->ep_group().size(), 2);
}

TEST_F(EpMultihostTest, JoinErrorsNameTheField) {
  v1::JoinEpGroupResponse out;
  grpc::Status st = Join(1, 3, ":1", &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("size 2"));
  st = Join(2, 2, ":1", &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("rank must be in [1, 2)"));
  // Rank 1 is held by a live server.
  st = Join(1, 2, "127.0.0.1:1", &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("already held"));
  // The peer is not a coordinator.
  auto stub = v1::KernelPlanService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", peer_->port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::JoinEpGroupRequest req;
  EXPECT_EQ(stub->JoinEpGroup(&context, req, &out).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(EpMultihostTest, AKilledPeerFailsTheRequestAndTheGroupReformsWhenItIsBack) {
  ASSERT_TRUE(Load(*single_client_).ok());
  ASSERT_TRUE(Load(*client_).ok());
  ExpectSameAsSingle(Request(5, 2, "kplan_all2allv"));
  const int64_t before = rank0_->environment().ep_group->generation();

  peer_.reset();  // the peer dies
  absl::StatusOr<v1::RunMoEResponse> failed = client_->RunMoE(Request(5, 2, "kplan_all2allv"));
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("rank 1"));

  peer_ = StartPeer();  // it comes back (another port), rejoins
  ASSERT_NE(peer_, nullptr);
  ASSERT_TRUE(Load(*client_).ok());  // its sets went with the old process
  ExpectSameAsSingle(Request(5, 2, "kplan_all2allv"));
  ExpectSameAsSingle(Request(6, 2, "allgather_reducescatter"));
  EXPECT_GT(rank0_->environment().ep_group->generation(), before);
}

TEST_F(EpMultihostTest, RankZerosFailureReleasesThePeerAtOnce) {
  ASSERT_TRUE(Load(*single_client_).ok());
  ASSERT_TRUE(Load(*client_).ok());
  ExpectSameAsSingle(Request(6, 2, "kplan_all2allv"));
  // Rank 0's second collective of the next step fails without joining: the
  // peer, past the first (so its step is in flight), then waits in it for
  // rank 0, and NCCL-like aborts reach no peer: only rank 0 cancelling the
  // peer's step (the peer aborts its own communicator) frees it before its
  // 10 s timeout.
  {
    std::lock_guard<std::mutex> lock(table_->mu);
    table_->hubs[table_->newest]->InjectFault(0, absl::UnavailableError("link down"),
                                              /*after_calls=*/1);
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RunMoEResponse> failed = client_->RunMoE(Request(6, 2, "kplan_all2allv"));
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("link down"));
  EXPECT_THAT(failed.status().message(), HasSubstr("failed on rank 0"));
  // The next step runs on a new generation, which the peer joins only once
  // its failed step is over.
  ExpectSameAsSingle(Request(6, 2, "allgather_reducescatter"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the peer waited out its timeout";
}

TEST(EpMultihostFormationTest, APeerThatNeverJoinsFailsRankZerosStart) {
  auto table = std::make_shared<CommTable>();
  ServerOptions rank0 = BaseOptions();
  rank0.ep_size = 3;
  rank0.ep_join_timeout = absl::Milliseconds(300);
  Inject(rank0, table);
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(rank0);
  ASSERT_TRUE(absl::IsDeadlineExceeded(s.status())) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("ranks 1, 2 of 3 did not join"));
}

TEST(EpMultihostFormationTest, FlagsAreChecked) {
  ServerOptions peer = BaseOptions();
  peer.ep_size = 2;
  peer.ep_rank = 1;  // no coordinator
  Inject(peer, std::make_shared<CommTable>());
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(peer);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("--ep_coordinator"));
  ServerOptions no_comm = BaseOptions();
  no_comm.ep_size = 2;  // CPU, nothing injected: needs GPUs and NCCL
  s = KplanServer::Start(no_comm);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  // A peer whose coordinator never answers gives up after its join timeout.
  peer.ep_coordinator = absl::StrCat("127.0.0.1:", FreePort());
  peer.ep_join_timeout = absl::Milliseconds(500);
  s = KplanServer::Start(peer);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("joining the expert-parallel group"));
}

}  // namespace
}  // namespace kplan::rpc
