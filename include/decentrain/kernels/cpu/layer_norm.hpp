// Layer normalisation over the last dim (as llm.c): forward keeps mean and 1/std per row for
// the backward pass, which then needs no second pass over the statistics.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

// With `residual`, the input is x + residual: the sum is written to `sum` (the residual stream
// of a pre-LN transformer goes on from it) and normalised in the same pass over the row, which
// saves the separate add's write and re-read. The sum is the same float add as `add`, so the
// fused and the unfused paths agree bit for bit. T is the arithmetic (and x's, the statistics'
// and the parameters') type; the residual is read from R and the output stored as O (each T,
// or bf16 on a device whose kernels store it: the op widens and narrows around the kernel
// elsewhere, with the same results).
template <class T, class O, class R = T>
void layer_norm_forward(cpu, O* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                        std::int64_t rows, std::int64_t cols, T eps, const R* residual = nullptr,
                        T* sum = nullptr) {
  DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * cols;
    T m = 0;
    if (residual != nullptr) {
      const R* res = residual + r * cols;
      T* h = sum + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        h[c] = in[c] + static_cast<T>(res[c]);
        m += h[c];
      }
      in = h;
    } else {
      for (std::int64_t c = 0; c < cols; ++c) m += in[c];
    }
    m /= static_cast<T>(cols);
    T v = 0;
    for (std::int64_t c = 0; c < cols; ++c) v += (in[c] - m) * (in[c] - m);
    v /= static_cast<T>(cols);
    const T s = T(1) / std::sqrt(v + eps);
    O* o = out + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) o[c] = O((in[c] - m) * s * weight[c] + bias[c]);
    mean[r] = m;
    rstd[r] = s;
  }
}

// dx, dweight, dbias are accumulated into (+=); any of them may be null when not needed. The
// output's gradient is read from G (T, or bf16 as the forward's output).
template <class T, class G>
void layer_norm_backward(cpu, T* dx, T* dweight, T* dbias, const G* dout, const T* x,
                         const T* weight, const T* mean, const T* rstd, std::int64_t rows,
                         std::int64_t cols) {
  if (dx) {
    DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
    for (std::int64_t r = 0; r < rows; ++r) {
      const G* g = dout + r * cols;
      const T* in = x + r * cols;
      const T m = mean[r], s = rstd[r];
      T mean_dn = 0, mean_dn_xhat = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        const T dn = weight[c] * static_cast<T>(g[c]);
        mean_dn += dn;
        mean_dn_xhat += dn * (in[c] - m) * s;
      }
      mean_dn /= static_cast<T>(cols);
      mean_dn_xhat /= static_cast<T>(cols);
      T* d = dx + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        const T xhat = (in[c] - m) * s;
        d[c] += (weight[c] * static_cast<T>(g[c]) - mean_dn - xhat * mean_dn_xhat) * s;
      }
    }
  }
  if (dweight || dbias) {
    // Parameter gradients reduce over rows; columns are split across threads so no two
    // threads write the same element.
    DECENTRAIN_OMP(parallel for if (rows * cols >= detail::parallel_threshold))
    for (std::int64_t c0 = 0; c0 < cols; c0 += 64) {
      const std::int64_t c1 = c0 + 64 < cols ? c0 + 64 : cols;
      T dw[64] = {}, db[64] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const G* g = dout + r * cols;
        const T* in = x + r * cols;
        for (std::int64_t c = c0; c < c1; ++c) {
          dw[c - c0] += (in[c] - mean[r]) * rstd[r] * static_cast<T>(g[c]);
          db[c - c0] += static_cast<T>(g[c]);
        }
      }
      for (std::int64_t c = c0; c < c1; ++c) {
        if (dweight) dweight[c] += dw[c - c0];
        if (dbias) dbias[c] += db[c - c0];
      }
    }
  }
}

}  // namespace decentrain::kernels
