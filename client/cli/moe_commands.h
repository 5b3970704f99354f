// The kplan CLI's MoE commands over a server's resident experts, one function
// per command, each taking the words after the command name and returning
// the exit code (0 success, 2 invalid request or usage, 1 other errors):
//   kplan experts                       ListExperts as a table (--json)
//   kplan load --id ID ...              LoadExperts from a safetensors file on
//                                       the server host, or --random weights
//   kplan unload --id ID (or ID)        UnloadExperts
//   kplan run-moe --id ID --tokens N    RunMoE on random inputs: plan, timing
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli/args.h"
#include "kplan/v1/service.pb.h"

namespace kplan {
class ChunkSource;  // client/cpp/client.h
}  // namespace kplan

namespace kplan::cli {

// `kplan load`'s flags (vLLM's names: --hidden-size, --intermediate-size;
// the older --hidden and --intermediate stay as aliases).
struct LoadFlags {
  std::string id, safetensors, name_template, gate_proj, up_proj, down_proj, w13, w2, w13_file,
      w2_file;
  std::string num_experts, hidden_size, intermediate_size, dtype = "bfloat16", activation = "silu",
                                                           quantization, seed = "0";
  bool random = false;

  void Register(ArgParser& p);
  // The header and, for --random and the files, the source of the chunks
  // that follow it (null for a server-side file).
  absl::Status Build(v1::ExpertsHeader* header, std::unique_ptr<ChunkSource>* source) const;
};

// `kplan run-moe`'s flags (--top-k and --routing-method, with the older
// --experts-per-token and --routing as aliases).
struct RunMoeFlags {
  std::string id, tokens, top_k = "2", routing = "RenormalizeNaive", moe_backend = "auto",
                          all2all_backend, repeat = "1", dtype, seed = "0";
  bool shm = false;         // tensors by reference in a POSIX shared-memory region
  std::string output_file;  // the last run's output, raw bytes

  void Register(ArgParser& p);
};

int ExpertsCommand(const std::vector<std::string>& args);
int LoadCommand(const std::vector<std::string>& args);
int UnloadCommand(const std::vector<std::string>& args);
int RunMoeCommand(const std::vector<std::string>& args);

}  // namespace kplan::cli
