// decentrain-gpt --config FILE: the TOML a run's options can be written in.
//
//   # run.toml
//   preset = "shakespeare-char"
//   steps = 2000
//   resume = true
//   join = ["10.0.0.1:7000", "10.0.0.2:7000"]
//   [train]            # keys under a command's table apply to that command only
//   batch-size = 16
//
// The subset of TOML that options need: comments, `key = value` with bare keys, strings (basic
// with escapes, and literal), integers, floats, booleans, one-line arrays of those, and tables
// named after commands. Anything else is refused with the file and line: a configuration that is
// read differently from how it was meant is worse than one that is refused. (CLI11's own reader,
// as Debian ships it, cuts a string at a '#' inside it and keeps its quote.)
#pragma once

#include <decentrain/detail/error.hpp>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace cli {

struct config_value {
  enum class kind { text, integer, real, boolean };
  kind type = kind::text;
  std::string text;  // as an option would be given it: a string unquoted, a number as written
};

struct config_entry {
  std::string table;  // "" for keys before any [table]
  std::string key;
  std::vector<config_value> values;  // one, or an array's items
  bool array = false;
  int line = 0;
  int table_line = 0;  // where [table] stands
};

namespace detail {

class config_line_parser {
 public:
  config_line_parser(const std::string& file, int line, const std::string& text) : file_(file), line_(line), s_(text) {}

  [[noreturn]] void fail(const std::string& what) const {
    decentrain::detail::fail(file_, ":", line_, ": ", what, " (decentrain-gpt reads a subset of TOML: key = value)");
  }
  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t')) ++at_;
  }
  bool done() {
    skip_space();
    return at_ == s_.size() || s_[at_] == '#';
  }
  char peek() const { return at_ < s_.size() ? s_[at_] : '\0'; }

  std::string bare_key() {
    skip_space();
    const auto start = at_;
    while (at_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[at_])) || s_[at_] == '-' || s_[at_] == '_')) ++at_;
    if (at_ == start) fail("expected a name, got '" + s_.substr(start) + "'");
    return s_.substr(start, at_ - start);
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "', got '" + s_.substr(at_) + "'");
    ++at_;
  }

  config_value value() {
    skip_space();
    const char c = peek();
    if (c == '"') return {config_value::kind::text, basic_string()};
    if (c == '\'') return {config_value::kind::text, literal_string()};
    const auto start = at_;
    while (at_ < s_.size() && !std::isspace(static_cast<unsigned char>(s_[at_])) && s_[at_] != ',' && s_[at_] != ']' &&
           s_[at_] != '#')
      ++at_;
    std::string word = s_.substr(start, at_ - start);
    if (word == "true" || word == "false") return {config_value::kind::boolean, word};
    if (word.empty()) fail("expected a value, got '" + s_.substr(start) + "'");
    // Numbers: digits with an optional sign, underscores between digits, a fraction and an exponent.
    std::string digits;
    for (std::size_t i = 0; i < word.size(); ++i) {
      if (word[i] != '_') digits += word[i];
      else if (i == 0 || i + 1 == word.size() || !std::isdigit(static_cast<unsigned char>(word[i - 1])) ||
               !std::isdigit(static_cast<unsigned char>(word[i + 1])))
        fail("'" + word + "' is not a number: an underscore must stand between digits");
    }
    std::size_t i = digits[0] == '+' || digits[0] == '-' ? 1 : 0;
    const auto int_start = i;
    while (i < digits.size() && std::isdigit(static_cast<unsigned char>(digits[i]))) ++i;
    bool is_real = false, ok = i > int_start;
    if (ok && i < digits.size() && digits[i] == '.') {
      is_real = true;
      const auto frac = ++i;
      while (i < digits.size() && std::isdigit(static_cast<unsigned char>(digits[i]))) ++i;
      ok = i > frac;
    }
    if (ok && i < digits.size() && (digits[i] == 'e' || digits[i] == 'E')) {
      is_real = true;
      ++i;
      if (i < digits.size() && (digits[i] == '+' || digits[i] == '-')) ++i;
      const auto exp = i;
      while (i < digits.size() && std::isdigit(static_cast<unsigned char>(digits[i]))) ++i;
      ok = i > exp;
    }
    if (!ok || i != digits.size())
      fail("'" + word + "' is not a value: strings are quoted (\"text\"), numbers are digits, booleans true or false");
    return {is_real ? config_value::kind::real : config_value::kind::integer, digits};
  }

 private:
  std::string basic_string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= s_.size()) fail("a string is not closed (a string stays on one line)");
      const char c = s_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) fail("a string ends in a lone backslash");
      const char e = s_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u':
        case 'U': unicode(out, e == 'u' ? 4 : 8); break;
        default: fail(std::string("unknown escape \\") + e + " in a string (a Windows path goes in 'single quotes')");
      }
    }
  }
  void unicode(std::string& out, int digits) {
    if (at_ + static_cast<std::size_t>(digits) > s_.size()) fail("\\u needs hexadecimal digits");
    std::uint32_t cp = 0;
    for (int k = 0; k < digits; ++k) {
      const char h = s_[at_++];
      if (!std::isxdigit(static_cast<unsigned char>(h))) fail("\\u needs hexadecimal digits");
      cp = cp * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("\\u escape is not a Unicode scalar value");
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string literal_string() {
    const auto end = s_.find('\'', ++at_);
    if (end == std::string::npos) fail("a string is not closed (a string stays on one line)");
    std::string out = s_.substr(at_, end - at_);
    at_ = end + 1;
    return out;
  }

  const std::string& file_;
  int line_;
  const std::string& s_;
  std::size_t at_ = 0;
};

}  // namespace detail

