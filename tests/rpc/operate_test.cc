// Integration tests of what operators rely on: TLS and mutual TLS, the
// bearer token, the Unix socket, and the Prometheus endpoint (scraped over
// HTTP). Certificates come from make_test_certs.sh (a ctest fixture).
#include <arpa/inet.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "server/rpc/server.h"
#include "tests/rpc/ep_comm_table.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string CertDir() {
  const char* dir = std::getenv("KPLAN_TEST_CERTS");
  return dir ? dir : "";
}

std::string Read(const std::string& name) {
  std::ifstream in(CertDir() + "/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<KplanServer> StartServer(ServerOptions options) {
  static NoDeviceProber prober;
  if (options.listen_address == "0.0.0.0:50051") options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

ClientOptions Quick() {
  ClientOptions o;
  o.deadline = absl::Seconds(5);
  o.max_attempts = 1;
  return o;
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CertDir().empty()) GTEST_SKIP() << "KPLAN_TEST_CERTS not set";
  }
  std::string Target(const KplanServer& s) { return absl::StrCat("localhost:", s.port()); }
};

TEST_F(TlsTest, TlsServesVerifiedClientsOnly) {
  ServerOptions options;
  options.tls_cert_file = CertDir() + "/server.pem";
  options.tls_key_file = CertDir() + "/server.key";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);

  ClientOptions tls = Quick();
  tls.tls_root_certs = Read("ca.pem");
  EXPECT_TRUE(Client::Connect(Target(*server), tls)->ResolveKernelConfig({}).ok());

  ClientOptions wrong_ca = Quick();
  wrong_ca.tls_root_certs = Read("rogue_ca.pem");
  EXPECT_EQ(Client::Connect(Target(*server), wrong_ca)->ResolveKernelConfig({}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Client::Connect(Target(*server), Quick())->ResolveKernelConfig({}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, MutualTlsNeedsACertificateFromTheClientCa) {
  ServerOptions options;
  options.tls_cert_file = CertDir() + "/server.pem";
  options.tls_key_file = CertDir() + "/server.key";
  options.tls_client_ca_file = CertDir() + "/ca.pem";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);

  ClientOptions good = Quick();
  good.tls_root_certs = Read("ca.pem");
  good.tls_client_cert = Read("client.pem");
  good.tls_client_key = Read("client.key");
  EXPECT_TRUE(Client::Connect(Target(*server), good)->ResolveKernelConfig({}).ok());

  ClientOptions no_cert = Quick();
  no_cert.tls_root_certs = Read("ca.pem");
  EXPECT_FALSE(Client::Connect(Target(*server), no_cert)->ResolveKernelConfig({}).ok());

  ClientOptions rogue = good;
  rogue.tls_client_cert = Read("rogue_client.pem");
  rogue.tls_client_key = Read("rogue_client.key");
  EXPECT_FALSE(Client::Connect(Target(*server), rogue)->ResolveKernelConfig({}).ok());
}

TEST_F(TlsTest, BadTlsFlagsAreRejectedWithTheFlagNamed) {
  ServerOptions only_cert;
  only_cert.listen_address = "127.0.0.1:0";
  only_cert.tls_cert_file = CertDir() + "/server.pem";
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(only_cert);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  ServerOptions missing;
  missing.listen_address = "127.0.0.1:0";
  missing.tls_cert_file = "/nonexistent.pem";
  missing.tls_key_file = "/nonexistent.key";
  EXPECT_THAT(std::string(KplanServer::Start(missing).status().message()),
              HasSubstr("cannot read tls_cert file"));
  ServerOptions peer_ca_alone;
  peer_ca_alone.listen_address = "127.0.0.1:0";
  peer_ca_alone.ep_peer_ca_file = CertDir() + "/ca.pem";
  s = KplanServer::Start(peer_ca_alone);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--ep_peer_ca needs --tls_cert"));
}

// The servers of an expert-parallel group reach each other over mutual TLS
// when they serve TLS: a peer joins rank 0, rank 0 streams experts to it and
// forwards steps; a peer that does not trust rank 0's CA cannot join.
TEST_F(TlsTest, AGroupAcrossServersTalksMutualTls) {
  auto table = std::make_shared<CommTable>();
  auto tls = [&](ServerOptions& o) {
    o.tls_cert_file = CertDir() + "/peer.pem";
    o.tls_key_file = CertDir() + "/peer.key";
    o.tls_client_ca_file = CertDir() + "/ca.pem";
    o.ep_peer_ca_file = CertDir() + "/ca.pem";
    o.ep_size = 2;
    o.ep_timeout = absl::Seconds(10);
    o.ep_join_timeout = absl::Seconds(20);
    Inject(o, table);
  };
  const int port = FreePort();
  ServerOptions rank0;
  rank0.listen_address = absl::StrCat("127.0.0.1:", port);
  tls(rank0);
  auto started = std::async(std::launch::async, [rank0] { return StartServer(rank0); });
  ServerOptions peer;
  tls(peer);
  peer.ep_rank = 1;
  peer.ep_coordinator = absl::StrCat("localhost:", port);
  std::unique_ptr<KplanServer> peer_server = StartServer(peer);
  std::unique_ptr<KplanServer> rank0_server = started.get();
  ASSERT_NE(peer_server, nullptr);
  ASSERT_NE(rank0_server, nullptr);

  ClientOptions good = Quick();
  good.tls_root_certs = Read("ca.pem");
  good.tls_client_cert = Read("client.pem");
  good.tls_client_key = Read("client.key");
  std::unique_ptr<Client> client = Client::Connect(absl::StrCat("localhost:", port), good);
  constexpr int kE = 4, kH = 8, kI = 4;
  std::mt19937 rng(11);
  v1::ExpertsHeader h;
  h.set_experts_id("tls-layer");
  h.set_num_experts(kE);
  h.set_hidden_size(kH);
  h.set_intermediate_size(kI);
  h.set_dtype(v1::DTYPE_FLOAT32);
  using testing::Bytes;
  using testing::Chunk;
  using testing::Random;
  absl::StatusOr<v1::LoadExpertsResponse> loaded = client->LoadExperts(
      h, {Chunk("w13", {kE, 2 * kI, kH}, Bytes(Random(kE * 2 * kI * kH, rng, 0.3f))),
          Chunk("w2", {kE, kH, kI}, Bytes(Random(kE * kH * kI, rng, 0.3f)))});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->experts().shards_size(), 2);  // rank 1's slice went over TLS
  v1::RunMoERequest req;
  req.set_experts_id("tls-layer");
  *req.mutable_hidden_states() = testing::MakeTensor(
      v1::DTYPE_FLOAT32, {3, kH}, testing::Bytes(testing::Random(3 * kH, rng, 1.f)));
  *req.mutable_router_logits() = testing::MakeTensor(
      v1::DTYPE_FLOAT32, {3, kE}, testing::Bytes(testing::Random(3 * kE, rng, 1.f)));
  req.mutable_routing()->set_top_k(2);
  absl::StatusOr<v1::RunMoEResponse> ran = client->RunMoE(req);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->plan().ep_size(), 2);

  // A third server that trusts another CA cannot verify rank 0.
  ServerOptions stranger;
  tls(stranger);
  stranger.ep_rank = 1;
  stranger.ep_coordinator = absl::StrCat("localhost:", port);
  stranger.ep_peer_ca_file = CertDir() + "/rogue_ca.pem";
  stranger.ep_join_timeout = absl::Seconds(1);
  stranger.listen_address = "127.0.0.1:0";
  static NoDeviceProber prober;
  stranger.prober = &prober;
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(stranger);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("joining the expert-parallel group"));
}

