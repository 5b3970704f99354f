// Bounded load and faults against the real server: 256 concurrent clients
// over 4 channels issue RunMoE (CPU path), RunIrOp and ResolveKernelConfig,
// some cancelled mid-flight, some with tiny deadlines; only OK, CANCELLED,
// DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED may come back, and the server
// still answers afterwards. Then shutdown with a backlog of slow RunMoE
// calls: in-process through KplanServer::Shutdown, and the kplan-server
// binary through SIGTERM; both must be gone within the exit timeout plus a
// small slack, the backlog answered OK, CANCELLED or UNAVAILABLE (or
// RESOURCE_EXHAUSTED for a full queue). Traffic goes to 127.0.0.1 only;
// every loop is bounded in count and every call has a deadline.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kplan/v1/service.grpc.pb.h"
#include "resolve/platform/local.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using testing::Bytes;
using testing::Chunk;
using testing::MakeTensor;
using testing::Random;
using Clock = std::chrono::steady_clock;

constexpr int kClients = 256;
constexpr int kCallsPerClient = 6;
constexpr int kChannels = 4;

struct SetShape {
  std::string id;
  int e, h, i;
};
constexpr int kTopK = 2;

std::chrono::system_clock::time_point In(std::chrono::microseconds d) {
  return std::chrono::system_clock::now() + d;
}

// kChannels channels to `target`, each connected before it is returned: the
// tests load the server, not first connections racing the traffic's threads
// (on a CI machine one such connect failed, and the channel then failed its
// calls fast with UNAVAILABLE, which no test here is about).
std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& target) {
  std::vector<std::shared_ptr<grpc::Channel>> out;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("kplan.test.channel", c);  // distinct args: one connection each
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    out.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    EXPECT_TRUE(out.back()->WaitForConnected(In(std::chrono::seconds(30)))) << "channel " << c;
  }
  return out;
}

grpc::Status Load(v1::KernelPlanService::Stub& stub, const SetShape& s, std::mt19937& rng) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(std::chrono::seconds(60)));
  v1::LoadExpertsResponse response;
  auto writer = stub.LoadExperts(&ctx, &response);
  v1::LoadExpertsRequest header;
  v1::ExpertsHeader* h = header.mutable_header();
  h->set_experts_id(s.id);
  h->set_num_experts(s.e);
  h->set_hidden_size(s.h);
  h->set_intermediate_size(s.i);
  h->set_activation("silu");
  h->set_dtype(v1::DTYPE_FLOAT32);
  writer->Write(header);
  v1::LoadExpertsRequest w13, w2;
  *w13.mutable_chunk() =
      Chunk("w13", {s.e, 2 * s.i, s.h}, Bytes(Random(size_t(s.e) * 2 * s.i * s.h, rng, 0.05f)));
  *w2.mutable_chunk() =
      Chunk("w2", {s.e, s.h, s.i}, Bytes(Random(size_t(s.e) * s.h * s.i, rng, 0.05f)));
  writer->Write(w13);
  writer->Write(w2);
  writer->WritesDone();
  return writer->Finish();
}

v1::RunMoERequest MoeRequest(const SetShape& s, int m, std::mt19937& rng) {
  v1::RunMoERequest r;
  r.set_experts_id(s.id);
  *r.mutable_hidden_states() =
      MakeTensor(v1::DTYPE_FLOAT32, {m, s.h}, Bytes(Random(size_t(m) * s.h, rng, 1.f)));
  *r.mutable_router_logits() =
      MakeTensor(v1::DTYPE_FLOAT32, {m, s.e}, Bytes(Random(size_t(m) * s.e, rng, 1.f)));
  r.mutable_routing()->set_top_k(kTopK);
  r.mutable_routing()->set_routing_method("Renormalize");
  return r;
}

