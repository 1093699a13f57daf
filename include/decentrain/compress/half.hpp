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

// Branch-free (each case computed, one selected by masks), so the encode and decode loops
// vectorise.
inline std::uint32_t select_bits(bool c, std::uint32_t yes, std::uint32_t no) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (yes & m) | (no & ~m);
}

inline std::uint16_t half_from_float(float f) {
  const std::uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  std::uint32_t r = a - 0x38000000u;  // exponent bias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);     // round the 13 dropped bits to nearest even
  // Below 2^-14: a subnormal half, m x 2^-24. a x 2^24 < 1024 is exact, and adding 1.5 x 2^23
  // rounds it to the nearest integer, ties to even, in the low mantissa bits.
  const bool subnormal = a < 0x38800000u;
  const std::uint32_t sub = bits_of(float_of(select_bits(subnormal, a, 0u)) * 16777216.0f + 12582912.0f) - 0x4b400000u;
  std::uint32_t h = select_bits(subnormal, sub, r >> 13);
  h = select_bits(a >= 0x477ff000u, 0x7bffu, h);  // would round to inf: saturate at 65504
  h = select_bits(a >= 0x7f800000u, 0x7c00u | select_bits(a > 0x7f800000u, 0x200u, 0u), h);  // inf, NaN
  return static_cast<std::uint16_t>(sign | h);
}

inline float float_from_half(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  // e == 0: m x 2^-24 (converted as signed: SSE2 converts those)
  const float sub = static_cast<float>(static_cast<std::int32_t>(m)) * 5.9604644775390625e-8f;
  const std::uint32_t normal = select_bits(e == 31, 0x7f800000u | (m << 13), ((e + 112u) << 23) | (m << 13));
  return float_of(sign | select_bits(e == 0, bits_of(sub), normal));
}

template <class To, class From>
void sixteen_bit_encode(std::span<const float> in, std::span<std::byte> out, From&& from) {
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  const float* x = in.data();  // not read through the span: bytes written may alias it, which stops vectorising
  const auto n = static_cast<std::int64_t>(in.size());
  DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t v = from(x[i]);
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
    // Lambdas, not the functions' addresses: the OpenMP body gets the conversion inlined.
    detail::sixteen_bit_encode<std::uint16_t>(in, out, [](float f) { return detail::half_from_float(f); });
    return 2 * in.size();
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    decentrain::detail::check(in.size() == 2 * into.size(), "fp16 codec: a payload of ", in.size(), " bytes for ",
                              into.size(), " values");
    detail::sixteen_bit_decode_add(in, into, [](std::uint16_t h) { return detail::float_from_half(h); });
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
