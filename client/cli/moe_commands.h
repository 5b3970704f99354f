// The kplan CLI's MoE commands over a server's resident experts, one function
// per command, each taking the words after the command name and returning
// the exit code (0 success, 2 invalid request or usage, 1 other errors):
//   kplan experts                       ListExperts as a table (--json)
//   kplan load --id ID ...              LoadExperts from a safetensors file on
//                                       the server host, or --random weights
//   kplan unload ID                     UnloadExperts
//   kplan run-moe --id ID --tokens N    RunMoE on random inputs: plan, timing
#pragma once

#include <string>
#include <vector>

namespace kplan::cli {

int ExpertsCommand(const std::vector<std::string>& args);
int LoadCommand(const std::vector<std::string>& args);
int UnloadCommand(const std::vector<std::string>& args);
int RunMoeCommand(const std::vector<std::string>& args);

}  // namespace kplan::cli
