// The hashes the library uses: FNV-1a over bytes (rng stream names), XXH64 (checkpoint and state
// checksums: gigabytes, so speed matters), splitmix64's mixing step (seeding rng state,
// counter-based batch sampling), and a word-wise hash for large buffers (do peers hold the same
// parameters?).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "decentrain/config.hpp"

namespace decentrain::detail {

inline std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// XXH64 (Yann Collet's xxHash, 64-bit, seed 0), written out here rather than linked: four
// independent lanes of 8-byte words, about 8 times FNV-1a's byte-at-a-time speed. Words are
// read little-endian, so the value is the same on every machine.
inline std::uint64_t xxh64(std::string_view bytes, std::uint64_t seed = 0) {
  constexpr std::uint64_t p1 = 11400714785074694791ull, p2 = 14029467366897019727ull, p3 = 1609587929392839161ull,
                          p4 = 9650029242287828579ull, p5 = 2870177450012600261ull;
  auto rotl = [](std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto read64 = [](const char* p) {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return v;
  };
  auto round = [&](std::uint64_t acc, std::uint64_t input) { return rotl(acc + input * p2, 31) * p1; };
  auto merge = [&](std::uint64_t acc, std::uint64_t v) { return (acc ^ round(0, v)) * p1 + p4; };
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  std::uint64_t h;
  if (bytes.size() >= 32) {
    std::uint64_t v1 = seed + p1 + p2, v2 = seed + p2, v3 = seed, v4 = seed - p1;
    for (; p + 32 <= end; p += 32) {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = seed + p5;
  }
  h += bytes.size();
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round(0, read64(p)), 27) * p1 + p4;
  if (p + 4 <= end) {
    std::uint64_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    h = rotl(h ^ (v * p1), 23) * p2 + p3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (static_cast<unsigned char>(*p) * p5), 11) * p1;
  h ^= h >> 33;
  h *= p2;
  h ^= h >> 29;
  h *= p3;
  return h ^ (h >> 32);
}

// splitmix64's output for state z: advance by the golden-ratio increment, then finalise (on the
// GPU too: the CUDA codecs draw stochastic rounding from the same stream).
DECENTRAIN_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform number in [0, 1) for value i of call `round` of a stream `seed`: the same on every
// thread and on the GPU (blockwise codecs' stochastic rounding).
DECENTRAIN_HOST_DEVICE inline float unit_draw(std::uint64_t seed, std::uint64_t round, std::uint64_t i) {
  const std::uint64_t h = splitmix64(seed ^ splitmix64(round) ^ (i * 0x9e3779b97f4a7c15ull));
  return static_cast<float>(h >> 40) * 0x1.0p-24f;
}

// 8 bytes at a time through splitmix64 (about 1 GB/s), the length mixed in; not for adversaries.
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
