#include "server/rpc/shm_channels.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/shm_channel.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

// A timeout past this many microseconds (~115 days) is no timeout.
constexpr int64_t kMaxTimeoutUs = int64_t{10'000'000'000'000};
// How long past its deadline a call's answer is waited for before the
// channel gives up on it (and ends).
constexpr absl::Duration kAnswerGrace = absl::Seconds(10);

// A close from the channel's own call, which would join its own thread.
absl::Status ClosedFromItsOwnCall(const std::string& name) {
  return absl::FailedPreconditionError(
      absl::StrCat("region '", name, "''s channel cannot be closed from its own call"));
}

}  // namespace

struct ShmChannelServer::Channel {
  std::string name;
  // Holds the mapping. The region's mapping is guarded against SIGBUS
  // (server/moe/shm_fault_guard.h): once the client truncates the object,
  // every access sees private zero pages and the region is Lost().
  ShmView window;
  ShmChannelHeader* header = nullptr;
  const char* request_area = nullptr;
  int64_t request_capacity = 0;
  char* response_area = nullptr;
  int64_t response_capacity = 0;
  std::atomic<bool> stop{false};
  std::atomic<bool> serving{true};  // until the thread's loop ends
  std::thread thread;
  std::thread::id thread_id;  // the thread's, set once at Open (join clears thread's own)
  // Guarded by the server's mu_. A closing channel stays in the map until
  // its thread is joined, so that no channel opens on the region while the
  // old thread may still write its state word.
  bool stopping = false;  // stop set and the thread woken
  bool joining = false;   // a Closing::Wait or CloseAll is joining the thread
  void Stop() {           // once: a later call does nothing
    if (stopping) return;
    stopping = true;
    stop.store(true, std::memory_order_release);
    ShmChannelWake(&header->state);  // zero pages when lost: harmless
  }
  bool Lost() const { return window.region->Lost(); }
};

ShmChannelServer::ShmChannelServer(Options options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {}

ShmChannelServer::~ShmChannelServer() { CloseAll(); }

absl::StatusOr<int64_t> ShmChannelServer::Open(const std::string& name, ShmView window,
                                               int64_t request_capacity) {
  if (window.device() >= 0) {
    return InvalidField("region", absl::StrCat("region '", name,
                                               "' is CUDA device memory; a channel needs a POSIX "
                                               "shared-memory region"));
  }
  if (window.size < kShmChannelHeaderBytes + kShmChannelMinResponseBytes + 1) {
    return InvalidField(
        "region",
        absl::StrCat("region '", name, "' has ", window.size, " bytes; a channel needs at least ",
                     kShmChannelHeaderBytes + kShmChannelMinResponseBytes + 1));
  }
  const int64_t max_request = std::min(
      window.size - kShmChannelHeaderBytes - kShmChannelMinResponseBytes, options_.max_area_bytes);
  if (request_capacity <= 0 || request_capacity > max_request) {
    return InvalidField(
        "request_capacity",
        absl::StrCat("request_capacity must be in [1, ", max_request, "] for region '", name, "' (",
                     window.size, " bytes: a 64-byte header, the request, and at least ",
                     kShmChannelMinResponseBytes, " bytes for the answer; at most ",
                     options_.max_area_bytes, " bytes each); got ", request_capacity));
  }
  const int64_t response_capacity = window.size - kShmChannelHeaderBytes - request_capacity;
  if (response_capacity > options_.max_area_bytes) {
    return InvalidField("region",
                        absl::StrCat("region '", name, "' leaves ", response_capacity,
                                     " bytes for the answer; at most ", options_.max_area_bytes,
                                     " may be (register a "
                                     "smaller window)"));
  }
  KPLAN_RETURN_IF_ERROR(window.region->CheckIntact());
  if (reinterpret_cast<uintptr_t>(window.data) % alignof(ShmChannelHeader) != 0) {
    return InvalidField("region", absl::StrCat("region '", name,
                                               "' does not start 64-byte aligned in its object "
                                               "(its offset must be a multiple of 64)"));
  }
  auto channel = std::make_shared<Channel>();
  channel->name = name;
  const ShmChannelAreas areas = ShmChannelAreasAt(window.data, request_capacity);
  channel->header = areas.header;
  if (ShmChannelLoad(&channel->header->magic) != kShmChannelMagic ||
      ShmChannelLoad(&channel->header->version) != kShmChannelVersion) {
    return InvalidField(
        "region", absl::StrCat("region '", name, "' does not hold a channel header of version ",
                               kShmChannelVersion, " (magic 0x", absl::Hex(kShmChannelMagic),
                               ") at its first byte"));
  }
  channel->request_area = areas.request;
  channel->request_capacity = request_capacity;
  channel->response_area = areas.response;
  channel->response_capacity = response_capacity;
  channel->window = std::move(window);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = channels_.find(name); it != channels_.end()) {
    return WithField(
        it->second->stopping
            ? absl::UnavailableError(
                  absl::StrCat("region '", name,
                               "' has a channel that is closing; open it again once it closed"))
            : absl::AlreadyExistsError(absl::StrCat("region '", name, "' has a channel already")),
        "region");
  }
  if (channels_.size() >= options_.max_channels) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server serves at most ", options_.max_channels,
                     " shared-memory channels (--max_shm_channels); close one first"));
  }
  // A call posted before the channel opened is taken as posted; one left
  // Running or Cancelled by an earlier channel on this region is over.
  uint32_t s = channel->header->state.load(std::memory_order_acquire);
  if (s != ShmWord(ShmChannelState::kPosted)) {
    channel->header->state.compare_exchange_strong(s, ShmWord(ShmChannelState::kIdle),
                                                   std::memory_order_acq_rel);
  }
  channel->thread = std::thread([this, channel] { Serve(channel); });
  channel->thread_id = channel->thread.get_id();
  channels_.emplace(name, std::move(channel));
  return response_capacity;
}

