// What a codec is: how a communication policy's f32 payload is put on the wire. A codec is a
// value type of settings (and any state it keeps, such as an error-feedback residual) with
//   std::size_t max_encoded_bytes(std::size_t values) const   an upper bound of encode's output
//   std::size_t encode(std::span<const float> values, std::span<std::byte> out)
//                                                             writes the payload, returns its size
//   void decode_add(std::span<const std::byte> payload, std::span<float> into) const
//                                                             adds the decoded values into `into`;
//                                                             throws decentrain::error on a payload
//                                                             it could not have written
// and may add
//   template <class Comm> void all_reduce(Comm&, std::span<float>, bool average)
//                                                             a collective of its own, which
//                                                             collective::encoded_all_reduce runs
//                                                             (the library's codecs have theirs there)
//   static constexpr bool dense                               fixed-size payloads that add up on a ring
//   void set_layout(const compress::layout&)                   the matrices the payload is made of (powersgd)
//   void set_reference(std::span<const float>, double lr_scale) the values the payload updates (significance)
//   std::string describe() const                              its settings, compared across peers
//   void save(io::checkpoint&, const std::string& prefix) const / void load(const io::checkpoint&, const std::string& prefix)
// Users write their own codecs without touching the library (as nlohmann/json's adl_serializer).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::compress {

// One static_assert per member, so a codec that lacks one is told which.
template <class C>
constexpr bool check_codec() {
  static_assert(std::is_copy_constructible_v<C>, "codec: a codec must be copyable (a value type of settings)");
  static_assert(requires(const C& c, std::size_t n) { { c.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>; },
                "codec: needs `std::size_t max_encoded_bytes(std::size_t values) const`");
  static_assert(requires(C& c, std::span<const float> in, std::span<std::byte> out) {
                  { c.encode(in, out) } -> std::convertible_to<std::size_t>;
                },
                "codec: needs `std::size_t encode(std::span<const float> values, std::span<std::byte> out)` "
                "returning the payload's size");
  static_assert(requires(const C& c, std::span<const std::byte> in, std::span<float> out) { c.decode_add(in, out); },
                "codec: needs `void decode_add(std::span<const std::byte> payload, std::span<float> into) const`");
  return true;
}

template <class C>
concept codec = std::is_copy_constructible_v<C> && requires(C& c, const C& cc, std::size_t n, std::span<const float> in,
                                                            std::span<std::byte> out, std::span<const std::byte> payload,
                                                            std::span<float> into) {
  { cc.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>;
  { c.encode(in, out) } -> std::convertible_to<std::size_t>;
  cc.decode_add(payload, into);
};

// The codec's settings as text, for error messages and for peers to compare: describe() where
// the codec has it, else its name.
template <class C>
std::string describe(const C& c) {
  if constexpr (requires { { c.describe() } -> std::convertible_to<std::string>; })
    return c.describe();
  else if constexpr (requires { { C::name } -> std::convertible_to<const char*>; })
    return C::name;
  else
    return "a codec without a name";
}

// Dense codecs (fixed-size payloads that can be added up on the way) go around a ring; the
// others are gathered. A codec says which with `static constexpr bool dense`; without it, gathered.
template <class C>
constexpr bool is_dense() {
  if constexpr (requires { { C::dense } -> std::convertible_to<bool>; })
    return C::dense;
  else
    return false;
}
// The same of a codec value: a codec chosen at run time (collective::any_codec) says with
// `bool is_dense() const`.
template <class C>
bool is_dense(const C& c) {
  if constexpr (requires { { c.is_dense() } -> std::convertible_to<bool>; })
    return c.is_dense();
  else
    return is_dense<C>();
}

}  // namespace decentrain::compress
