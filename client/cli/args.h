// A small command-line parser for the kplan CLI: GNU-style long options with
// dashes as vLLM's CLI spells them (--moe-backend triton, --moe-backend=triton,
// --enable-eplb / --no-enable-eplb), repeatable options and generated help.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kplan::cli {

class ArgParser {
 public:
  // --name VALUE
  void AddString(std::string name, std::string metavar, std::string help, std::string* out);
  // --name VALUE, may repeat
  void AddRepeated(std::string name, std::string metavar, std::string help,
                   std::vector<std::string>* out);
  // --name sets true
  void AddSwitch(std::string name, std::string help, bool* out);
  // --name sets true, --no-name sets false, absent leaves nullopt
  void AddTriState(std::string name, std::string help, std::optional<bool>* out);
  // A one-letter alias: -tp for --tensor-parallel-size.
  void AddAlias(std::string alias, std::string name);

  // Parses `args`; non-option words go to `positional`. Unknown options and
  // missing values are INVALID_ARGUMENT with the option named.
  absl::Status Parse(const std::vector<std::string>& args, std::vector<std::string>* positional);
  // One line per option, aligned.
  std::string Help() const;

 private:
  enum class Kind { kString, kRepeated, kSwitch, kTriState };
  struct Option {
    std::string name;
    std::string metavar;
    std::string help;
    Kind kind;
    void* out;
  };
  const Option* Find(const std::string& name, bool* negated) const;
  std::vector<Option> options_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

}  // namespace kplan::cli