ShmChannelServer::Closing ShmChannelServer::BeginClose(const std::string& name) {
  Closing closing;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(name);
  if (it == channels_.end()) {
    closing.status_ = WithField(
        absl::NotFoundError(absl::StrCat("region '", name, "' has no channel")), "region");
    return closing;
  }
  const std::shared_ptr<Channel>& channel = it->second;
  if (channel->thread_id == std::this_thread::get_id()) {
    closing.status_ = ClosedFromItsOwnCall(name);
    return closing;
  }
  closing.server_ = this;
  closing.channel_ = channel;
  channel->Stop();
  return closing;
}

absl::Status ShmChannelServer::Closing::Wait() {
  if (server_ == nullptr) return status_;
  if (channel_->thread_id == std::this_thread::get_id()) {  // moved to the channel's call
    return ClosedFromItsOwnCall(channel_->name);
  }
  ShmChannelServer* server = std::exchange(server_, nullptr);
  std::unique_lock<std::mutex> lock(server->mu_);
  if (!channel_->joining) {  // the first to wait joins; the others wait for it
    server->JoinLocked(lock, channel_);
  } else {
    server->closed_.wait(lock, [&] {
      auto now = server->channels_.find(channel_->name);
      return now == server->channels_.end() || now->second != channel_;
    });
  }
  channel_.reset();
  return status_;
}

ShmChannelServer::Closing::~Closing() { (void)Wait(); }

absl::Status ShmChannelServer::Close(const std::string& name) { return BeginClose(name).Wait(); }

void ShmChannelServer::JoinLocked(std::unique_lock<std::mutex>& lock,
                                  const std::shared_ptr<Channel>& channel) {
  channel->joining = true;
  lock.unlock();
  channel->thread.join();
  lock.lock();
  if (auto it = channels_.find(channel->name); it != channels_.end() && it->second == channel) {
    channels_.erase(it);
  }
  closed_.notify_all();
}

bool ShmChannelServer::Serving(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(name);
  return it != channels_.end() && it->second->serving.load(std::memory_order_acquire);
}

size_t ShmChannelServer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_.size();
}

void ShmChannelServer::CloseAll() {
  // Every channel stops taking calls at once, then each is joined: a close
  // waits for the call in flight, so one at a time the waits would add up.
  // Nothing here allocates (it runs in the destructor).
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& [name, channel] : channels_) {
    channel->Stop();
  }
  while (!channels_.empty()) {
    std::shared_ptr<Channel> next;
    for (const auto& [name, channel] : channels_) {
      if (!channel->joining) {
        next = channel;
        break;
      }
    }
    if (next == nullptr) {
      closed_.wait(lock);  // the rest are a Close's to join
      continue;
    }
    next->Stop();  // opened since the loop above
    JoinLocked(lock, next);
  }
}

