// Elementwise CPU kernels: broadcasting binary ops, scalar ops, accumulation. Broadcasting is
// expressed by strides (0 on a broadcast dim), so one loop serves every combination of shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"

namespace decentrain::kernels {

enum class binary_op { add, sub, mul, div };

namespace detail {
// Rows of work below this many elements are not worth a thread team.
inline constexpr std::int64_t parallel_threshold = 1 << 15;

template <class T>
DECENTRAIN_HOST_DEVICE inline T apply(binary_op op, T x, T y) {
  switch (op) {
    case binary_op::add: return x + y;
    case binary_op::sub: return x - y;
    case binary_op::mul: return x * y;
    case binary_op::div: return x / y;
  }
  return T(0);
}
}  // namespace detail

// out (contiguous, `sizes`) = a op b, where a and b are read through `a_strides`/`b_strides`
// given in the output's rank (0 where that operand is broadcast).
template <class T>
void binary(cpu, binary_op op, T* out, const std::vector<std::int64_t>& sizes, const T* a,
            const std::vector<std::int64_t>& a_strides, const T* b,
            const std::vector<std::int64_t>& b_strides) {
  const std::size_t rank = sizes.size();
  std::int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  if (numel == 0) return;
  if (rank == 0) {
    out[0] = detail::apply(op, a[0], b[0]);
    return;
  }
  const std::int64_t inner = sizes[rank - 1];
  const std::int64_t rows = numel / inner;
  const std::int64_t sa = a_strides[rank - 1], sb = b_strides[rank - 1];
  DECENTRAIN_OMP(parallel for if (numel >= detail::parallel_threshold))
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t oa = 0, ob = 0, rem = r;
    for (std::size_t d = rank - 1; d-- > 0;) {
      const std::int64_t i = rem % sizes[d];
      rem /= sizes[d];
      oa += i * a_strides[d];
      ob += i * b_strides[d];
    }
    const T* pa = a + oa;
    const T* pb = b + ob;
    T* po = out + r * inner;
    if (sa == 1 && sb == 1) {
      switch (op) {
        case binary_op::add: for (std::int64_t i = 0; i < inner; ++i) po[i] = pa[i] + pb[i]; break;
        case binary_op::sub: for (std::int64_t i = 0; i < inner; ++i) po[i] = pa[i] - pb[i]; break;
        case binary_op::mul: for (std::int64_t i = 0; i < inner; ++i) po[i] = pa[i] * pb[i]; break;
        case binary_op::div: for (std::int64_t i = 0; i < inner; ++i) po[i] = pa[i] / pb[i]; break;
      }
    } else {
      for (std::int64_t i = 0; i < inner; ++i) po[i] = detail::apply(op, pa[i * sa], pb[i * sb]);
    }
  }
}

// out = x * scale + shift
template <class T>
void affine(cpu, T* out, const T* x, std::int64_t n, T scale, T shift) {
  DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] * scale + shift;
}

// out = numerator / x
template <class T>
void reciprocal(cpu, T* out, const T* x, std::int64_t n, T numerator) {
  DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) out[i] = numerator / x[i];
}

// dst += scale * src: gradient accumulation.
template <class T>
void axpy(cpu, T* dst, const T* src, std::int64_t n, T scale = T(1)) {
  DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) dst[i] += scale * src[i];
}

}  // namespace decentrain::kernels
