// A linear layer's forward pass as one kernel call: out = x w + bias, optionally followed by
// GELU (then `pre` keeps x w + bias for the backward pass). On the CPU it is the GEMM with the
// bias as its starting C, then the GELU kernel: the same arithmetic as the separate ops, bit for
// bit. A GPU fuses bias and GELU into the GEMM (kernels/cuda/linear.cuh).
#pragma once

#include <algorithm>
#include <cstdint>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/activation.hpp"
#include "decentrain/kernels/cpu/gemm.hpp"

namespace decentrain::kernels {

// Row-major, contiguous: x (m, k), w (k, n), bias (n) or null, out (m, n); `pre` (m, n) or null:
// when given, pre = x w + bias and out = gelu(pre).
template <class T>
void linear_forward(cpu, std::int64_t m, std::int64_t n, std::int64_t k, const T* x, const T* w, const T* bias,
                    T* out, T* pre) {
  T* dst = pre ? pre : out;
  if (bias) {
    DECENTRAIN_OMP(parallel for if (m * n >= detail::parallel_threshold))
    for (std::int64_t r = 0; r < m; ++r) std::copy(bias, bias + n, dst + r * n);
  }
  gemm(cpu{}, false, false, m, n, k, T(1), x, k, w, n, bias ? T(1) : T(0), dst, n);
  if (pre) gelu_forward(cpu{}, out, pre, m * n);
}

}  // namespace decentrain::kernels