void ShmChannelServer::Serve(const std::shared_ptr<Channel>& channel) {
  std::atomic<uint32_t>* state = &channel->header->state;
  absl::Time spin_until = absl::InfinitePast();
  while (!channel->stop.load(std::memory_order_acquire) && !channel->Lost()) {
    const uint32_t s = state->load(std::memory_order_acquire);
    if (s == ShmWord(ShmChannelState::kPosted)) {
      RunOne(channel);
      spin_until = absl::Now() + options_.spin;
      continue;
    }
    if (s == ShmWord(ShmChannelState::kCancelled)) {
      // Taken back before this thread took it (no call of it runs here).
      uint32_t cancelled = s;
      if (state->compare_exchange_strong(cancelled, ShmWord(ShmChannelState::kIdle),
                                         std::memory_order_acq_rel)) {
        ShmChannelWake(state);
      }
      continue;
    }
    // Sleeping on the word costs the client a wake-up (a system call and a
    // thread switch), so only after a while without calls. At least every
    // 50 ms the loop looks at the region again (a truncated one reads Idle).
    const absl::Time now = absl::Now();
    ShmChannelAwaitChange(state, s, std::max(spin_until - now, absl::ZeroDuration()),
                          now + absl::Milliseconds(50), absl::Milliseconds(50), &channel->stop);
  }
  channel->serving.store(false, std::memory_order_release);
  if (channel->Lost()) {
    spdlog::warn("shared-memory channel '{}': its object was truncated; channel ended",
                 channel->name);
  }
  // Closed whatever the word held: a client reading Closed right after its
  // call's Done finds the answer still there (response_sequence is its own).
  state->exchange(ShmWord(ShmChannelState::kClosed), std::memory_order_acq_rel);
  ShmChannelWake(state);
}

namespace {

// One request's answer, shared by the handler's callback and the channel's
// thread that waits for it.
struct Pending {
  std::atomic<bool> answered{false};
  absl::Status written;  // what the first answer wrote (set before done)
  absl::Notification done;
};

}  // namespace

void ShmChannelServer::RunOne(const std::shared_ptr<Channel>& channel) {
  ShmChannelHeader* header = channel->header;
  uint32_t expected = ShmWord(ShmChannelState::kPosted);
  if (!header->state.compare_exchange_strong(expected, ShmWord(ShmChannelState::kRunning),
                                             std::memory_order_acq_rel)) {
    return;  // the client took it back
  }
  const absl::Time start = absl::Now();
  const uint64_t request_bytes = ShmChannelLoad(&header->request_bytes);
  const int64_t timeout_us = ShmChannelLoad(&header->timeout_us);
  const uint64_t sequence = ShmChannelLoad(&header->sequence);

  std::shared_ptr<Pending> pending;
  Answer answer;
  try {
    pending = std::make_shared<Pending>();
    // The channel is held by the answer: a handler that answers after the
    // thread gave up (below) writes into a mapping that still exists.
    answer = [this, channel, sequence, pending](
                 const absl::Status& status,
                 const google::protobuf::MessageLite* response) -> absl::Status {
      if (pending->answered.exchange(true)) {
        pending->done.WaitForNotification();
        return pending->written;
      }
      // WriteAnswer throws nothing; were it ever to, the waiters still wake.
      absl::Cleanup notify = [&pending] { pending->done.Notify(); };
      pending->written = WriteAnswer(*channel, sequence, status, response);
      return pending->written;
    };
  } catch (const std::bad_alloc&) {  // the call is answered all the same, with its code
    (void)WriteAnswer(*channel, sequence, absl::Status(absl::StatusCode::kResourceExhausted, ""),
                      nullptr);
    return;
  }
  absl::Time deadline = absl::InfiniteFuture();
  if (timeout_us > 0) deadline = start + absl::Microseconds(std::min(timeout_us, kMaxTimeoutUs));
  if (options_.max_call_time > absl::ZeroDuration()) {
    deadline = std::min(deadline, start + options_.max_call_time);
  }
  try {
    if (request_bytes > static_cast<uint64_t>(channel->request_capacity)) {
      (void)answer(InvalidField("request_bytes",
                                absl::StrCat("the request's ", request_bytes,
                                             " bytes exceed the channel's request capacity of ",
                                             channel->request_capacity, " bytes")),
                   nullptr);
      return;
    }
    Request request;
    request.start = start;
    request.deadline = deadline;
    // Not the channel closing: a close waits for the call in flight, whose
    // client then reads its answer.
    request.cancelled = [channel, deadline] {
      return channel->Lost() ||
             channel->header->state.load(std::memory_order_acquire) ==
                 ShmWord(ShmChannelState::kCancelled) ||
             absl::Now() >= deadline;
    };
    // A truncation during the copy leaves zeros, which fail to parse.
    request.bytes.assign(channel->request_area, static_cast<size_t>(request_bytes));
    handler_(std::move(request), answer);
  } catch (const std::bad_alloc&) {
    (void)answer(out_of_memory_, nullptr);
  } catch (const std::exception& e) {
    spdlog::error("shared-memory channel '{}': {}", channel->name, e.what());
    (void)answer(failed_, nullptr);
  }
  if (deadline == absl::InfiniteFuture()) {
    pending->done.WaitForNotification();
  } else if (!pending->done.WaitForNotificationWithDeadline(deadline + kAnswerGrace)) {
    // Every path answers its call (the device workers drop what is past its
    // deadline); if one ever does not, the channel ends rather than hang
    // its close and the server's shutdown. The call is answered here, so a
    // late answer writes nothing (not into a later channel's call).
    spdlog::error(
        "shared-memory channel '{}': call {} not answered {} past its deadline; "
        "channel ended",
        channel->name, sequence, absl::FormatDuration(kAnswerGrace));
    (void)answer(absl::DeadlineExceededError("the server gave up waiting for the call's answer"),
                 nullptr);
    channel->stop.store(true, std::memory_order_release);
  }
}

