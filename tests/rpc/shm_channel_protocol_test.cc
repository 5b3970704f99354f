// The shared-memory call channel's protocol alone (base/shm_channel.h), its
// server (server/rpc/shm_channels.h) and client (client/cpp/shm_channel.h)
// without gRPC, so that it runs under TSan (scripts/sanitize.sh tsan): a
// handler that answers late from other threads (as the device workers do),
// clients that give up on calls at random, channels closed while calls
// run. Every answer must be its own request's; nothing may hang.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/shm_channel.h"
#include "client/cpp/shm_channel.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "server/moe/shm_regions.h"
#include "server/rpc/shm_channels.h"

namespace kplan::rpc {
namespace {

constexpr int64_t kCapacity = 1 << 16;

// Answers on a few threads of its own, after a short random delay: the
// answer to a request is its hidden_states bytes reversed, and experts_id
// "error" is refused.
class LateHandler {
 public:
  explicit LateHandler(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { Work(i); });
  }
  ~LateHandler() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  void operator()(ShmChannelServer::Request request, ShmChannelServer::Answer answer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(request), std::move(answer)});
    }
    cv_.notify_one();
  }
  int64_t cancelled_seen() const { return cancelled_seen_.load(); }

 private:
  struct Item {
    ShmChannelServer::Request request;
    ShmChannelServer::Answer answer;
  };
  void Work(int seed) {
    std::mt19937 rng(seed);
    while (true) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::SleepFor(absl::Microseconds(rng() % 300));
      if (item.request.cancelled()) ++cancelled_seen_;
      v1::RunMoERequest request;
      if (!request.ParseFromString(item.request.bytes)) {
        (void)item.answer(absl::InvalidArgumentError("not a request"), nullptr);
        continue;
      }
      if (request.experts_id() == "error") {
        (void)item.answer(absl::NotFoundError("no set 'error'"), nullptr);
        continue;
      }
      v1::RunMoEResponse response;
      const std::string& x = request.hidden_states().data();
      response.mutable_output()->set_data(std::string(x.rbegin(), x.rend()));
      (void)item.answer(absl::OkStatus(), &response);
      (void)item.answer(absl::InternalError("a second answer must be dropped"), nullptr);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::atomic<int64_t> cancelled_seen_{0};
  std::vector<std::thread> workers_;
};

std::string PlainError(const absl::Status& status) {
  google::rpc::Status s;
  s.set_code(static_cast<int>(status.code()));
  s.set_message(std::string(status.message()));
  return s.SerializeAsString();
}

// A POSIX object registered as region `name`, mapped here too.
struct Region {
  std::string key;
  char* base = nullptr;
  size_t bytes = 0;
  Region(ShmRegistry& registry, const std::string& name, size_t size) : bytes(size) {
    key = absl::StrCat("/kplan-protocol-test-", getpid(), "-", name);
    const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    base = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    ShmChannelInit(base);
    EXPECT_TRUE(registry.Register(ShmRegionInfo{name, key, 0, int64_t(size), "", 0}).ok());
  }
  ~Region() {
    munmap(base, bytes);
    shm_unlink(key.c_str());
  }
};

ShmChannel::Options ClientOptions() {
  ShmChannel::Options o;
  o.request_capacity = kCapacity;
  o.response_capacity = kCapacity;
  o.spin = absl::Microseconds(20);
  return o;
}

v1::RunMoERequest RequestOf(std::mt19937& rng, int n) {
  v1::RunMoERequest r;
  r.set_experts_id(n % 9 == 0 ? "error" : "l");
  std::string x(16 + rng() % 512, '\0');
  for (char& c : x) c = static_cast<char>(rng());
  r.mutable_hidden_states()->set_data(x);
  return r;
}

