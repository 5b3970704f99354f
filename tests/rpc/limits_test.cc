// The server's limits on the CPU path: no request can take more memory than
// the budgets allow, wedge a worker past its deadline, or hold a load open
// forever. Integration tests against an in-process server on 127.0.0.1:0.
// Where order matters, a gate job on the CPU worker holds it while the
// requests under test queue, so no outcome depends on timing.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using testing::Bytes;
using ::testing::HasSubstr;
using testing::MakeTensor;
using testing::Random;

constexpr int64_t kMiB = int64_t{1} << 20;

v1::ExpertsHeader Header(const std::string& id, int e, int h, int i) {
  return testing::Float32Header(id, e, h, i);
}

// Float32 silu experts and the chunks that carry them (at most 8 MiB each).
struct Experts {
  int e, h, i;
  std::string w13, w2;
  Experts(int e_, int h_, int i_) : e(e_), h(h_), i(i_) {
    std::mt19937 rng(7);
    w13 = Bytes(Random(static_cast<size_t>(e) * 2 * i * h, rng, 0.05f));
    w2 = Bytes(Random(static_cast<size_t>(e) * h * i, rng, 0.05f));
  }
  int64_t bytes() const { return static_cast<int64_t>(w13.size() + w2.size()); }
  std::vector<v1::TensorChunk> Chunks() const {
    std::vector<v1::TensorChunk> out;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, const std::string& data) {
      for (size_t at = 0; at < data.size(); at += 8 * kMiB) {
        v1::TensorChunk c;
        c.set_name(name);
        if (at == 0) {
          c.set_dtype(v1::DTYPE_FLOAT32);
          for (int64_t d : shape) c.add_shape(d);
        }
        c.set_offset(static_cast<int64_t>(at));
        c.set_data(data.substr(at, 8 * kMiB));
        out.push_back(std::move(c));
      }
    };
    add("w13", {e, 2 * i, h}, w13);
    add("w2", {e, h, i}, w2);
    return out;
  }
};

v1::LoadExpertsRequest HeaderMessage(const v1::ExpertsHeader& header) {
  v1::LoadExpertsRequest r;
  *r.mutable_header() = header;
  return r;
}

v1::LoadExpertsRequest ChunkMessage(const v1::TensorChunk& chunk) {
  v1::LoadExpertsRequest r;
  *r.mutable_chunk() = chunk;
  return r;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Polls `done` for up to 20 s (waiting for the server to get somewhere, never
// an assertion in itself).
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Holds the server's CPU worker until Release().
class WorkerGate {
 public:
  explicit WorkerGate(DeviceExecutor* executor) : executor_(executor) {
    std::promise<void> started;
    std::future<void> running = started.get_future();
    EXPECT_TRUE(executor_
                    ->Submit(0,
                             [&started, open = open_](const DeviceSlot&, absl::Duration) {
                               started.set_value();
                               open.wait();
                             })
                    .ok());
    running.wait();
  }
  ~WorkerGate() { Release(); }
  void Release() {
    if (!released_) release_.set_value();
    released_ = true;
  }
  // Waits until everything queued on the CPU worker so far has run.
  void Drain() {
    std::promise<void> fence;
    ASSERT_TRUE(
        executor_->Submit(0, [&fence](const DeviceSlot&, absl::Duration) { fence.set_value(); })
            .ok());
    fence.get_future().wait();
  }

 private:
  DeviceExecutor* executor_;
  std::promise<void> release_;
  std::shared_future<void> open_ = release_.get_future().share();
  bool released_ = false;
};

class LimitsTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options) {
    static NoDeviceProber prober;
    options.listen_address = "127.0.0.1:0";
    options.prober = &prober;
    options.metrics_listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<KplanServer>> server = KplanServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    target_ = absl::StrCat("127.0.0.1:", server_->port());
    client_ = Client::Connect(target_);
    stub_ = v1::KernelPlanService::NewStub(
        grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }
  DeviceExecutor* executor() { return server_->environment().executor; }
  ExpertStore* store() { return server_->environment().experts; }
  std::string Metrics() { return server_->metrics()->Render(); }

  // A RunMoE request of m tokens over experts `id` (e experts, hidden h).
  static v1::RunMoERequest RunRequest(const std::string& id, int m, int e, int h) {
    std::mt19937 rng(5);
    v1::RunMoERequest req;
    req.set_experts_id(id);
    *req.mutable_hidden_states() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, h}, Bytes(Random(static_cast<size_t>(m) * h, rng, 1.f)));
    *req.mutable_router_logits() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, e}, Bytes(Random(static_cast<size_t>(m) * e, rng, 1.f)));
    req.mutable_routing()->set_top_k(2);
    return req;
  }

  std::unique_ptr<KplanServer> server_;
  std::string target_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::KernelPlanService::Stub> stub_;
};

