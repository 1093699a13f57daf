// Softmax and log-softmax over the last dim, forward and backward, numerically stable
// (the row maximum is subtracted before exponentiating).
#pragma once

#include <cmath>
#include <cstdint>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

namespace detail {
// The stable pieces of a softmax row: its maximum and sum(exp(x - max)).
template <class T>
struct softmax_stats {
  T max, sum;
};
template <class T>
softmax_stats<T> row_softmax_stats(const T* x, std::int64_t n) {
  T mx = x[0];
  for (std::int64_t c = 1; c < n; ++c) mx = x[c] > mx ? x[c] : mx;
  T sum = 0;
  for (std::int64_t c = 0; c < n; ++c) sum += std::exp(x[c] - mx);
  return {mx, sum};
}
}  // namespace detail

template <class T>
void softmax_forward(cpu, T* out, const T* x, std::int64_t rows, std::int64_t cols, bool log) {
  DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * cols;
    T* o = out + r * cols;
    const auto [mx, sum] = detail::row_softmax_stats(in, cols);
    if (log) {
      const T lse = mx + std::log(sum);
      for (std::int64_t c = 0; c < cols; ++c) o[c] = in[c] - lse;
    } else {
      const T inv = T(1) / sum;
      for (std::int64_t c = 0; c < cols; ++c) o[c] = std::exp(in[c] - mx) * inv;
    }
  }
}

// dx += softmax'(y) dout; for log=true, y is the log-softmax output.
template <class T>
void softmax_backward(cpu, T* dx, const T* y, const T* dout, std::int64_t rows, std::int64_t cols,
                      bool log) {
  DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* g = dout + r * cols;
    T* d = dx + r * cols;
    T dot = 0;
    if (log) {
      for (std::int64_t c = 0; c < cols; ++c) dot += g[c];
      for (std::int64_t c = 0; c < cols; ++c) d[c] += g[c] - std::exp(yr[c]) * dot;
    } else {
      for (std::int64_t c = 0; c < cols; ++c) dot += g[c] * yr[c];
      for (std::int64_t c = 0; c < cols; ++c) d[c] += yr[c] * (g[c] - dot);
    }
  }
}

}  // namespace decentrain::kernels
