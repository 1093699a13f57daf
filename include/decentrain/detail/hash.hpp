// The hashes the library uses: FNV-1a over bytes (rng stream names, small settings), XXH3
// (checkpoint and state checksums: gigabytes, so speed matters; XXH64 for checkpoints of format
// 2), splitmix64's mixing step (seeding rng state, counter-based batch sampling), and a word-wise
// hash for large buffers (do peers hold the same parameters?).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

// xxHash (Debian libxxhash-dev), header-only: XXH_INLINE_ALL gives its functions internal
// linkage under private names, so a program that links its own libxxhash is not disturbed.
// g++ at -Og refuses xxHash 0.8's forced inlining ("inlining failed in call to always_inline"):
// such a build defines XXH_NO_INLINE_HINTS (as DECENTRAIN_TESTS_OG does), which leaves inlining to
// the compiler; at -O2 and -O3 the hints make XXH3 faster, so they stay.
#if !defined(XXH_INLINE_ALL)
#define XXH_INLINE_ALL
#define DECENTRAIN_DEFINED_XXH_INLINE_ALL
#endif
#include <xxhash.h>
#if defined(DECENTRAIN_DEFINED_XXH_INLINE_ALL)
#undef XXH_INLINE_ALL
#undef DECENTRAIN_DEFINED_XXH_INLINE_ALL
#endif

#include "decentrain/config.hpp"

namespace decentrain::detail {

inline std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// XXH64 and XXH3 (64-bit, seed 0): the same value on every machine. XXH3 is the one to use; XXH64
// reads checkpoints of format 2.
inline std::uint64_t xxh64(std::string_view bytes) { return XXH64(bytes.data(), bytes.size(), 0); }
inline std::uint64_t xxh3(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

// XXH3 of bytes that come in pieces: the same value as xxh3 of the pieces joined.
class xxh3_stream {
 public:
  xxh3_stream() { XXH3_64bits_reset(&state_); }
  void update(std::string_view bytes) { XXH3_64bits_update(&state_, bytes.data(), bytes.size()); }
  std::uint64_t digest() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

// splitmix64's output for state z: advance by the golden-ratio increment, then finalise (on the
// GPU too: the CUDA codecs draw stochastic rounding from the same stream).
DECENTRAIN_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Stochastic rounding's draws (the blockwise codecs, on the CPU and the GPU alike): a uniform
// number in [0, 1), 24 bits, for value i of call `round` of a stream `seed`, the same on every
// thread. The call's key is one splitmix64 per call; each value's draw is a 32-bit mix of its
// index (two 32-bit multiplies, which SSE2 vectorises, where 64-bit ones it does not), keyed for
// each 2^32 values by a word of their own.
DECENTRAIN_HOST_DEVICE inline std::uint64_t draw_key(std::uint64_t seed, std::uint64_t round) {
  return splitmix64(seed ^ splitmix64(round));
}
// The key's word for values [2^32 high, 2^32 (high + 1)).
DECENTRAIN_HOST_DEVICE inline std::uint32_t draw_word(std::uint64_t key, std::uint64_t high) {
  return static_cast<std::uint32_t>(high == 0 ? key : splitmix64(key + high));
}
// Chris Wellons' lowbias32 (hash-prospector): a bijection on 32 bits with low bias.
DECENTRAIN_HOST_DEVICE inline std::uint32_t lowbias32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
// Value `low` (its index's low 32 bits) under `word`; through int32, which SSE2 converts.
DECENTRAIN_HOST_DEVICE inline float unit_draw_in(std::uint32_t word, std::uint32_t low) {
  return static_cast<float>(static_cast<std::int32_t>(lowbias32(low ^ word) >> 8)) * 0x1.0p-24f;
}
DECENTRAIN_HOST_DEVICE inline float unit_draw(std::uint64_t seed, std::uint64_t round, std::uint64_t i) {
  return unit_draw_in(draw_word(draw_key(seed, round), i >> 32), static_cast<std::uint32_t>(i));
}

// 8 bytes at a time through splitmix64, the length mixed in; not for adversaries.
inline std::uint64_t hash_words(std::span<const std::byte> bytes) {
  std::uint64_t h = splitmix64(bytes.size());
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = splitmix64(h ^ w);
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  return splitmix64(h ^ tail);
}

}  // namespace decentrain::detail
