#include "client/cli/common.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"

namespace kplan::cli {

void CommonFlags::Register(ArgParser& p) {
  const char* env = std::getenv("KPLAN_SERVER");
  server = env != nullptr ? env : "localhost:50051";
  p.AddString("server", "ADDR",
              "server address, HOST:PORT or unix:/path.sock ($KPLAN_SERVER sets the default)",
              &server);
  p.AddString("timeout", "SECONDS", timeout_help, &timeout);
  p.AddString("tls-ca", "FILE", "PEM CA bundle: connect over TLS and verify the server", &tls_ca);
  p.AddString("tls-cert", "FILE", "PEM client certificate (mutual TLS)", &tls_cert);
  p.AddString("tls-key", "FILE", "PEM key of --tls-cert", &tls_key);
  p.AddString("token-file", "FILE",
              "file with the server's bearer token (default: $KPLAN_TOKEN if set)", &token_file);
  p.AddSwitch("json", "print the response as JSON", &json);
}

absl::StatusOr<std::unique_ptr<Client>> CommonFlags::Connect() const {
  double seconds = 0;
  if (!absl::SimpleAtod(timeout, &seconds) || seconds <= 0) {
    return InvalidField(
        "timeout",
        absl::StrCat("--timeout needs a positive number of seconds, got '", timeout, "'"));
  }
  ClientOptions options;
  options.deadline = absl::Seconds(seconds);
  struct FileFlag {
    const std::string& path;
    const char* flag;
    std::string* out;
  };
  for (const FileFlag& f : {FileFlag{tls_ca, "tls-ca", &options.tls_root_certs},
                            FileFlag{tls_cert, "tls-cert", &options.tls_client_cert},
                            FileFlag{tls_key, "tls-key", &options.tls_client_key},
                            FileFlag{token_file, "token-file", &options.bearer_token}}) {
    if (f.path.empty()) continue;
    std::ifstream in(f.path);
    if (!in) return InvalidField(f.flag, absl::StrCat("cannot read --", f.flag, " file ", f.path));
    std::stringstream text;
    text << in.rdbuf();
    *f.out = text.str();
  }
  options.bearer_token = std::string(absl::StripAsciiWhitespace(options.bearer_token));
  if (options.bearer_token.empty()) {
    if (const char* t = std::getenv("KPLAN_TOKEN")) options.bearer_token = t;
  }
  if ((!tls_cert.empty() || !tls_key.empty()) && tls_ca.empty()) {
    return InvalidField("tls-ca", "--tls-cert/--tls-key need --tls-ca");
  }
  return Client::Connect(server, options);
}

int Fail(const absl::Status& status) {
  std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message();
  if (std::optional<std::string> field = FieldOf(status)) std::cerr << " [field: " << *field << "]";
  std::cerr << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

std::optional<int> ParseOrExit(ArgParser& parser, const std::vector<std::string>& args,
                               const std::string& synopsis) {
  absl::Status s = parser.Parse(args);
  if (!s.ok()) return Fail(s);
  if (parser.help()) {
    std::cout << synopsis << "\n\n"
              << parser.Help()
              << "\nEvery --multi-word flag also takes underscores (--moe_backend), as vLLM's "
                 "CLI does.\n";
    return 0;
  }
  return std::nullopt;
}

}  // namespace kplan::cli
