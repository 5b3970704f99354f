// The kplan CLI's flags on CLI11, spelled as vLLM's CLI spells them: GNU-style
// long options (--moe-backend triton, --moe-backend=triton), and, as vLLM's
// FlexibleArgumentParser does, underscores for dashes in any long name
// (--moe_backend), vLLM's short forms (-tp 2, -tp=2), --enable-eplb /
// --no-enable-eplb, repeatable options and a --help that lists every flag with
// its default. A name may carry aliases: "top-k,experts-per-token" registers
// --top-k and the older --experts-per-token.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace CLI {
class App;
}

namespace kplan::cli {

class ArgParser {
 public:
  ArgParser();
  ~ArgParser();
  ArgParser(const ArgParser&) = delete;
  ArgParser& operator=(const ArgParser&) = delete;

  // --name VALUE; the value `*out` holds now is the default --help shows.
  // `positional`: the value may also come as the command's one positional
  // word (kplan unload ID for kplan unload --id ID).
  void AddString(std::string names, std::string metavar, std::string help, std::string* out,
                 bool positional = false);
  // --name VALUE, may repeat
  void AddRepeated(std::string names, std::string metavar, std::string help,
                   std::vector<std::string>* out);
  // --name sets true
  void AddSwitch(std::string names, std::string help, bool* out);
  // --name sets true, --no-name sets false, absent leaves nullopt
  void AddTriState(std::string name, std::string help, std::optional<bool>* out);
  // A vLLM short form: -tp for --tensor-parallel-size (call after adding it).
  void AddAlias(std::string alias, std::string name);

  // Parses `args`. Unknown options, missing or extra values and stray words
  // are INVALID_ARGUMENT naming the option (its field). Sets help() for
  // --help / -h.
  absl::Status Parse(const std::vector<std::string>& args);
  bool help() const { return help_; }
  // Whether --`name` was on the command line (after Parse).
  bool Given(const std::string& name) const;
  // One line per option, aligned, with its default.
  std::string Help() const;

 private:
  std::unique_ptr<CLI::App> app_;
  std::vector<std::pair<std::string, std::string>> aliases_;
  bool help_ = false;
};

// vLLM's spelling of `args`: "--a_b[=v]" becomes "--a-b[=v]" and each short
// form in `aliases` ("-tp", "-tp=2") its long name; words after "--" and
// values are left alone.
std::vector<std::string> NormalizeArgs(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, std::string>>& aliases);

}  // namespace kplan::cli
