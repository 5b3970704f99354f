// The "NCCL" of tests that run an expert-parallel group across in-process
// servers: communicator ids are opaque strings and each id names one
// InProcessGroup, created by the first rank that asks for it. Inject() puts
// the table into a server's options.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/comm/in_process_communicator.h"
#include "server/rpc/server.h"

namespace kplan::rpc {

// Aborts are local, as NCCL's are: a rank waiting in a collective for a
// failed peer is released only by its own abort or its timeout.
struct CommTable {
  std::mutex mu;
  int next_id = 0;
  std::map<std::string, std::vector<std::unique_ptr<comm::InProcessCommunicator>>> groups;
  std::map<std::string, comm::InProcessGroup*> hubs;  // alive while its communicators are
  std::string newest;
};

inline void Inject(ServerOptions& options, std::shared_ptr<CommTable> table) {
  options.ep_id_source = [table]() -> absl::StatusOr<std::string> {
    std::lock_guard<std::mutex> lock(table->mu);
    return absl::StrCat("id-", ++table->next_id);
  };
  options.ep_comm_factory =
      [table](absl::string_view id, int rank, int size,
              absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    std::lock_guard<std::mutex> lock(table->mu);
    auto& group = table->groups[std::string(id)];
    if (group.empty()) {
      comm::InProcessOptions o;
      o.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
      o.abort_is_local = true;
      absl::StatusOr<std::vector<std::unique_ptr<comm::InProcessCommunicator>>> made =
          comm::InProcessGroup::Create(size, o);
      if (!made.ok()) return made.status();
      group = std::move(*made);
      table->hubs[std::string(id)] = &group[0]->group();
      table->newest = std::string(id);
    }
    if (rank >= static_cast<int>(group.size()) || group[rank] == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " already took id ", id));
    }
    return std::unique_ptr<comm::Communicator>(std::move(group[rank]));
  };
}

// A TCP port on 127.0.0.1 free right now (for a server whose address its
// peers need before it starts).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace kplan::rpc