TEST_F(LimitsTest, RunMoeBeyondTheQueuedBytesBudgetIsResourceExhausted) {
  ServerOptions options;
  options.max_queued_bytes = 16 << 10;
  Start(options);
  Experts small(4, 16, 8);
  ASSERT_TRUE(client_->LoadExperts(Header("l", 4, 16, 8), small.Chunks()).ok());
  EXPECT_TRUE(client_->RunMoE(RunRequest("l", 8, 4, 16)).ok());
  // 512 tokens: 32 KiB of hidden states and as much output.
  absl::StatusOr<v1::RunMoEResponse> big = client_->RunMoE(RunRequest("l", 512, 4, 16));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("max_queued_bytes"));
  // The small call's charge is released after its job ran, which may be
  // after its reply reached the client: every byte comes back, in time.
  EXPECT_TRUE(WaitFor([&] { return executor()->queued_bytes() == 0; }))
      << executor()->queued_bytes() << " bytes still charged";
}

TEST_F(LimitsTest, ExpiredRunMoeIsDroppedAndCountedAsDeadlineExceeded) {
  // The server's own deadline (200 ms from arrival), not the client's: the
  // client's reaches the server rounded and late, so it could not say when
  // the server must drop the call.
  ServerOptions options;
  options.max_request_time = absl::Milliseconds(200);
  Start(options);
  Experts small(4, 16, 8);
  ASSERT_TRUE(client_->LoadExperts(Header("l", 4, 16, 8), small.Chunks()).ok());
  WorkerGate gate(executor());
  absl::StatusOr<v1::RunMoEResponse> late;
  std::thread caller([&] { late = client_->RunMoE(RunRequest("l", 4, 4, 16)); });
  // Queued behind the gate; released once its deadline has surely passed.
  EXPECT_TRUE(WaitFor([&] { return executor()->queue_size(0) == 1; }));
  absl::SleepFor(absl::Milliseconds(400));
  gate.Release();
  caller.join();
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  gate.Drain();
  const std::string page = Metrics();
  EXPECT_THAT(page,
              HasSubstr("kplan_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"RunMoE\"} 1"));
  EXPECT_THAT(page,
              ::testing::Not(HasSubstr("kplan_requests_total{code=\"OK\",method=\"RunMoE\"}")));
}

// 4096 tokens over 48 MiB of experts is seconds of CPU work; the server's
// --max_request_time of 50 ms stops it between row blocks.
TEST_F(LimitsTest, CpuMoePastItsDeadlineStopsWithDeadlineExceeded) {
  ServerOptions options;
  options.max_request_time = absl::Milliseconds(50);
  options.max_expert_bytes = 64 * kMiB;
  Start(options);
  Experts big(8, 512, 1024);
  ASSERT_EQ(big.bytes(), 48 * kMiB);
  ASSERT_TRUE(client_->LoadExperts(Header("big", 8, 512, 1024), big.Chunks()).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RunMoEResponse> run = client_->RunMoE(RunRequest("big", 4096, 8, 512));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(run.status().code(), absl::StatusCode::kDeadlineExceeded) << run.status();
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("while the experts ran"));
  // Promptly: one row block past the deadline, not the whole layer.
  EXPECT_LT(took, absl::Seconds(3)) << took;
  // And the worker is free again (a layer small enough for 50 ms even under
  // a sanitizer).
  Experts tiny(4, 16, 16);
  ASSERT_TRUE(client_->LoadExperts(Header("tiny", 4, 16, 16), tiny.Chunks()).ok());
  absl::StatusOr<v1::RunMoEResponse> small = client_->RunMoE(RunRequest("tiny", 2, 4, 16));
  EXPECT_TRUE(small.ok()) << small.status();
}

