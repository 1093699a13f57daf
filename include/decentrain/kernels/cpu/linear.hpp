// A linear layer's forward pass as one kernel call: out = x w + bias, optionally followed by
// GELU (then `pre` keeps x w + bias for the backward pass), and the MLP's backward step through
// that GELU. On the CPU each is the GEMM and then the GELU kernel: the same arithmetic as the
// separate ops, bit for bit. A GPU fuses bias and GELU into the GEMM (kernels/cuda/linear.cuh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/core/memory.hpp"
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

namespace detail {
struct cpu_block_deleter {
  std::size_t bytes;
  void operator()(void* p) const noexcept { memory<cpu>::deallocate(p, bytes); }
};
}  // namespace detail

// The gradient reaching `pre` through gelu(pre) w, given the gradient g of that product:
// d_pre = (g w^T) * gelu'(pre). Row-major, contiguous: g (m, k), w (n, k), pre and d_pre (m, n).
template <class T>
void linear_backward_through_gelu(cpu, std::int64_t m, std::int64_t n, std::int64_t k, const T* g, const T* w,
                                  const T* pre, T* d_pre) {
  // From the block cache, as a tensor's buffer would be: a fresh vector would zero (and
  // first-touch) m * n elements the GEMM overwrites anyway.
  const std::size_t bytes = sizeof(T) * static_cast<std::size_t>(m * n);
  std::unique_ptr<void, detail::cpu_block_deleter> product(memory<cpu>::allocate(bytes), detail::cpu_block_deleter{bytes});
  T* p = static_cast<T*>(product.get());
  gemm(cpu{}, false, true, m, n, k, T(1), g, k, w, k, T(0), p, n);
  gelu_backward(cpu{}, d_pre, pre, p, m * n);
}

}  // namespace decentrain::kernels
