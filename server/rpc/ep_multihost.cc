#include "server/rpc/ep_multihost.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "server/moe/ep/ep_dispatch.h"
#include "server/rpc/call.h"
#include "server/rpc/moe_convert.h"
#include "server/rpc/service.h"
#include "server/rpc/status_mapping.h"
#include "spdlog/spdlog.h"

namespace kplan::rpc {
namespace {

constexpr int64_t kChunkBytes = int64_t{16} << 20;

std::shared_ptr<v1::KernelPlanService::Stub> StubFor(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  return v1::KernelPlanService::NewStub(grpc::CreateCustomChannel(address, credentials, args));
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

v1::DType ActProtoDType(kernels::DType d) { return ProtoDTypeFromWire(WireDTypeName(d)); }

v1::ExpertsHeader HeaderOf(const ExpertsSpec& s) {
  v1::ExpertsHeader h;
  h.set_experts_id(s.experts_id);
  h.set_num_experts(s.num_experts);
  h.set_hidden_size(static_cast<int32_t>(s.hidden));
  h.set_intermediate_size(static_cast<int32_t>(s.intermediate));
  h.set_activation(s.activation);
  h.set_dtype(ProtoDTypeFromWire(WireDTypeName(s.dtype)));
  h.set_has_bias(s.has_bias);
  v1::ExpertsQuantization* q = h.mutable_quantization();
  q->set_scheme(s.quant.scheme);
  q->set_block_n(s.quant.block_n);
  q->set_block_k(s.quant.block_k);
  q->set_group_size(s.quant.group_size);
  q->set_has_zero_points(s.quant.has_zero_points);
  q->set_activation_scale(s.quant.activation_scale);
  if (s.quant.a1_scale) q->set_a1_scale(*s.quant.a1_scale);
  if (s.quant.a2_scale) q->set_a2_scale(*s.quant.a2_scale);
  return h;
}

}  // namespace

std::string HostOfPeerUri(const std::string& uri) {
  absl::string_view rest = uri;
  if (absl::ConsumePrefix(&rest, "ipv6:")) {
    if (absl::StartsWith(rest, "%5B")) {  // URL-encoded brackets
      rest.remove_prefix(3);
      size_t end = rest.find("%5D");
      return absl::StrCat("[", rest.substr(0, end), "]");
    }
    size_t end = rest.find(']');
    return std::string(rest.substr(0, end == absl::string_view::npos ? rest.size() : end + 1));
  }
  absl::ConsumePrefix(&rest, "ipv4:");
  size_t colon = rest.rfind(':');
  return std::string(rest.substr(0, colon));
}

// ---------------------------------------------------------------------------
// EpCoordinator.

EpCoordinator::EpCoordinator(int size, std::string auth_token, absl::Duration step_timeout,
                             std::shared_ptr<grpc::ChannelCredentials> credentials)
    : size_(size),
      auth_token_(std::move(auth_token)),
      step_timeout_(step_timeout),
      credentials_(std::move(credentials)) {}

void EpCoordinator::AddAuth(grpc::ClientContext& context) const {
  if (!auth_token_.empty()) context.AddMetadata("authorization", "Bearer " + auth_token_);
}

absl::StatusOr<v1::JoinEpGroupResponse> EpCoordinator::Join(const v1::JoinEpGroupRequest& request,
                                                            const std::string& from_host) {
  if (request.size() != size_) {
    return WithField(absl::FailedPreconditionError(absl::StrCat(
                         "this expert-parallel group has size ", size_, " (rank 0's --ep_size); ",
                         "the peer was started with --ep_size=", request.size())),
                     "size");
  }
  if (request.rank() < 1 || request.rank() >= size_) {
    return WithField(
        absl::InvalidArgumentError(absl::StrCat("a peer's rank must be in [1, ", size_, "); got ",
                                                request.rank(), " (rank 0 is the coordinator)")),
        "rank");
  }
  std::string address = request.address();
  if (address.empty() || absl::StartsWith(address, ":")) {
    if (address.empty()) {
      return WithField(
          absl::InvalidArgumentError("the peer's address (HOST:PORT or :PORT) is empty"),
          "address");
    }
    address = absl::StrCat(from_host, address);
  }
  Peer peer{address, request.device(), request.instance(), nullptr};
  bool restarted = false;
  std::shared_ptr<v1::KernelPlanService::Stub> old_stub;
  std::string old_address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(request.rank());
    if (it != peers_.end() && it->second.instance != peer.instance) {
      old_stub = it->second.stub;
      old_address = it->second.address;
    }
  }
  if (old_stub != nullptr && old_address != address) {
    // Another process holds the rank: a duplicate unless it is gone.
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(1));
    AddAuth(context);
    v1::GetServerInfoRequest info_request;
    v1::GetServerInfoResponse info;
    if (old_stub->GetServerInfo(&context, info_request, &info).ok()) {
      return WithField(absl::FailedPreconditionError(absl::StrCat(
                           "rank ", request.rank(), " is already held by the live server at ",
                           old_address, "; ", address, " cannot join as the same rank")),
                       "rank");
    }
  }
  peer.stub = StubFor(address, credentials_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(request.rank());
    restarted = it != peers_.end() && it->second.instance != peer.instance;
    peers_[request.rank()] = peer;
  }
  cv_.notify_all();
  if (restarted && group_ != nullptr) group_->Invalidate();
  spdlog::info("expert-parallel group: rank {} {} at {} ({})", request.rank(),
               restarted ? "rejoined" : "joined", address, request.device());
  v1::JoinEpGroupResponse response;
  std::string id;
  int64_t generation = 0;
  if (group_ != nullptr) moe::ep::CurrentProcessGroupId(group_->kind(), &id, &generation);
  response.set_group_id(id);
  response.set_generation(generation);
  response.set_size(size_);
  return response;
}

