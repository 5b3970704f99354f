// RunMoE through gRPC against the layer time, hop by hop: an in-process
// kplan-server on the machine's GPUs (the CPU reference without one), one
// expert set streamed over LoadExperts from a chunk source, then RunMoE calls
// over TCP (127.0.0.1) and over a Unix socket. For each transport and token
// count it prints the medians of
//   null     GetServerInfo's round trip: the gRPC floor of this host;
//   skip     RunMoE with skip_device (the server runs --allow_skip_device):
//            decode, route, queue, encode and the wire, without the layer;
//   run      RunMoE: the same, with the layer;
//   shm      RunMoE with its inputs and output in a registered POSIX shm
//            region of this process (the server runs --allow_shared_memory);
//   chan     RunMoE with inline bytes through a shared-memory call channel
//            (client/cpp/shm_channel.h: no gRPC on the call's path; "wire"
//            is then the channel's share);
//   chshm    the shm call through the channel;
//   chskip   the chan call with skip_device (the channel's floor at this size);
// and, from MoETiming, each hop: decode (arrival to converted), route (to
// queued), queue, device, encode (output on the host to response filled),
// and wire = round trip - server total (serialisation, gRPC, the socket,
// both ways). Default shape: Qwen3-30B-A3B bf16 (E=128, k=8, H=2048, I=768).
// --inline 0 turns the server's --inline_runs off (every call hops to the
// device worker and back), --cuda_graphs 0 its CUDA graphs of small calls,
// for the comparisons.
//   moe_rpc_bench [--iters 200] [--tokens 1,8,64,512] [--transport tcp,unix]
//                 [--shape E,k,H,I] [--inline 1] [--cuda_graphs 1]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_channel.h"
#include "server/rpc/server.h"
#include "tests/testing/random_data.h"

ABSL_FLAG(double, channel_spin_us, 50,
          "chan / chshm: how long the server's channel thread and the client poll before they "
          "sleep on the state word (kplan-server's --shm_channel_spin); 0: sleep at once");

ABSL_FLAG(int64_t, channel_in_region_from, kplan::ShmChannel::Options().in_region_from_bytes,
          "chan: inline hidden states of at least this many bytes ride in the channel's region "
          "(ShmChannel::Options::in_region_from_bytes; negative: never)");

namespace {

void FillBf16(char* out, size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  for (size_t i = 0; i < n; ++i) {
    float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t h = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    std::memcpy(out + i * 2, &h, 2);
  }
}

std::string Bf16Bytes(size_t n, std::mt19937& rng, float scale) {
  std::string out(n * 2, '\0');
  FillBf16(out.data(), n, rng, scale);
  return out;
}

using kplan::bench::Median;

std::vector<int> IntList(absl::string_view s) {
  std::vector<int> out;
  for (absl::string_view t : absl::StrSplit(s, ',')) {
    int v = 0;
    if (absl::SimpleAtoi(t, &v)) out.push_back(v);
  }
  return out;
}

double SinceUs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

struct Shape {
  int e = 128, k = 8, h = 2048, inter = 768;
};

// Medians of one mode's calls.
struct Hops {
  std::vector<double> rt, total, decode, route, queue, device, encode;
  void Add(double round_trip, const kplan::v1::MoETiming& t) {
    rt.push_back(round_trip);
    total.push_back(t.total_us());
    decode.push_back(t.decoded_at_us());
    route.push_back(t.queued_at_us() - t.decoded_at_us());
    queue.push_back(t.device_start_at_us() - t.queued_at_us());
    device.push_back(t.device_end_at_us() - t.device_start_at_us());
    encode.push_back(t.encoded_at_us() - t.device_end_at_us());
  }
  void Print(const char* transport, int m, const char* mode, const std::string& backend) const {
    std::printf("%-9s %6d %-5s %-10s %9.1f %9.1f %8.1f %8.1f %8.1f %9.1f %8.1f %8.1f\n", transport,
                m, mode, backend.c_str(), Median(rt), Median(total), Median(decode), Median(route),
                Median(queue), Median(device), Median(encode), Median(rt) - Median(total));
  }
};

// A POSIX shm object of this process registered with the server as region
// "bench", regrown (re-registered) when a size needs more.
struct ShmArea {
  std::string key = absl::StrCat("/kplan-moe-rpc-bench-", getpid());
  char* data = nullptr;
  int64_t bytes = 0;

