// What every kplan CLI command shares: the connection flags (--server, TLS,
// token, timeout, --json, --help), argument parsing with --help and the
// mapping of errors to exit codes (2 invalid request or usage, 1 otherwise).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli/args.h"
#include "client/cpp/client.h"

namespace kplan::cli {

struct CommonFlags {
  std::string server;
  std::string timeout = "10";
  // --timeout's help; a command whose default is not `timeout` says it here
  // (and sets `timeout` empty before Register, so --help shows no default).
  std::string timeout_help = "deadline per call, retries included";
  std::string tls_ca, tls_cert, tls_key, token_file;
  bool json = false;

  void Register(ArgParser& p);
  // A client for --server with the TLS, token and deadline options.
  absl::StatusOr<std::unique_ptr<Client>> Connect() const;
};

// Prints `status` (with its field) to stderr; returns the exit code.
int Fail(const absl::Status& status);

// Parses `args` into `parser`; returns an exit code when the command must
// stop (--help, a parse error).
std::optional<int> ParseOrExit(ArgParser& parser, const std::vector<std::string>& args,
                               const std::string& synopsis);

}  // namespace kplan::cli