absl::Status EpCoordinator::WaitForPeers(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (static_cast<int>(peers_.size()) < size_ - 1 && absl::Now() < deadline) {
    cv_.wait_until(lock, absl::ToChronoTime(deadline));
  }
  std::vector<std::string> missing;
  for (int r = 1; r < size_; ++r) {
    if (peers_.count(r) == 0) missing.push_back(absl::StrCat(r));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "expert-parallel group formation: rank", missing.size() == 1 ? " " : "s ",
      absl::StrJoin(missing, ", "), " of ", size_, " did not join within ",
      absl::FormatDuration(timeout),
      " (start each peer with --ep_rank=R --ep_size=N --ep_coordinator=<this server>)"));
}

absl::StatusOr<EpCoordinator::Peer> EpCoordinator::PeerOf(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(rank);
  if (it == peers_.end()) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, " has not joined the group"));
  }
  return it->second;
}

std::string EpCoordinator::Device(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(rank);
  if (it == peers_.end()) return "(not joined)";
  return absl::StrCat(it->second.address, "/", it->second.device);
}

absl::Status EpCoordinator::RankError(int rank, const Peer& peer,
                                      const grpc::Status& status) const {
  absl::Status st = FromGrpcStatus(status);
  return absl::Status(st.code(),
                      absl::StrCat("rank ", rank, " at ", peer.address, ": ", st.message()));
}

void EpCoordinator::UnloadOnPeers(const std::string& experts_id) {
  std::map<int, Peer> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers = peers_;
  }
  for (const auto& [rank, peer] : peers) {
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(10));
    AddAuth(context);
    v1::UnloadExpertsRequest request;
    request.set_experts_id(experts_id);
    v1::UnloadExpertsResponse response;
    grpc::Status st = peer.stub->UnloadExperts(&context, request, &response);
    if (!st.ok() && st.error_code() != grpc::StatusCode::NOT_FOUND) {
      spdlog::warn("UnloadExperts '{}' on rank {} at {}: {}", experts_id, rank, peer.address,
                   st.error_message());
    }
  }
}