  bool Ready(int64_t need, kplan::Client& to) {
    need = std::max<int64_t>(need, 4096);
    if (data != nullptr && need <= bytes) return true;
    Release();
    client = &to;
    const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, need) != 0) return false;
    void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return false;
    data = static_cast<char*>(p);
    bytes = need;
    kplan::v1::SharedMemoryRegion r;
    r.set_name("bench");
    r.set_key(key);
    r.set_byte_size(need);
    absl::Status s = client->RegisterSharedMemory(r);
    if (!s.ok()) std::fprintf(stderr, "shm: %s\n", s.ToString().c_str());
    return s.ok();
  }
  kplan::v1::SharedMemoryRef Ref(int64_t offset, int64_t size) const {
    kplan::v1::SharedMemoryRef r;
    r.set_region("bench");
    r.set_offset(offset);
    r.set_byte_size(size);
    return r;
  }
  // Unregisters, unmaps and unlinks.
  void Release() {
    if (data == nullptr) return;
    (void)client->UnregisterSharedMemory("bench");
    munmap(data, bytes);
    shm_unlink(key.c_str());
    data = nullptr;
    bytes = 0;
  }
  kplan::Client* client = nullptr;  // the one that registered it
};

// One server on `address`: load, then every token count in every mode.
int Measure(const char* transport, const std::string& listen, const Shape& s,
            const std::vector<int>& tokens, const std::vector<std::string>& modes, int iters,
            bool inline_runs, bool cuda_graphs) {
  kplan::rpc::ServerOptions options;
  options.listen_address = listen;
  options.allow_skip_device = true;
  options.allow_shared_memory = true;
  ShmArea shm_area;
  options.inline_runs = inline_runs;
  options.cuda_graphs = cuda_graphs;
  options.shm_channel_spin = absl::Microseconds(absl::GetFlag(FLAGS_channel_spin_us));
  auto server = kplan::rpc::KplanServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string target =
      absl::StartsWith(listen, "unix:") ? listen : absl::StrCat("127.0.0.1:", (*server)->port());
  kplan::ClientOptions copt;
  copt.deadline = absl::Seconds(600);
  copt.max_message_bytes = 256 << 20;
  auto client = kplan::Client::Connect(target, copt);
  std::mt19937 rng(std::random_device{}());
  kplan::v1::ExpertsHeader header;
  header.set_experts_id("qwen3");
  header.set_num_experts(s.e);
  header.set_hidden_size(s.h);
  header.set_intermediate_size(s.inter);
  header.set_dtype(kplan::v1::DTYPE_BFLOAT16);
  // The weights are generated chunk by chunk as they stream, by threads
  // (random_data.h: non-zero bf16 of rms about 0.01).
  const uint64_t key = rng();
  std::vector<kplan::StreamedTensor> tensors;
  for (auto [name, shape] :
       {std::pair<const char*, std::vector<int64_t>>{"w13", {s.e, 2 * s.inter, s.h}},
        {"w2", {s.e, s.h, s.inter}}}) {
    kplan::StreamedTensor t;
    t.name = name;
    t.dtype = kplan::v1::DTYPE_BFLOAT16;
    t.bytes = 2;
    for (int64_t d : shape) t.bytes *= d;
    t.shape = shape;
    t.read = [key](int64_t offset, int64_t n, char* out) {
      kplan::test_util::ParallelDraws(n / 2, 4, key + static_cast<uint64_t>(offset / 2),
                                      [out](uint64_t r, int64_t i, int64_t count) {
                                        for (int64_t j = 0; j < count; ++j) {
                                          const uint16_t v = kplan::test_util::RandomBf16Of(
                                              static_cast<uint32_t>(r >> (16 * j)) & 0xffff, -6);
                                          std::memcpy(out + (i + j) * 2, &v, 2);
                                        }
                                      });
      return absl::OkStatus();
    };
    tensors.push_back(std::move(t));
  }
  kplan::TensorChunkSource source(std::move(tensors), 32 << 20);
  auto t0 = std::chrono::steady_clock::now();
  auto loaded = client->LoadExperts(header, source);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::printf("# %s (%s): loaded %.2f GB of experts in %.2f s on %s\n", transport, target.c_str(),
              loaded->experts().bytes() / 1e9, SinceUs(t0) / 1e6,
              loaded->experts().placement_size() > 1
                  ? loaded->experts().placement(1).device().c_str()
                  : "cpu");

  std::vector<double> null_rt;
  for (int it = 0; it < iters + 20; ++it) {
    auto start = std::chrono::steady_clock::now();
    if (!client->GetServerInfo().ok()) return 1;
    if (it >= 20) null_rt.push_back(SinceUs(start));
  }
  std::printf("%-9s %6s %-5s %-10s %9.1f\n", transport, "-", "null", "-", Median(null_rt));

  kplan::ShmChannel::Options channel_options;
  channel_options.request_capacity = 32 << 20;
  channel_options.response_capacity = 32 << 20;
  channel_options.spin = absl::Microseconds(absl::GetFlag(FLAGS_channel_spin_us));
  channel_options.in_region_from_bytes = absl::GetFlag(FLAGS_channel_in_region_from);
  absl::StatusOr<std::unique_ptr<kplan::ShmChannel>> channel =
      kplan::ShmChannel::Open(*client, channel_options);
  if (!channel.ok()) {
    std::fprintf(stderr, "channel: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  for (int m : tokens) {
    kplan::v1::RunMoERequest req;
    req.set_experts_id("qwen3");
    req.mutable_hidden_states()->set_dtype(kplan::v1::DTYPE_BFLOAT16);
    req.mutable_hidden_states()->add_shape(m);
    req.mutable_hidden_states()->add_shape(s.h);
    req.mutable_routing()->set_top_k(s.k);
    req.mutable_routing()->set_routing_method("RenormalizeNaive");
    req.mutable_router_logits()->set_dtype(kplan::v1::DTYPE_FLOAT32);
    req.mutable_router_logits()->add_shape(m);
    req.mutable_router_logits()->add_shape(s.e);
    // The shared-memory layout of this size: [hidden | logits | output].
    const int64_t hidden_bytes = int64_t(m) * s.h * 2, logits_bytes = int64_t(m) * s.e * 4;
    for (const std::string& mode : modes) {
      const bool shm = mode == "shm" || mode == "chshm";
      const bool via_channel = absl::StartsWith(mode, "ch");
      if (shm && !shm_area.Ready(2 * hidden_bytes + logits_bytes, *client)) continue;
      req.set_skip_device(mode == "skip" || mode == "chskip");
      Hops hops;
      std::string backend;
      // A channel caller's answer, reused from call to call as an engine
      // reuses its buffers (a fresh 2 MiB output string a call measures the
      // client's allocator: page faults whenever glibc hands back fresh pages).
      kplan::v1::RunMoEResponse answer;
      for (int it = 0; it < iters + 20; ++it) {
        // Fresh random routing and activations for every call.
        std::string x = Bf16Bytes(size_t(m) * s.h, rng, 1.f);
        std::vector<float> logits(size_t(m) * s.e);
        std::normal_distribution<float> d(0.f, 1.f);
        for (float& v : logits) v = d(rng);
        if (shm) {  // the client writes them in place; the request names them
          std::memcpy(shm_area.data, x.data(), x.size());
          std::memcpy(shm_area.data + hidden_bytes, logits.data(), logits_bytes);
          req.mutable_hidden_states()->clear_data();
          *req.mutable_hidden_states()->mutable_shm() = shm_area.Ref(0, hidden_bytes);
          req.mutable_router_logits()->clear_data();
          *req.mutable_router_logits()->mutable_shm() = shm_area.Ref(hidden_bytes, logits_bytes);
          *req.mutable_output_shm() = shm_area.Ref(hidden_bytes + logits_bytes, hidden_bytes);
        } else {
          req.mutable_hidden_states()->set_data(std::move(x));
          req.mutable_router_logits()->set_data(logits.data(), logits.size() * 4);
        }
        auto start = std::chrono::steady_clock::now();
        absl::StatusOr<kplan::v1::RunMoEResponse> r;
        absl::Status status;
        if (via_channel) {
          status = (*channel)->RunMoE(req, &answer);
        } else {
          r = client->RunMoE(req);
          status = r.status();
        }
        const double us = SinceUs(start);
        if (!status.ok()) {
          std::fprintf(stderr, "run: %s\n", status.ToString().c_str());
          return 1;
        }
        if (it < 20) continue;
        const kplan::v1::RunMoEResponse& got = via_channel ? answer : *r;
        backend = got.plan().backend();
        hops.Add(us, got.timing());
      }
      hops.Print(transport, m, mode.c_str(), backend);
      req.mutable_hidden_states()->clear_shm();
      req.mutable_router_logits()->clear_shm();
      req.clear_output_shm();
    }
  }
  channel->reset();
  shm_area.Release();
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}

}  // namespace

