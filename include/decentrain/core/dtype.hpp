// Element types a tensor can hold. bf16 is a storage type: math on it runs in f32. f64 exists
// so gradients can be checked by finite differences in double; i32 holds token ids.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "decentrain/config.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/detail/meta.hpp"

namespace decentrain {

// Brain float: the top 16 bits of an IEEE f32. Converting from f32 rounds to nearest even.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  DECENTRAIN_HOST_DEVICE explicit bf16(float value) : bits(round_from(value)) {}
  DECENTRAIN_HOST_DEVICE explicit operator float() const {
    std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float out;
    std::memcpy(&out, &wide, sizeof out);
    return out;
  }
  static bf16 from_bits(std::uint16_t b) {
    bf16 out;
    out.bits = b;
    return out;
  }
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }

 private:
  DECENTRAIN_HOST_DEVICE static std::uint16_t round_from(float value) {
    std::uint32_t wide;
    std::memcpy(&wide, &value, sizeof wide);
    if ((wide & 0x7f800000u) == 0x7f800000u && (wide & 0x007fffffu) != 0)
      return static_cast<std::uint16_t>((wide >> 16) | 0x0040u);  // keep NaN a quiet NaN
    const std::uint32_t rounding = 0x7fffu + ((wide >> 16) & 1u);
    return static_cast<std::uint16_t>((wide + rounding) >> 16);
  }
};

enum class dtype : std::uint8_t { f32, f64, bf16, i32 };

inline constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
  }
  return "unknown";
}

inline constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f64: return 8;
    case dtype::bf16: return 2;
    case dtype::i32: return 4;
  }
  return 0;
}

inline constexpr bool is_floating(dtype t) { return t != dtype::i32; }

template <class T>
inline constexpr dtype dtype_of = [] {
  if constexpr (std::is_same_v<T, float>) return dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return dtype::f64;
  else if constexpr (std::is_same_v<T, bf16>) return dtype::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return dtype::i32;
  else static_assert(detail::dependent_false<T>, "decentrain tensors hold float, double, bf16 or int32_t");
}();

// The type arithmetic runs in for a stored type: bf16 computes in f32.
template <class T>
using compute_type_t = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

// Calls f(T{}) with the C++ type stored for `t`, so code can be written once per type.
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::bf16: return f(bf16{});
    case dtype::i32: return f(std::int32_t{});
  }
  detail::fail("unknown dtype code ", static_cast<int>(t));
}

template <class To, class From>
DECENTRAIN_HOST_DEVICE To convert_element(From v) {
  if constexpr (std::is_same_v<To, From>) return v;
  else if constexpr (std::is_same_v<From, bf16>) return static_cast<To>(static_cast<float>(v));
  else if constexpr (std::is_same_v<To, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<To>(v);
}

}  // namespace decentrain