TEST_F(LimitsTest, ConcurrentLoadsReserveTheBudgetAtTheirHeader) {
  ServerOptions options;
  options.max_expert_bytes = 64 * kMiB;
  Start(options);
  Experts set(4, 1024, 1024);
  ASSERT_EQ(set.bytes(), 48 * kMiB);
  // The first stream's header reserves 48 MiB; nothing is buffered yet.
  grpc::ClientContext first_ctx;
  v1::LoadExpertsResponse first_response;
  auto first = stub_->LoadExperts(&first_ctx, &first_response);
  ASSERT_TRUE(first->Write(HeaderMessage(Header("a0", 4, 1024, 1024))));
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() == 48 * kMiB; }));
  // Five more streams while it is open: each is refused at its header.
  for (int k = 1; k < 6; ++k) {
    grpc::ClientContext ctx;
    v1::LoadExpertsResponse response;
    auto w = stub_->LoadExperts(&ctx, &response);
    w->Write(HeaderMessage(Header(absl::StrCat("a", k), 4, 1024, 1024)));
    w->WritesDone();
    absl::Status s = FromGrpc(w->Finish());
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("max_expert_bytes"));
    EXPECT_LE(store()->bytes_in_use(), 64 * kMiB);
  }
  for (const v1::TensorChunk& c : set.Chunks()) ASSERT_TRUE(first->Write(ChunkMessage(c)));
  first->WritesDone();
  absl::Status s = FromGrpc(first->Finish());
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(store()->bytes_in_use(), 48 * kMiB);
  EXPECT_EQ(client_->ListExperts()->experts_size(), 1);
}

