// The whole server in-process (no devices, 127.0.0.1:0), fed raw bytes over
// a grpc::GenericStub: the first input byte picks the method (every
// KernelPlanService unary method, or LoadExperts as a client stream whose
// messages are the rest cut at fuzz::kDelimiter), the rest is sent as the
// request bytes as they are. Each call has a 2 s deadline; afterwards the
// server must still answer GetServerInfo, else the target aborts. An expert
// set "fuzz" (E=4, H=16, I=32, float32) is loaded at start, so RunMoE
// requests naming it reach the layer. A method answering UNIMPLEMENTED or
// UNKNOWN aborts too (the codes seen per method are printed at exit).
// The last pick sends the rest through a shared-memory call channel
// (server/rpc/shm_channels.h) as its request bytes, with the length the
// input has (past the channel's capacity too): it must be answered within
// 5 s, with a code that is neither of those two.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/shm_channel.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_channel.h"
#include "fuzz/fuzz_util.h"
#include "kplan/v1/service.grpc.pb.h"
#include "resolve/platform/local.h"
#include "server/rpc/server.h"
#include "spdlog/spdlog.h"

namespace {

using namespace kplan;

constexpr const char* kUnary[] = {
    "/kplan.v1.KernelPlanService/ResolveKernelConfig",
    "/kplan.v1.KernelPlanService/GetServerInfo",
    "/kplan.v1.KernelPlanService/RunIrOp",
    "/kplan.v1.KernelPlanService/UnloadExperts",
    "/kplan.v1.KernelPlanService/ListExperts",
    "/kplan.v1.KernelPlanService/RunMoE",
    "/kplan.v1.KernelPlanService/JoinEpGroup",
    "/kplan.v1.KernelPlanService/RunEpStep",
};
constexpr int kNumUnary = sizeof(kUnary) / sizeof(kUnary[0]);
constexpr const char kLoadExperts[] = "/kplan.v1.KernelPlanService/LoadExperts";
constexpr const char kChannel[] = "shm channel RunMoE";
constexpr int kChannelPick = kNumUnary + 1;
constexpr int64_t kChannelCapacity = 64 << 10;

struct Harness {
  std::unique_ptr<rpc::KplanServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> generic;
  std::unique_ptr<v1::KernelPlanService::Stub> stub;
  grpc::CompletionQueue cq;
  std::unique_ptr<Client> client;           // opened the channel
  std::unique_ptr<ShmChannel> shm_channel;  // kept open for the whole run
  ShmChannelHeader* header = nullptr;       // a second mapping of its region
  char* request_area = nullptr;
  uint64_t sequence = 1u << 20;
};
Harness* h = nullptr;

// Codes seen per method (printed at exit). A request the server cannot
// parse or does not like must come back with a code that says so (ARCHITECTURE.md:
// INVALID_ARGUMENT for a wrong request); UNIMPLEMENTED for a method the
// service has, or UNKNOWN (an unmapped failure), aborts.
std::atomic<int64_t> codes[kNumUnary + 2][17];

const char* MethodName(int method) {
  return method == kChannelPick ? kChannel : method == kNumUnary ? kLoadExperts : kUnary[method];
}

void Record(int method, const grpc::Status& status, const std::string& bytes) {
  const int code = static_cast<int>(status.error_code());
  codes[method][code < 17 ? code : 2].fetch_add(1);
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
      status.error_code() == grpc::StatusCode::UNKNOWN) {
    std::fprintf(stderr, "server_fuzz: %s answered %d (%s) to %zu request bytes\n",
                 MethodName(method), code, status.error_message().c_str(), bytes.size());
    std::abort();
  }
}