v1::RunIrOpRequest IrRequest(std::mt19937& rng) {
  v1::RunIrOpRequest r;
  r.set_op("rms_norm");
  v1::NamedTensor* x = r.add_inputs();
  x->set_name("x");
  *x->mutable_tensor() = MakeTensor(v1::DTYPE_FLOAT32, {4, 64}, Bytes(Random(256, rng, 1.f)));
  v1::NamedTensor* w = r.add_inputs();
  w->set_name("weight");
  *w->mutable_tensor() = MakeTensor(v1::DTYPE_FLOAT32, {64}, Bytes(Random(64, rng, 1.f)));
  r.set_epsilon(1e-6);
  return r;
}

v1::ResolveKernelConfigRequest ResolveRequest() {
  v1::ResolveKernelConfigRequest r;
  r.mutable_model()->add_architectures("MixtralForCausalLM");
  v1::MoELayerConfig* m = r.mutable_model()->mutable_moe();
  m->set_num_experts(8);
  m->set_experts_per_token(2);
  m->set_hidden_dim(4096);
  m->set_intermediate_size(14336);
  m->set_in_dtype("bfloat16");
  r.mutable_parallel()->set_tp_size(2);
  v1::Platform* p = r.mutable_platform();
  p->set_kind(v1::PLATFORM_KIND_CUDA);
  p->mutable_device_capability()->set_major(9);
  p->set_device_name("NVIDIA H200");
  return r;
}

// Codes seen, and the first few that were not allowed.
class Tally {
 public:
  explicit Tally(std::set<grpc::StatusCode> allowed) : allowed_(std::move(allowed)) {}
  void Add(const char* what, const grpc::Status& s) {
    counts_[s.error_code()].fetch_add(1);
    if (allowed_.count(s.error_code())) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (unexpected_.size() < 10) {
      unexpected_.push_back(absl::StrCat(what, ": code ", s.error_code(), " ", s.error_message()));
    }
  }
  int count(grpc::StatusCode c) const { return counts_[c].load(); }
  int total() const {
    int n = 0;
    for (const auto& c : counts_) n += c.load();
    return n;
  }
  std::vector<std::string> unexpected() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unexpected_;
  }
  std::string Summary() const {
    std::string s;
    for (int c = 0; c < 17; ++c) {
      if (counts_[c].load()) absl::StrAppend(&s, " code", c, "=", counts_[c].load());
    }
    return s;
  }

 private:
  std::set<grpc::StatusCode> allowed_;
  std::atomic<int> counts_[17] = {};
  mutable std::mutex mu_;
  std::vector<std::string> unexpected_;
};

enum class Fault { kNone, kTinyDeadline, kCancel };

// One call through the callback API, optionally cancelled after `cancel_after`.
template <typename Request, typename Response, typename Method>
grpc::Status CallWith(Method method, const Request& request, Fault fault, std::mt19937& rng) {
  grpc::ClientContext ctx;
  std::uniform_int_distribution<int> tiny(1, 800), later(0, 3000);
  ctx.set_deadline(fault == Fault::kTinyDeadline ? In(std::chrono::microseconds(tiny(rng)))
                                                 : In(std::chrono::seconds(20)));
  Response response;
  std::promise<grpc::Status> done;
  method(&ctx, &request, &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
  if (fault == Fault::kCancel) {
    std::this_thread::sleep_for(std::chrono::microseconds(later(rng)));
    ctx.TryCancel();
  }
  return done.get_future().get();
}

// kClients threads over `channels`, kCallsPerClient calls each.
void Traffic(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const SetShape& set,
             Tally& tally) {
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(1000 + c);
      auto stub = v1::KernelPlanService::NewStub(channels[c % channels.size()]);
      std::uniform_int_distribution<int> pick(0, 99), tokens(1, 8);
      for (int j = 0; j < kCallsPerClient; ++j) {
        const int p = pick(rng);
        const Fault fault = p < 15 ? Fault::kTinyDeadline : p < 30 ? Fault::kCancel : Fault::kNone;
        grpc::Status s;
        const char* what = "";
        switch ((c + j) % 3) {
          case 0:
            what = "RunMoE";
            s = CallWith<v1::RunMoERequest, v1::RunMoEResponse>(
                [&](auto... a) { stub->async()->RunMoE(a...); }, MoeRequest(set, tokens(rng), rng),
                fault, rng);
            break;
          case 1:
            what = "RunIrOp";
            s = CallWith<v1::RunIrOpRequest, v1::RunIrOpResponse>(
                [&](auto... a) { stub->async()->RunIrOp(a...); }, IrRequest(rng), fault, rng);
            break;
          default:
            what = "ResolveKernelConfig";
            s = CallWith<v1::ResolveKernelConfigRequest, v1::ResolveKernelConfigResponse>(
                [&](auto... a) { stub->async()->ResolveKernelConfig(a...); }, ResolveRequest(),
                fault, rng);
            break;
        }
        tally.Add(what, s);
      }
    });
  }
  for (std::thread& t : clients) t.join();
}

