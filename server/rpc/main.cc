// kplan-server: serves kplan.v1.KernelPlanService until SIGTERM or SIGINT,
// then reports NOT_SERVING, drains in-flight calls for up to --exit_timeout
// and exits 0.
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "server/rpc/logging.h"
#include "server/rpc/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "Address to serve gRPC on: HOST:PORT (port 0 picks a free one) or unix:/path/to.sock");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20,
          "Largest request or response message in bytes (tensors travel inside messages)");
ABSL_FLAG(absl::Duration, exit_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long in-flight calls may finish before they are cancelled");
ABSL_FLAG(std::string, log_level, "info", "Log verbosity: trace, debug, info, warn, error, off");
ABSL_FLAG(std::string, log_format, "text",
          "Log lines: text, or json (one object per line: time, level, message, thread and the "
          "event's fields, e.g. a failed call's method, code, error, field and peer)");
ABSL_FLAG(int64_t, max_queue_depth, 256,
          "Requests queued per device before new ones get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_queued_bytes, 0,
          "Bytes that queued and running RunMoE/RunIrOp requests may hold (inputs and outputs), "
          "all devices together; beyond it RESOURCE_EXHAUSTED. 0: min(2 GiB, a quarter of host "
          "memory)");
ABSL_FLAG(int64_t, max_expert_bytes, 0,
          "Bytes of expert weights the server may hold in all, reserved when a load's header "
          "arrives; loads beyond get RESOURCE_EXHAUSTED. 0: derive (half the host memory; with "
          "GPUs also at most 90% of the smallest GPU's memory per GPU)");
ABSL_FLAG(absl::Duration, max_request_time, absl::Seconds(60),
          "Deadline of RunMoE/RunIrOp requests whose client set none (or a later one): queued "
          "work past it is dropped and the CPU path stops, with DEADLINE_EXCEEDED. 0: no cap");
ABSL_FLAG(double, failed_call_log_rate, 20,
          "Failed-call warnings logged a second on average, in bursts of up to as many: a client "
          "sending bad requests in a loop cannot flood the log; the next line logged counts "
          "those left out, and kplan_requests_total counts every call. 0: log every one");
ABSL_FLAG(absl::Duration, load_idle_timeout, absl::Seconds(60),
          "A LoadExperts stream that sends nothing this long is ended with DEADLINE_EXCEEDED and "
          "its reservation released. 0: never");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at HOST:PORT/metrics (e.g. 0.0.0.0:9464); empty: off");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve gRPC over TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates it signed (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File with a bearer token every KernelPlanService call must send as "
          "'authorization: Bearer <token>' (health and reflection stay open)");
namespace {

// --model_root takes a comma-separated list and may be repeated. absl keeps
// only a flag's last value, so every occurrence also adds its roots here.
struct ModelRootFlag {
  std::vector<std::string> roots;
};

std::vector<std::string>& AllModelRoots() {
  static std::vector<std::string> roots;
  return roots;
}

bool AbslParseFlag(absl::string_view text, ModelRootFlag* flag, std::string*) {
  flag->roots = absl::StrSplit(text, ',', absl::SkipEmpty());
  for (const std::string& root : flag->roots) AllModelRoots().push_back(root);
  return true;
}

std::string AbslUnparseFlag(const ModelRootFlag& flag) { return absl::StrJoin(flag.roots, ","); }

}  // namespace

ABSL_FLAG(ModelRootFlag, model_root, {},
          "Directory LoadExperts may read safetensors files from (comma-separated and/or "
          "repeated); absolute paths must resolve under one, relative ones resolve under the "
          "first. None: server-side loads are refused");
ABSL_FLAG(std::string, preload, "",
          "JSON file of expert sets to load at start, {\"experts\": [ExpertsHeader, ...]} with "
          "safetensors sources under --model_root; readiness waits for them, a failure stops "
          "the start");
ABSL_FLAG(absl::Duration, preload_timeout, absl::Minutes(10),
          "The longest one preloaded set may take");
ABSL_FLAG(std::string, devices, "all",
          "GPUs this server owns: all, none (CPU reference path) or a list such as 0,1");
ABSL_FLAG(int, cpu_ep_ranks, 0,
          "CPU path only (no GPUs): serve RunMoE from an expert-parallel group of this many CPU "
          "thread-ranks (experts placed linearly); 0: off. With several GPUs the GPUs form the "
          "group");
ABSL_FLAG(absl::Duration, ep_timeout, absl::Seconds(30),
          "Expert-parallel group: how long a rank may take to join a step, and each collective");

ABSL_FLAG(int, ep_size, 0,
          "Expert-parallel group across servers (one GPU each): the number of ranks; 0 or 1: "
          "off. Rank 0 coordinates; start every other rank with --ep_rank and --ep_coordinator");
ABSL_FLAG(int, ep_rank, 0, "This server's rank in the --ep_size group (0: the coordinator)");
ABSL_FLAG(std::string, ep_coordinator, "",
          "Ranks >= 1: rank 0's HOST:PORT, where this server joins the group (JoinEpGroup)");
