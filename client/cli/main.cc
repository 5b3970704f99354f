// kplan: the command-line client. `kplan resolve` asks a server (or, with
// --offline, the same library in-process) for the plan vLLM would build;
// `kplan info` and `kplan health` inspect a running server; `kplan experts`,
// `load`, `unload` and `run-moe` drive its resident experts (moe_commands.h).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/args.h"
#include "client/cli/common.h"
#include "client/cli/format.h"
#include "client/cli/moe_commands.h"
#include "client/cli/resolve_flags.h"
#include "client/cpp/client.h"
#include "base/status.h"
#include "resolve/platform/local.h"
#include "resolve/oracle/moe_plan.h"
#include "resolve/proto/moe_plan_convert.h"
#include "resolve/proto/resolve.h"

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
    "  experts   list the expert sets resident on the server (with expert-parallel shards)\n"
    "  load      load an expert set: from a safetensors file on the server host (under its\n"
    "            --model_root), or --random\n"
    "  unload    unload an expert set: kplan unload --id ID (or kplan unload ID)\n"
    "  run-moe   run a fused MoE layer on random inputs; show the plan and timing\n"
    "\n"
    "Run `kplan <command> --help` for the command's options; `kplan --version` for the\n"
    "version. Flags take vLLM's names and spellings (--moe-backend or --moe_backend, -tp 2).\n"
    "Example: kplan resolve --offline --platform cuda:9.0 --moe-backend triton\n";

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
  if (auto exit = ParseOrExit(parser, args, synopsis)) return *exit;
  absl::StatusOr<v1::ResolveKernelConfigRequest> request = flags.BuildRequest();
  if (!request.ok()) return Fail(request.status());
  absl::StatusOr<v1::ResolveKernelConfigResponse> response = ResolveVia(*request, offline, common);
  if (!response.ok()) return Fail(response.status());

  if (explain) {
    std::vector<MoePlan> plans = MoePlansOf(*response);
    if (plans.empty()) {
      return Fail(absl::InvalidArgumentError(
          "the request has no MoE layer to explain; give --num-experts, --top-k, "
          "--hidden-size and --intermediate-size (or model.moe in --request)"));
    }
    if (common.json) {  // what the table shows, as one document
      std::cout << ExplainToJson(*response);
      return 0;
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
  absl::StatusOr<v1::ResolveKernelConfigResponse> other =
      ResolveVia(other_request, offline, common);
  if (!other.ok()) return Fail(other.status());
  if (common.json) {  // one document: both answers, by the flag that chose the platform
    std::cout << JsonObject(
        {{"platform", ToJson(*response)}, {"compare_platform", ToJson(*other)}});
    return 0;
  }
  std::cout << FormatComparison(*response, *other);
  return 0;
}

int Info(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  common.Register(parser);
  if (auto exit = ParseOrExit(parser, args, "usage: kplan info [options]")) return *exit;
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
  if (auto exit = ParseOrExit(parser, args, "usage: kplan health [options]")) return *exit;
  absl::StatusOr<std::unique_ptr<Client>> client = common.Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<bool> serving = (*client)->Health(service);
  if (!serving.ok()) return Fail(serving.status());
  const char* status = *serving ? "SERVING" : "NOT_SERVING";
  if (common.json) {
    // Members in a fixed order (a Struct's map has none).
    std::cout << JsonObject({{"service", JsonString(service)}, {"status", JsonString(status)}});
  } else {
    std::cout << status << "\n";
  }
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
  if (command == "--version" || command == "version") {
    std::cout << "kplan " << KPLAN_VERSION << " (" << KPLAN_GIT_REVISION << ")\n";
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "resolve") return Resolve(args, /*explain=*/false);
  if (command == "explain") return Resolve(args, /*explain=*/true);
  if (command == "info") return Info(args);
  if (command == "health") return Health(args);
  if (command == "experts") return ExpertsCommand(args);
  if (command == "load") return LoadCommand(args);
  if (command == "unload") return UnloadCommand(args);
  if (command == "run-moe") return RunMoeCommand(args);
  std::cerr << "kplan: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
