// What this thread is doing, for the diagnostics that name it (in_process's deadlock report):
// the trainer's step and the collective call in progress. The trainer and the communicator set
// it with the scopes below; a transport reads it on the same thread. Costs a thread-local store.
#pragma once

#include <cstdint>

namespace decentrain::detail {

struct activity {
  std::int64_t step = -1;      // the step being trained (-1: none)
  const char* call = nullptr;  // the collective in progress ("all_reduce"), or none
};

inline activity& this_thread_activity() {
  thread_local activity a;
  return a;
}

// Sets this thread's call for the scope's life (the enclosing one's again after it).
class doing_call {
 public:
  explicit doing_call(const char* call) : before_(this_thread_activity().call) { this_thread_activity().call = call; }
  ~doing_call() { this_thread_activity().call = before_; }
  doing_call(const doing_call&) = delete;
  doing_call& operator=(const doing_call&) = delete;

 private:
  const char* before_;
};

}  // namespace decentrain::detail
