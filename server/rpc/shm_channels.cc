#include "server/rpc/shm_channels.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/shm_channel.h"
#include "base/status.h"
#include "google/rpc/status.pb.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

// A timeout past this many microseconds (~115 days) is no timeout.
constexpr int64_t kMaxTimeoutUs = int64_t{10'000'000'000'000};

}  // namespace

struct ShmChannelServer::Channel {
  std::string name;
  ShmView window;  // holds the mapping
  ShmChannelHeader* header = nullptr;
  const char* request_area = nullptr;
  int64_t request_capacity = 0;
  char* response_area = nullptr;
  int64_t response_capacity = 0;
  std::atomic<bool> stop{false};
  // Set when the region no longer covers the window: nothing of it may be
  // touched again (SIGBUS), not even the state word.
  std::atomic<bool> lost{false};
  std::thread thread;
};

ShmChannelServer::ShmChannelServer(Options options, Handler handler)
    : options_(options), handler_(std::move(handler)) {}

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
  const int64_t max_request = window.size - kShmChannelHeaderBytes - kShmChannelMinResponseBytes;
  if (request_capacity <= 0 || request_capacity > max_request) {
    return InvalidField(
        "request_capacity",
        absl::StrCat("request_capacity must be in [1, ", max_request, "] for region '", name, "' (",
                     window.size, " bytes: a 64-byte header, the request, and at least ",
                     kShmChannelMinResponseBytes, " bytes for the answer); got ",
                     request_capacity));
  }
  KPLAN_RETURN_IF_ERROR(window.region->CheckIntact());
  if (reinterpret_cast<uintptr_t>(window.data) % alignof(ShmChannelHeader) != 0) {
    return InvalidField("region", absl::StrCat("region '", name,
                                               "' does not start 64-byte aligned in its object "
                                               "(its offset must be a multiple of 64)"));
  }
  auto channel = std::make_unique<Channel>();
  channel->name = name;
  channel->header = reinterpret_cast<ShmChannelHeader*>(window.data);
  if (ShmChannelLoad(&channel->header->magic) != kShmChannelMagic ||
      ShmChannelLoad(&channel->header->version) != kShmChannelVersion) {
    return InvalidField(
        "region", absl::StrCat("region '", name, "' does not hold a channel header of version ",
                               kShmChannelVersion, " (magic 0x", absl::Hex(kShmChannelMagic),
                               ") at its first byte"));
  }
  channel->request_area = window.data + kShmChannelHeaderBytes;
  channel->request_capacity = request_capacity;
  channel->response_area = window.data + kShmChannelHeaderBytes + request_capacity;
  channel->response_capacity = window.size - kShmChannelHeaderBytes - request_capacity;
  channel->window = std::move(window);
  const int64_t response_capacity = channel->response_capacity;
  Channel* raw = channel.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (channels_.count(name) != 0) {
      return WithField(
          absl::AlreadyExistsError(absl::StrCat("region '", name, "' has a channel already")),
          "region");
    }
    if (channels_.size() >= options_.max_channels) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this server serves at most ", options_.max_channels,
                       " shared-memory channels (--max_shm_channels); close one first"));
    }
    // A call posted before the channel opened is taken as posted; one left
    // Running or Cancelled by an earlier channel on this region is over.
    uint32_t s = raw->header->state.load(std::memory_order_acquire);
    if (s != ShmWord(ShmChannelState::kPosted)) {
      raw->header->state.compare_exchange_strong(s, ShmWord(ShmChannelState::kIdle),
                                                 std::memory_order_acq_rel);
    }
    raw->thread = std::thread([this, raw] { Serve(raw); });
    channels_.emplace(name, std::move(channel));
  }
  return response_capacity;
}

absl::Status ShmChannelServer::Close(const std::string& name) {
  std::unique_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(name);
    if (it == channels_.end()) {
      return WithField(absl::NotFoundError(absl::StrCat("region '", name, "' has no channel")),
                       "region");
    }
    channel = std::move(it->second);
    channels_.erase(it);
  }
  channel->stop.store(true, std::memory_order_release);
  if (!channel->lost.load()) ShmChannelWake(&channel->header->state);
  channel->thread.join();
  return absl::OkStatus();
}

bool ShmChannelServer::Has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_.count(name) != 0;
}

size_t ShmChannelServer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_.size();
}

void ShmChannelServer::CloseAll() {
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, channel] : channels_) names.push_back(name);
  }
  for (const std::string& name : names) (void)Close(name);
}

void ShmChannelServer::Serve(Channel* channel) {
  std::atomic<uint32_t>* state = &channel->header->state;
  absl::Time spin_until = absl::InfinitePast();
  while (!channel->stop.load(std::memory_order_acquire) && !channel->lost.load()) {
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
    // thread switch), so only after a while without calls.
    ShmChannelAwaitChange(state, s, std::max(spin_until - absl::Now(), absl::ZeroDuration()),
                          absl::InfiniteFuture(), absl::Milliseconds(50), &channel->stop);
  }
  if (!channel->lost.load()) {
    state->store(ShmWord(ShmChannelState::kClosed), std::memory_order_release);
    ShmChannelWake(state);
  }
}