TEST_F(LimitsTest, SixConcurrentLoadsOfFortyEightMiBAgainstSixtyFour) {
  ServerOptions options;
  options.max_expert_bytes = 64 * kMiB;
  Start(options);
  const Experts set(4, 1024, 1024);
  const std::vector<v1::TensorChunk> chunks = set.Chunks();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> peak{0};
  std::thread monitor([&] {
    while (!stop) {
      const int64_t now = store()->bytes_in_use();
      int64_t seen = peak.load();
      while (now > seen && !peak.compare_exchange_weak(seen, now)) {
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  std::vector<absl::Status> results(6);
  std::vector<std::thread> loads;
  for (int k = 0; k < 6; ++k) {
    loads.emplace_back([&, k] {
      results[k] =
          client_->LoadExperts(Header(absl::StrCat("c", k), 4, 1024, 1024), chunks).status();
    });
  }
  for (std::thread& t : loads) t.join();
  stop = true;
  monitor.join();
  int ok = 0;
  for (const absl::Status& s : results) {
    if (s.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_LE(peak.load(), 64 * kMiB);
  EXPECT_EQ(store()->bytes_in_use(), 48 * kMiB);
}

// The derived budget (half of a faked 8 GiB host) refuses a 6 GiB header
// before anything is allocated.
TEST_F(LimitsTest, DerivedExpertBudgetFollowsHostMemory) {
  ServerOptions options;
  options.host_memory_bytes = [] { return int64_t{8} << 30; };
  Start(options);
  EXPECT_EQ(store()->max_bytes(), int64_t{4} << 30);
  grpc::ClientContext ctx;
  v1::LoadExpertsResponse response;
  auto w = stub_->LoadExperts(&ctx, &response);
  w->Write(HeaderMessage(Header("six", 128, 2048, 2048)));  // 12 * 128 * 2048^2 = 6 GiB
  v1::TensorChunk tiny;
  tiny.set_name("w13");
  tiny.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : {128, 4096, 2048}) tiny.add_shape(d);
  tiny.set_data("ab");
  w->Write(ChunkMessage(tiny));
  w->WritesDone();
  absl::Status s = FromGrpc(w->Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(store()->bytes_in_use(), 0);
}

// A limit that makes no sense stops the start, naming its option.
TEST(OptionLimitsTest, NegativeLimitsAreRefusedNamingTheField) {
  static NoDeviceProber prober;
  const auto refused = [](const ServerOptions& options) {
    absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    return FieldOf(s.status()).value_or("");
  };
  ServerOptions base;
  base.listen_address = "127.0.0.1:0";
  base.prober = &prober;
  ServerOptions o = base;
  o.failed_call_log_rate = -1;
  EXPECT_EQ(refused(o), "failed_call_log_rate");
  o.failed_call_log_rate = std::nan("");
  EXPECT_EQ(refused(o), "failed_call_log_rate");
  o = base;
  o.max_request_time = absl::Seconds(-1);
  EXPECT_EQ(refused(o), "max_request_time");
  o = base;
  o.load_idle_timeout = absl::Seconds(-1);
  EXPECT_EQ(refused(o), "load_idle_timeout");
  o = base;
  o.failed_call_log_rate = 0;  // log every one: a valid choice
  EXPECT_TRUE(KplanServer::Start(o).ok());
}

TEST(DerivedLimitsTest, FromHostAndDeviceMemory) {
  EXPECT_EQ(DerivedMaxQueuedBytes(int64_t{4} << 30), int64_t{1} << 30);
  EXPECT_EQ(DerivedMaxQueuedBytes(int64_t{512} << 30), int64_t{2} << 30);
  EXPECT_EQ(DerivedMaxExpertBytes(int64_t{64} << 30, {}), int64_t{32} << 30);
  std::vector<LocalDevice> gpus = {{0, "g", {9, 0}, int64_t{10} << 30, 1},
                                   {1, "g", {9, 0}, int64_t{20} << 30, 1}};
  // 90% of the smaller GPU, per GPU, under half of a large host.
  EXPECT_EQ(DerivedMaxExpertBytes(int64_t{1} << 40, gpus),
            2 * static_cast<int64_t>(static_cast<double>(int64_t{10} << 30) * 0.9));
  EXPECT_EQ(DerivedMaxExpertBytes(int64_t{16} << 30, gpus), int64_t{8} << 30);
  EXPECT_GT(PhysicalMemoryBytes(), 0);
}

// A header the budget allows but the host cannot hold: the chunk's buffer
// allocation fails, and the call is answered (it used to escape the gRPC
// thread as std::bad_alloc).
TEST_F(LimitsTest, AllocationFailureOnAChunkIsResourceExhausted) {
  ServerOptions options;
  options.max_expert_bytes = INT64_MAX;
  Start(options);
  // w13: 2^49 bytes, under the 2^50 a set may name, far over what a host holds.
  constexpr int kE = 1 << 16, kH = 1 << 15, kI = 1 << 15;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::LoadExpertsResponse response;
  auto w = stub_->LoadExperts(&ctx, &response);
  ASSERT_TRUE(w->Write(HeaderMessage(Header("huge", kE, kH, kI))));
  v1::TensorChunk tiny;
  tiny.set_name("w13");
  tiny.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : {int64_t{kE}, int64_t{2} * kI, int64_t{kH}}) tiny.add_shape(d);
  tiny.set_data("ab");
  w->Write(ChunkMessage(tiny));
  w->WritesDone();
  absl::Status s = FromGrpc(w->Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("out of memory"));
  EXPECT_TRUE(WaitFor([&] { return store()->bytes_in_use() == 0; }));
  // The server still serves, and stops (the fixture's teardown).
  EXPECT_TRUE(client_->ListExperts().ok());
}

TEST_F(LimitsTest, StalledLoadIsEndedAfterTheIdleTimeout) {
  ServerOptions options;
  options.load_idle_timeout = absl::Milliseconds(300);
  Start(options);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::LoadExpertsResponse response;
  auto w = stub_->LoadExperts(&ctx, &response);
  ASSERT_TRUE(w->Write(HeaderMessage(Header("stall", 4, 16, 8))));
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() > 0; }));
  // Nothing more is sent: the server ends the stream by itself.
  absl::Status s = FromGrpc(w->Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("load_idle_timeout"));
  EXPECT_EQ(store()->bytes_in_use(), 0);
  Experts small(4, 16, 8);
  absl::StatusOr<v1::LoadExpertsResponse> again =
      client_->LoadExperts(Header("stall", 4, 16, 8), small.Chunks());
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(
      Metrics(),
      HasSubstr("kplan_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"LoadExperts\"} 1"));
}

// The client cancels after its last chunk, while the set's commit job is
// queued: nothing is stored, the reservation is gone, the id loads again.
TEST_F(LimitsTest, LoadCancelledAfterItsLastChunkLeavesNothing) {
  Start(ServerOptions());
  Experts small(4, 16, 8);
  {
    WorkerGate gate(executor());
    grpc::ClientContext ctx;
    v1::LoadExpertsResponse response;
    auto w = stub_->LoadExperts(&ctx, &response);
    ASSERT_TRUE(w->Write(HeaderMessage(Header("gone", 4, 16, 8))));
    for (const v1::TensorChunk& c : small.Chunks()) ASSERT_TRUE(w->Write(ChunkMessage(c)));
    w->WritesDone();
    // The whole set arrived: its commit job waits behind the gate.
    ASSERT_TRUE(WaitFor([&] { return executor()->queue_size(0) == 1; }));
    EXPECT_GT(store()->bytes_in_use(), 0);
    ctx.TryCancel();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_TRUE(WaitFor([&] {
      return Metrics().find("kplan_requests_total{code=\"CANCELLED\",method=\"LoadExperts\"} 1") !=
             std::string::npos;
    })) << Metrics();
    EXPECT_EQ(store()->bytes_in_use(), 0);
    gate.Release();
    gate.Drain();  // the commit job, if it was queued, ran (and dropped the set)
  }
  EXPECT_EQ(client_->ListExperts()->experts_size(), 0);
  EXPECT_EQ(store()->bytes_in_use(), 0);
  absl::StatusOr<v1::LoadExpertsResponse> again =
      client_->LoadExperts(Header("gone", 4, 16, 8), small.Chunks());
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(client_->ListExperts()->experts_size(), 1);
}

TEST_F(LimitsTest, LoadCancelledMidStreamLeavesNothing) {
  Start(ServerOptions());
  Experts small(4, 16, 8);
  grpc::ClientContext ctx;
  v1::LoadExpertsResponse response;
  auto w = stub_->LoadExperts(&ctx, &response);
  ASSERT_TRUE(w->Write(HeaderMessage(Header("half", 4, 16, 8))));
  ASSERT_TRUE(w->Write(ChunkMessage(small.Chunks()[0])));
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() > 0; }));
  ctx.TryCancel();
  EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() == 0; }));
  absl::StatusOr<v1::LoadExpertsResponse> again =
      client_->LoadExperts(Header("half", 4, 16, 8), small.Chunks());
  EXPECT_TRUE(again.ok()) << again.status();
}