TEST(ShmChannelProtocolTest, LateAnswersAndAbandonedCalls) {
  ShmRegistry registry;
  LateHandler handler(3);
  ShmChannelServer::Options options;
  options.spin = absl::Microseconds(20);
  options.error_bytes = PlainError;
  ShmChannelServer server(
      options, [&](auto request, auto answer) { handler(std::move(request), std::move(answer)); });
  constexpr int kChannels = 4, kCalls = 150;
  std::vector<std::unique_ptr<Region>> regions;
  // The client side works on the server's own mapping (the same addresses),
  // so that TSan sees both sides of every byte.
  std::vector<ShmView> views;
  for (int c = 0; c < kChannels; ++c) {
    const std::string name = absl::StrCat("ch", c);
    regions.push_back(
        std::make_unique<Region>(registry, name, kShmChannelHeaderBytes + 2 * kCapacity));
    views.push_back(*registry.ResolveWindow(name, "region"));
    ASSERT_TRUE(server.Open(name, views.back(), kCapacity).ok());
  }
  std::atomic<int> wrong{0}, deadlines{0}, answered{0}, refused{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kChannels; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(100 + c);
      std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(views[c].data, ClientOptions());
      for (int n = 1; n <= kCalls; ++n) {
        const v1::RunMoERequest request = RequestOf(rng, n);
        // One call in five gives up almost at once.
        const absl::Duration timeout =
            rng() % 5 == 0 ? absl::Microseconds(rng() % 200) : absl::Seconds(10);
        v1::RunMoEResponse response;
        const absl::Status s = channel->RunMoE(request, &response, timeout);
        const std::string& x = request.hidden_states().data();
        if (s.ok()) {
          ++answered;
          if (request.experts_id() == "error" ||
              response.output().data() != std::string(x.rbegin(), x.rend())) {
            ++wrong;
          }
        } else if (absl::IsDeadlineExceeded(s)) {
          ++deadlines;
        } else if (absl::IsNotFound(s) && request.experts_id() == "error" &&
                   s.message() == "no set 'error'") {
          ++refused;
        } else {
          ADD_FAILURE() << "call " << n << " on channel " << c << ": " << s;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(answered.load(), kChannels * kCalls / 2);
  EXPECT_GT(deadlines.load(), 0);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(answered + deadlines + refused, kChannels * kCalls);
  server.CloseAll();
  EXPECT_EQ(server.size(), 0u);
  for (const auto& r : regions) {
    EXPECT_EQ(reinterpret_cast<ShmChannelHeader*>(r->base)->state.load(),
              ShmWord(ShmChannelState::kClosed));
  }
}

// An answer whose error bytes cannot be made (out of memory: error_bytes
// throws) still answers its call, with the code alone; the channel serves
// the next calls and closes at once. It had hung: the write threw past the
// answer's notification, and the call's second answer waited for it forever
// (without the fix the calls fail DEADLINE_EXCEEDED, then the close hangs
// until ctest's timeout).
TEST(ShmChannelProtocolTest, AnErrorWhoseBytesFailStillAnswers) {
  ShmRegistry registry;
  ShmChannelServer::Options options;
  options.spin = absl::ZeroDuration();
  options.error_bytes = [](const absl::Status&) -> std::string { throw std::bad_alloc(); };
  ShmChannelServer server(options, [](ShmChannelServer::Request, ShmChannelServer::Answer answer) {
    (void)answer(absl::NotFoundError("no set 'x'"), nullptr);
  });
  Region region(registry, "e", kShmChannelHeaderBytes + 2 * kCapacity);
  const ShmView view = *registry.ResolveWindow("e", "region");
  ASSERT_TRUE(server.Open("e", view, kCapacity).ok());
  std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(view.data, ClientOptions());
  for (int n = 0; n < 3; ++n) {
    v1::RunMoERequest request;
    request.set_experts_id("x");
    v1::RunMoEResponse response;
    const absl::Status s = channel->RunMoE(request, &response, absl::Seconds(5));
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }
  const absl::Time start = absl::Now();
  EXPECT_TRUE(server.Close("e").ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Closing every channel stops them all from taking calls at once, then
// waits for their calls in flight together. Six clients post back to back
// calls that take 500 ms each: closed in turn, each later channel kept
// taking calls meanwhile, and the waits added up (here about 2.1 s; a
// hostile client could stretch a shutdown that way); together it is at
// most one call's time.
constexpr int kChannels = 6;
constexpr absl::Duration kCall = absl::Milliseconds(500);
TEST(ShmChannelProtocolTest, CloseAllStopsEveryChannelAtOnce) {
  ShmRegistry registry;
  std::mutex mu;
  std::deque<std::pair<absl::Time, ShmChannelServer::Answer>> due;  // answered in order
  std::atomic<bool> stop{false};
  std::thread answerer([&] {
    v1::RunMoEResponse response;
    while (!stop.load()) {
      ShmChannelServer::Answer answer;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!due.empty() && due.front().first <= absl::Now()) {
          answer = std::move(due.front().second);
          due.pop_front();
        }
      }
      if (answer) {
        (void)answer(absl::OkStatus(), &response);
      } else {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
  });
  ShmChannelServer::Options options;
  options.spin = absl::ZeroDuration();
  options.error_bytes = PlainError;
  auto server = std::make_unique<ShmChannelServer>(
      options, [&](ShmChannelServer::Request, ShmChannelServer::Answer answer) {
        std::lock_guard<std::mutex> lock(mu);
        due.emplace_back(absl::Now() + kCall, std::move(answer));
      });
  std::vector<std::unique_ptr<Region>> regions;
  std::vector<std::thread> clients;
  std::atomic<int> calls{0};
  for (int i = 0; i < kChannels; ++i) {
    const std::string name = absl::StrCat("all", i);
    regions.push_back(
        std::make_unique<Region>(registry, name, kShmChannelHeaderBytes + 2 * kCapacity));
    const ShmView view = *registry.ResolveWindow(name, "region");
    ASSERT_TRUE(server->Open(name, view, kCapacity).ok());
    clients.emplace_back([view, i, &calls] {
      // Out of step, each channel's calls ending before the one closed
      // before it (they close in name order): closed in turn, each waited
      // for a call it took while the one before it closed.
      absl::SleepFor(kCall * (kChannels - i) / kChannels);
      std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(view.data, ClientOptions());
      v1::RunMoERequest request;
      request.set_experts_id("l");
      while (true) {
        v1::RunMoEResponse response;
        const absl::Status s = channel->RunMoE(request, &response, absl::Seconds(10));
        if (absl::IsUnavailable(s)) return;  // closed
        EXPECT_TRUE(s.ok()) << s;
        ++calls;
      }
    });
  }
  absl::SleepFor(kCall * 2);
  const absl::Time start = absl::Now();
  server->CloseAll();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, kCall + absl::Seconds(1)) << took;  // in turn: 2.1 s
  EXPECT_EQ(server->size(), 0u);
  EXPECT_GT(calls.load(), 0);
  for (std::thread& t : clients) t.join();
  stop = true;
  answerer.join();
}

// A channel server whose handler holds the first call's answer until
// Release and answers every later call at once (OK, an empty response).
class HeldFirstCall {
 public:
  HeldFirstCall() {
    ShmChannelServer::Options options;
    options.spin = absl::ZeroDuration();
    options.error_bytes = PlainError;
    server_ = std::make_unique<ShmChannelServer>(
        options, [this](ShmChannelServer::Request, ShmChannelServer::Answer answer) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!taken_) {
            taken_ = true;
            held_ = std::move(answer);
          } else {
            const v1::RunMoEResponse response;
            (void)answer(absl::OkStatus(), &response);
          }
        });
  }
  ShmChannelServer& server() { return *server_; }
  // A client thread making one call on `view`'s channel, which must answer OK;
  // returns once the server holds it.
  std::thread CallAndHold(const ShmView& view) {
    std::thread client([view] {
      std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(view.data, ClientOptions());
      v1::RunMoERequest request;
      request.set_experts_id("held");
      v1::RunMoEResponse response;
      EXPECT_TRUE(channel->RunMoE(request, &response, absl::Seconds(10)).ok());
    });
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!Held() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_TRUE(Held()) << "the call never reached the handler";
    return client;
  }
  void Release() {
    const v1::RunMoEResponse response;
    std::lock_guard<std::mutex> lock(mu_);
    if (held_) (void)held_(absl::OkStatus(), &response);
  }

 private:
  bool Held() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<bool>(held_);
  }
  std::mutex mu_;
  bool taken_ = false;
  ShmChannelServer::Answer held_;
  std::unique_ptr<ShmChannelServer> server_;  // first to go: its threads use the rest
};

// A region reopened while its channel closes: the open is refused until the
// close returns (UNAVAILABLE "region"), a second close waits for the first,
// and the channel opened after them serves. It had opened at once, beside
// the old thread, whose exit then marked the new channel Closed.
TEST(ShmChannelProtocolTest, ReopenWhileClosing) {
  ShmRegistry registry;
  HeldFirstCall held;
  ShmChannelServer& server = held.server();
  Region region(registry, "r", kShmChannelHeaderBytes + 2 * kCapacity);
  const ShmView view = *registry.ResolveWindow("r", "region");
  ASSERT_TRUE(server.Open("r", view, kCapacity).ok());
  std::thread client = held.CallAndHold(view);
  std::thread first([&] { EXPECT_TRUE(server.Close("r").ok()); });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  absl::Status reopened;
  do {  // ALREADY_EXISTS until the close has begun
    reopened = server.Open("r", view, kCapacity).status();
    absl::SleepFor(absl::Milliseconds(1));
  } while (absl::IsAlreadyExists(reopened) && absl::Now() < give_up);
  EXPECT_TRUE(absl::IsUnavailable(reopened)) << reopened;
  std::atomic<bool> second_started{false}, second_done{false};
  std::thread second([&] {
    second_started = true;
    EXPECT_TRUE(server.Close("r").ok());  // NOT_FOUND had it not waited for the first
    second_done = true;
  });
  while (!second_started.load()) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(100));  // the second close is waiting
  EXPECT_FALSE(second_done.load());
  EXPECT_EQ(server.size(), 1u);
  held.Release();
  first.join();
  second.join();
  client.join();
  EXPECT_EQ(server.size(), 0u);
  ASSERT_TRUE(server.Open("r", view, kCapacity).ok());
  std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(view.data, ClientOptions());
  v1::RunMoERequest request;
  v1::RunMoEResponse response;
  EXPECT_TRUE(channel->RunMoE(request, &response, absl::Seconds(10)).ok());
  EXPECT_TRUE(server.Serving("r"));
}

