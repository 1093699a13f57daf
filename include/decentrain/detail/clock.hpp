// The calling thread's CPU time: what a simulated link charges as compute when in-process peers
// share fewer cores than there are peers (wall time would count the other peers' turns).
#pragma once

#include <chrono>
#include <ctime>

namespace decentrain::detail {

inline double thread_cpu_seconds() {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace decentrain::detail