namespace {

// One request's answer, shared by the handler's callback and the channel's
// thread that waits for it.
struct Pending {
  std::atomic<bool> answered{false};
  absl::Notification done;
};

// An error as the answer area holds it: a google.rpc.Status, the one the
// gRPC path would send in its trailers (with the field when one is named),
// its message cut to fit.
std::string ErrorBytes(const absl::Status& status, int64_t capacity) {
  const grpc::Status g = ToGrpcStatus(status);
  std::string bytes = g.error_details();
  if (bytes.empty() || static_cast<int64_t>(bytes.size()) > capacity) {
    google::rpc::Status plain;
    plain.set_code(g.error_code());
    plain.set_message(
        g.error_message().substr(0, static_cast<size_t>(std::max<int64_t>(0, capacity - 16))));
    bytes = plain.SerializeAsString();
  }
  return bytes;
}

}  // namespace

void ShmChannelServer::RunOne(Channel* channel) {
  ShmChannelHeader* header = channel->header;
  uint32_t expected = ShmWord(ShmChannelState::kPosted);
  if (!header->state.compare_exchange_strong(expected, ShmWord(ShmChannelState::kRunning),
                                             std::memory_order_acq_rel)) {
    return;  // the client took it back
  }
  const absl::Time start = absl::Now();
  if (!channel->window.region->CheckIntact().ok()) {
    spdlog::warn("shared-memory channel '{}': its object was truncated; channel stopped",
                 channel->name);
    channel->lost.store(true);
    return;
  }
  const uint64_t request_bytes = ShmChannelLoad(&header->request_bytes);
  const int64_t timeout_us = ShmChannelLoad(&header->timeout_us);
  const uint64_t sequence = ShmChannelLoad(&header->sequence);

  auto pending = std::make_shared<Pending>();
  Answer answer = [this, channel, sequence, pending](
                      const absl::Status& status, const google::protobuf::MessageLite* response) {
    if (pending->answered.exchange(true)) return;  // once
    WriteAnswer(channel, sequence, status, response);
    pending->done.Notify();
  };

  if (request_bytes > static_cast<uint64_t>(channel->request_capacity)) {
    answer(InvalidField("request_bytes",
                        absl::StrCat("the request's ", request_bytes,
                                     " bytes exceed the channel's request capacity of ",
                                     channel->request_capacity, " bytes")),
           nullptr);
    return;
  }
  Request request;
  request.start = start;
  request.deadline = absl::InfiniteFuture();
  if (timeout_us > 0) {
    request.deadline = start + absl::Microseconds(std::min(timeout_us, kMaxTimeoutUs));
  }
  if (options_.max_call_time > absl::ZeroDuration()) {
    request.deadline = std::min(request.deadline, start + options_.max_call_time);
  }
  const absl::Time deadline = request.deadline;
  request.cancelled = [channel, deadline] {
    return channel->stop.load(std::memory_order_acquire) || channel->lost.load() ||
           channel->header->state.load(std::memory_order_acquire) ==
               ShmWord(ShmChannelState::kCancelled) ||
           absl::Now() >= deadline;
  };
  try {
    request.bytes.assign(channel->request_area, static_cast<size_t>(request_bytes));
    handler_(std::move(request), answer);
  } catch (const std::bad_alloc&) {
    answer(absl::ResourceExhaustedError("out of memory for the channel's request"), nullptr);
  } catch (const std::exception& e) {
    spdlog::error("shared-memory channel '{}': {}", channel->name, e.what());
    answer(absl::InternalError("the server failed on the channel's request"), nullptr);
  }
  pending->done.WaitForNotification();
}

void ShmChannelServer::WriteAnswer(Channel* channel, uint64_t sequence, const absl::Status& status,
                                   const google::protobuf::MessageLite* response) {
  ShmChannelHeader* header = channel->header;
  std::atomic<uint32_t>* state = &header->state;
  if (channel->lost.load()) return;
  if (!channel->window.region->CheckIntact().ok()) {
    channel->lost.store(true);
    return;
  }
  uint32_t s = state->load(std::memory_order_acquire);
  if (s == ShmWord(ShmChannelState::kRunning)) {
    absl::Status outcome = status;
    uint64_t bytes = 0;
    if (outcome.ok()) {
      const size_t size = response->ByteSizeLong();
      if (static_cast<int64_t>(size) > channel->response_capacity) {
        outcome =
            WithField(absl::ResourceExhaustedError(absl::StrCat(
                          "the answer's ", size, " bytes exceed the channel's answer area of ",
                          channel->response_capacity,
                          " bytes: open the channel on a larger region or with a smaller "
                          "request_capacity, or have the output written to a region (output_shm)")),
                      "request_capacity");
      } else {
        response->SerializeWithCachedSizesToArray(
            reinterpret_cast<uint8_t*>(channel->response_area));
        bytes = size;
      }
    }
    if (!outcome.ok()) {
      const std::string error = ErrorBytes(outcome, channel->response_capacity);
      std::memcpy(channel->response_area, error.data(), error.size());
      bytes = error.size();
    }
    ShmChannelStore(&header->status_code, static_cast<int32_t>(outcome.code()));
    ShmChannelStore(&header->response_bytes, bytes);
    ShmChannelStore(&header->response_sequence, sequence);
    if (state->compare_exchange_strong(s, ShmWord(ShmChannelState::kDone),
                                       std::memory_order_acq_rel)) {
      ShmChannelWake(state);
      return;
    }
  }
  // The client gave up on this call: the channel is free again.
  if (s == ShmWord(ShmChannelState::kCancelled)) {
    state->compare_exchange_strong(s, ShmWord(ShmChannelState::kIdle), std::memory_order_acq_rel);
    ShmChannelWake(state);
  }
}

}  // namespace kplan::rpc
