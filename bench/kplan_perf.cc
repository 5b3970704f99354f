// kplan_perf: a load generator for RunMoE, in the manner of Triton's
// perf_analyzer. For each (tokens, concurrency) it runs `concurrency` closed-
// loop clients, each on its own channel (kept from step to step), sending
// RunMoE for --duration_s after --warmup_s, and reports p50/p90/p99 latency, requests/s and
// tokens/s, with errors counted by gRPC code. The transport is the address: host:port (TCP) or
// unix:PATH. Writes a table, and --json / --csv (bench/plot_perf.py draws the JSON).
// --shm sends the tensors by reference instead (Triton's system shared
// memory): one registered POSIX region per client thread holds its inputs
// and takes the output (a server on this host with --allow_shared_memory);
// --cuda_shm puts them in a cudaMalloc per thread registered by CUDA IPC
// handle (a GPU server; the layer reads and writes them device-to-device).
// --channel sends each call through a shared-memory call channel per client
// thread instead of gRPC (client/cpp/shm_channel.h; with or without --shm;
// the server needs --allow_shared_memory and --max_shm_channels >= the
// concurrency).
//
//   kplan_perf --server unix:/tmp/kplan.sock --concurrency 1,4,16,64 --tokens 1,64
//       --num_experts 128 --hidden 2048 --intermediate 768 --top_k 8 --json perf.json
//
// Without --experts_id it loads a random bf16 set of the given shape (and
// unloads it at the end). --server_pid samples that process's resident
// memory before and after every step (a server on this host).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/float16.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_channel.h"
#include "client/cpp/shm_region.h"
#if KPLAN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server address: HOST:PORT or unix:PATH");
ABSL_FLAG(std::string, concurrency, "1,4,16,64", "Comma-separated numbers of concurrent clients");
ABSL_FLAG(std::string, tokens, "1", "Comma-separated tokens per request");
ABSL_FLAG(double, duration_s, 5.0, "Measured seconds per (tokens, concurrency)");
ABSL_FLAG(double, warmup_s, 1.0, "Unmeasured seconds before each measurement");
ABSL_FLAG(std::string, experts_id, "", "An expert set already loaded; empty: load a random one");
ABSL_FLAG(int, num_experts, 128, "Experts of the random set");
ABSL_FLAG(int, hidden, 2048, "Hidden size of the random set");
ABSL_FLAG(int, intermediate, 768, "Intermediate size of the random set");
ABSL_FLAG(int, top_k, 8, "Experts per token");
ABSL_FLAG(std::string, backend, "", "moe_backend of every request (empty: auto)");
ABSL_FLAG(double, timeout_s, 30.0, "Deadline of each request");
ABSL_FLAG(int, server_pid, 0, "A local server's pid: its resident memory is sampled per step");
ABSL_FLAG(bool, shm, false,
          "Tensors by reference: each client thread registers a POSIX shared-memory region "
          "holding its inputs and output (the server needs --allow_shared_memory)");
ABSL_FLAG(bool, cuda_shm, false,
          "Tensors by reference in CUDA memory: each client thread cudaMallocs its inputs and "
          "output on --cuda_device and registers the IPC handle (a GPU server on this host with "
          "--allow_shared_memory; a CUDA build of kplan_perf)");
ABSL_FLAG(bool, channel, false,
          "Call through a shared-memory call channel per client thread instead of gRPC (a "
          "server on this host with --allow_shared_memory; see --max_shm_channels)");
ABSL_FLAG(int64_t, channel_capacity, 1 << 20,
          "--channel: bytes of each channel's request area and of its answer area");
ABSL_FLAG(int64_t, channel_in_region_from, kplan::ShmChannel::Options().in_region_from_bytes,
          "--channel: inline hidden states of at least this many bytes ride in the channel's "
          "region by reference (ShmChannel::Options::in_region_from_bytes; negative: never)");
ABSL_FLAG(int, cuda_device, 0, "The GPU of --cuda_shm's allocations (the server's index)");
ABSL_FLAG(bool, skip_device, false,
          "Debug: requests skip the layer (the server needs --allow_skip_device): the service's "
          "floor, transport included");
ABSL_FLAG(std::string, json, "", "Write the results as JSON to this file");
ABSL_FLAG(std::string, csv, "", "Write the results as CSV to this file");

