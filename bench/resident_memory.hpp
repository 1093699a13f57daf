// The process's resident memory, for the programs that show a peer does not grow on what another
// peer sends it (the transport tests, bench/random_insider.hpp).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <fstream>

namespace bench {

// Bytes of this process in memory now (/proc/self/statm's second field, in pages).
inline std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace bench