// The entries of `file`, in order; a key given twice in one table is refused, as TOML does.
inline std::vector<config_entry> read_config_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  decentrain::detail::check(in.good(), "--config ", file, " cannot be read");
  std::vector<config_entry> out;
  std::map<std::pair<std::string, std::string>, int> seen;
  std::string table, text;
  int table_line = 0;
  for (int line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    // Not text (a binary file given by mistake): named by its first such byte, never echoed.
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", c);
        decentrain::detail::fail(file, ":", line, ": not a text file (byte ", hex, " at column ", i + 1,
                                 "); --config takes a TOML file of key = value lines");
      }
    }
    detail::config_line_parser p(file, line, text);
    if (p.done()) continue;
    if (p.peek() == '[') {
      p.expect('[');
      if (p.peek() == '[') p.fail("arrays of tables are not options");
      table = p.bare_key();
      table_line = line;
      p.expect(']');
      if (!p.done()) p.fail("unexpected text after [" + table + "]");
      continue;
    }
    config_entry e;
    e.table = table;
    e.line = line;
    e.table_line = table_line;
    e.key = p.bare_key();
    p.expect('=');
    p.skip_space();
    if (p.peek() == '[') {
      e.array = true;
      p.expect('[');
      p.skip_space();
      if (p.peek() == ']') {
        p.expect(']');
      } else {
        for (;;) {
          e.values.push_back(p.value());
          p.skip_space();
          if (p.peek() == ',') {
            p.expect(',');
            p.skip_space();
            if (p.peek() == ']') {  // a trailing comma
              p.expect(']');
              break;
            }
            continue;
          }
          if (p.peek() != ']') p.fail("an array is not closed (an array stays on one line)");
          p.expect(']');
          break;
        }
      }
    } else {
      e.values.push_back(p.value());
    }
    if (!p.done()) p.fail("unexpected text after the value of " + e.key);
    if (const auto [it, fresh] = seen.emplace(std::pair{table, e.key}, line); !fresh)
      p.fail(e.key + " is given twice (first on line " + std::to_string(it->second) + ")");
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace cli