void PrintCodes() {
  for (int m = 0; m <= kChannelPick; ++m) {
    std::string line;
    for (int c = 0; c < 17; ++c) {
      if (codes[m][c].load())
        line += " " + std::to_string(c) + ":" + std::to_string(codes[m][c].load());
    }
    if (!line.empty()) {
      std::fprintf(stderr, "server_fuzz codes %s:%s\n", MethodName(m), line.c_str());
    }
  }
}

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(2);
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Waits for `tag` on the shared queue (one call in flight at a time).
bool Await(void* tag) {
  void* got = nullptr;
  bool ok = false;
  if (!h->cq.Next(&got, &ok)) std::abort();
  if (got != tag) {
    std::fprintf(stderr, "server_fuzz: unexpected tag\n");
    std::abort();
  }
  return ok;
}

void Unary(int pick, const std::string& bytes) {
  const char* method = kUnary[pick];
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::ByteBuffer request = Buffer(bytes), response;
  grpc::Status status;
  auto call = h->generic->PrepareUnaryCall(&ctx, method, request, &h->cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  Await(reinterpret_cast<void*>(1));
  Record(pick, status, bytes);
}

void Stream(const std::string& bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto call = h->generic->PrepareCall(&ctx, kLoadExperts, &h->cq);
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = Await(reinterpret_cast<void*>(1));
  std::vector<std::string> parts =
      fuzz::SplitMessages(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  for (const std::string& part : parts) {
    if (!open) break;
    call->Write(Buffer(part), reinterpret_cast<void*>(2));
    open = Await(reinterpret_cast<void*>(2));
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    Await(reinterpret_cast<void*>(3));
  }
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  Await(reinterpret_cast<void*>(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  Await(reinterpret_cast<void*>(5));
  Record(kNumUnary, status, bytes);
}

// The bytes as a channel request of their length; the answer's code.
void ChannelCall(const std::string& bytes) {
  ShmChannelHeader* hd = h->header;
  std::memcpy(h->request_area, bytes.data(),
              std::min(bytes.size(), static_cast<size_t>(kChannelCapacity)));
  ShmChannelStore(&hd->request_bytes, static_cast<uint64_t>(bytes.size()));
  ShmChannelStore(&hd->timeout_us, int64_t{2'000'000});
  ShmChannelStore(&hd->sequence, ++h->sequence);
  hd->state.store(ShmWord(ShmChannelState::kPosted), std::memory_order_release);
  ShmChannelWake(&hd->state);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  uint32_t s = hd->state.load(std::memory_order_acquire);
  while (s != ShmWord(ShmChannelState::kDone) && absl::Now() < deadline) {
    ShmChannelAwaitChange(&hd->state, s, absl::Microseconds(50), deadline, absl::Milliseconds(5));
    s = hd->state.load(std::memory_order_acquire);
  }
  if (s != ShmWord(ShmChannelState::kDone) ||
      ShmChannelLoad(&hd->response_sequence) != h->sequence) {
    std::fprintf(stderr, "server_fuzz: the channel did not answer %zu bytes (state %u)\n",
                 bytes.size(), s);
    std::abort();
  }
  const int code = ShmChannelLoad(&hd->status_code);
  Record(kChannelPick, grpc::Status(static_cast<grpc::StatusCode>(code), ""), bytes);
}

void OpenChannel() {
  h->client = Client::Connect(absl::StrCat("127.0.0.1:", h->server->port()));
  ShmChannel::Options options;
  options.request_capacity = kChannelCapacity;
  options.response_capacity = kChannelCapacity;
  absl::StatusOr<std::unique_ptr<ShmChannel>> channel = ShmChannel::Open(*h->client, options);
  if (!channel.ok()) {
    std::fprintf(stderr, "server_fuzz: %s\n", channel.status().ToString().c_str());
    std::abort();
  }
  h->shm_channel = *std::move(channel);
  const size_t bytes = kShmChannelHeaderBytes + 2 * kChannelCapacity;
  const int fd = shm_open(absl::StrCat("/", h->shm_channel->region()).c_str(), O_RDWR, 0);
  void* p = fd < 0 ? MAP_FAILED : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) std::abort();
  h->header = static_cast<ShmChannelHeader*>(p);
  h->request_area = static_cast<char*>(p) + kShmChannelHeaderBytes;
}

void CheckAlive(const char* after) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::GetServerInfoRequest request;
  v1::GetServerInfoResponse response;
  grpc::Status status = h->stub->GetServerInfo(&ctx, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "server_fuzz: GetServerInfo after %s: %d %s\n", after,
                 static_cast<int>(status.error_code()), status.error_message().c_str());
    std::abort();
  }
}

// Loads "fuzz"; `must`: abort when that fails (at start; later a fuzzed
// UnloadExperts may have removed it, or not).
void LoadFuzzExperts(bool must) {
  std::mt19937 rng(99);
  std::normal_distribution<float> dist(0.f, 0.3f);
  auto floats = [&](int64_t n) {
    std::string s(static_cast<size_t>(n) * 4, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      std::memcpy(&s[static_cast<size_t>(i) * 4], &f, 4);
    }
    return s;
  };
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::LoadExpertsResponse response;
  auto writer = h->stub->LoadExperts(&ctx, &response);
  v1::LoadExpertsRequest header;
  v1::ExpertsHeader* hd = header.mutable_header();
  hd->set_experts_id("fuzz");
  hd->set_num_experts(fuzz::kNumExperts);
  hd->set_hidden_size(fuzz::kHidden);
  hd->set_intermediate_size(fuzz::kIntermediate);
  hd->set_activation("silu");
  hd->set_dtype(v1::DTYPE_FLOAT32);
  writer->Write(header);
  const int64_t e = fuzz::kNumExperts, hh = fuzz::kHidden, ii = fuzz::kIntermediate;
  for (auto [name, shape] : {std::pair<const char*, std::vector<int64_t>>{"w13", {e, 2 * ii, hh}},
                             {"w2", {e, hh, ii}}}) {
    v1::LoadExpertsRequest chunk;
    v1::TensorChunk* c = chunk.mutable_chunk();
    c->set_name(name);
    c->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) c->add_shape(d);
    c->set_data(floats(shape[0] * shape[1] * shape[2]));
    writer->Write(chunk);
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (must && !status.ok()) {
    std::fprintf(stderr, "server_fuzz: loading the expert set: %s\n",
                 status.error_message().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  h = new Harness;
  // Per-call info logs would dominate the time per input (and the log).
  spdlog::set_level(spdlog::level::err);
  static NoDeviceProber prober;
  rpc::ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.devices = "none";
  options.prober = &prober;
  options.max_expert_bytes = int64_t{256} << 20;
  options.allow_shared_memory = true;  // the channel pick
  absl::StatusOr<std::unique_ptr<rpc::KplanServer>> server = rpc::KplanServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "server_fuzz: %s\n", server.status().ToString().c_str());
    std::abort();
  }
  h->server = std::move(*server);
  h->channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", h->server->port()),
                                   grpc::InsecureChannelCredentials());
  h->generic = std::make_unique<grpc::GenericStub>(h->channel);
  h->stub = v1::KernelPlanService::NewStub(h->channel);
  LoadFuzzExperts(true);
  OpenChannel();
  CheckAlive("start");
  std::atexit(PrintCodes);
  // libFuzzer ends the process without unwinding the harness: the channel's
  // object would stay in /dev/shm after every run (the server's mapping
  // goes with the process).
  std::atexit([] { shm_unlink(absl::StrCat("/", h->shm_channel->region()).c_str()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int pick = data[0] % (kNumUnary + 2);
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (pick == kChannelPick) {
    ChannelCall(bytes);
    CheckAlive(kChannel);
  } else if (pick == kNumUnary) {
    Stream(bytes);
    CheckAlive(kLoadExperts);
  } else {
    Unary(pick, bytes);
    CheckAlive(kUnary[pick]);
    if (pick == 3) LoadFuzzExperts(false);  // UnloadExperts may have removed "fuzz"
  }
  return 0;
}
