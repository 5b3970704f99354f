// RunMoE through shared-memory call channels (base/shm_channel.h,
// server/rpc/shm_channels.h, client/cpp/shm_channel.h) on the CPU path: the
// answers are the bytes gRPC's RunMoE answers on fresh random data, errors
// keep their code and field, and a client that breaks the protocol (lengths
// past the area, garbage, abandoned calls) only breaks its own calls: the
// channel keeps serving.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/shm_channel.h"
#include "base/status.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/server.h"
#include "tests/rpc/moe_rpc_util.h"

namespace kplan::rpc {
namespace {

using testing::Bytes;
using testing::MakeTensor;
using testing::Random;

constexpr int kE = 8, kK = 2, kH = 32, kI = 16;

class ShmChannelTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(Options()); }

  static ServerOptions Options() {
    static NoDeviceProber prober;
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.prober = &prober;
    options.allow_shared_memory = true;
    options.max_shm_channels = 4;
    return options;
  }

  void Start(const ServerOptions& options) {
    client_.reset();
    server_ = std::move(KplanServer::Start(options).value());
    client_ = Client::Connect(absl::StrCat("127.0.0.1:", server_->port()));
    std::mt19937 rng(rng_());
    std::vector<v1::TensorChunk> chunks = {
        testing::Chunk("w13", {kE, 2 * kI, kH}, Bytes(Random(size_t(kE) * 2 * kI * kH, rng, 0.3f))),
        testing::Chunk("w2", {kE, kH, kI}, Bytes(Random(size_t(kE) * kH * kI, rng, 0.3f)))};
    ASSERT_TRUE(client_->LoadExperts(testing::Float32Header("l", kE, kH, kI), chunks).ok());
  }