absl::StatusOr<int64_t> EpCoordinator::PlaceExperts(int rank, const ExpertSet& set) {
  KPLAN_ASSIGN_OR_RETURN(Peer peer, PeerOf(rank));
  {  // A set of this id left on the peer (e.g. rank 0 restarted) goes first.
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(30));
    AddAuth(context);
    v1::UnloadExpertsRequest request;
    request.set_experts_id(set.spec().experts_id);
    v1::UnloadExpertsResponse response;
    grpc::Status st = peer.stub->UnloadExperts(&context, request, &response);
    if (!st.ok() && st.error_code() != grpc::StatusCode::NOT_FOUND) {
      return RankError(rank, peer, st);
    }
  }
  grpc::ClientContext context;
  SetDeadline(context, step_timeout_);
  AddAuth(context);
  v1::LoadExpertsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::LoadExpertsRequest>> writer =
      peer.stub->LoadExperts(&context, &response);
  v1::LoadExpertsRequest header;
  *header.mutable_header() = HeaderOf(set.spec());
  bool ok = writer->Write(header);
  for (const auto& [name, bytes] : set.tensors()) {
    for (int64_t off = 0; ok && off < static_cast<int64_t>(bytes.size()); off += kChunkBytes) {
      v1::LoadExpertsRequest chunk;
      v1::TensorChunk* c = chunk.mutable_chunk();
      c->set_name(name);
      if (off == 0) {
        for (const TensorSpec& t : ExpectedTensors(set.spec())) {
          if (t.name != name) continue;
          c->set_dtype(ProtoDTypeFromWire(t.wire_dtype));
          for (int64_t d : t.shape) c->add_shape(d);
        }
      }
      c->set_offset(off);
      c->set_data(bytes.substr(off, kChunkBytes));
      ok = writer->Write(chunk);
    }
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) return RankError(rank, peer, st);
  for (const v1::ExpertShard& shard : response.experts().shards()) {
    if (shard.rank() == rank) return shard.bytes();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank, " at ", peer.address, " keeps experts '", set.spec().experts_id,
                   "' off its expert-parallel rank (see its log)"));
}

absl::StatusOr<std::string> EpCoordinator::RunStep(const moe::ep::EpForwardedStep& step) {
  KPLAN_ASSIGN_OR_RETURN(Peer peer, PeerOf(step.rank));
  v1::RunEpStepRequest request;
  request.set_experts_id(step.experts_id);
  request.set_generation(step.generation);
  request.set_group_id(step.group_id);
  request.set_rank(step.rank);
  request.set_size(step.size);
  request.set_top_k(step.options.top_k);
  request.set_apply_router_weight_on_input(step.options.apply_router_weight_on_input);
  request.set_all2all_backend(std::string(moe::ep::EpStrategyName(step.options.strategy)));
  const int64_t k = step.options.top_k;
  const int64_t h = step.num_tokens == 0
                        ? 0
                        : static_cast<int64_t>(step.hidden_states.size()) / step.num_tokens /
                              kernels::DTypeSize(step.options.act_dtype);
  v1::Tensor* x = request.mutable_hidden_states();
  x->set_dtype(ActProtoDType(step.options.act_dtype));
  x->add_shape(step.num_tokens);
  x->add_shape(h);
  x->set_data(step.hidden_states);
  v1::Tensor* ids = request.mutable_topk_ids();
  ids->set_dtype(v1::DTYPE_INT32);
  ids->add_shape(step.num_tokens);
  ids->add_shape(k);
  ids->set_data(reinterpret_cast<const char*>(step.topk_ids.data()), step.topk_ids.size() * 4);
  v1::Tensor* w = request.mutable_topk_weights();
  w->set_dtype(v1::DTYPE_FLOAT32);
  w->add_shape(step.num_tokens);
  w->add_shape(k);
  w->set_data(reinterpret_cast<const char*>(step.topk_weights.data()),
              step.topk_weights.size() * 4);

  grpc::ClientContext context;
  SetDeadline(context, step_timeout_);
  AddAuth(context);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cancelled_.find(step.rank);
        it != cancelled_.end() && step.generation <= it->second) {
      return absl::CancelledError(absl::StrCat("rank ", step.rank, "'s step of generation ",
                                               step.generation,
                                               " was given up before it was sent"));
    }
    in_flight_[step.rank] = InFlight{&context, step.generation};
  }
  v1::RunEpStepResponse response;
  grpc::Status st = peer.stub->RunEpStep(&context, request, &response);
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(step.rank);
  }
  if (!st.ok()) return RankError(step.rank, peer, st);
  return std::move(*response.mutable_output()->mutable_data());
}

