// fp16 and bf16: each value as 16 bits, rounded to nearest even (2x fewer bytes than f32).
// fp16 keeps 11 significant bits over [2^-24, 65504] (finite values beyond are saturated to
// +-65504, so an average never turns infinite on the way); bf16 keeps f32's range with 8 bits.
// NaN and infinities pass through as themselves.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "decentrain/compress/codec.hpp"
#include "decentrain/config.hpp"
#include "decentrain/core/dtype.hpp"

namespace decentrain::compress {

namespace detail {
inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t half_from_float(float f) {
  const std::uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));  // inf, NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7bffu);  // would round to inf: saturate at 65504
  if (a < 0x38800000u)  // below 2^-14: a subnormal half, m x 2^-24 (exact scaling, rounded to nearest even)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(float_of(a) * 16777216.0f)));
  std::uint32_t r = a - 0x38000000u;  // exponent bias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);     // round the 13 dropped bits to nearest even
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

inline float float_from_half(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m x 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

template <class To, class From>
void sixteen_bit_encode(std::span<const float> in, std::span<std::byte> out, From&& from) {
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  const auto n = static_cast<std::int64_t>(in.size());
  DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t v = from(in[static_cast<std::size_t>(i)]);
    std::memcpy(o + 2 * i, &v, 2);
  }
}
template <class To>
void sixteen_bit_decode_add(std::span<const std::byte> in, std::span<float> into, To&& to) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const auto n = static_cast<std::int64_t>(into.size());
  DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    into[static_cast<std::size_t>(i)] += to(v);
  }
}
}  // namespace detail

struct fp16 {
  static constexpr const char* name = "fp16";
  static constexpr bool dense = true;
  std::string describe() const { return "fp16"; }
  std::size_t max_encoded_bytes(std::size_t n) const { return 2 * n; }
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    detail::sixteen_bit_encode<std::uint16_t>(in, out, detail::half_from_float);
    return 2 * in.size();
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    decentrain::detail::check(in.size() == 2 * into.size(), "fp16 codec: a payload of ", in.size(), " bytes for ",
                              into.size(), " values");
    detail::sixteen_bit_decode_add(in, into, detail::float_from_half);
  }
};

struct bf16 {
  static constexpr const char* name = "bf16";
  static constexpr bool dense = true;
  std::string describe() const { return "bf16"; }
  std::size_t max_encoded_bytes(std::size_t n) const { return 2 * n; }
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    detail::sixteen_bit_encode<std::uint16_t>(in, out, [](float f) { return decentrain::bf16(f).bits; });
    return 2 * in.size();
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    decentrain::detail::check(in.size() == 2 * into.size(), "bf16 codec: a payload of ", in.size(), " bytes for ",
                              into.size(), " values");
    detail::sixteen_bit_decode_add(in, into, [](std::uint16_t b) { return static_cast<float>(decentrain::bf16::from_bits(b)); });
  }
};

static_assert(check_codec<fp16>() && check_codec<bf16>());

}  // namespace decentrain::compress
