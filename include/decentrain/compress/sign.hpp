// signSGD-style: one bit per value (its sign) and, per block, the mean magnitude as the scale:
// 32x fewer bytes than f32 at large blocks. Very lossy on its own; meant to run inside
// error_feedback<sign>, which carries what it drops into the next round.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"

namespace decentrain::compress {

struct sign {
  static constexpr const char* name = "sign";
  static constexpr bool dense = true;
  std::size_t block = 256;  // a multiple of 8, so a block's bits are whole bytes

  std::string describe() const { return "sign(block=" + std::to_string(block) + ")"; }
  std::size_t blocks(std::size_t n) const { return (n + block - 1) / block; }
  std::size_t max_encoded_bytes(std::size_t n) const {
    check_settings();
    return 4 * blocks(n) + (n + 7) / 8;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    check_settings();
    const std::size_t n = in.size(), nb = blocks(n);
    auto* bits = reinterpret_cast<std::uint8_t*>(out.data() + 4 * nb);
    std::memset(bits, 0, (n + 7) / 8);
    const auto nblocks = static_cast<std::int64_t>(nb);
    unsigned nonfinite = 0;  // checked in the same pass, named after it
    DECENTRAIN_OMP(parallel for reduction(| : nonfinite) if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, to = std::min(n, from + block);
      // Eight running sums in double (one per lane: they vectorise without reordering a sum, and
      // finite magnitudes near f32's largest cannot overflow them); a byte of sign bits per eight
      // values (a block is whole bytes).
      double lanes[8] = {};
      auto eight = [&](std::size_t i, std::size_t m) {  // values i .. i + m - 1 (m <= 8) into one byte
        unsigned byte = 0;
        for (std::size_t j = 0; j < m; ++j) {
          std::uint32_t u;
          std::memcpy(&u, in.data() + i + j, 4);
          lanes[j] += std::abs(in[i + j]);
          byte |= ((u >> 31) ^ 1u) << j;
          nonfinite |= (u & 0x7f800000u) == 0x7f800000u;
        }
        bits[i / 8] = static_cast<std::uint8_t>(byte);
      };
      std::size_t i = from;
#if defined(__SSE2__)
      // Eight values at a time: their sign bits straight from movemask (the loop above does not
      // vectorise), the same lanes and the same sums in the same order as the loop, so the same
      // payload.
      {
        const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
        const __m128i exponent = _mm_set1_epi32(0x7f800000);
        __m128d l01 = _mm_setzero_pd(), l23 = l01, l45 = l01, l67 = l01;
        __m128i ones = _mm_setzero_si128();  // lanes whose exponent is all ones: inf or NaN
        for (; i + 8 <= to; i += 8) {
          const __m128 lo = _mm_loadu_ps(in.data() + i), hi = _mm_loadu_ps(in.data() + i + 4);
          bits[i / 8] = static_cast<std::uint8_t>(~(_mm_movemask_ps(lo) | (_mm_movemask_ps(hi) << 4)));
          const __m128 ma = _mm_and_ps(lo, magnitude), mb = _mm_and_ps(hi, magnitude);
          l01 = _mm_add_pd(l01, _mm_cvtps_pd(ma));
          l23 = _mm_add_pd(l23, _mm_cvtps_pd(_mm_movehl_ps(ma, ma)));
          l45 = _mm_add_pd(l45, _mm_cvtps_pd(mb));
          l67 = _mm_add_pd(l67, _mm_cvtps_pd(_mm_movehl_ps(mb, mb)));
          ones = _mm_or_si128(ones, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(lo), exponent), exponent));
          ones = _mm_or_si128(ones, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(hi), exponent), exponent));
        }
        _mm_storeu_pd(lanes, l01);
        _mm_storeu_pd(lanes + 2, l23);
        _mm_storeu_pd(lanes + 4, l45);
        _mm_storeu_pd(lanes + 6, l67);
        nonfinite |= _mm_movemask_epi8(ones) != 0;
      }
#endif
      for (; i + 8 <= to; i += 8) eight(i, 8);
      if (i < to) eight(i, to - i);
      double total = 0;
      for (double l : lanes) total += l;
      const float scale = static_cast<float>(total / static_cast<double>(to - from));
      std::memcpy(out.data() + 4 * static_cast<std::size_t>(b), &scale, 4);
    }
    if (nonfinite) detail::check_finite(in, name);  // names the first value that is not finite
    return 4 * nb + (n + 7) / 8;
  }

  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    check_settings();
    const std::size_t n = into.size(), nb = blocks(n);
    decentrain::detail::check(in.size() == 4 * nb + (n + 7) / 8, "sign codec: a payload of ", in.size(), " bytes for ", n,
                              " values (expected ", 4 * nb + (n + 7) / 8, ")");
    detail::check_scales(in.data(), nb, name);
    const auto* bits = reinterpret_cast<const std::uint8_t*>(in.data() + 4 * nb);
    if (n % 8) decentrain::detail::check((bits[n / 8] >> (n % 8)) == 0, "sign codec: padding bits after value ", n - 1, " are not 0");
    const auto nblocks = static_cast<std::int64_t>(nb);
    DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, to = std::min(n, from + block);
      const float s = detail::load_f32(in.data() + 4 * static_cast<std::size_t>(b));
      std::size_t i = from;
      for (; i + 8 <= to; i += 8) {  // a byte's eight signs from a table: two vector adds
        const float* plus_minus = signs()[bits[i / 8]];
        DECENTRAIN_OMP(simd)
        for (std::size_t j = 0; j < 8; ++j) into[i + j] += plus_minus[j] * s;
      }
      for (; i < to; ++i) into[i] += (bits[i / 8] >> (i % 8)) & 1u ? s : -s;
    }
  }

 private:
  // +1 or -1 for each bit of each byte (8 KB).
  static const float (&signs())[256][8] {
    static const auto table = [] {
      struct t {
        float v[256][8];
      } out{};
      for (unsigned b = 0; b < 256; ++b)
        for (unsigned j = 0; j < 8; ++j) out.v[b][j] = (b >> j) & 1u ? 1.0f : -1.0f;
      return out;
    }();
    return table.v;
  }
  void check_settings() const {
    decentrain::detail::check(block >= 8 && block % 8 == 0 && block <= (std::size_t{1} << 24),
                              "sign codec: block must be a multiple of 8 in [8, 2^24], got ", block);
  }
};

static_assert(check_codec<sign>());

}  // namespace decentrain::compress