absl::Status ShmChannelServer::WriteAnswer(Channel& channel, uint64_t sequence,
                                           const absl::Status& status,
                                           const google::protobuf::MessageLite* response) noexcept {
  ShmChannelHeader* header = channel.header;
  std::atomic<uint32_t>* state = &header->state;
  absl::Status outcome = status;
  if (outcome.ok()) {
    const size_t size = response->ByteSizeLong();
    if (static_cast<int64_t>(size) > channel.response_capacity) {
      try {
        outcome =
            WithField(absl::ResourceExhaustedError(absl::StrCat(
                          "the answer's ", size, " bytes exceed the channel's answer area of ",
                          channel.response_capacity,
                          " bytes: open the channel on a larger region or with a smaller "
                          "request_capacity, or have the output written to a region (output_shm)")),
                      "request_capacity");
      } catch (...) {  // out of memory for the message: the code alone
        outcome = absl::Status(absl::StatusCode::kResourceExhausted, "");
      }
    }
  }
  uint32_t s = state->load(std::memory_order_acquire);
  if (s == ShmWord(ShmChannelState::kRunning)) {
    // Past a truncation these writes land in zero pages (the guard): lost,
    // not a fault.
    uint64_t bytes = 0;
    if (outcome.ok()) {
      response->SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(channel.response_area));
      bytes = response->GetCachedSize();
    } else {
      std::string error;
      try {
        error = options_.error_bytes(outcome);
      } catch (...) {  // out of memory: the client reads the code alone
        error.clear();
      }
      if (static_cast<int64_t>(error.size()) > channel.response_capacity) {
        error.clear();  // not with 4 KiB; the client then reads the code alone
      }
      std::memcpy(channel.response_area, error.data(), error.size());
      bytes = error.size();
    }
    // absl's canonical codes, which are gRPC's numbers.
    ShmChannelStore(&header->status_code, static_cast<int32_t>(outcome.code()));
    ShmChannelStore(&header->response_bytes, bytes);
    ShmChannelStore(&header->response_sequence, sequence);
    if (state->compare_exchange_strong(s, ShmWord(ShmChannelState::kDone),
                                       std::memory_order_acq_rel)) {
      ShmChannelWake(state);
      return outcome;
    }
  }
  // The client gave up on this call: the channel is free again.
  if (s == ShmWord(ShmChannelState::kCancelled)) {
    state->compare_exchange_strong(s, ShmWord(ShmChannelState::kIdle), std::memory_order_acq_rel);
    ShmChannelWake(state);
  }
  return outcome;
}

}  // namespace kplan::rpc
