// --device: where a process's peers compute. cpu; cuda (each peer on a GPU of its own where
// there are several: rank r on GPU r % count, else all on one); cuda:N (every peer on GPU N).
// Peers of one run may differ: a TCP peer on a GPU trains beside CPU peers.
#pragma once

#include <decentrain/detail/error.hpp>

#include <charconv>
#include <string>

namespace cli {

struct device_choice {
  bool cuda = false;
  int index = -1;  // cuda:N; -1: by rank

  std::string describe() const { return !cuda ? "cpu" : index < 0 ? "cuda" : "cuda:" + std::to_string(index); }
};

inline device_choice parse_device(const std::string& s) {
  if (s == "cpu") return {};
  if (s == "cuda") return {true, -1};
  const bool prefixed = s.size() > 5 && s.rfind("cuda:", 0) == 0;
  int n = -1;
  if (prefixed) {
    const auto [end, ec] = std::from_chars(s.data() + 5, s.data() + s.size(), n);
    if (ec != std::errc() || end != s.data() + s.size()) n = -1;
  }
  decentrain::detail::check(prefixed && n >= 0 && n < 1024, "--device: expected cpu, cuda or cuda:N (N a GPU's index, from 0), got '",
                            s, "'");
  return {true, n};
}

}  // namespace cli
