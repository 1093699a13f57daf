// decentrain-gpt's options: each command declares every option it takes once (its name, the value
// it holds, its help, its default and its range) on a CLI11 subcommand; CLI11 parses the command
// line (--name value, --name=value) and the entries of --config FILE against the declarations, and
// the program reads the values back through `options`. The help prints the declared defaults and
// the program reads the same ones, so the two cannot drift; a value outside its range, of the
// wrong type or under an unknown name is refused at parse time, naming the option.
#pragma once

#include "config_file.hpp"

#include <decentrain/detail/error.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cli {

// ---- values ----------------------------------------------------------------------------------

inline std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The whole text as an integer, or nothing (no sign-only, trailing junk or overflow).
inline std::optional<std::int64_t> parse_integer(const std::string& s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}
// The whole text as a finite number, or nothing.
inline std::optional<double> parse_real(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// ---- declarations ----------------------------------------------------------------------------

// An option holding an integer in [lo, hi]; `fallback` is its default (none: the help says what
// its absence means, and the program asks has() first).
inline CLI::Option* integer(CLI::App& cmd, const std::string& name, const std::string& value_name, const std::string& help,
                            std::optional<std::int64_t> fallback, std::int64_t lo, std::int64_t hi) {
  auto* o = cmd.add_option("--" + name, help)->type_name(value_name);
  if (fallback) o->default_str(std::to_string(*fallback));
  o->check(CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const bool digits = !s.empty() && s.find_first_not_of("-0123456789") == std::string::npos;
        const auto v = parse_integer(s);
        if (!v && !digits) return "expects an integer, got '" + s + "'";
        if (!v || *v < lo || *v > hi)  // an integer too large for 64 bits is outside the range too
          return "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + s;
        return {};
      },
      "", "integer"));
  return o;
}

// An option holding a finite number in [lo, hi].
inline CLI::Option* real(CLI::App& cmd, const std::string& name, const std::string& value_name, const std::string& help,
                         std::optional<double> fallback, double lo = -std::numeric_limits<double>::max(),
                         double hi = std::numeric_limits<double>::max()) {
  auto* o = cmd.add_option("--" + name, help)->type_name(value_name);
  if (fallback) o->default_str(show(*fallback));
  o->check(CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const auto v = parse_real(s);
        if (!v) return "expects a finite number, got '" + s + "'";
        if (*v < lo || *v > hi) return "must be in [" + show(lo) + ", " + show(hi) + "], got " + s;
        return {};
      },
      "", "real"));
  return o;
}

// An option holding text ("" by default unless `fallback` says otherwise).
inline CLI::Option* text(CLI::App& cmd, const std::string& name, const std::string& value_name, const std::string& help,
                         const std::string& fallback = "") {
  auto* o = cmd.add_option("--" + name, help)->type_name(value_name);
  if (!fallback.empty()) o->default_str(fallback);
  return o;
}

// An option holding one of `names` (the first is the default unless `fallback` is given as "").
inline CLI::Option* choice(CLI::App& cmd, const std::string& name, const std::string& value_name, const std::string& help,
                           const std::vector<std::string>& names, std::optional<std::string> fallback = std::nullopt) {
  auto* o = text(cmd, name, value_name, help, fallback ? *fallback : names.front());
  o->check(CLI::Validator(
      [names](std::string& s) -> std::string {
        for (const auto& n : names)
          if (s == n) return {};
        std::string list;
        for (std::size_t i = 0; i < names.size(); ++i)
          list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
        return "must be " + list + ", got '" + s + "'";
      },
      "", "choice"));
  return o;
}

// A flag: given or not (--name=false undoes one given in --config).
inline CLI::Option* flag(CLI::App& cmd, const std::string& name, const std::string& help) {
  return cmd.add_flag("--" + name, help);
}

// ---- lookups ---------------------------------------------------------------------------------

// The parsed options of one command. Asking for an option the command did not declare is a bug
// of the program (std::logic_error), not of the user.
class options {
 public:
  explicit options(const CLI::App& cmd) : cmd_(&cmd) {}

