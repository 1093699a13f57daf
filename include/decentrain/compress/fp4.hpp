// fp4: each value as an E2M1 float (a sign and one of 0, 0.5, 1, 1.5, 2, 3, 4, 6) times a scale
// per block (absmax / 6, as an f32), as Streaming DiLoCo sends its outer gradients: 7.1x fewer
// bytes than f32 at block 64, the same as int4, with finer steps near zero and coarser ones near
// the block's largest value. Rounds to the nearest grid point, ties to the even code, as
// IEEE does. Payload: the blocks' scales, then the codes (two to a byte, low nibble first);
// code 0b1000 (-0) is never written.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/config.hpp"

namespace decentrain::compress {

struct fp4 {
  static constexpr const char* name = "fp4";
  static constexpr bool dense = true;
  std::size_t block = 64;  // even: a byte never holds two blocks' codes

  std::string describe() const { return "fp4(block=" + std::to_string(block) + ")"; }
  std::size_t blocks(std::size_t n) const { return (n + block - 1) / block; }
  std::size_t max_encoded_bytes(std::size_t n) const {
    check_settings();
    return 4 * blocks(n) + (n + 1) / 2;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    check_settings();
    const std::size_t n = in.size(), nb = blocks(n);
    auto* codes = reinterpret_cast<std::uint8_t*>(out.data() + 4 * nb);
    const auto nblocks = static_cast<std::int64_t>(nb);
    int nonfinite = 0;
    DECENTRAIN_OMP(parallel for reduction(| : nonfinite) if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, len = std::min(n, from + block) - from;
      const float* x = in.data() + from;
      // absmax through the bits (finite magnitudes order as integers), an integer max reduction
      // that g++ and clang both vectorise; a value that is not finite is named after the pass.
      std::uint32_t top = 0;
      int bad = 0;
      DECENTRAIN_OMP(simd reduction(max : top) reduction(| : bad))
      for (std::size_t i = 0; i < len; ++i) {
        std::uint32_t u;
        std::memcpy(&u, x + i, 4);
        u &= 0x7fffffffu;
        top = std::max(top, u);
        bad |= u >= 0x7f800000u;
      }
      nonfinite |= bad;
      float absmax;
      std::memcpy(&absmax, &top, 4);
      const float scale = absmax / 6.0f;
      std::memcpy(out.data() + 4 * static_cast<std::size_t>(b), &scale, 4);
      // 6 / absmax overflows f32 for a denormal absmax: there, in double.
      const double inv = absmax > 0 ? 6.0 / static_cast<double>(absmax) : 0.0;
      const bool tiny = inv > 1e30;
      const auto inv_f = static_cast<float>(inv);
      std::uint8_t* o = codes + from / 2;  // block is even: the block starts a byte
      if (tiny) {
        auto code = [&](std::size_t i) { return code_of(x[i], static_cast<float>(std::abs(static_cast<double>(x[i]) * inv))); };
        for (std::size_t i = 0; i < len / 2; ++i) o[i] = static_cast<std::uint8_t>(code(2 * i) | (code(2 * i + 1) << 4));
        if (len % 2) o[len / 2] = code(len - 1);
      } else {  // two codes a byte, straight from the values: one loop that vectorises
        DECENTRAIN_OMP(simd)
        for (std::size_t i = 0; i < len / 2; ++i)
          o[i] = static_cast<std::uint8_t>(code_of(x[2 * i], std::abs(x[2 * i]) * inv_f) |
                                           (code_of(x[2 * i + 1], std::abs(x[2 * i + 1]) * inv_f) << 4));
        if (len % 2) o[len / 2] = code_of(x[len - 1], std::abs(x[len - 1]) * inv_f);
      }
    }
    if (nonfinite) detail::check_finite(in, name);  // names the first value that is not finite
    return 4 * nb + (n + 1) / 2;
  }

  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    check_settings();
    const std::size_t n = into.size(), nb = blocks(n);
    decentrain::detail::check(in.size() == 4 * nb + (n + 1) / 2, name, " codec: a payload of ", in.size(), " bytes for ", n,
                              " values (expected ", 4 * nb + (n + 1) / 2, ")");
    detail::check_scales(in.data(), nb, name);
    const auto* codes = reinterpret_cast<const std::uint8_t*>(in.data() + 4 * nb);
    // Everything checked before anything is added: one pass over the bytes, then the first bad
    // code named.
    int bad = 0;
    const auto bytes = static_cast<std::int64_t>((n + 1) / 2);
    DECENTRAIN_OMP_FOR_SIMD(reduction(| : bad) if (n >= (1 << 16)))
    for (std::int64_t i = 0; i < bytes; ++i) bad |= (codes[i] & 0xfu) == 0x8u || (codes[i] >> 4) == 0x8u;
    if (n % 2) decentrain::detail::check((codes[n / 2] >> 4) == 0, name, " codec: the padding nibble after value ", n - 1, " is not 0");
    if (bad)
      for (std::size_t i = 0; i < n; ++i)
        decentrain::detail::check(code_at(codes, i) != 0x8u, name, " codec: value ", i, " has code -0, which is never written");
    const auto nblocks = static_cast<std::int64_t>(nb);
    DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, len = std::min(n, from + block) - from;
      const float s = detail::load_f32(in.data() + 4 * static_cast<std::size_t>(b));
      float* y = into.data() + from;
      const std::uint8_t* c = codes + from / 2;  // block is even: the block starts a byte
      DECENTRAIN_OMP(simd)
      for (std::size_t i = 0; i < len / 2; ++i) {
        y[2 * i] += value_of(c[i] & 0xfu) * s;
        y[2 * i + 1] += value_of(c[i] >> 4) * s;
      }
      if (len % 2) y[len - 1] += value_of(c[len / 2] & 0xfu) * s;
    }
  }

 private:
  void check_settings() const {
    decentrain::detail::check(block >= 2 && block % 2 == 0 && block <= (std::size_t{1} << 24), name,
                              " codec: block must be even and in [2, 2^24], got ", block);
  }
  // q = |x| / scale in [0, 6]: the number of midpoints below it is the magnitude's code. The
  // midpoints whose upper neighbour has the even code (0.75, 1.75, 3.5) round up on a tie.
  static std::uint8_t code_of(float x, float q) {
    const unsigned m = unsigned{q > 0.25f} + unsigned{q >= 0.75f} + unsigned{q > 1.25f} + unsigned{q >= 1.75f} +
                       unsigned{q > 2.5f} + unsigned{q >= 3.5f} + unsigned{q > 5.0f};
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return static_cast<std::uint8_t>(m | ((u >> 28) & (m != 0 ? 8u : 0u)));  // a sign, never on a zero (no -0)
  }
  static unsigned code_at(const std::uint8_t* codes, std::size_t i) { return (codes[i / 2] >> (4 * (i % 2))) & 0xfu; }
  // The grid point of a code, built from its bits (E2M1: magnitude m = 2e + mantissa; 0.5 for
  // m = 1) instead of a table lookup, so the decode loop vectorises.
  static float value_of(unsigned code) {
    const unsigned m = code & 7u, e = m >> 1;
    const std::uint32_t normal = ((e + 126u) << 23) | ((m & 1u) << 22);  // m >= 2: (1 + mantissa / 2) x 2^(e - 1)
    const std::uint32_t magnitude = m >= 2 ? normal : (m == 1 ? 0x3f000000u : 0u);
    float v;
    const std::uint32_t bits = magnitude | (static_cast<std::uint32_t>(code & 8u) << 28);
    std::memcpy(&v, &bits, 4);
    return v;
  }
};

static_assert(check_codec<fp4>());

}  // namespace decentrain::compress