ABSL_FLAG(int, iters, 200, "Calls per (transport, tokens, mode); medians over them");
ABSL_FLAG(std::string, tokens, "1,8,64,512", "Comma-separated tokens per request");
ABSL_FLAG(std::string, transport, "tcp,unix", "Comma-separated transports: tcp, unix");
ABSL_FLAG(std::string, shape, "128,8,2048,768",
          "The random bf16 set: experts, top-k, hidden, intermediate (default Qwen3-30B-A3B)");
ABSL_FLAG(std::string, modes, "skip,run,shm,chan,chshm",
          "Comma-separated modes: skip, run, shm, chan, chshm, chskip");
ABSL_FLAG(int, inline, 1, "The server's --inline_runs (0: every call hops to the device worker)");
ABSL_FLAG(int, cuda_graphs, 1, "The server's --cuda_graphs (0: small GPU calls launch eagerly)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "RunMoE through an in-process kplan-server, hop by hop, against GetServerInfo's round "
      "trip.\n  moe_rpc_bench --iters 200 --tokens 1,8,64,512 --transport tcp,unix");
  absl::ParseCommandLine(argc, argv);
  const int iters = absl::GetFlag(FLAGS_iters);
  const std::vector<int> tokens = IntList(absl::GetFlag(FLAGS_tokens));
  const std::vector<std::string> transports = absl::StrSplit(absl::GetFlag(FLAGS_transport), ',');
  const std::vector<int> dims = IntList(absl::GetFlag(FLAGS_shape));
  const int inline_runs = absl::GetFlag(FLAGS_inline);
  const int cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  if (iters <= 0 || tokens.empty() || dims.size() != 4) {
    std::fprintf(stderr, "moe_rpc_bench: --iters > 0, --tokens N[,N...] and --shape E,k,H,I\n");
    return 2;
  }
  for (const std::string& m : modes) {
    if (m != "skip" && m != "run" && m != "shm" && m != "chan" && m != "chshm" && m != "chskip") {
      std::fprintf(stderr, "moe_rpc_bench: unknown mode '%s' in --modes\n", m.c_str());
      return 2;
    }
  }
  const Shape shape{dims[0], dims[1], dims[2], dims[3]};
  std::printf(
      "# E=%d k=%d H=%d I=%d, medians of %d calls (us), inline runs %s, CUDA graphs %s; wire = "
      "round trip - server total\n",
      shape.e, shape.k, shape.h, shape.inter, iters, inline_runs ? "on" : "off",
      cuda_graphs ? "on" : "off");
  std::printf("%-9s %6s %-5s %-10s %9s %9s %8s %8s %8s %9s %8s %8s\n", "transport", "tokens",
              "mode", "backend", "rt", "server", "decode", "route", "queue", "device", "encode",
              "wire");
  for (const std::string& t : transports) {
    const std::string listen =
        t == "unix" ? absl::StrCat("unix:/tmp/kplan-moe-rpc-bench-", getpid(), ".sock")
                    : std::string("127.0.0.1:0");
    if (int rc = Measure(t.c_str(), listen, shape, tokens, modes, iters, inline_runs != 0,
                         cuda_graphs != 0);
        rc != 0) {
      return rc;
    }
  }
  return 0;
}
