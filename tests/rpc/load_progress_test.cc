// Loads under way as clients see them (ListExperts: state LOADING and
// progress; READY once resident; gone when cancelled) and a client racing
// the server's --preload for one of its ids, on the CPU path.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
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
using testing::Random;

constexpr int kE = 4, kH = 16, kI = 8;

// Hands out `chunks`, but before chunk `stop_at` waits for go(): true
// sends the rest, false fails the source (the client cancels the call).
class GatedSource final : public ChunkSource {
 public:
  GatedSource(std::vector<v1::TensorChunk> chunks, size_t stop_at)
      : chunks_(std::move(chunks)), stop_at_(stop_at) {}
  absl::StatusOr<bool> Next(v1::TensorChunk* chunk) override {
    if (next_ == stop_at_) {
      go_.WaitForNotification();
      if (!proceed_) return absl::AbortedError("the test stopped this source");
    }
    if (next_ == chunks_.size()) return false;
    *chunk = chunks_[next_++];
    return true;
  }
  void Go(bool proceed) {
    proceed_ = proceed;
    go_.Notify();
  }

 private:
  std::vector<v1::TensorChunk> chunks_;
  size_t stop_at_, next_ = 0;
  bool proceed_ = false;
  absl::Notification go_;
};

// The set `id` as ListExperts shows it, once `done` holds for it (within 10 s).
std::optional<v1::ExpertsInfo> WaitFor(Client& client, const std::string& id,
                                       const std::function<bool(const v1::ExpertsInfo*)>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::ListExpertsResponse> list = client.ListExperts();
    if (list.ok()) {
      const v1::ExpertsInfo* found = nullptr;
      for (const v1::ExpertsInfo& e : list->experts()) {
        if (e.experts_id() == id) found = &e;
      }
      if (done(found)) return found ? std::optional(*found) : v1::ExpertsInfo();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return std::nullopt;
}

// A CPU-path server's options, listening on `listen`.
ServerOptions CpuServer(std::string listen) {
  static NoDeviceProber prober;
  ServerOptions options;
  options.listen_address = std::move(listen);
  options.prober = &prober;
  return options;
}

class LoadProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::move(KplanServer::Start(CpuServer("127.0.0.1:0")).value());
    client_ = Client::Connect(absl::StrCat("127.0.0.1:", server_->port()));
    std::mt19937 rng(std::random_device{}());
    w13_ = Bytes(Random(kE * 2 * kI * kH, rng, 0.3f));
    w2_ = Bytes(Random(kE * kH * kI, rng, 0.3f));
  }

  // w13 whole, then w2 in halves: the first half is experts 0 and 1.
  std::vector<v1::TensorChunk> Chunks() const {
    v1::TensorChunk second = testing::Chunk("w2", {}, w2_.substr(w2_.size() / 2));
    second.clear_dtype();
    second.set_offset(static_cast<int64_t>(w2_.size() / 2));
    return {testing::Chunk("w13", {kE, 2 * kI, kH}, w13_),
            testing::Chunk("w2", {kE, kH, kI}, w2_.substr(0, w2_.size() / 2)), second};
  }

  std::unique_ptr<KplanServer> server_;
  std::unique_ptr<Client> client_;
  std::string w13_, w2_;
};

