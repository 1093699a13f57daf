// int8 and int4 with a scale per block (absmax / 127 or / 7, as an f32): 3.8x and 7.1x fewer
// bytes than f32 at block 64. Each value lands within half a step (scale / 2) of itself with
// nearest rounding; stochastic rounding is unbiased (its expectation is the value), from a
// counter-based stream so every thread and every run draws the same. Payload: the blocks'
// scales, then the codes (int4: two to a byte, low nibble first).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "decentrain/compress/codec.hpp"
#include "decentrain/config.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::compress {

enum class rounding { nearest, stochastic };

namespace detail {
// Refuses to encode what it cannot represent, naming the value (a NaN gradient is a bug to
// report, not a scale to send).
inline void check_finite(std::span<const float> in, const char* codec) {
  // One pass that vectorises (an exponent of all ones through the bits), then the first one named.
  int bad = 0;
  const auto n = static_cast<std::int64_t>(in.size());
  DECENTRAIN_OMP_FOR_SIMD(reduction(| : bad) if (n >= (1 << 18)))
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, in.data() + i, 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  if (!bad) return;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (!std::isfinite(in[i])) decentrain::detail::fail(codec, " codec: value ", i, " is ", in[i], ", not finite");
}

inline float load_f32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// A payload's `count` f32 scales at `at`: each finite and >= 0, or an error naming the first
// that is not ("<codec> codec: <what> 3 has scale nan").
inline void check_scales(const std::byte* at, std::size_t count, const char* codec, const char* what = "block") {
  for (std::size_t b = 0; b < count; ++b)
    if (const float s = load_f32(at + 4 * b); !std::isfinite(s) || s < 0)
      decentrain::detail::fail(codec, " codec: ", what, " ", b, " has scale ", s, " (a scale is finite and >= 0)");
}
}  // namespace detail

template <int Bits>
struct blockwise {
  static_assert(Bits == 8 || Bits == 4, "blockwise<Bits>: 8 or 4 bits");
  static constexpr const char* name = Bits == 8 ? "int8" : "int4";
  static constexpr bool dense = true;
  static constexpr int levels = Bits == 8 ? 127 : 7;  // codes -levels..levels (-128 / -8 never written)

  std::size_t block = 64;
  rounding mode = rounding::nearest;
  std::uint64_t seed = 0;  // stochastic rounding's stream (with the encode call's number)

