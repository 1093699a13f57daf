// The one exception type of the library and the helpers that build its messages, so every
// failure names the offending value and what was expected (house rule 4).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace decentrain {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw error(concat(std::forward<Parts>(parts)...));
}

template <class... Parts>
void check(bool ok, Parts&&... parts) {
  if (!ok) fail(std::forward<Parts>(parts)...);
}

}  // namespace detail
}  // namespace decentrain