// A second client sees the load mid-way (bytes and experts done), then
// READY; RunMoE on a set still loading says so.
TEST_F(LoadProgressTest, ALoadUnderWayIsListedWithItsProgressThenReady) {
  GatedSource source(Chunks(), 2);  // w13 and half of w2 sent, then it waits
  absl::StatusOr<v1::LoadExpertsResponse> loaded;
  std::thread loader(
      [&] { loaded = client_->LoadExperts(testing::Float32Header("big", kE, kH, kI), source); });
  const int64_t total = static_cast<int64_t>(w13_.size() + w2_.size());
  const int64_t sent = static_cast<int64_t>(w13_.size() + w2_.size() / 2);
  std::unique_ptr<Client> other = Client::Connect(absl::StrCat("127.0.0.1:", server_->port()));
  // What kplan load draws from: the watcher's callbacks while it loads.
  std::mutex mu;
  std::vector<int64_t> watched;
  auto watch = std::make_unique<LoadWatch>(
      *other, "big",
      [&](const v1::ExpertsInfo& e) {
        std::lock_guard<std::mutex> lock(mu);
        watched.push_back(e.progress().bytes_done());
      },
      absl::Milliseconds(5));
  std::optional<v1::ExpertsInfo> mid = WaitFor(*other, "big", [&](const v1::ExpertsInfo* e) {
    return e != nullptr && e->progress().bytes_done() == sent;
  });
  ASSERT_TRUE(mid.has_value()) << "the load never showed its first chunks";
  EXPECT_EQ(mid->state(), v1::EXPERTS_STATE_LOADING);
  EXPECT_GT(mid->progress().bytes_done(), 0);
  EXPECT_LT(mid->progress().bytes_done(), mid->progress().bytes_total());
  EXPECT_EQ(mid->progress().bytes_total(), total);
  EXPECT_EQ(mid->bytes(), total);
  EXPECT_EQ(mid->progress().experts_done(), kE / 2);  // all of w13, half of w2
  EXPECT_EQ(mid->progress().experts_total(), kE);
  EXPECT_FALSE(mid->progress().preload());
  EXPECT_EQ(mid->num_experts(), kE);
  EXPECT_EQ(mid->placement_size(), 0);

  v1::RunMoERequest run;
  run.set_experts_id("big");
  *run.mutable_hidden_states() =
      testing::MakeTensor(v1::DTYPE_FLOAT32, {1, kH}, std::string(kH * 4, '\0'));
  *run.mutable_router_logits() =
      testing::MakeTensor(v1::DTYPE_FLOAT32, {1, kE}, std::string(kE * 4, '\0'));
  run.mutable_routing()->set_top_k(2);
  absl::StatusOr<v1::RunMoEResponse> early = other->RunMoE(run);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kNotFound) << early.status();
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("being loaded"));

  for (int i = 0; i < 2000; ++i) {  // until the watcher saw the gated state
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!watched.empty() && watched.back() == sent) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  source.Go(true);
  loader.join();
  watch.reset();
  ASSERT_FALSE(watched.empty()) << "LoadWatch never reported the load";
  EXPECT_NE(std::find(watched.begin(), watched.end(), sent), watched.end());
  EXPECT_TRUE(std::is_sorted(watched.begin(), watched.end()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->experts().state(), v1::EXPERTS_STATE_READY);
  absl::StatusOr<v1::ListExpertsResponse> after = other->ListExperts();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->experts_size(), 1);
  EXPECT_EQ(after->experts(0).state(), v1::EXPERTS_STATE_READY);
  EXPECT_FALSE(after->experts(0).has_progress());
  EXPECT_TRUE(other->RunMoE(run).ok());
}

// A cancelled load leaves the list (and its id free).
TEST_F(LoadProgressTest, ACancelledLoadDisappears) {
  GatedSource source(Chunks(), 1);
  absl::StatusOr<v1::LoadExpertsResponse> loaded;
  std::thread loader(
      [&] { loaded = client_->LoadExperts(testing::Float32Header("gone", kE, kH, kI), source); });
  ASSERT_TRUE(WaitFor(*client_, "gone", [&](const v1::ExpertsInfo* e) {
                return e != nullptr && e->progress().bytes_done() > 0;
              }).has_value());
  source.Go(false);
  loader.join();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kAborted) << loaded.status();
  EXPECT_TRUE(
      WaitFor(*client_, "gone", [](const v1::ExpertsInfo* e) { return e == nullptr; }).has_value())
      << "the cancelled load is still listed";
  std::vector<v1::TensorChunk> chunks = Chunks();
  EXPECT_TRUE(client_->LoadExperts(testing::Float32Header("gone", kE, kH, kI), chunks).ok());
}