  std::string describe() const {
    return std::string(name) + "(block=" + std::to_string(block) + (mode == rounding::stochastic ? ",stochastic" : "") + ")";
  }
  std::size_t blocks(std::size_t n) const { return (n + block - 1) / block; }
  std::size_t code_bytes(std::size_t n) const { return Bits == 8 ? n : (n + 1) / 2; }
  std::size_t max_encoded_bytes(std::size_t n) const {
    check_settings();
    return 4 * blocks(n) + code_bytes(n);
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    check_settings();
    const std::size_t n = in.size(), nb = blocks(n);
    std::byte* scales = out.data();
    auto* codes = reinterpret_cast<std::uint8_t*>(out.data() + 4 * nb);
    const std::uint64_t call = round_++, key = decentrain::detail::draw_key(seed, call);
    const auto nblocks = static_cast<std::int64_t>(nb);
    int nonfinite = 0;
    DECENTRAIN_OMP(parallel for reduction(| : nonfinite) if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, len = std::min(n, from + block) - from;
      const float* x = in.data() + from;
      // absmax through the bits (finite magnitudes order as integers), which vectorises.
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
      const float scale = absmax / static_cast<float>(levels);
      std::memcpy(scales + 4 * static_cast<std::size_t>(b), &scale, 4);
      // levels / absmax overflows f32 for denormal blocks: there, scale in double.
      const double inv = absmax > 0 ? static_cast<double>(levels) / static_cast<double>(absmax) : 0.0;
      const bool tiny = inv > 1e30;
      const auto inv_f = static_cast<float>(tiny ? 0.0 : inv);
      std::int8_t q[block_chunk];
      for (std::size_t c0 = 0; c0 < len; c0 += block_chunk) {
        const std::size_t m = std::min(block_chunk, len - c0);
        if (tiny)
          for (std::size_t i = 0; i < m; ++i) q[i] = quantize(static_cast<float>(static_cast<double>(x[c0 + i]) * inv), 0.0f);
        else if (mode == rounding::nearest)  // |x| <= absmax, so x * inv rounds into the codes unclamped
          DECENTRAIN_OMP(simd)
          for (std::size_t i = 0; i < m; ++i) q[i] = round_even(x[c0 + i] * inv_f);
        else if (const std::uint64_t at = from + c0; (at >> 32) == ((at + m - 1) >> 32)) {  // one draw word: vectorises
          const std::uint32_t word = decentrain::detail::draw_word(key, at >> 32), low = static_cast<std::uint32_t>(at);
          DECENTRAIN_OMP(simd)
          for (std::size_t i = 0; i < m; ++i)
            q[i] = quantize(x[c0 + i] * inv_f, decentrain::detail::unit_draw_in(word, low + static_cast<std::uint32_t>(i)) - 0.5f);
        } else {
          for (std::size_t i = 0; i < m; ++i) q[i] = quantize(x[c0 + i] * inv_f, decentrain::detail::unit_draw(seed, call, at + i) - 0.5f);
        }
        if constexpr (Bits == 8) {
          std::memcpy(codes + from + c0, q, m);
        } else {  // block and block_chunk are even: a byte never holds two chunks' codes
          std::uint8_t* o = codes + (from + c0) / 2;
          for (std::size_t i = 0; i + 1 < m; i += 2)
            o[i / 2] = static_cast<std::uint8_t>((static_cast<std::uint8_t>(q[i]) & 0xfu) | (static_cast<std::uint8_t>(q[i + 1]) << 4));
          if (m % 2) o[m / 2] = static_cast<std::uint8_t>(static_cast<std::uint8_t>(q[m - 1]) & 0xfu);
        }
      }
    }
    if (nonfinite) detail::check_finite(in, name);  // names the first value that is not finite
    return 4 * nb + code_bytes(n);
  }

  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    check_settings();
    const std::size_t n = into.size(), nb = blocks(n);
    decentrain::detail::check(in.size() == 4 * nb + code_bytes(n), name, " codec: a payload of ", in.size(), " bytes for ",
                              n, " values (expected ", 4 * nb + code_bytes(n), ")");
    const auto* codes = reinterpret_cast<const std::uint8_t*>(in.data() + 4 * nb);
    detail::check_scales(in.data(), nb, name);
    // Codes first checked (-levels - 1 is never written), then added: nothing lands before all is checked.
    int bad = 0;
    const auto bytes = static_cast<std::int64_t>(code_bytes(n));
    DECENTRAIN_OMP_FOR_SIMD(reduction(| : bad) if (n >= (1 << 16)))
    for (std::int64_t i = 0; i < bytes; ++i) {
      const std::uint8_t c = codes[i];
      if constexpr (Bits == 8)
        bad |= c == 0x80u;
      else
        bad |= (c & 0xfu) == 0x8u || (c >> 4) == 0x8u;
    }
    if constexpr (Bits == 4)
      if (n % 2 == 1) decentrain::detail::check((codes[n / 2] >> 4) == 0, name, " codec: the padding nibble after value ", n - 1, " is not 0");
    if (bad)
      for (std::size_t i = 0; i < n; ++i) {
        const int code = code_at(codes, i);
        decentrain::detail::check(code >= -levels, name, " codec: value ", i, " has code ", code, ", below -", levels);
      }
    const auto nblocks = static_cast<std::int64_t>(nb);
    DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, len = std::min(n, from + block) - from;
      const float s = detail::load_f32(in.data() + 4 * static_cast<std::size_t>(b));
      float* y = into.data() + from;
      if constexpr (Bits == 8) {
        const auto* c = reinterpret_cast<const std::int8_t*>(codes + from);
        DECENTRAIN_OMP(simd)
        for (std::size_t i = 0; i < len; ++i) y[i] += static_cast<float>(c[i]) * s;
      } else {
        const std::uint8_t* c = codes + from / 2;
        DECENTRAIN_OMP(simd)
        for (std::size_t i = 0; i < len / 2; ++i) {
          y[2 * i] += static_cast<float>(static_cast<std::int8_t>(static_cast<std::uint8_t>(c[i] << 4)) >> 4) * s;
          y[2 * i + 1] += static_cast<float>(static_cast<std::int8_t>(c[i]) >> 4) * s;
        }
        if (len % 2) y[len - 1] += static_cast<float>(code_at(codes, from + len - 1)) * s;
      }
    }
  }

  // The encode calls' number, which stochastic rounding draws from: resuming continues the stream.
  void save(io::checkpoint& c, const std::string& prefix) const { c.counters[prefix + "round"] = static_cast<std::int64_t>(round_); }
  void load(const io::checkpoint& c, const std::string& prefix) {
    auto it = c.counters.find(prefix + "round");
    round_ = it == c.counters.end() ? 0 : static_cast<std::uint64_t>(it->second);
  }

 private:
  void check_settings() const {
    decentrain::detail::check(block >= 1 && block <= (std::size_t{1} << 24), name, " codec: block must be in [1, 2^24], got ",
                              block);
    if constexpr (Bits == 4) decentrain::detail::check(block % 2 == 0, name, " codec: block must be even, got ", block);
  }
  static constexpr std::size_t block_chunk = 256;  // codes computed on the stack, then stored
  // Rounds to the nearest integer (ties to even: adding and taking away 1.5 x 2^23 leaves f32's
  // own rounding to do it, which vectorises where nearbyint is a call), `shift` in [-0.5, 0.5)
  // moving the point (stochastic rounding), and clamps to the codes. |x| is at most a little over
  // `levels` here, so the clamp can follow the conversion, in integers (clamped as floats first,
  // g++ does not vectorise the loop).
  static int round_to_int(float x) {
    constexpr float magic = 12582912.0f;
    return static_cast<int>((x + magic) - magic);
  }
  static std::int8_t round_even(float x) { return static_cast<std::int8_t>(round_to_int(x)); }
  static std::int8_t quantize(float x, float shift) {
    return static_cast<std::int8_t>(std::min(std::max(round_to_int(x + shift), -levels), levels));
  }
  static int code_at(const std::uint8_t* codes, std::size_t i) {
    if constexpr (Bits == 8) return static_cast<std::int8_t>(codes[i]);
    const int nibble = (codes[i / 2] >> (4 * (i % 2))) & 0xf;
    return nibble >= 8 ? nibble - 16 : nibble;
  }
  std::uint64_t round_ = 0;
};

using int8_blockwise = blockwise<8>;
using int4_blockwise = blockwise<4>;

static_assert(check_codec<int8_blockwise>() && check_codec<int4_blockwise>());

}  // namespace decentrain::compress