ABSL_FLAG(std::string, ep_advertise, "",
          "Ranks >= 1: HOST:PORT where rank 0 reaches this server; empty: this server's port on "
          "the address rank 0 sees the join come from");
ABSL_FLAG(std::string, ep_peer_ca, "",
          "Group across servers with TLS (--tls_cert): PEM CA bundle that verifies the other "
          "ranks' certificates (default: the system roots); this server presents --tls_cert as "
          "its client certificate to them");
ABSL_FLAG(absl::Duration, ep_join_timeout, absl::Seconds(60),
          "Group across servers: how long rank 0 waits at start for every rank to join, and how "
          "long a rank keeps trying to join rank 0");
ABSL_FLAG(bool, allow_skip_device, false,
          "Debug: RunMoE honours its skip_device flag (the whole request path without the "
          "layer), for measuring the service's floor; off in production");
ABSL_FLAG(bool, inline_runs, true,
          "Small RunMoE calls on a GPU whose worker is idle run on the gRPC thread that "
          "received them (no hand-over to the worker and back)");
ABSL_FLAG(bool, cuda_graphs, true,
          "Small RunMoE calls on a GPU (up to 64 tokens, tensors in the request or in POSIX "
          "shared memory) replay one CUDA graph of their uploads, layer and download per "
          "shape, captured at the shape's second call");
ABSL_FLAG(int64_t, coalesce_window_us, 0,
          "RunMoE coalescing: concurrent calls on one device that may share a launch (same "
          "set, route, dtype, routing) wait up to this many microseconds for partners and run "
          "as one launch, each caller getting the bits it gets alone; 0: off");
ABSL_FLAG(int64_t, coalesce_max_tokens, 256,
          "RunMoE coalescing: the most tokens of one launch (1 to 1048576); a larger call runs "
          "alone");
ABSL_FLAG(bool, allow_shared_memory, false,
          "Serve RegisterSharedMemory: co-located clients' POSIX shared-memory regions that "
          "RunMoE tensors may reference instead of carrying their bytes, and the regions' "
          "call channels (OpenShmChannel: RunMoE without gRPC on the call path)");
ABSL_FLAG(int64_t, max_shm_channels, 64,
          "With --allow_shared_memory: the most shared-memory call channels open at once (a "
          "server thread each)");
ABSL_FLAG(absl::Duration, shm_channel_spin, absl::Microseconds(50),
          "With --allow_shared_memory: how long a channel's thread polls for the client's next "
          "call after an answer before it sleeps (a sleeping thread costs the next call a "
          "wake-up of a few microseconds; a polling one a core); 0: sleep at once");

namespace {

// A flag's defining file as --help shows it: relative to the source tree
// (the build directory's "../" and "./" dropped), never a build-machine path.
std::string FlagFileForHelp(absl::string_view file) {
  constexpr absl::string_view kSourceDir = KPLAN_SOURCE_DIR "/";
  if (absl::StartsWith(file, kSourceDir)) file.remove_prefix(kSourceDir.size());
  while (absl::ConsumePrefix(&file, "../") || absl::ConsumePrefix(&file, "./")) {
  }
  if (absl::StartsWith(file, "/")) {  // a library built elsewhere: from its own tree
    const size_t absl_dir = file.rfind("/absl/");
    file.remove_prefix(absl_dir != absl::string_view::npos ? absl_dir + 1 : file.rfind('/') + 1);
  }
  return std::string(file);
}

// --help and --helpshort: the server's own flags (this file), not the
// libraries' (--helpfull lists those too).
bool IsServerFlagFile(absl::string_view file) {
  return absl::EndsWith(FlagFileForHelp(file), "server/rpc/main.cc");
}

// vLLM's rule, as the kplan CLI keeps it: a flag name's dashes are its
// underscores (--max-message-bytes is --max_message_bytes). Values and the
// words after "--" are left alone.
std::vector<std::string> UnderscoreFlagNames(int argc, char** argv) {
  std::vector<std::string> words(argv, argv + argc);
  for (size_t i = 1; i < words.size(); ++i) {
    std::string& w = words[i];
    if (w == "--") break;
    if (!absl::StartsWith(w, "--")) continue;
    const size_t end = std::min(w.find('='), w.size());
    std::replace(w.begin() + 2, w.begin() + end, '-', '_');
    // vLLM's --no-X for a boolean is abseil's --noX.
    if (absl::StartsWith(w, "--no_") && end > 5) w.erase(4, 1);
  }
  return words;
}

}  // namespace

