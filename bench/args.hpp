// A benchmark's command line as `--flag value` pairs: value(key, fallback) takes a flag out,
// and finish() fails naming any flag nobody took (a typo fails before minutes of measuring).
#pragma once

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace bench {

class args {
 public:
  args(int argc, char** argv, const char* usage) {
    for (int i = 1; i < argc; i += 2) {
      decentrain::detail::check(i + 1 < argc && std::string(argv[i]).rfind("--", 0) == 0, usage);
      pairs_[argv[i] + 2] = argv[i + 1];
    }
  }
  std::string value(const std::string& key, const std::string& fallback) {
    auto it = pairs_.find(key);
    if (it == pairs_.end()) return fallback;
    std::string v = it->second;
    pairs_.erase(it);
    return v;
  }
  void finish() const {
    decentrain::detail::check(pairs_.empty(), "unknown option --", pairs_.empty() ? "" : pairs_.begin()->first);
  }

 private:
  std::map<std::string, std::string> pairs_;
};

// A list flag's items ("a,b,c"), empty items dropped.
inline std::vector<std::string> split(const std::string& list, char by) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, by);)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace bench
