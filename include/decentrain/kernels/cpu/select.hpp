// Selection on the CPU: the k largest values of an array and where they are, in the order a
// GPU radix sort (CUB) gives them, so both devices return the same indices: descending by the
// value's bit pattern read as an ordered integer (-0 and +0 equal, NaNs with the sign bit clear
// above +inf, those with it set below -inf), ties by lower index.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "decentrain/core/device.hpp"

namespace decentrain::kernels {

namespace detail {
// The radix-sort key of a float: an unsigned integer that orders as the floats do (CUB treats
// -0 as +0).
template <class T>
auto ordered_key(T value) {
  static_assert(std::is_floating_point_v<T>, "ordered_key: floating-point values only");
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  if (value == T(0)) value = T(0);
  const U bits = std::bit_cast<U>(value), sign = U{1} << (8 * sizeof(T) - 1);
  return (bits & sign) ? U(~bits) : U(bits | sign);
}
}  // namespace detail

// values[0..k) and indices[0..k) = the k largest of x[0..n), largest first; 0 <= k <= n.
template <class T>
void top_k(cpu, const T* x, std::int64_t n, std::int64_t k, T* values, std::int32_t* indices) {
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const auto first = [&](std::int32_t a, std::int32_t b) {
    const auto ka = detail::ordered_key(x[a]), kb = detail::ordered_key(x[b]);
    return ka != kb ? ka > kb : a < b;
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), first);
  for (std::int64_t i = 0; i < k; ++i) {
    indices[i] = order[static_cast<std::size_t>(i)];
    values[i] = x[indices[i]];
  }
}

}  // namespace decentrain::kernels