// The client's deadline passes mid-stream: the server drops the load and
// its reservation, and the same id loads again at once.
TEST_F(LimitsTest, LoadPastItsDeadlineMidStreamLeavesNothing) {
  Start(ServerOptions());
  Experts small(4, 16, 8);
  grpc::ClientContext ctx;
  // Long enough for the header and a chunk to be taken on a loaded machine.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  v1::LoadExpertsResponse response;
  auto w = stub_->LoadExperts(&ctx, &response);
  ASSERT_TRUE(w->Write(HeaderMessage(Header("late", 4, 16, 8))));
  ASSERT_TRUE(w->Write(ChunkMessage(small.Chunks()[0])));
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() > 0; }));
  // Nothing more until the deadline has passed.
  EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() == 0; }));
  absl::StatusOr<v1::LoadExpertsResponse> again =
      client_->LoadExperts(Header("late", 4, 16, 8), small.Chunks());
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(client_->ListExperts()->experts_size(), 1);
}

TEST_F(LimitsTest, SecondConcurrentLoadOfOneIdIsAlreadyExistsAtItsHeader) {
  Start(ServerOptions());
  grpc::ClientContext first_ctx;
  v1::LoadExpertsResponse first_response;
  auto first = stub_->LoadExperts(&first_ctx, &first_response);
  ASSERT_TRUE(first->Write(HeaderMessage(Header("same", 4, 16, 8))));
  ASSERT_TRUE(WaitFor([&] { return store()->bytes_in_use() > 0; }));
  grpc::ClientContext ctx;
  v1::LoadExpertsResponse response;
  auto second = stub_->LoadExperts(&ctx, &response);
  second->Write(HeaderMessage(Header("same", 4, 16, 8)));
  second->WritesDone();
  absl::Status s = FromGrpc(second->Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  Experts small(4, 16, 8);
  for (const v1::TensorChunk& c : small.Chunks()) ASSERT_TRUE(first->Write(ChunkMessage(c)));
  first->WritesDone();
  EXPECT_TRUE(first->Finish().ok());
}

}  // namespace
}  // namespace kplan::rpc