TEST_F(TlsTest, BearerTokenGuardsTheServiceNotTheProbes) {
  ServerOptions options;
  options.auth_token_file = CertDir() + "/token";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const std::string target = absl::StrCat("127.0.0.1:", server->port());
  const std::string token(absl::StripAsciiWhitespace(Read("token")));

  auto anonymous = Client::Connect(target, Quick());
  absl::StatusOr<v1::GetServerInfoResponse> denied = anonymous->GetServerInfo();
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(anonymous->Health().value());  // probes need no token

  ClientOptions wrong = Quick();
  wrong.bearer_token = token + "x";
  EXPECT_EQ(Client::Connect(target, wrong)->ResolveKernelConfig({}).status().code(),
            absl::StatusCode::kUnauthenticated);
  ClientOptions right = Quick();
  right.bearer_token = token;
  EXPECT_TRUE(Client::Connect(target, right)->ResolveKernelConfig({}).ok());
}

TEST(UnixSocketTest, ServesOnAUnixSocketAndReplacesAStaleOne) {
  const std::string path = absl::StrCat("/tmp/kplan-test-", getpid(), ".sock");
  ServerOptions options;
  options.listen_address = "unix:" + path;
  {
    auto server = StartServer(options);
    ASSERT_NE(server, nullptr);
    EXPECT_TRUE(Client::Connect("unix:" + path, Quick())->ResolveKernelConfig({}).ok());
  }
  // A socket file left behind must not stop the next server.
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  auto again = StartServer(options);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(Client::Connect("unix:" + path, Quick())->Health().value());
  again.reset();
  unlink(path.c_str());

  // A regular file in the way is an error, not something to delete.
  const std::string file = path + ".txt";
  std::ofstream(file) << "keep me";
  ServerOptions blocked;
  blocked.listen_address = "unix:" + file;
  blocked.prober = options.prober;
  absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(blocked);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  std::ifstream kept(file);
  std::string content;
  std::getline(kept, content);
  EXPECT_EQ(content, "keep me");
  unlink(file.c_str());
}

