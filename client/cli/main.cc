// kplan: the command-line client. `kplan resolve` asks a server (or, with
// --offline, the same library in-process) for the plan vLLM would build;
// `kplan info` and `kplan health` inspect a running server.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli/args.h"
#include "client/cli/format.h"
#include "client/cli/resolve_flags.h"
#include "client/cpp/client.h"
#include "server/base/status.h"
#include "server/platform/local.h"
#include "server/oracle/moe_plan.h"
#include "server/rpc/moe_convert.h"
#include "server/rpc/resolve.h"

namespace kplan::cli {
namespace {

constexpr char kUsage[] =
    "usage: kplan <command> [options]\n"
    "\n"
    "Commands:\n"
    "  resolve   resolve a KernelConfig and MoE plan as vLLM would (add --offline to plan\n"
    "            in-process without a server, --compare-platform SPEC to see what changes)\n"
    "  explain   every MoE backend candidate with its verdict and vLLM's reason\n"
    "  info      show the server's version, build, devices and platform\n"
    "  health    check the server's health; exit 0 when SERVING\n"
    "\n"
    "Run `kplan <command> --help` for the command's options.\n"
    "Example: kplan resolve --offline --platform cuda:9.0 --moe-backend triton\n";

struct CommonFlags {
  std::string server;
  std::string timeout = "10";
  std::string tls_ca, tls_cert, tls_key, token_file;
  bool json = false;
  bool help = false;