  // Given on the command line or in --config.
  bool has(const std::string& name) const { return option(name)->count() > 0; }
  bool flag(const std::string& name) const {
    const auto* o = option(name);
    if (o->count() == 0) return false;
    const auto& v = o->results().back();
    return !(v == "false" || v == "0" || v == "off" || v == "no");
  }
  // The value given (the last one, when given twice), else the declared default.
  std::string text(const std::string& name) const {
    const auto* o = option(name);
    return o->count() > 0 ? o->results().back() : o->get_default_str();
  }
  std::int64_t integer(const std::string& name) const { return *parse_integer(value(name)); }
  double real(const std::string& name) const { return *parse_real(value(name)); }
  const CLI::App& command() const { return *cmd_; }

 private:
  const CLI::Option* option(const std::string& name) const {
    const auto* o = cmd_->get_option_no_throw("--" + name);
    if (o == nullptr) throw std::logic_error("decentrain-gpt " + cmd_->get_name() + " declares no option --" + name);
    return o;
  }
  // Numbers were validated at parse time; one with no default must be asked about with has().
  std::string value(const std::string& name) const {
    const auto v = text(name);
    if (v.empty()) throw std::logic_error("--" + name + " has no default: ask has() first");
    return v;
  }
  const CLI::App* cmd_;
};

// ---- help ------------------------------------------------------------------------------------

// CLI11's help, with each option's default at the end of its description, as "(default X)".
class formatter : public CLI::Formatter {
 public:
  formatter() { column_width(25); }
  std::string make_option_opts(const CLI::Option* o) const override {
    return o->get_expected_max() != 0 && !o->get_type_name().empty() ? " " + o->get_type_name() : std::string();
  }
  std::string make_option_desc(const CLI::Option* o) const override {
    std::string d = o->get_description();
    if (o->get_expected_max() != 0 && !o->get_default_str().empty()) d += " (default " + o->get_default_str() + ")";
    return wrap(d, 72);
  }
  // Words refilled into lines of at most `width` columns (CLI11 indents each line under the first).
  static std::string wrap(const std::string& text, std::size_t width) {
    std::string out, line, word;
    std::istringstream words(text);
    while (words >> word) {
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    return out + line;
  }
};

// ---- parsing ---------------------------------------------------------------------------------

// Where a library error names a setting that a flag sets, the flag follows it:
// "tcp_options::join" reads "tcp_options::join (--join HOST:PORT)".
inline std::string with_flags(std::string what) {
  static const std::pair<const char*, const char*> flags[] = {
      {"tcp_options::join", "--join HOST:PORT"},
      {"tcp_options::advertise", "--advertise HOST"},
      {"tcp_options::key", "--key-file or DECENTRAIN_KEY_FILE"},
      {"tcp_options::identity", "--identity, --roster"},
      {"tcp_options::tls", "--tls-cert, --tls-key, --tls-ca"},
      {"tls::options certificate, private_key, ca", "--tls-cert, --tls-key, --tls-ca"},
      {"identity::options::identity", "--identity"},
      {"identity::options::roster", "--roster"},
  };
  for (const auto& [setting, flag] : flags)
    for (auto at = what.find(setting); at != std::string::npos; at = what.find(setting, at + 1)) {
      const auto end = at + std::string_view(setting).size();
      if (end < what.size() && (std::isalnum(static_cast<unsigned char>(what[end])) || what[end] == '_')) continue;
      const auto note = std::string(" (") + flag + ")";
      what.insert(end, note);
      at = end + note.size() - 1;
    }
  return what;
}

// The library's errors name its own settings ("codec 'int5': ..."); the flag a value came from is
// the command line's to add: `--codec: codec 'int5': unknown codec ...`.
template <class Parse>
auto from_flag(const char* flag, Parse&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const decentrain::error& e) {
    throw decentrain::error(decentrain::detail::concat(flag, ": ", e.what()));
  }
}

// What a command line was: a parse error (the user's; status 2), help asked for, or options.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The subcommand `name` of `app`, or nullptr.
inline CLI::App* find_command(const CLI::App& app, const std::string& name) {
  for (auto* c : const_cast<CLI::App&>(app).get_subcommands([](const CLI::App*) { return true; }))
    if (c->get_name() == name) return c;
  return nullptr;
}