// `n` slow RunMoE calls in flight (30 s deadlines) on `channels`; each
// answer goes into `tally`. Returns once all are sent.
class Backlog {
 public:
  Backlog(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const SetShape& set, int n,
          int tokens, Tally& tally)
      : tally_(tally), calls_(n) {
    std::mt19937 rng(5);
    const v1::RunMoERequest request = MoeRequest(set, tokens, rng);
    for (int i = 0; i < n; ++i) {
      Pending& p = calls_[i];
      p.stub = v1::KernelPlanService::NewStub(channels[i % channels.size()]);
      p.request = request;
      p.ctx.set_deadline(In(std::chrono::seconds(30)));
      p.stub->async()->RunMoE(&p.ctx, &p.request, &p.response, [this, &p](grpc::Status s) {
        tally_.Add("backlog RunMoE", s);
        p.done.set_value();
      });
    }
  }
  // Waits for every answer, at most `limit`; false if some never came.
  bool Wait(std::chrono::seconds limit) {
    const auto until = Clock::now() + limit;
    for (Pending& p : calls_) {
      if (p.future.wait_until(until) != std::future_status::ready) return false;
    }
    return true;
  }
  ~Backlog() {
    for (Pending& p : calls_) p.ctx.TryCancel();
    Wait(std::chrono::seconds(30));
  }

 private:
  struct Pending {
    std::unique_ptr<v1::KernelPlanService::Stub> stub;
    grpc::ClientContext ctx;
    v1::RunMoERequest request;
    v1::RunMoEResponse response;
    std::promise<void> done;
    std::future<void> future = done.get_future();
  };
  Tally& tally_;
  std::vector<Pending> calls_;
};

const SetShape kSmall{"small", 4, 16, 32};
// Large enough that a call of a few dozen tokens takes a good part of a
// second on the CPU reference path (BacklogTokens picks the count).
const SetShape kSlow{"slow", 4, 256, 512};

// Tokens per backlog call such that one call takes about 0.3 s on this
// build and machine (timed with one 64-token call), so that a full queue
// holds far more work than the exit timeout in optimised and sanitizer
// builds alike, yet the tests stay short when shutdown runs the backlog.
int BacklogTokens(v1::KernelPlanService::Stub& stub, const SetShape& set) {
  std::mt19937 rng(11);
  const v1::RunMoERequest request = MoeRequest(set, 64, rng);
  grpc::ClientContext ctx;
  ctx.set_deadline(In(std::chrono::seconds(60)));
  v1::RunMoEResponse response;
  const auto start = Clock::now();
  const grpc::Status status = stub.RunMoE(&ctx, request, &response);
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(status.ok()) << status.error_message();
  const int tokens = static_cast<int>(std::clamp(64 * 0.3 / std::max(s, 1e-4), 16.0, 1024.0));
  std::printf("one 64-token call: %.3f s; backlog calls of %d tokens\n", s, tokens);
  return tokens;
}

// How far past the exit timeout the server may take to be gone (thread
// joins, sanitizer builds on a loaded 2-core machine).
constexpr auto kExitSlack = std::chrono::seconds(5);
constexpr auto kExitTimeout = std::chrono::seconds(2);