namespace {

kplan::ShmChannel::Options ChannelOptions() {
  kplan::ShmChannel::Options o;
  o.request_capacity = o.response_capacity = absl::GetFlag(FLAGS_channel_capacity);
  o.in_region_from_bytes = absl::GetFlag(FLAGS_channel_in_region_from);
  return o;
}

std::vector<int> IntList(const std::string& text, const char* flag) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      std::fprintf(stderr, "--%s: '%s' is not a positive integer\n", flag,
                   std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  if (out.empty()) {
    std::fprintf(stderr, "--%s: give at least one value\n", flag);
    std::exit(2);
  }
  return out;
}

// Uniform in [-1, 1) from a xorshift generator: fast enough for gigabytes
// of weights.
float NextUniform(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return static_cast<float>(state >> 40) / 8388608.f - 1.f;
}

// bf16 values uniform in about [-scale, scale].
std::string RandomBf16(size_t n, uint64_t& state, float scale) {
  std::string out(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = kplan::FloatToBf16(scale * NextUniform(state));
    std::memcpy(&out[i * 2], &h, 2);
  }
  return out;
}

kplan::v1::Tensor Bf16Tensor(std::vector<int64_t> shape, std::string bytes) {
  kplan::v1::Tensor t;
  t.set_dtype(kplan::v1::DTYPE_BFLOAT16);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(bytes));
  return t;
}

absl::Status LoadRandomSet(kplan::Client& client, const std::string& id, int e, int h, int i) {
  kplan::v1::ExpertsHeader header;
  header.set_experts_id(id);
  header.set_num_experts(e);
  header.set_hidden_size(h);
  header.set_intermediate_size(i);
  header.set_activation("silu");
  header.set_dtype(kplan::v1::DTYPE_BFLOAT16);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  std::vector<kplan::v1::TensorChunk> chunks;
  const struct {
    const char* name;
    std::vector<int64_t> shape;
    float scale;
  } tensors[] = {{"w13", {e, 2 * i, h}, 1.f / std::sqrt(static_cast<float>(h))},
                 {"w2", {e, h, i}, 1.f / std::sqrt(static_cast<float>(i))}};
  constexpr size_t kChunk = 4 << 20;
  for (const auto& t : tensors) {
    const std::string bytes =
        RandomBf16(static_cast<size_t>(t.shape[0] * t.shape[1] * t.shape[2]), state, t.scale);
    for (size_t at = 0; at < bytes.size(); at += kChunk) {
      kplan::v1::TensorChunk c;
      c.set_name(t.name);
      if (at == 0) {
        c.set_dtype(kplan::v1::DTYPE_BFLOAT16);
        for (int64_t d : t.shape) c.add_shape(d);
      }
      c.set_offset(static_cast<int64_t>(at));
      c.set_data(bytes.substr(at, kChunk));
      chunks.push_back(std::move(c));
    }
  }
  return client.LoadExperts(header, chunks).status();
}

