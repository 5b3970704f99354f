#include "client/cli/args.h"

#include <algorithm>
#include <cctype>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace kplan::cli {
namespace {

// CLI11's help without its usage line (each command prints its own synopsis)
// and with the default after the description.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(36); }
  std::string make_usage(const CLI::App*, std::string) const override { return ""; }
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->nonpositional() || opt->get_type_size() == 0 || opt->get_type_name().empty()) {
      return "";
    }
    return " " + opt->get_type_name();
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    if (!opt->get_default_str().empty())
      absl::StrAppend(&desc, " (default: ", opt->get_default_str(), ")");
    return desc;
  }
};

// "a,b-c" as CLI11 names: "--a,--b-c".
std::string LongNames(const std::string& names) {
  std::vector<std::string> out;
  for (absl::string_view n : absl::StrSplit(names, ',', absl::SkipEmpty())) {
    out.push_back(absl::StrCat("--", n));
  }
  return absl::StrJoin(out, ",");
}

// The first --option a CLI11 message names, without its dashes.
std::string OptionNamed(const std::string& message) {
  size_t at = message.find("--");
  if (at == std::string::npos) return "";
  size_t end = at + 2;
  while (end < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-')) {
    ++end;
  }
  return message.substr(at + 2, end - at - 2);
}

}  // namespace

std::vector<std::string> NormalizeArgs(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, std::string>>& aliases) {
  std::vector<std::string> out;
  bool options_done = false;
  for (const std::string& arg : args) {
    if (options_done || arg == "--") {
      options_done = true;
      out.push_back(arg);
      continue;
    }
    std::string word = arg;
    for (const auto& [alias, name] : aliases) {
      if (word == alias) word = "--" + name;
      if (absl::StartsWith(word, alias + "="))
        word = absl::StrCat("--", name, word.substr(alias.size()));
    }
    if (absl::StartsWith(word, "--")) {
      const size_t eq = std::min(word.find('='), word.size());
      std::replace(word.begin(), word.begin() + eq, '_', '-');
    }
    out.push_back(std::move(word));
  }
  return out;
}

ArgParser::ArgParser() : app_(std::make_unique<CLI::App>()) {
  app_->formatter(std::make_shared<HelpFormatter>());
  app_->set_help_flag("-h,--help", "show this help");
}

ArgParser::~ArgParser() = default;

bool ArgParser::Given(const std::string& name) const { return app_->count("--" + name) > 0; }

void ArgParser::AddString(std::string names, std::string metavar, std::string help,
                          std::string* out, bool positional) {
  std::string cli_names = LongNames(names);
  if (positional) cli_names = absl::StrCat(metavar, ",", cli_names);
  app_->add_option(cli_names, *out, help)
      ->type_name(metavar)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();
}

void ArgParser::AddRepeated(std::string names, std::string metavar, std::string help,
                            std::vector<std::string>* out) {
  app_->add_option(LongNames(names), *out, help + " (repeatable)")
      ->type_name(metavar)
      ->allow_extra_args(false);
}

void ArgParser::AddSwitch(std::string names, std::string help, bool* out) {
  app_->add_flag(LongNames(names), *out, help);
}

void ArgParser::AddTriState(std::string name, std::string help, std::optional<bool>* out) {
  app_->add_flag_function(
      absl::StrCat("--", name, ",!--no-", name), [out](std::int64_t count) { *out = count > 0; },
      help + " (--no-" + name + ": off)");
}

void ArgParser::AddAlias(std::string alias, std::string name) {
  if (CLI::Option* o = app_->get_option_no_throw("--" + name)) {
    o->description(absl::StrCat(o->get_description(), " (also ", alias, ")"));
  }
  aliases_.emplace_back(std::move(alias), std::move(name));
}

absl::Status ArgParser::Parse(const std::vector<std::string>& args) {
  const std::vector<std::string> words = NormalizeArgs(args, aliases_);
  std::vector<const char*> argv = {"kplan"};
  for (const std::string& w : words) argv.push_back(w.c_str());
  try {
    app_->parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    help_ = true;
  } catch (const CLI::ParseError& e) {
    const std::string message = absl::StrCat(e.what(), " (see --help)");
    const std::string option = OptionNamed(e.what());
    if (option.empty()) return absl::InvalidArgumentError(message);
    return InvalidField(option, message);
  }
  return absl::OkStatus();
}

std::string ArgParser::Help() const {
  return std::string(absl::StripAsciiWhitespace(app_->help())) + "\n";
}

}  // namespace kplan::cli