// The server in-process with both sets loaded.
class LoadFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.devices = "none";
    options.prober = &prober_;
    options.max_queue_depth = 64;
    options.max_expert_bytes = int64_t{64} << 20;
    absl::StatusOr<std::unique_ptr<KplanServer>> started = KplanServer::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(*started);
    channels_ = Channels(absl::StrCat("127.0.0.1:", server_->port()));
    stub_ = v1::KernelPlanService::NewStub(channels_[0]);
    std::mt19937 rng(42);
    ASSERT_TRUE(Load(*stub_, kSmall, rng).ok());
    ASSERT_TRUE(Load(*stub_, kSlow, rng).ok());
  }

  NoDeviceProber prober_;
  std::unique_ptr<KplanServer> server_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::unique_ptr<v1::KernelPlanService::Stub> stub_;
};

TEST_F(LoadFaultTest, ConcurrentClientsWithCancelsAndDeadlines) {
  auto& stub = stub_;
  const auto& channels = channels_;
  std::mt19937 rng(42);

  {  // Each request is fine by itself.
    Tally ok({grpc::StatusCode::OK});
    ok.Add("RunMoE", CallWith<v1::RunMoERequest, v1::RunMoEResponse>(
                         [&](auto... a) { stub->async()->RunMoE(a...); },
                         MoeRequest(kSmall, 3, rng), Fault::kNone, rng));
    ok.Add("RunIrOp", CallWith<v1::RunIrOpRequest, v1::RunIrOpResponse>(
                          [&](auto... a) { stub->async()->RunIrOp(a...); }, IrRequest(rng),
                          Fault::kNone, rng));
    ok.Add("Resolve", CallWith<v1::ResolveKernelConfigRequest, v1::ResolveKernelConfigResponse>(
                          [&](auto... a) { stub->async()->ResolveKernelConfig(a...); },
                          ResolveRequest(), Fault::kNone, rng));
    ASSERT_TRUE(ok.unexpected().empty()) << ok.unexpected()[0];
  }

  const auto traffic_start = Clock::now();
  Tally tally({grpc::StatusCode::OK, grpc::StatusCode::CANCELLED,
               grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::RESOURCE_EXHAUSTED});
  Traffic(channels, kSmall, tally);
  const double traffic_s = std::chrono::duration<double>(Clock::now() - traffic_start).count();
  std::printf("traffic: %d calls in %.1f s:%s\n", tally.total(), traffic_s,
              tally.Summary().c_str());
  EXPECT_EQ(tally.total(), kClients * kCallsPerClient);
  for (const std::string& u : tally.unexpected()) ADD_FAILURE() << u;
  EXPECT_GT(tally.count(grpc::StatusCode::OK), kClients * kCallsPerClient / 3) << tally.Summary();

  {  // Still serving, the sets still there.
    grpc::ClientContext ctx;
    ctx.set_deadline(In(std::chrono::seconds(10)));
    v1::ListExpertsResponse list;
    ASSERT_TRUE(stub->ListExperts(&ctx, v1::ListExpertsRequest(), &list).ok());
    EXPECT_EQ(list.experts_size(), 2);
  }
}