int64_t ResidentBytes(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in(absl::StrCat("/proc/", pid, "/statm"));
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

struct Row {
  int tokens = 0, concurrency = 0;
  int64_t requests = 0;
  std::map<std::string, int64_t> errors;  // by gRPC code name
  std::string first_error;
  double seconds = 0, p50_us = 0, p90_us = 0, p99_us = 0, mean_us = 0;
  int64_t rss_before = 0, rss_after = 0;
  int64_t error_count() const {
    int64_t n = 0;
    for (const auto& [code, count] : errors) n += count;
    return n;
  }
};

// Clients, each on a channel (and connection) of its own, kept across steps
// as a real client's would be: step n uses the first `concurrency`.
class ClientPool {
 public:
  explicit ClientPool(std::string server) : server_(std::move(server)) {}
  std::vector<std::unique_ptr<kplan::Client>>& Take(int n) {
    kplan::ClientOptions options;
    options.deadline = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
    options.max_attempts = 1;  // an error is a result here, not something to hide
    while (static_cast<int>(clients_.size()) < n) {
      grpc::ChannelArguments args;
      args.SetInt("kplan.perf_client", static_cast<int>(clients_.size()));
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      clients_.push_back(std::make_unique<kplan::Client>(
          grpc::CreateCustomChannel(server_, grpc::InsecureChannelCredentials(), args), options));
    }
    return clients_;
  }

 private:
  std::string server_;
  std::vector<std::unique_ptr<kplan::Client>> clients_;
};

// --shm: `request` with its tensors in a region of this thread's, which
// also takes the output; the region goes (unregistered, unlinked) with it.
absl::StatusOr<std::shared_ptr<void>> ShmRequest(kplan::Client& client,
                                                 const kplan::v1::RunMoERequest& request,
                                                 kplan::v1::RunMoERequest* out) {
  *out = request;
  const int64_t x = static_cast<int64_t>(request.hidden_states().data().size());
  const int64_t bytes = 2 * x + static_cast<int64_t>(request.router_logits().data().size()) + 128;
  absl::StatusOr<std::unique_ptr<kplan::ClientShmRegion>> region =
      kplan::ClientShmRegion::Create(client, bytes, "perf");
  if (!region.ok()) return region.status();
  absl::StatusOr<int64_t> at = (*region)->Place(out->mutable_hidden_states(), 0);
  if (at.ok()) at = (*region)->Place(out->mutable_router_logits(), *at);
  if (!at.ok()) return at.status();
  *out->mutable_output_shm() = (*region)->Ref(*at, x);
  return std::shared_ptr<void>(*std::move(region));
}

// --cuda_shm: `request` with its tensors in one cudaMalloc of this process
// registered by IPC handle, which also takes the output; the holder
// unregisters and frees it.
absl::StatusOr<std::shared_ptr<void>> CudaShmRequest(kplan::Client& client,
                                                     const kplan::v1::RunMoERequest& request,
                                                     kplan::v1::RunMoERequest* out) {
#if KPLAN_HAVE_CUDA
  static std::atomic<int> counter{0};
  const int device = absl::GetFlag(FLAGS_cuda_device);
  const std::string& x = request.hidden_states().data();
  const std::string& l = request.router_logits().data();
  const auto align = [](size_t n) { return static_cast<int64_t>((n + 255) / 256 * 256); };
  const int64_t l_at = align(x.size()), out_at = l_at + align(l.size());
  const int64_t bytes = out_at + static_cast<int64_t>(x.size());
  void* base = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&base, bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", bytes, " on cuda:", device));
  }
  const std::string name = absl::StrCat("kplan-perf-cuda-", getpid(), "-", counter++);
  std::shared_ptr<void> held(base, [&client, name](void* p) {
    (void)client.UnregisterSharedMemory(name);
    cudaFree(p);
  });
  cudaIpcMemHandle_t handle;
  if (cudaMemcpy(base, x.data(), x.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(static_cast<char*>(base) + l_at, l.data(), l.size(), cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaIpcGetMemHandle(&handle, base) != cudaSuccess) {
    return absl::InternalError(cudaGetErrorString(cudaGetLastError()));
  }
  kplan::v1::SharedMemoryRegion region;
  region.set_name(name);
  region.set_cuda_ipc_handle(reinterpret_cast<const char*>(&handle), sizeof(handle));
  region.set_device_id(device);
  region.set_byte_size(bytes);
  if (absl::Status s = client.RegisterSharedMemory(region); !s.ok()) return s;
  *out = request;
  const auto ref = [&](kplan::v1::SharedMemoryRef* r, int64_t at, size_t n) {
    r->set_region(name);
    r->set_offset(at);
    r->set_byte_size(static_cast<int64_t>(n));
  };
  out->mutable_hidden_states()->clear_data();
  ref(out->mutable_hidden_states()->mutable_shm(), 0, x.size());
  out->mutable_router_logits()->clear_data();
  ref(out->mutable_router_logits()->mutable_shm(), l_at, l.size());
  ref(out->mutable_output_shm(), out_at, x.size());
  return held;
#else
  (void)client;
  (void)request;
  (void)out;
  return absl::UnimplementedError("--cuda_shm needs a CUDA build of kplan_perf");
#endif
}

Row RunStep(ClientPool& pool, const kplan::v1::RunMoERequest& request, int tokens,
            int concurrency) {
  Row row;
  row.tokens = tokens;
  row.concurrency = concurrency;
  row.rss_before = ResidentBytes(absl::GetFlag(FLAGS_server_pid));
  std::vector<std::unique_ptr<kplan::Client>>& clients = pool.Take(concurrency);
  const absl::Duration warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup_s));
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  const absl::Time start = absl::Now() + absl::Milliseconds(50);  // every thread is up by then
  const absl::Time measure_from = start + warmup, measure_to = measure_from + duration;
  std::vector<std::vector<double>> latencies(concurrency);
  std::vector<std::map<std::string, int64_t>> errors(concurrency);
  std::vector<std::string> first_error(concurrency);
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      kplan::v1::RunMoERequest shm_request;
      std::shared_ptr<void> region;  // --shm / --cuda_shm: this thread's, gone with it
      const kplan::v1::RunMoERequest* req = &request;
      if (absl::GetFlag(FLAGS_cuda_shm) || absl::GetFlag(FLAGS_shm)) {
        absl::StatusOr<std::shared_ptr<void>> made =
            absl::GetFlag(FLAGS_cuda_shm) ? CudaShmRequest(*clients[c], request, &shm_request)
                                          : ShmRequest(*clients[c], request, &shm_request);
        if (!made.ok()) {
          ++errors[c][absl::StatusCodeToString(made.status().code())];
          first_error[c] = made.status().ToString();
          return;
        }
        region = *std::move(made);
        req = &shm_request;
      }
      std::unique_ptr<kplan::ShmChannel> channel;  // --channel: this thread's
      if (absl::GetFlag(FLAGS_channel)) {
        absl::StatusOr<std::unique_ptr<kplan::ShmChannel>> opened =
            kplan::ShmChannel::Open(*clients[c], ChannelOptions());
        if (!opened.ok()) {
          ++errors[c][absl::StatusCodeToString(opened.status().code())];
          first_error[c] = opened.status().ToString();
          return;
        }
        channel = *std::move(opened);
      }
      const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
      kplan::v1::RunMoEResponse response;
      absl::SleepFor(start - absl::Now());
      while (true) {
        const absl::Time sent = absl::Now();
        if (sent >= measure_to) break;
        absl::Status status;
        if (channel != nullptr) {
          status = channel->RunMoE(*req, &response, timeout);
        } else {
          status = clients[c]->RunMoE(*req).status();
        }
        const absl::Time done = absl::Now();
        if (sent < measure_from || done > measure_to) continue;  // outside the window
        if (status.ok()) {
          latencies[c].push_back(absl::ToDoubleMicroseconds(done - sent));
        } else {
          ++errors[c][absl::StatusCodeToString(status.code())];
          if (first_error[c].empty()) first_error[c] = status.ToString();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<double> all;
  for (int c = 0; c < concurrency; ++c) {
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    for (const auto& [code, n] : errors[c]) row.errors[code] += n;
    if (row.first_error.empty()) row.first_error = first_error[c];
  }
  std::sort(all.begin(), all.end());
  row.requests = static_cast<int64_t>(all.size());
  row.seconds = absl::ToDoubleSeconds(duration);
  auto pct = [&](double q) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(q * all.size()))];
  };
  row.p50_us = pct(0.50);
  row.p90_us = pct(0.90);
  row.p99_us = pct(0.99);
  double sum = 0;
  for (double v : all) sum += v;
  row.mean_us = all.empty() ? 0 : sum / all.size();
  row.rss_after = ResidentBytes(absl::GetFlag(FLAGS_server_pid));
  return row;
}