// A close in two steps: BeginClose stops the channel at once, whatever its
// call in flight (a reopen is refused meanwhile, other regions' channels
// open and close freely), and Wait returns once the call was answered. The
// server's UnregisterSharedMemory takes the first step under its admin lock
// and waits outside it.
TEST(ShmChannelProtocolTest, BeginCloseStopsAtOnceAndWaitsLater) {
  ShmRegistry registry;
  HeldFirstCall held;
  ShmChannelServer& server = held.server();
  Region a(registry, "a", kShmChannelHeaderBytes + 2 * kCapacity);
  Region b(registry, "b", kShmChannelHeaderBytes + 2 * kCapacity);
  const ShmView view_a = *registry.ResolveWindow("a", "region");
  const ShmView view_b = *registry.ResolveWindow("b", "region");
  ASSERT_TRUE(server.Open("a", view_a, kCapacity).ok());
  std::thread client = held.CallAndHold(view_a);
  ShmChannelServer::Closing closing = server.BeginClose("a");  // returns with the call held
  EXPECT_TRUE(absl::IsUnavailable(server.Open("a", view_a, kCapacity).status()));
  EXPECT_TRUE(server.Open("b", view_b, kCapacity).ok());  // no ASSERT: threads run
  EXPECT_TRUE(server.Close("b").ok());
  std::thread answerer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    held.Release();
  });
  EXPECT_TRUE(closing.Wait().ok());
  EXPECT_EQ(server.size(), 0u);
  answerer.join();
  client.join();
  EXPECT_EQ(server.BeginClose("a").Wait().code(), absl::StatusCode::kNotFound);
}