void EpCoordinator::Cancel(int rank, int64_t generation, absl::string_view) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t& cancelled = cancelled_[rank];
  cancelled = std::max(cancelled, generation);
  auto it = in_flight_.find(rank);
  if (it != in_flight_.end() && it->second.generation <= generation)
    it->second.context->TryCancel();
}

// ---------------------------------------------------------------------------
// A peer's join.

absl::StatusOr<v1::JoinEpGroupResponse> JoinEpGroupAtStart(const EpPeerJoin& join) {
  std::shared_ptr<v1::KernelPlanService::Stub> stub = StubFor(join.coordinator, join.credentials);
  v1::JoinEpGroupRequest request;
  request.set_rank(join.rank);
  request.set_size(join.size);
  request.set_address(join.address);
  request.set_device(join.device);
  request.set_instance(absl::StrCat(getpid(), "-", absl::ToUnixNanos(absl::Now())));
  const absl::Time deadline = absl::Now() + join.timeout;
  grpc::Status last;
  do {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(true);  // rank 0 may not be listening yet
    if (!join.auth_token.empty()) context.AddMetadata("authorization", "Bearer " + join.auth_token);
    v1::JoinEpGroupResponse response;
    last = stub->JoinEpGroup(&context, request, &response);
    if (last.ok()) return response;
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < deadline);
  absl::Status st = FromGrpcStatus(last);
  return absl::Status(st.code(),
                      absl::StrCat("joining the expert-parallel group at ", join.coordinator,
                                   " as rank ", join.rank, " of ", join.size, ": ", st.message()));
}

// ---------------------------------------------------------------------------
// Handlers.

grpc::ServerUnaryReactor* KernelPlanServiceImpl::JoinEpGroup(grpc::CallbackServerContext* context,
                                                             const v1::JoinEpGroupRequest* request,
                                                             v1::JoinEpGroupResponse* response) {
  Call call(env_, context, "JoinEpGroup");
  if (absl::Status auth = call.Authorize(); !auth.ok()) return call.FinishUnary(auth);
  if (env_.ep_coordinator == nullptr) {
    return call.FinishUnary(absl::FailedPreconditionError(
        "this server does not coordinate an expert-parallel group (rank 0 runs with "
        "--ep_size=N and no --ep_coordinator)"));
  }
  absl::StatusOr<v1::JoinEpGroupResponse> joined =
      env_.ep_coordinator->Join(*request, HostOfPeerUri(context->peer()));
  if (joined.ok()) *response = std::move(*joined);
  return call.FinishUnary(joined.status());
}

namespace {

// RunEpStep's reactor: when rank 0 cancels the call (it gave up on the step:
// it failed, or the step's deadline passed), the peer's communicator of that
// generation is aborted, so a step waiting in a collective for rank 0 fails
// now instead of at its own timeout and the peer is free for the next one.
// Armed only once the call is authorised and valid, just before its step is
// posted: a cancel before that aborts nothing (an unauthorised call must not
// stop the peer's generation), a cancel after it marks the generation
// abandoned even if the step has not started.
class RunEpStepReactor final : public grpc::ServerUnaryReactor {
 public:
  void Arm(moe::ep::EpPeerRank* peer, int64_t generation) {
    generation_.store(generation);
    peer_.store(peer);
  }
  void OnCancel() override {
    if (moe::ep::EpPeerRank* peer = peer_.load()) {
      peer->AbortStep(generation_.load(), "rank 0 cancelled the step");
    }
  }
  void OnDone() override { delete this; }