std::string ErrorsText(const Row& r) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : r.errors) parts.push_back(absl::StrCat(code, ":", n));
  return parts.empty() ? "0" : absl::StrJoin(parts, " ");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "RunMoE load generator: latency percentiles and throughput against concurrency.\n"
      "  kplan_perf --server unix:/tmp/kplan.sock --concurrency 1,16,64 --tokens 1 "
      "--json perf.json");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as kplan-server
  const std::string server = absl::GetFlag(FLAGS_server);
  const std::vector<int> concurrency = IntList(absl::GetFlag(FLAGS_concurrency), "concurrency");
  const std::vector<int> tokens = IntList(absl::GetFlag(FLAGS_tokens), "tokens");
  const int e = absl::GetFlag(FLAGS_num_experts), h = absl::GetFlag(FLAGS_hidden),
            i = absl::GetFlag(FLAGS_intermediate), k = absl::GetFlag(FLAGS_top_k);
  kplan::ClientOptions load_options;
  load_options.deadline = absl::Minutes(10);
  auto admin = kplan::Client::Connect(server, load_options);
  std::string id = absl::GetFlag(FLAGS_experts_id);
  const bool own_set = id.empty();
  if (own_set) {
    id = absl::StrCat("kplan-perf-", getpid());
    std::printf("loading a random bf16 set '%s': E=%d H=%d I=%d\n", id.c_str(), e, h, i);
    absl::Status loaded = LoadRandomSet(*admin, id, e, h, i);
    if (!loaded.ok()) {
      std::fprintf(stderr, "LoadExperts: %s\n", loaded.ToString().c_str());
      return 1;
    }
  }
  std::vector<Row> rows;
  ClientPool pool(server);
  std::printf("%-7s %-11s %9s %8s %10s %10s %10s %10s %11s  %s\n", "tokens", "concurrency",
              "requests", "errors", "req/s", "tok/s", "p50_us", "p90_us", "p99_us", "server_rss");
  for (int m : tokens) {
    uint64_t state = 0x2545f4914f6cdd1dull + static_cast<uint64_t>(m);
    kplan::v1::RunMoERequest request;
    request.set_experts_id(id);
    *request.mutable_hidden_states() =
        Bf16Tensor({m, h}, RandomBf16(static_cast<size_t>(m) * h, state, 1.f));
    std::string logits(static_cast<size_t>(m) * e * 4, '\0');
    for (size_t x = 0; x < static_cast<size_t>(m) * e; ++x) {
      const float v = 2.f * NextUniform(state);  // [-2, 2)
      std::memcpy(&logits[x * 4], &v, 4);
    }
    kplan::v1::Tensor& router = *request.mutable_router_logits();
    router.set_dtype(kplan::v1::DTYPE_FLOAT32);  // the router's float32 logits
    router.add_shape(m);
    router.add_shape(e);
    router.set_data(std::move(logits));
    request.mutable_routing()->set_top_k(k);
    request.set_skip_device(absl::GetFlag(FLAGS_skip_device));
    if (!absl::GetFlag(FLAGS_backend).empty()) {
      request.mutable_kernel_config()->set_moe_backend(absl::GetFlag(FLAGS_backend));
    }
    for (int c : concurrency) {
      Row r = RunStep(pool, request, m, c);
      std::printf("%-7d %-11d %9lld %8lld %10.1f %10.1f %10.1f %10.1f %11.1f  %s\n", m, c,
                  static_cast<long long>(r.requests), static_cast<long long>(r.error_count()),
                  r.requests / r.seconds, r.requests * m / r.seconds, r.p50_us, r.p90_us, r.p99_us,
                  r.rss_after > 0 ? absl::StrFormat("%.1f -> %.1f MiB", r.rss_before / 1048576.0,
                                                    r.rss_after / 1048576.0)
                                        .c_str()
                                  : "-");
      if (r.error_count() > 0) {
        std::printf("        errors: %s; first: %s\n", ErrorsText(r).c_str(),
                    r.first_error.c_str());
      }
      std::fflush(stdout);
      rows.push_back(std::move(r));
    }
  }
  if (own_set) (void)admin->UnloadExperts(id);
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream out(path);
    out << "{\"system\": \"kplan\", \"server\": \"" << server << "\", \"transport\": \""
        << (absl::GetFlag(FLAGS_channel) ? "channel+" : "")
        << (absl::GetFlag(FLAGS_cuda_shm) ? "cuda_shm"
            : absl::GetFlag(FLAGS_shm)    ? "shm"
                                          : "inline")
        << "\", \"shape\": {\"num_experts\": " << e << ", \"hidden\": " << h
        << ", \"intermediate\": " << i << ", \"top_k\": " << k << "},\n \"rows\": [";
    for (size_t n = 0; n < rows.size(); ++n) {
      const Row& r = rows[n];
      out << (n ? ",\n  " : "\n  ")
          << absl::StrFormat(
                 "{\"tokens\": %d, \"concurrency\": %d, \"requests\": %d, \"errors\": %d, "
                 "\"req_per_s\": %.3f, \"tokens_per_s\": %.3f, \"p50_us\": %.1f, "
                 "\"p90_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
                 "\"server_rss_before\": %d, \"server_rss_after\": %d}",
                 r.tokens, r.concurrency, r.requests, r.error_count(), r.requests / r.seconds,
                 r.requests * r.tokens / r.seconds, r.p50_us, r.p90_us, r.p99_us, r.mean_us,
                 r.rss_before, r.rss_after);
    }
    out << "\n ]}\n";
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    out << "tokens,concurrency,requests,errors,req_per_s,tokens_per_s,p50_us,p90_us,p99_us,"
           "mean_us,server_rss_before,server_rss_after\n";
    for (const Row& r : rows) {
      out << absl::StrFormat("%d,%d,%d,%d,%.3f,%.3f,%.1f,%.1f,%.1f,%.1f,%d,%d\n", r.tokens,
                             r.concurrency, r.requests, r.error_count(), r.requests / r.seconds,
                             r.requests * r.tokens / r.seconds, r.p50_us, r.p90_us, r.p99_us,
                             r.mean_us, r.rss_before, r.rss_after);
    }
  }
  int64_t failed = 0;
  for (const Row& r : rows) failed += r.error_count();
  return failed == 0 ? 0 : 3;
}