TEST(UnixSocketTest, ALiveServersSocketIsNotTakenOver) {
  const std::string path = absl::StrCat("/tmp/kplan-test-live-", getpid(), ".sock");
  ServerOptions options;
  options.listen_address = "unix:" + path;
  static NoDeviceProber prober;
  options.prober = &prober;
  auto first = StartServer(options);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<KplanServer>> second = KplanServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_EQ(FieldOf(second.status()), "listen");
  // The first server still has its socket and its clients.
  EXPECT_TRUE(Client::Connect("unix:" + path, Quick())->ResolveKernelConfig({}).ok());
  first.reset();
  unlink(path.c_str());
}

TEST(TcpPortTest, ASecondServerOnAPortInUseIsRefused) {
  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.prober = &prober;
  auto first = StartServer(options);
  ASSERT_NE(first, nullptr);
  ServerOptions same = options;
  same.listen_address = absl::StrCat("127.0.0.1:", first->port());
  absl::StatusOr<std::unique_ptr<KplanServer>> second = KplanServer::Start(same);
  ASSERT_FALSE(second.ok()) << "two servers share port " << first->port() << " (SO_REUSEPORT)";
  EXPECT_EQ(FieldOf(second.status()), "listen");
  EXPECT_TRUE(Client::Connect(same.listen_address, Quick())->ResolveKernelConfig({}).ok());
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

TEST(MetricsTest, ScrapeShowsRequestsByCodeLatencyAndBuild) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->metrics_port(), 0);
  auto client = Client::Connect(absl::StrCat("127.0.0.1:", server->port()), Quick());
  ASSERT_TRUE(client->ResolveKernelConfig({}).ok());
  ASSERT_TRUE(client->ResolveKernelConfig({}).ok());
  v1::ResolveKernelConfigRequest bad;
  bad.mutable_kernel_config()->set_moe_backend("nope");
  ASSERT_FALSE(client->ResolveKernelConfig(bad).ok());

  std::string page = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_THAT(page, HasSubstr("200 OK"));
  EXPECT_THAT(page,
              HasSubstr("kplan_requests_total{code=\"OK\",method=\"ResolveKernelConfig\"} 2"));
  EXPECT_THAT(page, HasSubstr("kplan_requests_total{code=\"INVALID_ARGUMENT\",method="
                              "\"ResolveKernelConfig\"} 1"));
  EXPECT_THAT(page,
              HasSubstr("kplan_request_duration_seconds_count{method=\"ResolveKernelConfig\"} 3"));
  EXPECT_THAT(page, HasSubstr("kplan_inflight_requests 0"));
  EXPECT_THAT(page, HasSubstr("kplan_build_info{"));
  EXPECT_THAT(page, HasSubstr("kplan_experts_loaded{device=\"cpu\"} 0"));
}

// HTTP probes on the metrics port: /healthz while the process serves,
// /readyz with the readiness health service (503 once draining).
TEST(MetricsTest, HealthzAndReadyzOnTheMetricsPort) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int port = server->metrics_port();
  EXPECT_THAT(HttpGet(port, "/healthz"), HasSubstr("200 OK"));
  EXPECT_THAT(HttpGet(port, "/readyz"), HasSubstr("200 OK"));
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("kplan_build_info{"));  // still the exposer's
  server->Shutdown(absl::ZeroDuration());
  const std::string ready = HttpGet(port, "/readyz");
  EXPECT_THAT(ready, HasSubstr("503 Service Unavailable"));
  EXPECT_THAT(ready, HasSubstr("not ready"));
  EXPECT_THAT(HttpGet(port, "/healthz"), HasSubstr("200 OK"));
}

