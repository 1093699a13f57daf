// A "NAME[:SETTING,...]" spec (a codec's, an aggregator's: what a command line passes as text):
// split into the name and its settings (KEY=VALUE, or a bare KEY), numbers read strictly, every
// error naming what the spec is of, the spec and the setting.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::detail {

struct spec {
  std::string what;  // "codec", for messages
  std::string text;  // the whole spec, for messages
  std::string name;
  std::vector<std::pair<std::string, std::string>> settings;  // in order; a bare KEY has no '=' and an empty value

  spec(std::string of, std::string_view s) : what(std::move(of)), text(s) {
    // The name ends at ':' or, without settings of its own, at ',' ("median,partitioned" is
    // "median:partitioned").
    const auto colon = s.find_first_of(":,");
    name = std::string(s.substr(0, colon));
    if (colon == std::string_view::npos) return;
    const std::string rest(s.substr(colon + 1));
    for (std::size_t at = 0; at <= rest.size();) {
      const auto comma = std::min(rest.find(',', at), rest.size());
      const std::string p = rest.substr(at, comma - at);
      at = comma + 1;
      check(!p.empty(), what, " '", text, "': an empty setting");
      const auto eq = p.find('=');
      settings.emplace_back(p.substr(0, eq), eq == std::string::npos ? "" : p.substr(eq + 1));
    }
  }

  double number(const std::string& key, const std::string& value) const {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == value.size() && used > 0 && std::isfinite(v), what, " '", text, "': ", key, " expects a number, got '", value,
          "'");
    return v;
  }
  std::uint64_t whole(const std::string& key, const std::string& value, double lo, double hi) const {
    const double v = number(key, value);
    check(v == std::floor(v) && v >= lo && v <= hi, what, " '", text, "': ", key, " must be a whole number in [", lo, ", ", hi,
          "], got ", value);
    return static_cast<std::uint64_t>(v);
  }
};

}  // namespace decentrain::detail
