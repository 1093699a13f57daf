// Whether ops record a graph. Recording is switched off by a scope (`no_grad`), as in PyTorch.
// The flag is thread-local on purpose: each peer thread decides for itself, and there is no
// process-wide setting to leak between users of the library.
#pragma once

namespace decentrain {

namespace detail {
inline bool& grad_enabled_flag() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

inline bool grad_enabled() { return detail::grad_enabled_flag(); }

// While alive, no op records a graph on this thread (evaluation, optimizer updates).
class no_grad {
 public:
  no_grad() : previous_(detail::grad_enabled_flag()) { detail::grad_enabled_flag() = false; }
  ~no_grad() { detail::grad_enabled_flag() = previous_; }
  no_grad(const no_grad&) = delete;
  no_grad& operator=(const no_grad&) = delete;

 private:
  bool previous_;
};

}  // namespace decentrain