  void Register(ArgParser& p) {
    const char* env = std::getenv("KPLAN_SERVER");
    server = env != nullptr ? env : "localhost:50051";
    p.AddString("server", "ADDR", "server address (default $KPLAN_SERVER or localhost:50051)",
                &server);
    p.AddString("timeout", "SECONDS", "deadline per call, retries included (default 10)",
                &timeout);
    p.AddString("tls-ca", "FILE", "PEM CA bundle: connect over TLS and verify the server",
                &tls_ca);
    p.AddString("tls-cert", "FILE", "PEM client certificate (mutual TLS)", &tls_cert);
    p.AddString("tls-key", "FILE", "PEM key of --tls-cert", &tls_key);
    p.AddString("token-file", "FILE",
                "file with the server's bearer token (default: $KPLAN_TOKEN if set)", &token_file);
    p.AddSwitch("json", "print the response as JSON", &json);
    p.AddSwitch("help", "show this help", &help);
  }
  absl::StatusOr<std::unique_ptr<Client>> Connect() const {
    double seconds = 0;
    if (!absl::SimpleAtod(timeout, &seconds) || seconds <= 0) {
      return InvalidField("timeout", absl::StrCat("--timeout needs a positive number of seconds, got '",
                                                  timeout, "'"));
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
};

int Fail(const absl::Status& status) {
  std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message();
  if (std::optional<std::string> field = FieldOf(status)) std::cerr << " [field: " << *field << "]";
  std::cerr << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// Parses `args` into `parser`; returns an exit code when the command must stop.
std::optional<int> ParseOrExit(ArgParser& parser, const std::vector<std::string>& args,
                               const CommonFlags& common, const std::string& synopsis) {
  std::vector<std::string> positional;
  absl::Status s = parser.Parse(args, &positional);
  if (!s.ok()) return Fail(s);
  if (common.help) {
    std::cout << synopsis << "\n\nOptions:\n" << parser.Help();
    return 0;
  }
  if (!positional.empty()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("unexpected argument '", positional[0], "'")));
  }
  return std::nullopt;
}

// Resolves `request` through the server or, offline, in-process.
absl::StatusOr<v1::ResolveKernelConfigResponse> ResolveVia(
    const v1::ResolveKernelConfigRequest& request, bool offline, const CommonFlags& common) {
  if (offline) {
    KPLAN_ASSIGN_OR_RETURN(LocalRuntime runtime, MakeDefaultDeviceProber()->Probe());
    return rpc::ResolveKernelConfig(request,
                                    LocalPlatform(runtime.devices, KPLAN_HAVE_CUDA_KERNELS));
  }
  KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, common.Connect());
  return client->ResolveKernelConfig(request);
}

// `kplan resolve` (explain = false) and `kplan explain` (explain = true).
int Resolve(const std::vector<std::string>& args, bool explain) {
  ArgParser parser;
  CommonFlags common;
  ResolveFlags flags;
  bool offline = false;
  std::string compare_platform;
  common.Register(parser);
  parser.AddSwitch("offline", "plan in-process for this machine's platform, no server", &offline);
  if (!explain) {
    parser.AddString("compare-platform", "SPEC",
                     "resolve again for this platform and show what changes and why",
                     &compare_platform);
  }
  flags.Register(parser);
  const std::string synopsis =
      explain ? "usage: kplan explain [options]\n\nShow every MoE backend candidate vLLM would try "
                "for the request's MoE layer(s), with its verdict and reason."
              : "usage: kplan resolve [options]\n\nResolve a KernelConfig as vLLM's "
                "set_platform_defaults() would, with the MoE plan and config hash.";
  if (auto exit = ParseOrExit(parser, args, common, synopsis)) return *exit;
  absl::StatusOr<v1::ResolveKernelConfigRequest> request = flags.BuildRequest();
  if (!request.ok()) return Fail(request.status());
  absl::StatusOr<v1::ResolveKernelConfigResponse> response = ResolveVia(*request, offline, common);
  if (!response.ok()) return Fail(response.status());

  if (explain) {
    if (common.json) {
      std::cout << ToJson(*response);
      return 0;
    }
    std::vector<MoePlan> plans = MoePlansOf(*response);
    if (plans.empty()) {
      return Fail(absl::InvalidArgumentError(
          "the request has no MoE layer to explain; give --num-experts, --experts-per-token, "
          "--hidden-size and --intermediate-size (or model.moe in --request)"));
    }
    for (const MoePlan& plan : plans) std::cout << ExplainPlan(plan) << "\n";
    for (const std::string& w : response->warnings()) std::cout << "warning: " << w << "\n";
    return 0;
  }
  if (compare_platform.empty()) {
    std::cout << (common.json ? ToJson(*response) : FormatResolve(*response));
    return 0;
  }
  v1::ResolveKernelConfigRequest other_request = *request;
  absl::StatusOr<v1::Platform> other_platform = PlatformProtoFromSpec(compare_platform);
  if (!other_platform.ok()) return Fail(NestField(other_platform.status(), "compare-platform"));
  *other_request.mutable_platform() = *other_platform;
  absl::StatusOr<v1::ResolveKernelConfigResponse> other = ResolveVia(other_request, offline, common);
  if (!other.ok()) return Fail(other.status());
  if (common.json) {
    std::cout << ToJson(*response) << ToJson(*other);
    return 0;
  }
  std::cout << FormatComparison(*response, *other);
  return 0;
}

int Info(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  common.Register(parser);
  if (auto exit = ParseOrExit(parser, args, common, "usage: kplan info [options]")) return *exit;
  absl::StatusOr<std::unique_ptr<Client>> client = common.Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<v1::GetServerInfoResponse> info = (*client)->GetServerInfo();
  if (!info.ok()) return Fail(info.status());
  std::cout << (common.json ? ToJson(*info) : FormatServerInfo(*info));
  return 0;
}

int Health(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  std::string service;
  common.Register(parser);
  parser.AddString("service", "NAME",
                   "health service name (default: the whole server; readiness: "
                   "kplan.v1.KernelPlanService)",
                   &service);
  if (auto exit = ParseOrExit(parser, args, common, "usage: kplan health [options]")) return *exit;
  absl::StatusOr<std::unique_ptr<Client>> client = common.Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<bool> serving = (*client)->Health(service);
  if (!serving.ok()) return Fail(serving.status());
  std::cout << (*serving ? "SERVING" : "NOT_SERVING") << "\n";
  return *serving ? 0 : 1;
}

}  // namespace
}  // namespace kplan::cli

int main(int argc, char** argv) {
  using namespace kplan::cli;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "resolve") return Resolve(args, /*explain=*/false);
  if (command == "explain") return Resolve(args, /*explain=*/true);
  if (command == "info") return Info(args);
  if (command == "health") return Health(args);
  std::cerr << "kplan: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
