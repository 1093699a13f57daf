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
    detail::check_finite(in, name);
    const std::size_t n = in.size(), nb = blocks(n);
    auto* codes = reinterpret_cast<std::uint8_t*>(out.data() + 4 * nb);
    const auto nblocks = static_cast<std::int64_t>(nb);
    DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, len = std::min(n, from + block) - from;
      const float* x = in.data() + from;
      // absmax through the bits (the values are finite, checked above; finite magnitudes order
      // as integers): an integer max reduction, which g++ and clang both vectorise.
      std::uint32_t top = 0;
      DECENTRAIN_OMP(simd reduction(max : top))
      for (std::size_t i = 0; i < len; ++i) {
        std::uint32_t u;
        std::memcpy(&u, x + i, 4);
        top = std::max(top, u & 0x7fffffffu);
      }
      float absmax;
      std::memcpy(&absmax, &top, 4);
      const float scale = absmax / 6.0f;
      std::memcpy(out.data() + 4 * static_cast<std::size_t>(b), &scale, 4);
      // 6 / absmax overflows f32 for a denormal absmax: there, in double.
      const double inv = absmax > 0 ? 6.0 / static_cast<double>(absmax) : 0.0;
      const bool tiny = inv > 1e30;
      const auto inv_f = static_cast<float>(inv);
      std::uint8_t q[block_chunk];
      for (std::size_t c0 = 0; c0 < len; c0 += block_chunk) {
        const std::size_t m = std::min(block_chunk, len - c0);
        if (tiny)
          for (std::size_t i = 0; i < m; ++i) q[i] = code_of(x[c0 + i], static_cast<float>(std::abs(static_cast<double>(x[c0 + i]) * inv)));
        else
          DECENTRAIN_OMP(simd)
          for (std::size_t i = 0; i < m; ++i) q[i] = code_of(x[c0 + i], std::abs(x[c0 + i]) * inv_f);
        std::uint8_t* o = codes + (from + c0) / 2;  // block and block_chunk are even
        for (std::size_t i = 0; i + 1 < m; i += 2) o[i / 2] = static_cast<std::uint8_t>(q[i] | (q[i + 1] << 4));
        if (m % 2) o[m / 2] = q[m - 1];
      }
    }
    return 4 * nb + (n + 1) / 2;
  }

  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    check_settings();
    const std::size_t n = into.size(), nb = blocks(n);
    decentrain::detail::check(in.size() == 4 * nb + (n + 1) / 2, name, " codec: a payload of ", in.size(), " bytes for ", n,
                              " values (expected ", 4 * nb + (n + 1) / 2, ")");
    detail::check_scales(in.data(), nb, name);
    const auto* codes = reinterpret_cast<const std::uint8_t*>(in.data() + 4 * nb);
    for (std::size_t i = 0; i < n; ++i)  // everything checked before anything is added
      decentrain::detail::check(code_at(codes, i) != 0x8u, name, " codec: value ", i, " has code -0, which is never written");
    if (n % 2) decentrain::detail::check((codes[n / 2] >> 4) == 0, name, " codec: the padding nibble after value ", n - 1, " is not 0");
    const auto nblocks = static_cast<std::int64_t>(nb);
    DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, len = std::min(n, from + block) - from;
      const float s = detail::load_f32(in.data() + 4 * static_cast<std::size_t>(b));
      float* y = into.data() + from;
      for (std::size_t i = 0; i < len; ++i) y[i] += grid[code_at(codes, from + i)] * s;
    }
  }

 private:
  void check_settings() const {
    decentrain::detail::check(block >= 2 && block % 2 == 0 && block <= (std::size_t{1} << 24), name,
                              " codec: block must be even and in [2, 2^24], got ", block);
  }
  static constexpr std::size_t block_chunk = 256;
  static constexpr float grid[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  // q = |x| / scale in [0, 6]: the number of midpoints below it is the magnitude's code. The
  // midpoints whose upper neighbour has the even code (0.75, 1.75, 3.5) round up on a tie.
  static std::uint8_t code_of(float x, float q) {
    const int m = (q > 0.25f) + (q >= 0.75f) + (q > 1.25f) + (q >= 1.75f) + (q > 2.5f) + (q >= 3.5f) + (q > 5.0f);
    return static_cast<std::uint8_t>(m | (m > 0 && x < 0 ? 8 : 0));
  }
  static unsigned code_at(const std::uint8_t* codes, std::size_t i) { return (codes[i / 2] >> (4 * (i % 2))) & 0xfu; }
};

static_assert(check_codec<fp4>());

}  // namespace decentrain::compress