// After --exit_timeout, cancelled calls and the workers' teardown may take
// this much longer before the process exits regardless.
constexpr absl::Duration kExitGrace = absl::Seconds(5);

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kplan-server resolves vLLM kernel plans and runs MoE layers over gRPC.\n"
      "Usage: kplan-server [--listen=0.0.0.0:50051] [--devices=all] [--exit_timeout=30s]\n"
      "--help lists the server's flags with their defaults; --helpfull adds the libraries'.\n"
      "Flags take dashes or underscores alike (--max-message-bytes, --max_message_bytes).");
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [] {
    return absl::StrCat("kplan-server ", KPLAN_VERSION, " (", KPLAN_GIT_REVISION, ")\n");
  };
  usage_config.contains_help_flags = IsServerFlagFile;
  usage_config.contains_helpshort_flags = IsServerFlagFile;
  usage_config.normalize_filename = FlagFileForHelp;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<std::string> words = UnderscoreFlagNames(argc, argv);
  std::vector<char*> word_ptrs;
  for (std::string& w : words) word_ptrs.push_back(w.data());
  absl::ParseCommandLine(static_cast<int>(word_ptrs.size()), word_ptrs.data());
  // Debian's Abseil keeps absl::Mutex's deadlock detection on (a global
  // lock-order graph updated on every Lock; gRPC's mutexes are absl's): a
  // few per cent of every call's CPU, for a check the tests' sanitizers do.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  absl::StatusOr<kplan::rpc::LogFormat> log_format =
      kplan::rpc::ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!log_format.ok()) {
    std::cerr << log_format.status().message() << "\n";
    return 2;
  }
  kplan::rpc::SetLogFormat(*log_format);
  kplan::rpc::RouteGrpcLogs();

  spdlog::level::level_enum level = spdlog::level::from_str(absl::GetFlag(FLAGS_log_level));
  if (level == spdlog::level::off && absl::GetFlag(FLAGS_log_level) != "off") {
    std::cerr << "--log_level: unknown level '" << absl::GetFlag(FLAGS_log_level)
              << "'; expected trace, debug, info, warn, error or off\n";
    return 2;
  }
  spdlog::set_level(level);

  // Block the stop signals in every thread (gRPC's threads inherit this mask)
  // and take them synchronously below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  kplan::rpc::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.devices = absl::GetFlag(FLAGS_devices);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.max_queue_depth = absl::GetFlag(FLAGS_max_queue_depth);
  options.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  options.max_expert_bytes = absl::GetFlag(FLAGS_max_expert_bytes);
  options.max_request_time = absl::GetFlag(FLAGS_max_request_time);
  options.load_idle_timeout = absl::GetFlag(FLAGS_load_idle_timeout);
  options.failed_call_log_rate = absl::GetFlag(FLAGS_failed_call_log_rate);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.model_roots = AllModelRoots();
  options.preload_file = absl::GetFlag(FLAGS_preload);
  options.preload_timeout = absl::GetFlag(FLAGS_preload_timeout);
  options.cpu_ep_ranks = absl::GetFlag(FLAGS_cpu_ep_ranks);
  options.ep_timeout = absl::GetFlag(FLAGS_ep_timeout);
  options.ep_size = absl::GetFlag(FLAGS_ep_size);
  options.ep_rank = absl::GetFlag(FLAGS_ep_rank);
  options.ep_coordinator = absl::GetFlag(FLAGS_ep_coordinator);
  options.ep_advertise = absl::GetFlag(FLAGS_ep_advertise);
  options.ep_peer_ca_file = absl::GetFlag(FLAGS_ep_peer_ca);
  options.ep_join_timeout = absl::GetFlag(FLAGS_ep_join_timeout);
  options.allow_skip_device = absl::GetFlag(FLAGS_allow_skip_device);
  options.inline_runs = absl::GetFlag(FLAGS_inline_runs);
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.coalesce_window = absl::Microseconds(absl::GetFlag(FLAGS_coalesce_window_us));
  options.coalesce_max_tokens = absl::GetFlag(FLAGS_coalesce_max_tokens);
  options.allow_shared_memory = absl::GetFlag(FLAGS_allow_shared_memory);
  options.max_shm_channels = absl::GetFlag(FLAGS_max_shm_channels);
  options.shm_channel_spin = absl::GetFlag(FLAGS_shm_channel_spin);
  absl::StatusOr<std::unique_ptr<kplan::rpc::KplanServer>> server =
      kplan::rpc::KplanServer::Start(options);
  if (!server.ok()) {
    spdlog::critical("cannot start: {}", server.status().ToString());
    return 1;
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("received {}; shutting down", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  const absl::Duration exit_timeout = absl::GetFlag(FLAGS_exit_timeout);
  // The backstop of --exit_timeout: drain, cancel and teardown normally end
  // well within it, but nothing a client sent (a call whose work never
  // returns, a peer that never answers) may keep the process alive past it.
  std::thread([exit_timeout] {
    absl::SleepFor(exit_timeout + kExitGrace);
    spdlog::error("shutdown did not finish within --exit_timeout ({}) + {}; exiting now",
                  absl::FormatDuration(exit_timeout), absl::FormatDuration(kExitGrace));
    spdlog::shutdown();
    std::_Exit(1);  // not a clean stop: work was abandoned
  }).detach();
  (*server)->Shutdown(exit_timeout);
  server->reset();  // joins the device workers
  return 0;
}
