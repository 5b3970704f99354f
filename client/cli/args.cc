#include "client/cli/args.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"

namespace kplan::cli {

void ArgParser::AddString(std::string name, std::string metavar, std::string help,
                          std::string* out) {
  options_.push_back({std::move(name), std::move(metavar), std::move(help), Kind::kString, out});
}
void ArgParser::AddRepeated(std::string name, std::string metavar, std::string help,
                            std::vector<std::string>* out) {
  options_.push_back({std::move(name), std::move(metavar), std::move(help), Kind::kRepeated, out});
}
void ArgParser::AddSwitch(std::string name, std::string help, bool* out) {
  options_.push_back({std::move(name), "", std::move(help), Kind::kSwitch, out});
}
void ArgParser::AddTriState(std::string name, std::string help, std::optional<bool>* out) {
  options_.push_back({std::move(name), "", std::move(help), Kind::kTriState, out});
}
void ArgParser::AddAlias(std::string alias, std::string name) {
  aliases_.emplace_back(std::move(alias), std::move(name));
}

const ArgParser::Option* ArgParser::Find(const std::string& name, bool* negated) const {
  *negated = false;
  for (const Option& o : options_) {
    if (o.name == name) return &o;
  }
  if (absl::StartsWith(name, "no-")) {
    std::string positive = name.substr(3);
    for (const Option& o : options_) {
      if (o.name == positive && o.kind == Kind::kTriState) {
        *negated = true;
        return &o;
      }
    }
  }
  return nullptr;
}

absl::Status ArgParser::Parse(const std::vector<std::string>& args,
                              std::vector<std::string>* positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    for (const auto& [alias, name] : aliases_) {
      if (arg == alias) arg = "--" + name;
    }
    if (!absl::StartsWith(arg, "--") || arg == "--") {
      positional->push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    bool negated = false;
    const Option* o = Find(name, &negated);
    if (o == nullptr) {
      return InvalidField(name, absl::StrCat("unknown option --", name, " (see --help)"));
    }
    if (o->kind == Kind::kSwitch || o->kind == Kind::kTriState) {
      if (value) {
        return InvalidField(name, absl::StrCat("option --", name, " takes no value"));
      }
      if (o->kind == Kind::kSwitch) {
        *static_cast<bool*>(o->out) = true;
      } else {
        *static_cast<std::optional<bool>*>(o->out) = !negated;
      }
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return InvalidField(name, absl::StrCat("option --", name, " needs a value (", o->metavar,
                                               ")"));
      }
      value = args[++i];
    }
    if (o->kind == Kind::kString) {
      *static_cast<std::string*>(o->out) = *value;
    } else {
      static_cast<std::vector<std::string>*>(o->out)->push_back(*value);
    }
  }
  return absl::OkStatus();
}

std::string ArgParser::Help() const {
  std::vector<std::pair<std::string, std::string>> rows;
  size_t width = 0;
  for (const Option& o : options_) {
    std::string left = absl::StrCat("  --", o.name);
    if (o.kind == Kind::kTriState) left = absl::StrCat("  --[no-]", o.name);
    if (!o.metavar.empty()) absl::StrAppend(&left, " ", o.metavar);
    for (const auto& [alias, name] : aliases_) {
      if (name == o.name) absl::StrAppend(&left, ", ", alias);
    }
    width = std::max(width, left.size());
    rows.emplace_back(left, o.help + (o.kind == Kind::kRepeated ? " (repeatable)" : ""));
  }
  std::string out;
  for (const auto& [left, help] : rows) {
    absl::StrAppend(&out, absl::StrFormat("%-*s  %s\n", static_cast<int>(width), left, help));
  }
  return out;
}

}  // namespace kplan::cli
