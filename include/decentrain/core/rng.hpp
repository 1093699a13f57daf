// Seeded, named random streams. Every source of randomness in the library is one of these, so
// a run is reproducible from its seeds and two streams with different names never correlate.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <string_view>

#include "decentrain/detail/hash.hpp"

namespace decentrain {

class rng {
 public:
  using state_type = std::array<std::uint64_t, 4>;

  rng(std::uint64_t seed, std::string_view name) : name_(name) {
    // The name is hashed (FNV-1a) into the seed; splitmix64 then fills xoshiro's state.
    std::uint64_t x = seed ^ detail::fnv1a(name);
    for (auto& word : state_) {
      word = detail::splitmix64(x);
      x += 0x9e3779b97f4a7c15ull;
    }
  }

  const std::string& name() const { return name_; }

  // xoshiro256**: fast, 256-bit state, passes BigCrush.
  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  // Uniform integer in [0, n) without modulo bias (Lemire's method).
  std::uint64_t below(std::uint64_t n) {
    detail::uint128 m = static_cast<detail::uint128>(next_u64()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<detail::uint128>(next_u64()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  // Standard normal by Box-Muller; both values of a pair are returned so nothing is cached.
  std::array<double, 2> normal_pair() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    return {r * std::cos(theta), r * std::sin(theta)};
  }
  double normal() { return normal_pair()[0]; }

  const state_type& state() const { return state_; }
  void set_state(const state_type& s) { state_ = s; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  std::string name_;
  state_type state_{};
};

}  // namespace decentrain