  v1::RunMoERequest Request(int m) {
    v1::RunMoERequest r;
    r.set_experts_id("l");
    *r.mutable_hidden_states() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, kH}, Bytes(Random(size_t(m) * kH, rng_, 1)));
    *r.mutable_router_logits() =
        MakeTensor(v1::DTYPE_FLOAT32, {m, kE}, Bytes(Random(size_t(m) * kE, rng_, 1)));
    r.mutable_routing()->set_top_k(kK);
    return r;
  }

  std::unique_ptr<ShmChannel> Open(ShmChannel::Options options = {}) {
    absl::StatusOr<std::unique_ptr<ShmChannel>> channel = ShmChannel::Open(*client_, options);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? *std::move(channel) : nullptr;
  }

  // The channel's region as a second mapping of its object, as a client
  // that ignores the protocol would write it.
  struct Raw {
    char* base = nullptr;
    size_t bytes = 0;
    ShmChannelHeader* header() const { return reinterpret_cast<ShmChannelHeader*>(base); }
    ~Raw() {
      if (base != nullptr) munmap(base, bytes);
    }
  };
  static void MapRaw(const ShmChannel& channel, size_t bytes, Raw* raw) {
    const int fd = shm_open(absl::StrCat("/", channel.region()).c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(p, MAP_FAILED);
    raw->base = static_cast<char*>(p);
    raw->bytes = bytes;
  }

  std::mt19937 rng_{std::random_device{}()};
  std::unique_ptr<KplanServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ShmChannelTest, AnswersAreGrpcsBytes) {
  std::unique_ptr<ShmChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  // This user's alone by default, whatever the umask; a group's on request.
  struct stat st;
  ASSERT_EQ(stat(absl::StrCat("/dev/shm/", channel->region()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ShmChannel::Options shared;
  shared.mode = 0660;
  const mode_t umask_before = umask(0077);  // would strip the group's bits
  std::unique_ptr<ShmChannel> group = Open(shared);
  umask(umask_before);
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(stat(absl::StrCat("/dev/shm/", group->region()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  for (int m : {1, 3, 1, 17, 64, 0, 5}) {
    v1::RunMoERequest req = Request(m);
    req.set_return_routing(m % 2 == 1);
    absl::StatusOr<v1::RunMoEResponse> grpc_answer = client_->RunMoE(req);
    ASSERT_TRUE(grpc_answer.ok()) << grpc_answer.status();
    v1::RunMoEResponse answer;
    absl::Status s = channel->RunMoE(req, &answer);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(answer.output().data(), grpc_answer->output().data()) << m << " tokens";
    EXPECT_THAT(answer.output().shape(), ::testing::ElementsAre(m, kH));
    EXPECT_EQ(answer.topk_ids().data(), grpc_answer->topk_ids().data());
    EXPECT_EQ(answer.plan().SerializeAsString(), grpc_answer->plan().SerializeAsString());
    if (m > 0) {
      EXPECT_NE(answer.output().data(), std::string(size_t(m) * kH * 4, '\0'));
    }
  }
}

// Tensors by reference and the output written into a region, through the
// channel: no tensor bytes travel through it.
TEST_F(ShmChannelTest, ReferencesIntoRegions) {
  std::unique_ptr<ShmChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  absl::StatusOr<std::unique_ptr<ClientShmRegion>> data =
      ClientShmRegion::Create(*client_, 1 << 16, "test");
  ASSERT_TRUE(data.ok()) << data.status();
  const int m = 9;
  v1::RunMoERequest inline_req = Request(m);
  absl::StatusOr<v1::RunMoEResponse> expected = client_->RunMoE(inline_req);
  ASSERT_TRUE(expected.ok()) << expected.status();
  v1::RunMoERequest req = inline_req;
  absl::StatusOr<int64_t> end = (*data)->Place(req.mutable_hidden_states(), 0);
  ASSERT_TRUE(end.ok()) << end.status();
  end = (*data)->Place(req.mutable_router_logits(), *end);
  ASSERT_TRUE(end.ok()) << end.status();
  const int64_t out_bytes = int64_t(m) * kH * 4;
  *req.mutable_output_shm() = (*data)->Ref(*end, out_bytes);
  std::memset((*data)->data() + *end, 0, size_t(out_bytes));
  v1::RunMoEResponse answer;
  absl::Status s = channel->RunMoE(req, &answer);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(answer.output().data().empty());
  EXPECT_EQ(std::string((*data)->data() + *end, size_t(out_bytes)), expected->output().data());
}

// Large inline tensors ride in the channel's own region (references into
// the request area's tail, the output written there): the caller still sends
// and gets bytes, the same bytes gRPC answers; a call whose tensors do not
// fit that way goes serialized.
TEST_F(ShmChannelTest, LargeTensorsRideInTheRegion) {
  ShmChannel::Options options;
  options.request_capacity = 1 << 20;
  options.in_region_from_bytes = 64 << 10;  // 512 tokens of 32 float32
  std::unique_ptr<ShmChannel> by_size = Open(options);
  options.in_region_from_bytes = 0;
  std::unique_ptr<ShmChannel> always = Open(options);
  options.in_region_from_bytes = -1;
  std::unique_ptr<ShmChannel> never = Open(options);
  // In-region needs room for the output too: 600 tokens fit serialized
  // (96 KiB of inputs), not in the region (171 KiB).
  options.request_capacity = 120 << 10;
  options.in_region_from_bytes = 0;
  std::unique_ptr<ShmChannel> tight = Open(options);
  ASSERT_TRUE(by_size && always && never && tight);
  Raw raw[4];
  ShmChannel* const channels[4] = {by_size.get(), always.get(), never.get(), tight.get()};
  for (int c = 0; c < 4; ++c) {
    ASSERT_NO_FATAL_FAILURE(MapRaw(*channels[c], kShmChannelHeaderBytes, &raw[c]));
  }
  // One answer for every call of a channel: its buffers are reused.
  v1::RunMoEResponse reused[4];
  for (int m : {600, 1, 17, 0, 513, 512, 511}) {
    v1::RunMoERequest req = Request(m);
    req.set_return_routing(m % 2 == 1);
    absl::StatusOr<v1::RunMoEResponse> grpc_answer = client_->RunMoE(req);
    ASSERT_TRUE(grpc_answer.ok()) << grpc_answer.status();
    const uint64_t serialized = req.ByteSizeLong();
    for (int c = 0; c < 4; ++c) {
      ShmChannel* channel = channels[c];
      v1::RunMoEResponse answer;
      absl::Status s = channel->RunMoE(req, &answer);
      ASSERT_TRUE(s.ok()) << s << " at " << m << " tokens";
      EXPECT_EQ(answer.output().data(), grpc_answer->output().data()) << m << " tokens";
      EXPECT_FALSE(answer.output().has_shm());
      ASSERT_TRUE(channel->RunMoE(req, &reused[c]).ok());
      EXPECT_EQ(reused[c].output().SerializeAsString(), grpc_answer->output().SerializeAsString())
          << "channel " << c << ", " << m << " tokens";
      EXPECT_EQ(reused[c].has_topk_ids(), grpc_answer->has_topk_ids());
      EXPECT_EQ(reused[c].topk_ids().data(), grpc_answer->topk_ids().data());
      EXPECT_EQ(reused[c].topk_weights().data(), grpc_answer->topk_weights().data());
      EXPECT_EQ(reused[c].plan().SerializeAsString(), grpc_answer->plan().SerializeAsString());
      EXPECT_THAT(answer.output().shape(), ::testing::ElementsAre(m, kH));
      EXPECT_EQ(answer.topk_ids().data(), grpc_answer->topk_ids().data());
      EXPECT_EQ(answer.topk_weights().data(), grpc_answer->topk_weights().data());
      // Which form went: a small envelope, or the request serialized.
      const bool enveloped = m > 0 && (channel == always.get() ||
                                       (channel == by_size.get() && m * kH * 4 >= (64 << 10)) ||
                                       (channel == tight.get() && m < 100));
      const uint64_t sent = ShmChannelLoad(&raw[c].header()->request_bytes);
      if (enveloped) {
        EXPECT_LT(sent, 256u) << "channel " << c << ", " << m << " tokens";
      } else {
        EXPECT_EQ(sent, serialized) << "channel " << c << ", " << m << " tokens";
      }
    }
  }
  // The caller's request is untouched.
  v1::RunMoERequest req = Request(600);
  const std::string before = req.SerializeAsString();
  v1::RunMoEResponse answer;
  ASSERT_TRUE(always->RunMoE(req, &answer).ok());
  EXPECT_EQ(req.SerializeAsString(), before);
}

// An error keeps the code, text and field gRPC's RunMoE gives it.
TEST_F(ShmChannelTest, ErrorsAreGrpcs) {
  std::unique_ptr<ShmChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  std::vector<v1::RunMoERequest> bad(4, Request(2));
  bad[0].set_experts_id("nope");
  bad[1].mutable_hidden_states()->set_data("abc");
  bad[2].mutable_routing()->set_top_k(kE + 1);
  bad[3].set_skip_device(true);  // not honoured without --allow_skip_device
  for (const v1::RunMoERequest& req : bad) {
    absl::Status over_grpc = client_->RunMoE(req).status();
    ASSERT_FALSE(over_grpc.ok());
    v1::RunMoEResponse answer;
    absl::Status over_channel = channel->RunMoE(req, &answer);
    EXPECT_EQ(over_channel.code(), over_grpc.code()) << over_channel;
    EXPECT_EQ(over_channel.message(), over_grpc.message());
    EXPECT_TRUE(FieldOf(over_grpc).has_value()) << over_grpc;
    EXPECT_EQ(FieldOf(over_channel), FieldOf(over_grpc));
  }
  v1::RunMoEResponse answer;  // and the channel still serves
  EXPECT_TRUE(channel->RunMoE(Request(1), &answer).ok());
}

TEST_F(ShmChannelTest, SizesPastTheAreas) {
  ShmChannel::Options small;
  small.request_capacity = 16384;
  small.response_capacity = 4096;
  std::unique_ptr<ShmChannel> channel = Open(small);
  ASSERT_NE(channel, nullptr);
  v1::RunMoEResponse answer;
  absl::Status s = channel->RunMoE(Request(200), &answer);  // 25 KiB of hidden states
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "request");
  s = channel->RunMoE(Request(40), &answer);  // fits; its 5 KiB answer does not
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "request_capacity");
  EXPECT_TRUE(channel->RunMoE(Request(2), &answer).ok());
}

TEST_F(ShmChannelTest, OpenChecksItsRegion) {
  absl::StatusOr<std::unique_ptr<ClientShmRegion>> plain =
      ClientShmRegion::Create(*client_, 16384, "plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<std::unique_ptr<ClientShmRegion>> tiny =
      ClientShmRegion::Create(*client_, 4096, "tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  struct Case {
    std::string region;
    int64_t request_capacity;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"nope", 1024, absl::StatusCode::kNotFound, "region"},
      {(*plain)->name(), 1024, absl::StatusCode::kInvalidArgument, "region"},  // no header
      {(*tiny)->name(), 1024, absl::StatusCode::kInvalidArgument, "region"},   // too small
      {(*plain)->name(), 0, absl::StatusCode::kInvalidArgument, "request_capacity"},
      {(*plain)->name(), 16384 - 64 - 4095, absl::StatusCode::kInvalidArgument, "request_capacity"},
  };
  for (const Case& c : cases) {
    absl::Status s = client_->OpenShmChannel(c.region, c.request_capacity).status();
    EXPECT_EQ(s.code(), c.code) << c.region << " " << c.request_capacity << ": " << s;
    EXPECT_EQ(FieldOf(s).value_or(""), c.field) << s;
  }
  std::unique_ptr<ShmChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  absl::Status again = client_->OpenShmChannel(channel->region(), 1024).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  std::vector<std::unique_ptr<ShmChannel>> more;
  for (int i = 0; i < 3; ++i) more.push_back(Open());  // 4 in all: the server's cap
  absl::StatusOr<std::unique_ptr<ShmChannel>> fifth = ShmChannel::Open(*client_, {});
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted) << fifth.status();
  EXPECT_EQ(client_->CloseShmChannel("nope").code(), absl::StatusCode::kNotFound);
}

TEST_F(ShmChannelTest, OffWithoutSharedMemory) {
  ServerOptions options = Options();
  options.allow_shared_memory = false;
  Start(options);
  absl::Status s = client_->OpenShmChannel("any", 1024).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(FieldOf(s).value_or(""), "region");
}

// Lengths past the area, garbage and a doctored state word: each call of
// the misbehaving client fails alone, and the channel then serves again.
TEST_F(ShmChannelTest, HostileHeaderBreaksOnlyItsCall) {
  ShmChannel::Options options;
  options.request_capacity = 4096;
  options.response_capacity = 4096;
  std::unique_ptr<ShmChannel> channel = Open(options);
  ASSERT_NE(channel, nullptr);
  Raw raw;
  MapRaw(*channel, 64 + 4096 + 4096, &raw);
  ShmChannelHeader* h = raw.header();
  auto post = [&](uint64_t bytes) {
    h->request_bytes = bytes;
    h->timeout_us = 2'000'000;
    h->sequence = 1000;
    h->state.store(static_cast<uint32_t>(ShmChannelState::kPosted));
    ShmChannelWake(&h->state);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (uint32_t s = h->state.load();
         s != static_cast<uint32_t>(ShmChannelState::kDone) && absl::Now() < deadline;
         s = h->state.load()) {
      ShmChannelAwaitChange(&h->state, s, absl::Microseconds(100), deadline, absl::Milliseconds(5));
    }
    EXPECT_EQ(h->state.load(), static_cast<uint32_t>(ShmChannelState::kDone));
    EXPECT_EQ(h->response_sequence, 1000u);
    return static_cast<absl::StatusCode>(h->status_code);
  };
  EXPECT_EQ(post(uint64_t{1} << 62), absl::StatusCode::kInvalidArgument);  // past the area
  std::memset(raw.base + 64, 0xff, 4096);
  EXPECT_EQ(post(4096), absl::StatusCode::kInvalidArgument);  // not a message
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {  // random bytes: answered, whatever they parse as
    for (int j = 0; j < 256; ++j) raw.base[64 + j] = static_cast<char>(rng());
    EXPECT_NE(post(rng() % 257), absl::StatusCode::kOk);
  }
  // A state word set to nonsense is left alone by the server; the client's
  // next call takes the channel back.
  h->state.store(77);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(h->state.load(), 77u);
  v1::RunMoEResponse answer;
  v1::RunMoERequest req = Request(3);
  absl::Status s = channel->RunMoE(req, &answer);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(answer.output().data(), client_->RunMoE(req)->output().data());
}

// A client that truncates its channel's object under the server's thread
// (which polls the page) ends its channel, not the server.
TEST_F(ShmChannelTest, TruncatedChannelEndsNotTheServer) {
  const std::string key = absl::StrCat("/kplan-channel-truncate-", getpid());
  const int64_t bytes = 64 + 2 * 16384;
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  absl::Cleanup unlink = [&] { shm_unlink(key.c_str()); };
  ASSERT_EQ(ftruncate(fd, bytes), 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  ShmChannelInit(p);
  munmap(p, bytes);  // this process touches it no more (it is not guarded here)
  v1::SharedMemoryRegion region;
  region.set_name("truncated");
  region.set_key(key);
  region.set_byte_size(bytes);
  ASSERT_TRUE(client_->RegisterSharedMemory(region).ok());
  ASSERT_TRUE(client_->OpenShmChannel("truncated", 16384).ok());
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  // The channel's thread notices within 50 ms and ends; the server lives.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (server_->environment().shm_channels->Serving("truncated") && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(server_->environment().shm_channels->Serving("truncated"));
  // Alive, and serving: gRPC and another channel.
  v1::RunMoERequest req = Request(2);
  absl::StatusOr<v1::RunMoEResponse> over_grpc = client_->RunMoE(req);
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status();
  std::unique_ptr<ShmChannel> other = Open();
  ASSERT_NE(other, nullptr);
  v1::RunMoEResponse answer;
  ASSERT_TRUE(other->RunMoE(req, &answer).ok());
  EXPECT_EQ(answer.output().data(), over_grpc->output().data());
  // The region is gone for RunMoE too, and leaves cleanly.
  v1::RunMoERequest by_ref = req;
  *by_ref.mutable_hidden_states()->mutable_shm() =
      testing::Ref("truncated", 64, int64_t(req.hidden_states().data().size()));
  by_ref.mutable_hidden_states()->clear_data();
  EXPECT_EQ(client_->RunMoE(by_ref).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->UnregisterSharedMemory("truncated").ok());
}

// A call whose client gives up is abandoned, not lost: the next call waits
// for the server to let go of it and is answered.
// Also when the tensors ride in the region: the next call waits for the
// server to let go of the abandoned one before it places its own inputs.
TEST_F(ShmChannelTest, AbandonedCallsFreeTheChannel) {
  for (int64_t in_region_from : {int64_t{-1}, int64_t{0}}) {
    ShmChannel::Options options;
    options.in_region_from_bytes = in_region_from;
    std::unique_ptr<ShmChannel> channel = Open(options);
    ASSERT_NE(channel, nullptr);
    v1::RunMoERequest big = Request(200);
    v1::RunMoERequest small = Request(2);
    const std::string expected = client_->RunMoE(small)->output().data();
    int deadlines = 0;
    for (int i = 0; i < 20; ++i) {
      v1::RunMoEResponse answer;
      absl::Status s = channel->RunMoE(big, &answer, absl::Microseconds(1));
      if (absl::IsDeadlineExceeded(s)) ++deadlines;
      s = channel->RunMoE(small, &answer);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(answer.output().data(), expected);
    }
    EXPECT_GT(deadlines, 0) << in_region_from;
  }
}

// Closing, unregistering and shutdown end a channel; its client is told.
TEST_F(ShmChannelTest, ClosedChannelsSayUnavailable) {
  std::unique_ptr<ShmChannel> a = Open();
  std::unique_ptr<ShmChannel> b = Open();
  // c outlives the server: its client does not wait long for a server that
  // is gone when the channel's destructor unregisters its region.
  ClientOptions brief;
  brief.deadline = absl::Milliseconds(300);
  brief.max_attempts = 1;
  std::unique_ptr<Client> short_lived =
      Client::Connect(absl::StrCat("127.0.0.1:", server_->port()), brief);
  absl::StatusOr<std::unique_ptr<ShmChannel>> c_or = ShmChannel::Open(*short_lived, {});
  ASSERT_TRUE(c_or.ok()) << c_or.status();
  std::unique_ptr<ShmChannel> c = *std::move(c_or);
  ASSERT_TRUE(a && b);
  v1::RunMoEResponse answer;
  ASSERT_TRUE(a->RunMoE(Request(1), &answer).ok());
  ASSERT_TRUE(client_->CloseShmChannel(a->region()).ok());
  EXPECT_EQ(a->RunMoE(Request(1), &answer).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(client_->UnregisterSharedMemory(b->region()).ok());
  EXPECT_EQ(b->RunMoE(Request(1), &answer).code(), absl::StatusCode::kUnavailable);
  a.reset();
  b.reset();
  // Shutdown while c's call runs: answered (or refused), then closed.
  v1::RunMoERequest big = Request(2000);
  std::atomic<int> code{-1};
  std::thread caller([&] {
    v1::RunMoEResponse r;
    code = static_cast<int>(c->RunMoE(big, &r, absl::Seconds(60)).code());
  });
  absl::SleepFor(absl::Milliseconds(5));
  server_->Shutdown(absl::Seconds(5));
  caller.join();
  // Answered if the server took it before it closed, else told so.
  EXPECT_TRUE(code.load() == int(absl::StatusCode::kOk) ||
              code.load() == int(absl::StatusCode::kUnavailable))
      << code.load();
  EXPECT_EQ(c->RunMoE(Request(1), &answer, absl::Seconds(5)).code(),
            absl::StatusCode::kUnavailable);
}

// Channels of several threads at once: each answer is its own request's.
TEST_F(ShmChannelTest, ThreadsEachOnTheirChannel) {
  constexpr int kThreads = 4, kCalls = 25;
  std::vector<v1::RunMoERequest> requests;
  std::vector<std::string> expected;
  for (int i = 0; i < kThreads * kCalls; ++i) {
    requests.push_back(Request(1 + i % 7));
    expected.push_back(client_->RunMoE(requests.back())->output().data());
  }
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<ShmChannel> channel = *ShmChannel::Open(*client_, {});
      for (int i = 0; i < kCalls; ++i) {
        v1::RunMoEResponse answer;
        const int n = t * kCalls + i;
        if (!channel->RunMoE(requests[n], &answer).ok() || answer.output().data() != expected[n]) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace kplan::rpc