namespace detail {

// --config FILE's entries as --name=value arguments for `cmd`: the keys at the top of the file
// and under [<command>] (tables of other commands are theirs; '_' may stand for '-').
inline std::vector<std::string> config_arguments(const CLI::App& app, const CLI::App& cmd, const std::string& file) {
  std::vector<std::string> out;
  for (const auto& e : read_config_file(file)) {
    const auto where = file + ":" + std::to_string(e.line) + ": ";
    if (!e.table.empty() && e.table != cmd.get_name()) {
      if (find_command(app, e.table) == nullptr)
        throw usage_error(file + ":" + std::to_string(e.table_line) + ": [" + e.table + "] is not a command of decentrain-gpt");
      continue;
    }
    std::string key = e.key;
    for (auto& c : key)
      if (c == '_') c = '-';
    const auto* o = cmd.get_option_no_throw("--" + key);
    if (o == nullptr || key == "config" || key == "help")
      throw usage_error(where + "'" + e.key + "' is not an option of decentrain-gpt " + cmd.get_name() + " (see decentrain-gpt " +
                        cmd.get_name() + " --help)");
    const bool is_flag = o->get_expected_max() == 0;  // add_flag: expects no value
    if (is_flag) {
      if (e.array || e.values[0].type != config_value::kind::boolean)
        throw usage_error(where + e.key + " is a flag: write " + e.key + " = true or false");
      out.push_back("--" + key + "=" + e.values[0].text);
      continue;
    }
    std::string value;
    for (const auto& v : e.values) {
      if (v.type == config_value::kind::boolean)
        throw usage_error(where + e.key + " takes a value, not " + v.text + " (only flags are true or false)");
      value += (value.empty() ? "" : ",") + v.text;
    }
    if (value.empty()) {  // CLI11 reads "--name=" as "--name" and takes the next argument
      out.push_back("--" + key);
      out.emplace_back();
    } else {
      out.push_back("--" + key + "=" + value);
    }
  }
  return out;
}

}  // namespace detail

// Parses argv[2..] as the options of subcommand `cmd` of `app`: --config FILE's entries first,
// then the command line, whose values win (each option keeps the last value given). Throws
// usage_error for anything the user got wrong, CLI::CallForHelp for --help.
inline void parse(CLI::App& app, CLI::App& cmd, int argc, char** argv) {
  std::vector<std::string> args{cmd.get_name()};
  std::size_t from_files = 0;  // config arguments so far: a later --config's come after (and win)
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    std::string file;
    if (a == "--config") {
      if (i + 1 >= argc) throw usage_error("--config: needs a file");
      file = argv[i + 1];
    } else if (a.rfind("--config=", 0) == 0) {
      file = a.substr(9);
    }
    if (!file.empty()) {
      std::vector<std::string> from_file;
      try {
        from_file = detail::config_arguments(app, cmd, file);
      } catch (const decentrain::error& e) {
        throw usage_error(e.what());
      }
      args.insert(args.begin() + 1 + static_cast<std::ptrdiff_t>(from_files), from_file.begin(), from_file.end());
      from_files += from_file.size();
    }
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      args.push_back(a.substr(0, a.size() - 1));  // "--name=": an empty value, which CLI11 would read as a bare "--name"
      args.emplace_back();
    } else {
      args.push_back(a);
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector of arguments last-first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    throw;
  } catch (const CLI::ArgumentMismatch& e) {  // "--x: 1 required N missing"
    const std::string what = e.what();
    throw usage_error(what.substr(0, what.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
  const auto rest = cmd.remaining();
  if (!rest.empty()) {
    const auto& r = rest.front();
    throw usage_error(r.rfind("-", 0) == 0
                          ? "unknown option " + r.substr(0, r.find('=')) + " (see decentrain-gpt " + cmd.get_name() + " --help)"
                          : "unexpected argument '" + r + "' (options start with --)");
  }
}

}  // namespace cli