// A client's LoadExperts of an id the --preload lists, while the preload
// runs, is ALREADY_EXISTS naming the id; the preload still loads every set
// once, from its file.
TEST(PreloadRaceTest, AClientCannotTakeAPreloadedId) {
  // Twenty 24 MiB sets first, read from one file, so the preload takes a while.
  constexpr int kBigE = 8, kBigH = 512, kBigI = 512;
  const std::string dir = ::testing::TempDir();
  const std::string file = absl::StrCat("race-", getpid(), ".safetensors");
  {
    const int64_t n13 = int64_t{kBigE} * 2 * kBigI * kBigH * 4,
                  n2 = int64_t{kBigE} * kBigH * kBigI * 4;
    const std::string header = absl::StrCat(
        "{\"w13\":{\"dtype\":\"F32\",\"shape\":[", kBigE, ",", 2 * kBigI, ",", kBigH,
        "],\"data_offsets\":[0,", n13, "]},\"w2\":{\"dtype\":\"F32\",\"shape\":[", kBigE, ",",
        kBigH, ",", kBigI, "],\"data_offsets\":[", n13, ",", n13 + n2, "]}}");
    std::ofstream f(absl::StrCat(dir, "/", file), std::ios::binary);
    const uint64_t len = header.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << header << std::string(static_cast<size_t>(n13 + n2), '\x01');
  }
  std::string entries;
  const int kSets = 20;
  for (int i = 0; i <= kSets; ++i) {
    absl::StrAppend(&entries, i ? ", " : "", "{\"experts_id\": \"",
                    i < kSets ? absl::StrCat("big", i) : "small", "\", \"num_experts\": ", kBigE,
                    ", \"hidden_size\": ", kBigH, ", \"intermediate_size\": ", kBigI,
                    ", \"dtype\": \"DTYPE_FLOAT32\", \"safetensors\": {\"path\": \"", file,
                    "\", \"w13\": \"w13\", \"w2\": \"w2\"}}");
  }
  const std::string socket = absl::StrCat(dir, "/race-", getpid(), ".sock");
  ServerOptions options = CpuServer("unix:" + socket);
  options.model_roots = {dir};
  options.max_expert_bytes = int64_t{1} << 30;
  options.preload_file = absl::StrCat(dir, "/race-", getpid(), ".json");
  std::ofstream(options.preload_file) << "{\"experts\": [" << entries << "]}";
  absl::StatusOr<std::unique_ptr<KplanServer>> started;
  std::thread starter([&] { started = KplanServer::Start(options); });

  // A fresh channel per attempt until one answers: a channel whose first
  // connection fails (before the server listens) waits out gRPC's reconnect
  // backoff (a second) and would miss the race.
  ClientOptions probe;
  probe.deadline = absl::Milliseconds(100);
  probe.max_attempts = 1;
  std::unique_ptr<Client> client;
  for (int i = 0; i < 500; ++i) {
    client = Client::Connect("unix:" + socket, probe);
    if (client->ListExperts().ok()) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  client = Client::Connect("unix:" + socket);  // it listens: connects at once, usual deadline
  // The last set is held for the preload from the moment the server listens.
  std::optional<v1::ExpertsInfo> held =
      WaitFor(*client, "small", [](const v1::ExpertsInfo* e) { return e != nullptr; });
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->state(), v1::EXPERTS_STATE_LOADING)
      << "the preload finished before the test raced it";
  EXPECT_TRUE(held->progress().preload());
  // Until every preloaded set is resident: alive, not ready.
  EXPECT_EQ(client->Health("").value_or(false), true);
  absl::StatusOr<bool> ready = client->Health(KplanServer::kReadinessService);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_FALSE(*ready) << "readiness SERVING during the preload";
  std::vector<v1::TensorChunk> chunks = {
      testing::Chunk("w13", {kE, 2 * kI, kH}, std::string(kE * 2 * kI * kH * 4, '\0')),
      testing::Chunk("w2", {kE, kH, kI}, std::string(kE * kH * kI * 4, '\0'))};
  for (const std::string id : {"small", "big7"}) {
    absl::StatusOr<v1::LoadExpertsResponse> raced =
        client->LoadExperts(testing::Float32Header(id, kE, kH, kI), chunks);
    EXPECT_EQ(raced.status().code(), absl::StatusCode::kAlreadyExists) << raced.status();
    EXPECT_THAT(std::string(raced.status().message()),
                HasSubstr(absl::StrCat("experts '", id, "' are being preloaded")));
    EXPECT_EQ(FieldOf(raced.status()).value_or(""), "header.experts_id");
  }
  starter.join();
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(client->Health(KplanServer::kReadinessService).value_or(false), true);
  absl::StatusOr<v1::ListExpertsResponse> list = client->ListExperts();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->experts_size(), kSets + 1);  // each once
  for (const v1::ExpertsInfo& e : list->experts()) {
    EXPECT_EQ(e.state(), v1::EXPERTS_STATE_READY) << e.experts_id();
    EXPECT_EQ(e.num_experts(), kBigE) << e.experts_id();  // the preload's, not the client's
  }
}

// The preload's holds are checked before the server listens: a header
// LoadExperts would refuse, or sets that together exceed --max_expert_bytes,
// stop the start naming the entry.
TEST(PreloadRaceTest, HoldsAreCheckedBeforeListening) {
  const std::string dir = ::testing::TempDir();
  ServerOptions options = CpuServer("127.0.0.1:0");
  options.model_roots = {dir};
  options.max_expert_bytes = 10000;  // one 6 KiB set fits, two do not
  options.preload_file = absl::StrCat(dir, "/holds-", getpid(), ".json");
  auto entry = [](const std::string& id, int experts) {
    return absl::StrCat("{\"experts_id\": \"", id, "\", \"num_experts\": ", experts,
                        ", \"hidden_size\": ", kH, ", \"intermediate_size\": ", kI,
                        ", \"dtype\": \"DTYPE_FLOAT32\", \"safetensors\": {\"path\": \"x\", "
                        "\"w13\": \"w13\", \"w2\": \"w2\"}}");
  };
  struct Case {
    std::string entries;
    absl::StatusCode code;
    std::string field, message;
  };
  const std::vector<Case> cases = {
      {entry("a", 0), absl::StatusCode::kInvalidArgument, "preload.experts[0].num_experts",
       "preload.experts[0] ('a'): num_experts must be at least 1"},
      {absl::StrCat(entry("a", kE), ", ", entry("b", kE)), absl::StatusCode::kResourceExhausted,
       "preload.experts[1]", "preload.experts[1] ('b'): loading 6144 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entries);
    std::ofstream(options.preload_file) << "{\"experts\": [" << c.entries << "]}";
    absl::StatusOr<std::unique_ptr<KplanServer>> s = KplanServer::Start(options);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), c.code) << s.status();
    EXPECT_EQ(FieldOf(s.status()).value_or(""), c.field) << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace kplan::rpc
