#include "client/cpp/shm_channel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/shm_channel.h"
#include "base/status.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/util/field_mask_util.h"
#include "google/rpc/status.pb.h"

namespace kplan {
namespace {

// How long one sleep on the state word lasts before the deadline is checked.
constexpr absl::Duration kSlice = absl::Milliseconds(20);

absl::Status Closed() {
  return absl::UnavailableError(
      "the server closed the shared-memory channel (CloseShmChannel, its region unregistered, "
      "or the server stopping)");
}

// Every field of the request but the bytes (and shm) of the tensors that
// ride in the region (hidden_states, and router_logits when
// `logits_placed`): a field added to RunMoERequest or Tensor later travels
// without a change here.
google::protobuf::FieldMask MakeEnvelopeMask(bool logits_placed) {
  google::protobuf::FieldMask mask;
  const google::protobuf::Descriptor* d = v1::RunMoERequest::descriptor();
  const google::protobuf::Descriptor* t = v1::Tensor::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const bool placed =
        f->number() == v1::RunMoERequest::kHiddenStatesFieldNumber ||
        (logits_placed && f->number() == v1::RunMoERequest::kRouterLogitsFieldNumber);
    if (!placed) {
      mask.add_paths(f->name());
      continue;
    }
    for (int j = 0; j < t->field_count(); ++j) {
      const int n = t->field(j)->number();
      if (n == v1::Tensor::kDataFieldNumber || n == v1::Tensor::kShmFieldNumber) continue;
      mask.add_paths(absl::StrCat(f->name(), ".", t->field(j)->name()));
    }
  }
  return mask;
}

const google::protobuf::FieldMask& EnvelopeMask(bool logits_placed) {
  static const auto* const masks =
      new google::protobuf::FieldMask[2]{MakeEnvelopeMask(false), MakeEnvelopeMask(true)};
  return masks[logits_placed ? 1 : 0];
}

// ParseFromArray into `response`, but keeping its output bytes' buffer:
// ParseFromArray clears the message, which deletes the output submessage, so
// a caller that reuses its response would still get a fresh allocation for
// every answer's output (2 MiB at 512 Qwen3 tokens), and its first-touch
// page faults cost more than the copy (docs/PERF.md, session 30). One
// difference: an answer without an output leaves has_output() true, on an
// empty Tensor (the server's answers always carry one). The unsafe_arena
// pair hands the Tensor back to the message that owned it (release_output
// would copy it out of an arena).
bool ParseKeepingOutput(const char* data, int size, v1::RunMoEResponse* response) {
  v1::Tensor* output = response->unsafe_arena_release_output();
  response->Clear();
  if (output != nullptr) {
    output->Clear();  // a cleared string keeps its capacity
    response->unsafe_arena_set_allocated_output(output);
  }
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(data), size);
  return response->MergeFromCodedStream(&in) && in.ConsumedEntireMessage();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Open(Client& client, Options options) {
  if (options.request_capacity <= 0) {
    return InvalidField("request_capacity", "a channel's request_capacity must be positive");
  }
  if (options.response_capacity < kShmChannelMinResponseBytes) {
    return InvalidField("response_capacity",
                        absl::StrCat("a channel's response_capacity must be at least ",
                                     kShmChannelMinResponseBytes, " bytes"));
  }
  std::unique_ptr<ShmChannel> channel(new ShmChannel());
  channel->client_ = &client;
  channel->options_ = options;
  const int64_t bytes =
      kShmChannelHeaderBytes + options.request_capacity + options.response_capacity;
  KPLAN_ASSIGN_OR_RETURN(channel->region_,
                         ClientShmRegion::Create(client, bytes, "channel", options.mode));
  char* base = channel->region_->data();  // page-aligned
  ShmChannelInit(base);
  channel->Point(base);
  KPLAN_ASSIGN_OR_RETURN(v1::OpenShmChannelResponse opened,
                         client.OpenShmChannel(channel->region(), options.request_capacity));
  channel->open_ = true;
  if (opened.response_capacity() != options.response_capacity) {
    return absl::InternalError(absl::StrCat("the server reports an answer area of ",
                                            opened.response_capacity(), " bytes, not ",
                                            options.response_capacity));
  }
  return channel;
}

std::unique_ptr<ShmChannel> ShmChannel::Attach(char* base, Options options) {
  std::unique_ptr<ShmChannel> channel(new ShmChannel());
  channel->options_ = options;
  channel->Point(base);
  return channel;
}

void ShmChannel::Point(char* base) {
  const ShmChannelAreas areas = ShmChannelAreasAt(base, options_.request_capacity);
  header_ = areas.header;
  request_area_ = areas.request;
  response_area_ = areas.response;
  response_capacity_ = options_.response_capacity;
  // Past the calls already made on this header (an attached channel), so
  // that no earlier answer passes for one of ours.
  sequence_ = ShmChannelLoad(&header_->sequence);
}

ShmChannel::~ShmChannel() {
  // A channel the server closed (or never opened) needs no CloseShmChannel.
  if (open_ &&
      header_->state.load(std::memory_order_acquire) != ShmWord(ShmChannelState::kClosed)) {
    (void)client_->CloseShmChannel(region());
  }
  // region_ unregisters, unmaps and unlinks.
}

std::optional<ShmChannel::InRegion> ShmChannel::PlaceInRegion(const v1::RunMoERequest& request,
                                                              v1::RunMoERequest* envelope) {
  const v1::Tensor& hidden = request.hidden_states();
  const auto hidden_bytes = static_cast<int64_t>(hidden.data().size());
  if (region_ == nullptr || options_.in_region_from_bytes < 0 || hidden_bytes == 0 ||
      hidden_bytes < options_.in_region_from_bytes || hidden.has_shm() ||
      request.has_output_shm()) {
    return std::nullopt;
  }
  const v1::Tensor& logits = request.router_logits();
  const auto logits_bytes = static_cast<int64_t>(logits.data().size());
  const bool logits_placed = logits_bytes > 0 && !logits.has_shm();
  // From the area's end down, 64-byte aligned: output, logits, hidden.
  const auto down64 = [](int64_t x) { return x & ~int64_t{63}; };
  InRegion at;
  at.output_bytes = hidden_bytes;  // [M, H] in the hidden states' dtype
  at.output = down64(options_.request_capacity - at.output_bytes);
  int64_t below = at.output;
  if (logits_placed) below = at.logits = down64(below - logits_bytes);
  at.hidden = down64(below - hidden_bytes);
  if (at.hidden <= 0) return std::nullopt;
  google::protobuf::util::FieldMaskUtil::MergeMessageTo(
      request, EnvelopeMask(logits_placed), google::protobuf::util::FieldMaskUtil::MergeOptions(),
      envelope);
  const int64_t area_in_region = request_area_ - region_->data();
  *envelope->mutable_hidden_states()->mutable_shm() =
      region_->Ref(area_in_region + at.hidden, hidden_bytes);
  if (logits_placed) {
    *envelope->mutable_router_logits()->mutable_shm() =
        region_->Ref(area_in_region + at.logits, logits_bytes);
  }
  *envelope->mutable_output_shm() = region_->Ref(area_in_region + at.output, at.output_bytes);
  if (static_cast<int64_t>(envelope->ByteSizeLong()) > at.hidden) return std::nullopt;
  std::memcpy(request_area_ + at.hidden, hidden.data().data(), hidden_bytes);
  if (logits_placed) std::memcpy(request_area_ + at.logits, logits.data().data(), logits_bytes);
  return at;
}

absl::Status ShmChannel::RunMoE(const v1::RunMoERequest& request, v1::RunMoEResponse* response,
                                absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    timeout = client_ != nullptr ? client_->options().deadline : absl::Seconds(10);
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::atomic<uint32_t>* state = &header_->state;
  uint32_t s = state->load(std::memory_order_acquire);
  // An abandoned call (Posted, Running, Cancelled) holds the channel until
  // the server lets go of it.
  while (s != ShmWord(ShmChannelState::kIdle) && s != ShmWord(ShmChannelState::kDone)) {
    if (s == ShmWord(ShmChannelState::kClosed)) return Closed();
    if (s == ShmWord(ShmChannelState::kPosted) || s == ShmWord(ShmChannelState::kRunning)) {
      state->compare_exchange_strong(s, ShmWord(ShmChannelState::kCancelled),
                                     std::memory_order_acq_rel);
      continue;
    }
    if (s > ShmWord(ShmChannelState::kClosed)) {
      // Not a state of the protocol (this process wrote over the word): the
      // server ignores it, so the channel is this client's to reset.
      state->compare_exchange_strong(s, ShmWord(ShmChannelState::kIdle), std::memory_order_acq_rel);
      continue;
    }
    const uint32_t now = ShmChannelAwaitChange(state, s, options_.spin, deadline, kSlice);
    if (now == s) {
      return absl::DeadlineExceededError(
          "the shared-memory channel is still held by an abandoned call");
    }
    s = now;
  }
  // The area is this call's from here on.
  v1::RunMoERequest envelope;
  const std::optional<InRegion> placed = PlaceInRegion(request, &envelope);
  const v1::RunMoERequest& wire = placed ? envelope : request;
  const size_t size = wire.ByteSizeLong();
  if (static_cast<int64_t>(size) > options_.request_capacity) {
    return InvalidField(
        "request",
        absl::StrCat("the request's ", size, " bytes exceed the channel's request capacity of ",
                     options_.request_capacity,
                     " bytes (ShmChannel::Options::request_capacity; or pass "
                     "tensors by reference into a registered region)"));
  }
  wire.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(request_area_));
  const uint64_t sequence = ++sequence_;
  ShmChannelStore(&header_->request_bytes, static_cast<uint64_t>(size));
  ShmChannelStore(&header_->timeout_us,
                  std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now())));
  ShmChannelStore(&header_->sequence, sequence);
  if (!state->compare_exchange_strong(s, ShmWord(ShmChannelState::kPosted),
                                      std::memory_order_acq_rel)) {
    return s == ShmWord(ShmChannelState::kClosed)
               ? Closed()
               : absl::InternalError(absl::StrCat("the channel's state moved to ", s,
                                                  " under the client (two threads on one "
                                                  "channel?)"));
  }
  ShmChannelWake(state);  // a server thread that sleeps on the word
  s = ShmWord(ShmChannelState::kPosted);
  while (s == ShmWord(ShmChannelState::kPosted) || s == ShmWord(ShmChannelState::kRunning)) {
    const uint32_t now = ShmChannelAwaitChange(state, s, options_.spin, deadline, kSlice);
    if (now == s) {  // the deadline passed
      if (state->compare_exchange_strong(s, ShmWord(ShmChannelState::kCancelled),
                                         std::memory_order_acq_rel)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no answer on the shared-memory channel within ", absl::FormatDuration(timeout)));
      }
      continue;  // it moved meanwhile: read what it moved to
    }
    s = now;
  }
  // Closed right after Done (the channel closing, the server stopping) still
  // holds this call's answer.
  const bool ours = ShmChannelLoad(&header_->response_sequence) == sequence;
  if (s == ShmWord(ShmChannelState::kClosed) && !ours) return Closed();
  if ((s != ShmWord(ShmChannelState::kDone) && s != ShmWord(ShmChannelState::kClosed)) || !ours) {
    return absl::InternalError(
        absl::StrCat("the channel's state moved to ", s, " without an answer to call ", sequence));
  }
  const uint64_t bytes = ShmChannelLoad(&header_->response_bytes);
  if (bytes > static_cast<uint64_t>(response_capacity_) ||
      bytes > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return absl::InternalError("the server's answer overruns the channel's answer area");
  }
  const int32_t code = ShmChannelLoad(&header_->status_code);
  if (code == 0) {
    if (!ParseKeepingOutput(response_area_, static_cast<int>(bytes), response)) {
      return absl::InternalError("the channel's answer is not a kplan.v1.RunMoEResponse");
    }
    if (placed && response->output().has_shm()) {  // answered as the caller asked: inline
      v1::Tensor* out = response->mutable_output();
      out->clear_shm();
      // assign, not set_data: set_data copies through a temporary string.
      out->mutable_data()->assign(request_area_ + placed->output,
                                  static_cast<size_t>(placed->output_bytes));
    }
    return absl::OkStatus();
  }
  google::rpc::Status error;
  if (!error.ParseFromArray(response_area_, static_cast<int>(bytes))) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        "(the server's error text could not be read from the channel)");
  }
  // The bytes are what gRPC's grpc-status-details-bin would carry: the
  // same conversion keeps the field the server named.
  std::string details;
  error.SerializeToString(&details);
  return FromGrpcStatus(
      grpc::Status(static_cast<grpc::StatusCode>(code), error.message(), std::move(details)));
}

}  // namespace kplan