// CloseAll on the thread of a Closing not yet waited for joins the channel
// itself (it had waited for that Closing: a deadlock), and the Closing's
// wait then finds it gone.
TEST(ShmChannelProtocolTest, CloseAllJoinsAChannelWhoseClosingWaitsLater) {
  ShmRegistry registry;
  HeldFirstCall held;
  ShmChannelServer& server = held.server();
  Region region(registry, "w", kShmChannelHeaderBytes + 2 * kCapacity);
  ASSERT_TRUE(server.Open("w", *registry.ResolveWindow("w", "region"), kCapacity).ok());
  ShmChannelServer::Closing closing = server.BeginClose("w");
  server.CloseAll();
  EXPECT_EQ(server.size(), 0u);
  EXPECT_TRUE(closing.Wait().ok());
}

// Closing a channel while its client calls: every call ends (answered, or
// UNAVAILABLE once closed) and none hangs.
TEST(ShmChannelProtocolTest, CloseWhileCalling) {
  ShmRegistry registry;
  LateHandler handler(2);
  ShmChannelServer::Options options;
  options.spin = absl::ZeroDuration();
  options.error_bytes = PlainError;
  ShmChannelServer server(
      options, [&](auto request, auto answer) { handler(std::move(request), std::move(answer)); });
  Region region(registry, "c", kShmChannelHeaderBytes + 2 * kCapacity);
  const ShmView view = *registry.ResolveWindow("c", "region");
  ASSERT_TRUE(server.Open("c", view, kCapacity).ok());
  std::atomic<bool> closed{false};
  std::atomic<int> unavailable{0}, ok{0};
  std::thread client([&] {
    std::mt19937 rng(7);
    std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(view.data, ClientOptions());
    for (int n = 1; n <= 100000; ++n) {
      v1::RunMoERequest request = RequestOf(rng, 1);
      v1::RunMoEResponse response;
      const absl::Status s = channel->RunMoE(request, &response, absl::Seconds(5));
      if (s.ok()) ++ok;
      if (absl::IsUnavailable(s)) {
        ++unavailable;
        break;
      }
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_TRUE(closed.load());
  });
  absl::SleepFor(absl::Milliseconds(50));
  closed = true;
  ASSERT_TRUE(server.Close("c").ok());
  client.join();
  EXPECT_EQ(unavailable.load(), 1);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(server.Close("c").code(), absl::StatusCode::kNotFound);
}

// A call in flight when its channel closes is answered: the close waits
// for it, and the client reads its answer, not UNAVAILABLE; the next call
// is told the channel closed.
TEST(ShmChannelProtocolTest, AnswerInFlightAtCloseIsDelivered) {
  ShmRegistry registry;
  std::mutex mu;
  std::condition_variable cv;
  ShmChannelServer::Answer held;
  std::string held_bytes;
  bool taken = false, gate = false;
  ShmChannelServer::Options options;
  options.spin = absl::ZeroDuration();
  options.error_bytes = PlainError;
  std::vector<std::thread> answering;  // joined before the test's locals go
  ShmChannelServer server(
      options, [&](ShmChannelServer::Request request, ShmChannelServer::Answer answer) {
        answering.emplace_back([&, request = std::move(request), answer = std::move(answer)] {
          std::unique_lock<std::mutex> lock(mu);
          taken = true;
          cv.notify_all();
          cv.wait(lock, [&] { return gate; });
          v1::RunMoERequest r;
          ASSERT_TRUE(r.ParseFromString(request.bytes));
          v1::RunMoEResponse response;
          response.mutable_output()->set_data(r.hidden_states().data());
          (void)answer(absl::OkStatus(), &response);
        });
      });
  Region region(registry, "c", kShmChannelHeaderBytes + 2 * kCapacity);
  const ShmView view = *registry.ResolveWindow("c", "region");
  ASSERT_TRUE(server.Open("c", view, kCapacity).ok());
  std::unique_ptr<ShmChannel> channel = ShmChannel::Attach(view.data, ClientOptions());
  v1::RunMoERequest request;
  request.mutable_hidden_states()->set_data("in flight");
  absl::Status first;
  v1::RunMoEResponse response;
  std::thread caller([&] { first = channel->RunMoE(request, &response, absl::Seconds(10)); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return taken; });
  }
  std::thread closer([&] { EXPECT_TRUE(server.Close("c").ok()); });
  // The close has begun (a reopen is refused as closing) and waits for the answer.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!absl::IsUnavailable(server.Open("c", view, kCapacity).status()) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_LT(absl::Now(), give_up) << "the close never began";
  absl::SleepFor(absl::Milliseconds(10));
  {
    std::lock_guard<std::mutex> lock(mu);
    gate = true;
  }
  cv.notify_all();
  closer.join();
  caller.join();
  for (std::thread& t : answering) t.join();
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_EQ(response.output().data(), "in flight");
  EXPECT_EQ(channel->RunMoE(request, &response, absl::Seconds(1)).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kplan::rpc
