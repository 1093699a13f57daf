// The two hashes the library uses: FNV-1a over bytes (rng stream names, checkpoint checksums)
// and splitmix64's mixing step (seeding rng state, counter-based batch sampling).
#pragma once

#include <cstdint>
#include <string_view>

namespace decentrain::detail {

inline std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// splitmix64's output for state z: advance by the golden-ratio increment, then finalise.
inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace decentrain::detail
