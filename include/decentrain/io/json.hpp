// A small JSON reader for file headers (safetensors), not a general JSON library: objects,
// arrays, strings, numbers, true/false/null, with nesting depth bounded so a hostile header
// cannot exhaust the stack. Numbers keep their text; callers convert what they expect.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::io {

struct json_value {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  bool boolean = false;
  std::string text;  // string contents, or a number's literal
  std::vector<json_value> items;
  std::map<std::string, json_value> members;

  bool is(kind k) const { return type == k; }
  const json_value& at(const std::string& key) const {
    decentrain::detail::check(type == kind::object, "json: expected an object when looking up '", key, "'");
    auto it = members.find(key);
    decentrain::detail::check(it != members.end(), "json: missing key '", key, "'");
    return it->second;
  }
  std::int64_t as_int() const {
    decentrain::detail::check(type == kind::number, "json: expected a number, got ", describe());
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    decentrain::detail::check(used == text.size() && used > 0, "json: '", text, "' is not an integer");
    return v;
  }
  const std::string& as_string() const {
    decentrain::detail::check(type == kind::string, "json: expected a string, got ", describe());
    return text;
  }
  std::string describe() const {
    switch (type) {
      case kind::null: return "null";
      case kind::boolean: return "a boolean";
      case kind::number: return "the number " + text;
      case kind::string: return "a string";
      case kind::array: return "an array";
      case kind::object: return "an object";
    }
    return "?";
  }
};

}  // namespace decentrain::io

namespace decentrain::detail {
class json_parser {
 public:
  explicit json_parser(std::string_view s) : s_(s) {}

  io::json_value document() {
    io::json_value v = value(0);
    skip_space();
    check(pos_ == s_.size(), "trailing characters after the JSON value");
    return v;
  }

 private:
  static constexpr int max_depth = 64;

  void check(bool ok, const char* what) const {
    decentrain::detail::check(ok, "json: ", what, " at offset ", pos_);
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    skip_space();
    check(pos_ < s_.size(), "unexpected end of input");
    return s_[pos_];
  }
  void expect(char c) {
    check(peek() == c, "unexpected character");
    ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  io::json_value value(int depth) {
    using io::json_value;
    check(depth < max_depth, "nesting too deep");
    json_value v;
    const char c = peek();
    if (c == '{') {
      v.type = json_value::kind::object;
      ++pos_;
      if (peek() == '}') { ++pos_; return v; }
      while (true) {
        check(peek() == '"', "expected a string key");
        std::string key = string_body();
        expect(':');
        check(v.members.count(key) == 0, "duplicate key");
        v.members.emplace(std::move(key), value(depth + 1));
        if (peek() == ',') { ++pos_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = json_value::kind::array;
      ++pos_;
      if (peek() == ']') { ++pos_; return v; }
      while (true) {
        v.items.push_back(value(depth + 1));
        if (peek() == ',') { ++pos_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = json_value::kind::string;
      v.text = string_body();
      return v;
    }
    if (literal("true")) { v.type = json_value::kind::boolean; v.boolean = true; return v; }
    if (literal("false")) { v.type = json_value::kind::boolean; return v; }
    if (literal("null")) return v;
    const std::size_t start = pos_;
    number();
    v.type = json_value::kind::number;
    v.text = std::string(s_.substr(start, pos_ - start));
    return v;
  }

  std::string string_body() {
    expect('"');
    std::string out;
    while (true) {
      check(pos_ < s_.size(), "unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        check(static_cast<unsigned char>(c) >= 0x20, "control character in string");
        out += c;
        continue;
      }
      check(pos_ < s_.size(), "unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          // Characters beyond the BMP come as a surrogate pair; a lone half is not text.
          std::uint32_t code = hex4();
          check(code < 0xdc00 || code > 0xdfff, "\\u escape holds a low surrogate without a high one");
          if (code >= 0xd800 && code <= 0xdbff) {
            check(s_.substr(pos_, 2) == "\\u", "\\u escape holds a high surrogate without a low one");
            pos_ += 2;
            const std::uint32_t low = hex4();
            check(low >= 0xdc00 && low <= 0xdfff, "\\u escape holds a high surrogate without a low one");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, code);
          break;
        }
        default: check(false, "unknown escape");
      }
    }
  }

  std::uint32_t hex4() {
    check(pos_ + 4 <= s_.size(), "short \\u escape");
    std::uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') code |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') code |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') code |= static_cast<std::uint32_t>(h - 'A' + 10);
      else check(false, "bad hex digit in \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, std::uint32_t code) {
    const auto put = [&](std::uint32_t b) { out += static_cast<char>(b); };
    if (code < 0x80) {
      put(code);
    } else if (code < 0x800) {
      put(0xc0 | (code >> 6)), put(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      put(0xe0 | (code >> 12)), put(0x80 | ((code >> 6) & 0x3f)), put(0x80 | (code & 0x3f));
    } else {
      put(0xf0 | (code >> 18)), put(0x80 | ((code >> 12) & 0x3f)), put(0x80 | ((code >> 6) & 0x3f)),
          put(0x80 | (code & 0x3f));
    }
  }

  // JSON's number grammar exactly: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  void number() {
    const auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    const auto digits = [&](const char* what) {
      check(digit(), what);
      while (digit()) ++pos_;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    check(digit(), "expected a value");
    if (s_[pos_] == '0') {
      ++pos_;
      check(!digit(), "number with a leading zero");
    } else {
      digits("expected a digit");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      digits("expected a digit after the decimal point");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits("expected a digit in the exponent");
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};
}  // namespace decentrain::detail

namespace decentrain::io {

inline json_value parse_json(std::string_view text) { return detail::json_parser(text).document(); }

// A JSON string literal for `s` (used when writing headers).
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
    else if (c < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

}  // namespace decentrain::io
