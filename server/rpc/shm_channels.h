// The server's side of the shared-memory call channels (base/shm_channel.h;
// issue #15): a RunMoE whose request and answer travel through a client's
// registered POSIX region, with no gRPC on the call path. OpenShmChannel
// (an authorised gRPC call) gives a region a channel and a thread that
// waits on its state word: it spins for a while after each answer (a client
// in a loop posts its next call within microseconds), then sleeps on the
// word's futex. The thread copies the request out of the region, hands it
// to the handler (RunMoE's, in moe_handlers.cc), waits for the answer and
// writes it back. Everything the client wrote is bounded before it is
// used; a client that breaks the protocol only breaks its own calls.
//
// This class is the transport alone: it knows the layout, not RunMoE.
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "server/moe/shm_regions.h"

namespace kplan::rpc {

class ShmChannelServer {
  struct Channel;  // shm_channels.cc

 public:
  // One request read from a channel.
  struct Request {
    std::string bytes;    // copied out of the region
    absl::Time start;     // when the server took it
    absl::Time deadline;  // from the client's timeout, capped by max_call_time
    std::function<bool()>
        cancelled;  // the client gave up, the deadline passed, or the region was lost
  };
  // Answers a request, once, from any thread: `response` (OK) is serialized
  // into the answer area; an error as Options::error_bytes makes it. Returns
  // the outcome the client reads: `status`, or RESOURCE_EXHAUSTED naming
  // "request_capacity" for a response too large for the area (a second
  // call of it: the first's).
  using Answer = std::function<absl::Status(const absl::Status& status,
                                            const google::protobuf::MessageLite* response)>;
  using Handler = std::function<void(Request request, Answer answer)>;

  struct Options {
    size_t max_channels = 64;
    // How long a channel's thread spins on the state word after an answer
    // before it sleeps (0: it sleeps at once).
    absl::Duration spin = absl::Microseconds(50);
    // The longest a call may run (--max_request_time); zero: no cap. A
    // call not answered by then plus a grace of 10 s ends its channel.
    absl::Duration max_call_time = absl::ZeroDuration();
    // The largest request or answer area (--max_message_bytes, as gRPC's).
    int64_t max_area_bytes = int64_t{64} << 20;
    // An error as the answer area holds it: a serialized google.rpc.Status
    // (the server's: rpc::StatusProtoBytes, the one status mapping).
    std::function<std::string(const absl::Status&)> error_bytes;
  };

  ShmChannelServer(Options options, Handler handler);
  ~ShmChannelServer();  // CloseAll()
  ShmChannelServer(const ShmChannelServer&) = delete;
  ShmChannelServer& operator=(const ShmChannelServer&) = delete;

  // Gives region `name` (its whole window, `window`) a channel and returns
  // the answer area's bytes. Errors name the request's fields:
  // INVALID_ARGUMENT "region" for a CUDA region, a window whose header
  // lacks the magic and version, or an answer area past max_area_bytes;
  // "request_capacity" for one that leaves no kShmChannelMinResponseBytes
  // for the answer, is past max_area_bytes, or is not positive;
  // ALREADY_EXISTS "region" when it has a channel (UNAVAILABLE while that
  // channel closes); RESOURCE_EXHAUSTED past
  // max_channels.
  absl::StatusOr<int64_t> Open(const std::string& name, ShmView window, int64_t request_capacity);
  // Stops the channel's thread after its call in flight (if any) has been
  // answered, and marks the channel Closed. NOT_FOUND "region" when the
  // region has none; a channel another Close is closing is waited for. Until
  // the close returns, Open on the region is UNAVAILABLE "region".
  absl::Status Close(const std::string& name);
  // Close in two steps: BeginClose stops the channel taking calls at once
  // (a later Open on the region is UNAVAILABLE), Closing::Wait (or the
  // Closing's destructor) waits for its call in flight and its thread, and
  // answers what Close answers. So a caller can stop a channel under a lock
  // of its own and wait for it outside. Whoever waits first (a Closing, or
  // CloseAll) joins the thread, the others wait for that; a Closing must not
  // outlive its server.
  class Closing {
   public:
    Closing() = default;
    Closing(Closing&& other) noexcept
        : server_(std::exchange(other.server_, nullptr)),
          channel_(std::move(other.channel_)),
          status_(std::move(other.status_)) {}
    Closing& operator=(Closing&&) = delete;
    ~Closing();
    absl::Status Wait();

   private:
    friend class ShmChannelServer;
    ShmChannelServer* server_ = nullptr;  // null: nothing to wait for
    std::shared_ptr<Channel> channel_;
    absl::Status status_;
  };
  Closing BeginClose(const std::string& name);
  void CloseAll();
  // Channels open (their threads may have ended: a region truncated, a
  // call never answered); a channel stays until closed.
  size_t size() const;
  // Whether region `name` has a channel whose thread still serves it.
  bool Serving(const std::string& name) const;

 private:
  void Serve(const std::shared_ptr<Channel>& channel);
  void RunOne(const std::shared_ptr<Channel>& channel);
  // Marks `channel` (stopped, not yet joining) joining, joins its thread
  // with `lock` (on mu_) released, and takes the channel out of the map.
  void JoinLocked(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Channel>& channel);
  // Throws nothing: out of memory for an error's bytes, it writes the code alone.
  absl::Status WriteAnswer(Channel& channel, uint64_t sequence, const absl::Status& status,
                           const google::protobuf::MessageLite* response) noexcept;

  const Options options_;
  const Handler handler_;
  // The answers to an exception in a call, built with the server, so that
  // answering one allocates nothing.
  const absl::Status out_of_memory_ =
      absl::ResourceExhaustedError("out of memory for the channel's request");
  const absl::Status failed_ = absl::InternalError("the server failed on the channel's request");
  mutable std::mutex mu_;
  // Shared with the answers of calls in flight, which may outlive a channel
  // whose thread gave up on them.
  std::map<std::string, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::condition_variable closed_;  // a channel left channels_
};

}  // namespace kplan::rpc
