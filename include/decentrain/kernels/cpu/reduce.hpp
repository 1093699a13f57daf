// Reductions on the CPU. Sums accumulate in double: in f32 a long sum drifts by more than the
// tolerances the parity tests state, and the extra cost is small next to the memory traffic.
#pragma once

#include <cstdint>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

// out[r] = scale * sum_c in[r * cols + c]
template <class T>
void sum_rows(cpu, T* out, const T* in, std::int64_t rows, std::int64_t cols, T scale = T(1)) {
  DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
  for (std::int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    const T* row = in + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) acc += static_cast<double>(row[c]);
    out[r] = static_cast<T>(acc * static_cast<double>(scale));
  }
}

// out[c] = scale * sum_r in[r * cols + c]: the reduction of leading dims, without a transpose.
template <class T>
void sum_columns(cpu, T* out, const T* in, std::int64_t rows, std::int64_t cols, T scale = T(1)) {
  DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
  for (std::int64_t c0 = 0; c0 < cols; c0 += 64) {
    const std::int64_t c1 = c0 + 64 < cols ? c0 + 64 : cols;
    double acc[64] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = in + r * cols;
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(row[c]);
    }
    for (std::int64_t c = c0; c < c1; ++c)
      out[c] = static_cast<T>(acc[c - c0] * static_cast<double>(scale));
  }
}

}  // namespace decentrain::kernels
