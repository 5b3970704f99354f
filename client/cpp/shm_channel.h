// RunMoE through a shared-memory call channel (base/shm_channel.h): for a
// client on the server's host, a call without gRPC on its path. Open()
// creates and registers a POSIX region (ClientShmRegion), writes the
// channel header and asks the server to serve it (OpenShmChannel; the server
// needs --allow_shared_memory). Each RunMoE then writes the serialized
// request into the region, flips the state word, and waits for the answer:
// it polls for `spin`, then sleeps on the word's futex. Tensors may still be
// references into other registered regions (ClientShmRegion::Place), so a
// large call moves no bytes through the channel at all.
//
// One call at a time: a channel is for one thread (open one per thread).
// The destructor closes the channel and then the region (errors ignored:
// the server may be gone).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_region.h"
#include "kplan/v1/service.pb.h"

namespace kplan {

struct ShmChannelHeader;  // base/shm_channel.h

class ShmChannel {
 public:
  struct Options {
    int64_t request_capacity = 1 << 20;   // the largest request, serialized
    int64_t response_capacity = 1 << 20;  // the largest answer (at least 4096)
    // How long a call polls for its answer before it sleeps.
    absl::Duration spin = absl::Microseconds(50);
    // The region object's permissions (ClientShmRegion::Create): 0660 for
    // a server of another user in the object's group (the sidecar pod).
    mode_t mode = 0600;
    // At or past this many bytes of inline hidden states (1 MiB: 256
    // tokens of hidden size 2048), the hidden states, inline router logits
    // and the output go into the request area's tail, and the request names
    // them as references into the channel's own region (output_shm for the
    // output), so the server reads and writes them in place as it does any
    // shm tensor: no request bytes copied out, no megabytes parsed or
    // serialized. RunMoE still answers with the output's bytes inline. A
    // call whose tensors do not fit the area this way goes serialized (with
    // the default 1 MiB areas, every call: open larger areas for calls this
    // large). 0: every call; negative: never. Measured with 32 MiB areas
    // (docs/PERF.md, session 32): 512 tokens of Qwen3-30B-A3B (2 MiB)
    // 2833-3002 us a round trip serialized, 1543-1650 in the region; at 64
    // tokens (256 KiB) the same median but a p99 of 1224 us against 780,
    // hence the threshold above it. A placed call that runs past the
    // server's call-time cap fails CANCELLED naming output_shm (its output
    // is not written after the deadline), where a serialized one answers.
    int64_t in_region_from_bytes = int64_t{1} << 20;
  };

  static absl::StatusOr<std::unique_ptr<ShmChannel>> Open(Client& client, Options options);
  // A channel over memory the caller mapped (kShmChannelHeaderBytes +
  // request_capacity + response_capacity bytes at `base`, 64-byte aligned),
  // initialised (ShmChannelInit) and had a server open: Open does all of
  // that. Nothing is owned; the destructor closes nothing.
  static std::unique_ptr<ShmChannel> Attach(char* base, Options options);
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // RunMoE as Client::RunMoE answers it (the server's status, with the field
  // it names), within `timeout` (InfiniteDuration: the client's deadline).
  // Large inline tensors may ride in the region (Options::in_region_from_bytes);
  // their bytes belong to the call until it is answered or let go of, one
  // more reason for one thread per channel.
  // DEADLINE_EXCEEDED when no answer came in time: the call is abandoned,
  // and the next call first waits (within its own timeout) for the server to
  // let go of it. UNAVAILABLE when the server closed the channel (close,
  // unregister, shutdown). INVALID_ARGUMENT naming "request" when the
  // request does not fit the channel.
  absl::Status RunMoE(const v1::RunMoERequest& request, v1::RunMoEResponse* response,
                      absl::Duration timeout = absl::InfiniteDuration());

  // The region's name (empty for an attached channel).
  const std::string& region() const { return region_ != nullptr ? region_->name() : no_region_; }

 private:
  ShmChannel() = default;
  void Point(char* base);  // the header and areas at `base`, as options_ lays them out
  // Where a call's tensors ride in the request area's tail (offsets in the
  // area); none when the call goes as serialized bytes.
  struct InRegion {
    int64_t hidden = 0, logits = -1, output = 0, output_bytes = 0;
  };
  std::optional<InRegion> PlaceInRegion(const v1::RunMoERequest& request,
                                        v1::RunMoERequest* envelope);
  Client* client_ = nullptr;  // null when attached
  Options options_;
  std::unique_ptr<ClientShmRegion> region_;
  bool open_ = false;  // the server serves it: closed by the destructor
  ShmChannelHeader* header_ = nullptr;
  char* request_area_ = nullptr;
  const char* response_area_ = nullptr;
  int64_t response_capacity_ = 0;
  uint64_t sequence_ = 0;
  inline static const std::string no_region_;
};

}  // namespace kplan