 private:
  std::atomic<moe::ep::EpPeerRank*> peer_{nullptr};
  std::atomic<int64_t> generation_{0};
};

}  // namespace

grpc::ServerUnaryReactor* KernelPlanServiceImpl::RunEpStep(grpc::CallbackServerContext* context,
                                                           const v1::RunEpStepRequest* request,
                                                           v1::RunEpStepResponse* response) {
  auto call = std::make_shared<Call>(env_, context, "RunEpStep", /*unary=*/false);
  auto* reactor = new RunEpStepReactor;
  auto finish = [call, reactor](const absl::Status& status) {
    if (call->Claim()) reactor->Finish(call->Done(status));
    return reactor;
  };
  if (absl::Status auth = call->Authorize(); !auth.ok()) return finish(auth);
  if (env_.ep_peer == nullptr) {
    return finish(absl::FailedPreconditionError(
        "this server is not a peer rank of an expert-parallel group (--ep_rank >= 1)"));
  }
  absl::StatusOr<std::shared_ptr<const ExpertSet>> set = env_.experts->Get(request->experts_id());
  if (!set.ok()) return finish(set.status());
  moe::ep::EpForwardedStep step;
  step.experts_id = request->experts_id();
  step.generation = request->generation();
  step.group_id = request->group_id();
  step.rank = request->rank();
  step.size = request->size();
  step.options.top_k = request->top_k();
  step.options.apply_router_weight_on_input = request->apply_router_weight_on_input();
  absl::StatusOr<moe::ep::EpStrategy> strategy =
      moe::ep::ParseEpStrategy(request->all2all_backend());
  if (!strategy.ok()) return finish(WithField(strategy.status(), "all2all_backend"));
  step.options.strategy = *strategy;
  switch (request->hidden_states().dtype()) {
    case v1::DTYPE_FLOAT32:
      step.options.act_dtype = kernels::DType::kFloat32;
      break;
    case v1::DTYPE_FLOAT16:
      step.options.act_dtype = kernels::DType::kFloat16;
      break;
    case v1::DTYPE_BFLOAT16:
      step.options.act_dtype = kernels::DType::kBFloat16;
      break;
    default:
      return finish(InvalidField("hidden_states.dtype",
                                 "hidden_states must be float32, float16 or bfloat16"));
  }
  step.num_tokens =
      request->hidden_states().shape_size() > 0 ? request->hidden_states().shape(0) : 0;
  step.hidden_states = request->hidden_states().data();
  const std::string& ids = request->topk_ids().data();
  const std::string& weights = request->topk_weights().data();
  step.topk_ids.resize(ids.size() / 4);
  step.topk_weights.resize(weights.size() / 4);
  // Guarded on the destinations: 1-3 bytes resize them to 0 (memcpy of null is UB).
  if (!step.topk_ids.empty()) {
    std::memcpy(step.topk_ids.data(), ids.data(), step.topk_ids.size() * 4);
  }
  if (!step.topk_weights.empty()) {
    std::memcpy(step.topk_weights.data(), weights.data(), step.topk_weights.size() * 4);
  }
  const v1::DType dtype = request->hidden_states().dtype();
  const int64_t m = step.num_tokens;
  const int64_t h =
      request->hidden_states().shape_size() > 1 ? request->hidden_states().shape(1) : 0;
  reactor->Arm(env_.ep_peer, step.generation);  // before posting: the step may finish at once
  env_.ep_peer->RunStep(*set, std::move(step),
                        [finish, response, dtype, m, h](absl::StatusOr<std::string> out) {
                          if (out.ok()) {
                            v1::Tensor* t = response->mutable_output();
                            t->set_dtype(dtype);
                            t->add_shape(m);
                            t->add_shape(h);
                            t->set_data(std::move(*out));
                          }
                          finish(out.status());
                        });
  return reactor;
}

}  // namespace kplan::rpc