// One kplan_expert_set_bytes series per resident set, gone at unload.
TEST(MetricsTest, ExpertSetBytesPerResidentSet) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto client = Client::Connect(absl::StrCat("127.0.0.1:", server->port()), Quick());
  std::mt19937 rng(std::random_device{}());
  const int e = 2 + static_cast<int>(rng() % 3), h = 8, i = 4;  // sizes vary per run
  auto load = [&](const std::string& id) {
    std::vector<v1::TensorChunk> chunks = {
        testing::Chunk("w13", {e, 2 * i, h},
                       testing::Bytes(testing::Random(e * 2 * i * h, rng, 1))),
        testing::Chunk("w2", {e, h, i}, testing::Bytes(testing::Random(e * h * i, rng, 1)))};
    return client->LoadExperts(testing::Float32Header(id, e, h, i), chunks);
  };
  ASSERT_TRUE(load("set-a").ok());
  ASSERT_TRUE(load("set-b").ok());
  const std::string bytes = absl::StrCat(e * 3 * i * h * 4);
  std::string page = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_THAT(page,
              HasSubstr(absl::StrCat("kplan_expert_set_bytes{experts_id=\"set-a\"} ", bytes)));
  EXPECT_THAT(page,
              HasSubstr(absl::StrCat("kplan_expert_set_bytes{experts_id=\"set-b\"} ", bytes)));
  ASSERT_TRUE(client->UnloadExperts("set-a").ok());
  page = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_THAT(page, Not(HasSubstr("experts_id=\"set-a\"")));
  EXPECT_THAT(page, HasSubstr("kplan_expert_set_bytes{experts_id=\"set-b\"}"));
}

// The standard process_* families, with this process's own values.
TEST(MetricsTest, ScrapeShowsProcessMetrics) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const std::string page = HttpGet(server->metrics_port(), "/metrics");
  auto value = [&](const std::string& name) {
    const size_t at = page.find("\n" + name + " ");
    if (at == std::string::npos) return -1.0;
    double v = -1;
    const size_t begin = at + name.size() + 2;
    EXPECT_TRUE(absl::SimpleAtod(page.substr(begin, page.find('\n', begin) - begin), &v)) << name;
    return v;
  };
  // Resident memory within 0.5x..2x of what getrusage says at its peak.
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  const double rss = value("process_resident_memory_bytes");
  EXPECT_GT(rss, 0.25 * usage.ru_maxrss * 1024.0) << page;
  EXPECT_LE(rss, 2.0 * usage.ru_maxrss * 1024.0) << page;
  EXPECT_GE(value("process_virtual_memory_bytes"), rss);
  EXPECT_GE(value("process_open_fds"), 3);  // stdio, sockets
  EXPECT_GE(value("process_max_fds"), value("process_open_fds"));
  EXPECT_GE(value("process_threads"), 2);  // the test's thread and gRPC's
  EXPECT_GE(value("process_cpu_seconds_total"), 0);
  const double start = value("process_start_time_seconds");
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_GT(start, now - 3600);  // this test process started within the hour
  EXPECT_LE(start, now + 1);
}

// A device the prober reports, with memory in use, shows up in the scrape.
TEST(MetricsTest, ReportsDeviceMemoryInUse) {
  class OneGpu final : public DeviceProber {
   public:
    absl::StatusOr<LocalRuntime> Probe() const override {
      LocalRuntime rt;
      rt.devices.push_back(LocalDevice{0, "NVIDIA H200", {9, 0}, 141LL << 30, 132});
      return rt;
    }
    absl::StatusOr<int64_t> MemoryUsed(int device) const override { return 123456789 + device; }
  } prober;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  options.prober = &prober;
  auto server = KplanServer::Start(options).value();
  std::string page;
  for (int i = 0; i < 50 && page.find("kplan_device_memory_used_bytes") == std::string::npos; ++i) {
    page = HttpGet(server->metrics_port(), "/metrics");
    usleep(20000);
  }
  EXPECT_THAT(page, HasSubstr("kplan_device_memory_used_bytes{device=\"cuda:0\"} 123456789"));
}

}  // namespace
}  // namespace kplan::rpc