// Shutdown(2 s) with a backlog far longer than that on the CPU worker: the
// server must be gone (Shutdown returned, then destroyed as main() does)
// within the timeout plus the slack.
TEST_F(LoadFaultTest, ShutdownWithBacklogWithinExitTimeout) {
  const auto& channels = channels_;
  auto& server = server_;
  Tally backlog_tally({grpc::StatusCode::OK, grpc::StatusCode::CANCELLED,
                       grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::RESOURCE_EXHAUSTED});
  {
    Backlog backlog(channels, kSlow, 96, BacklogTokens(*stub_, kSlow), backlog_tally);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it queue up
    const auto stop_start = Clock::now();
    std::future<void> stopped = std::async(std::launch::async, [&] {
      server->Shutdown(absl::FromChrono(kExitTimeout));
      server.reset();  // the workers and the rest, as main() returning does
    });
    const bool in_time = stopped.wait_for(kExitTimeout + kExitSlack) == std::future_status::ready;
    const double stop_s = std::chrono::duration<double>(Clock::now() - stop_start).count();
    EXPECT_TRUE(in_time) << "Shutdown(" << kExitTimeout.count() << " s) with a backlog took over "
                         << stop_s << " s";
    std::printf("shutdown with backlog: %.1f s\n", stop_s);
    EXPECT_TRUE(backlog.Wait(std::chrono::seconds(in_time ? 10 : 60)))
        << "backlog calls never answered";
    if (!in_time) stopped.wait();
  }
  std::printf("backlog:%s\n", backlog_tally.Summary().c_str());
  for (const std::string& u : backlog_tally.unexpected()) ADD_FAILURE() << u;
}

// kplan-server itself: SIGTERM with a backlog, gone within --exit_timeout.
TEST(LoadFaultBinaryTest, ServerBinaryExitsWithinExitTimeoutOnSigtermWithBacklog) {
  const char* bin = std::getenv("KPLAN_SERVER_BIN");
  if (bin == nullptr || access(bin, X_OK) != 0) GTEST_SKIP() << "KPLAN_SERVER_BIN not set";
  char log_template[] = "/tmp/kplan-load-fault-XXXXXX";
  const int log_fd = mkstemp(log_template);
  ASSERT_GE(log_fd, 0);
  const std::string log_path = log_template;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    const std::string exit_timeout = absl::StrCat("--exit_timeout=", kExitTimeout.count(), "s");
    execl(bin, bin, "--listen=127.0.0.1:0", "--devices=none", exit_timeout.c_str(),
          "--max_queue_depth=256", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(log_fd);
  struct Reaper {
    pid_t pid;
    bool reaped = false;
    ~Reaper() {
      if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid};
  auto log = [&] {
    std::ifstream in(log_path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  int port = 0;
  const std::regex port_re(R"(\(port ([0-9]+)\))");
  for (int i = 0; i < 300 && port == 0; ++i) {  // up to 30 s (sanitizer builds start slowly)
    std::smatch m;
    const std::string text = log();
    if (std::regex_search(text, m, port_re)) port = std::stoi(m[1]);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(port, 0) << "kplan-server did not start:\n" << log();
  const auto channels = Channels(absl::StrCat("127.0.0.1:", port));
  auto stub = v1::KernelPlanService::NewStub(channels[0]);
  std::mt19937 rng(43);
  ASSERT_TRUE(Load(*stub, kSlow, rng).ok());

  Tally tally({grpc::StatusCode::OK, grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE,
               grpc::StatusCode::RESOURCE_EXHAUSTED});
  {
    Backlog backlog(channels, kSlow, 96, BacklogTokens(*stub, kSlow), tally);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto stop_start = Clock::now();
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &status, WNOHANG)) == 0 &&
           Clock::now() - stop_start < kExitTimeout + kExitSlack + std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double stop_s = std::chrono::duration<double>(Clock::now() - stop_start).count();
    std::printf("SIGTERM with backlog: exited after %.1f s\n", stop_s);
    ASSERT_EQ(got, pid) << "kplan-server still running " << stop_s << " s after SIGTERM\n" << log();
    reaper.reaped = true;
    EXPECT_LE(stop_s, std::chrono::duration<double>(kExitTimeout + kExitSlack).count())
        << "--exit_timeout=" << kExitTimeout.count() << "s\n"
        << log();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n"
                                                               << log();
    EXPECT_TRUE(backlog.Wait(std::chrono::seconds(10))) << "backlog calls never answered";
  }
  std::printf("backlog:%s\n", tally.Summary().c_str());
  for (const std::string& u : tally.unexpected()) ADD_FAILURE() << u;
  unlink(log_path.c_str());
}

}  // namespace
}  // namespace kplan::rpc
