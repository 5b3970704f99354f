// The gRPC side of expert-parallel groups across servers (ep_process.h):
// rank 0's registry of peer servers and its calls to them (EpCoordinator,
// an EpRemoteRanks), and a peer's join at start-up (JoinEpGroupAtStart).
//
// Formation: rank 0 starts, builds its group (a first communicator id) and
// waits up to --ep_join_timeout for every peer's JoinEpGroup; a rank that
// never shows up fails rank 0's start with DEADLINE_EXCEEDED naming it. A
// peer retries JoinEpGroup (rank 0 may not be listening yet) until the same
// deadline. A peer that joins again as a new process (a new `instance`) is a
// restarted peer: it replaces the old registration and the group builds a
// new communicator generation before the next step. A second live process
// claiming a rank that is held is FAILED_PRECONDITION on `rank`.
//
// Experts: LoadExperts on rank 0 streams the whole set to every peer (its
// own LoadExperts; each peer keeps its linear slice resident), so clients
// talk to rank 0 only and peers need no access to rank 0's files.
#pragma once

#include <grpcpp/security/credentials.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kplan/v1/service.grpc.pb.h"
#include "server/moe/ep/ep_process.h"

namespace kplan::rpc {

class EpCoordinator final : public moe::ep::EpRemoteRanks {
 public:
  // `step_timeout` bounds each forwarded step; `auth_token` ("" = none) is
  // sent to peers as a bearer token; `credentials` reach the peers' servers
  // (null: plaintext).
  EpCoordinator(int size, std::string auth_token, absl::Duration step_timeout,
                std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  int size() const { return size_; }
  // The group whose generation a restarted peer invalidates (set once,
  // after the group exists).
  void SetGroup(moe::ep::EpGroup* group) { group_ = group; }

  // JoinEpGroup on rank 0. `from_host` is the caller's host (from the call's
  // peer URI), used when the request's address is ":PORT".
  absl::StatusOr<v1::JoinEpGroupResponse> Join(const v1::JoinEpGroupRequest& request,
                                               const std::string& from_host);
  // Blocks until every peer has joined; DEADLINE_EXCEEDED naming the missing
  // ranks after `timeout`.
  absl::Status WaitForPeers(absl::Duration timeout);
  // UnloadExperts on every joined peer (best effort: NOT_FOUND is fine).
  void UnloadOnPeers(const std::string& experts_id);

  std::string Device(int rank) const override;
  absl::StatusOr<int64_t> PlaceExperts(int rank, const ExpertSet& set) override;
  absl::StatusOr<std::string> RunStep(const moe::ep::EpForwardedStep& step) override;
  void Cancel(int rank, int64_t generation, absl::string_view reason) override;

 private:
  struct Peer {
    std::string address, device, instance;
    std::shared_ptr<v1::KernelPlanService::Stub> stub;
  };
  absl::StatusOr<Peer> PeerOf(int rank) const;
  void AddAuth(grpc::ClientContext& context) const;
  absl::Status RankError(int rank, const Peer& peer, const grpc::Status& status) const;

  const int size_;
  const std::string auth_token_;
  const absl::Duration step_timeout_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  moe::ep::EpGroup* group_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Peer> peers_;
  struct InFlight {
    grpc::ClientContext* context;
    int64_t generation;
  };
  std::map<int, InFlight> in_flight_;  // by rank
  std::map<int, int64_t> cancelled_;   // by rank: the newest generation given up on
};

struct EpPeerJoin {
  std::string coordinator;  // rank 0's HOST:PORT
  std::string address;      // where rank 0 reaches this server: HOST:PORT or ":PORT"
  std::string device;       // "cuda:0", "cpu"
  int rank = 0, size = 0;
  std::string auth_token;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // to rank 0; null: plaintext
  absl::Duration timeout = absl::Seconds(30);
};

// A peer's JoinEpGroup, retried while rank 0 is unreachable, until
// `join.timeout`.
absl::StatusOr<v1::JoinEpGroupResponse> JoinEpGroupAtStart(const EpPeerJoin& join);

// "HOST" of a gRPC peer URI ("ipv4:10.0.0.2:4321", "ipv6:[::1]:4321").
std::string HostOfPeerUri(const std::string& uri);

}  // namespace kplan::rpc
