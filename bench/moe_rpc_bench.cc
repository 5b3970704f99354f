// RunMoE through gRPC against the layer time: an in-process kplan-server on
// the machine's GPUs, Qwen3-30B-A3B-shaped bf16 experts (E=128, k=8, H=2048,
// I=768) loaded over LoadExperts, then single-token (and small) RunMoE calls
// on 127.0.0.1. Prints the median client round trip next to the server's own
// device and queue time, so the difference is the RPC overhead.
//   moe_rpc_bench [--iters 200] [--tokens 1,8,64]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "server/rpc/server.h"

namespace {

std::string Bf16Bytes(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::string out(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t h = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    std::memcpy(&out[i * 2], &h, 2);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  std::vector<int> tokens = {1, 8, 64};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") (void)absl::SimpleAtoi(argv[i + 1], &iters);
    if (std::string(argv[i]) == "--tokens") {
      tokens.clear();
      for (absl::string_view t : absl::StrSplit(argv[i + 1], ',')) {
        int v = 0;
        if (absl::SimpleAtoi(t, &v)) tokens.push_back(v);
      }
    }
  }
  kplan::rpc::ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  auto server = kplan::rpc::KplanServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const int e = 128, k = 8, h = 2048, inter = 768;
  kplan::ClientOptions copt;
  copt.deadline = absl::Seconds(600);
  auto client = kplan::Client::Connect(absl::StrCat("127.0.0.1:", (*server)->port()), copt);
  std::mt19937 rng(std::random_device{}());
  kplan::v1::ExpertsHeader header;
  header.set_experts_id("qwen3");
  header.set_num_experts(e);
  header.set_hidden_size(h);
  header.set_intermediate_size(inter);
  header.set_dtype(kplan::v1::DTYPE_BFLOAT16);
  std::vector<kplan::v1::TensorChunk> chunks;
  for (auto [name, n, shape] : {std::tuple<const char*, size_t, std::vector<int64_t>>{
                                    "w13", size_t(e) * 2 * inter * h, {e, 2 * inter, h}},
                                {"w2", size_t(e) * h * inter, {e, h, inter}}}) {
    kplan::AppendTensorChunks(name, kplan::v1::DTYPE_BFLOAT16, shape, Bf16Bytes(n, rng, 0.02f),
                              32 << 20, &chunks);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto loaded = client->LoadExperts(header, chunks);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("loaded %.2f GB of experts in %.2f s (%s)\n", loaded->experts().bytes() / 1e9, load_s,
              loaded->experts().placement_size() > 1
                  ? loaded->experts().placement(1).device().c_str()
                  : "cpu");
  std::printf("\n%6s %10s %14s %12s %12s %14s %10s\n", "tokens", "backend", "round_trip_us",
              "server_us", "device_us", "overhead_us", "overhead%");
  for (int m : tokens) {
    kplan::v1::RunMoERequest req;
    req.set_experts_id("qwen3");
    req.mutable_hidden_states()->set_dtype(kplan::v1::DTYPE_BFLOAT16);
    req.mutable_hidden_states()->add_shape(m);
    req.mutable_hidden_states()->add_shape(h);
    req.mutable_routing()->set_top_k(k);
    req.mutable_routing()->set_routing_method("RenormalizeNaive");
    req.mutable_router_logits()->set_dtype(kplan::v1::DTYPE_FLOAT32);
    req.mutable_router_logits()->add_shape(m);
    req.mutable_router_logits()->add_shape(e);
    std::vector<double> rt, server_us, device_us;
    std::string backend;
    for (int it = 0; it < iters + 20; ++it) {
      // Fresh random routing and activations for every call.
      req.mutable_hidden_states()->set_data(Bf16Bytes(size_t(m) * h, rng, 1.f));
      std::vector<float> logits(size_t(m) * e);
      std::normal_distribution<float> d(0.f, 1.f);
      for (float& x : logits) x = d(rng);
      req.mutable_router_logits()->set_data(logits.data(), logits.size() * 4);
      auto s = std::chrono::steady_clock::now();
      auto r = client->RunMoE(req);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count();
      if (!r.ok()) {
        std::fprintf(stderr, "run: %s\n", r.status().ToString().c_str());
        return 1;
      }
      if (it < 20) continue;
      backend = r->plan().backend();
      rt.push_back(us);
      server_us.push_back(r->timing().total_us());
      device_us.push_back(r->timing().device_us());
    }
    const double mrt = Median(rt), mdev = Median(device_us);
    std::printf("%6d %10s %14.1f %12.1f %12.1f %14.1f %9.1f%%\n", m, backend.c_str(), mrt,
                Median(server_us), mdev, mrt - mdev, 100.0 * (mrt - mdev) / mrt);
  }
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
