// GELU, tanh form (as GPT-2 and PyTorch's approximate="tanh"), forward and backward.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

namespace detail {
template <class T>
inline constexpr T gelu_scale = static_cast<T>(0.79788456080286535587989211986876);  // sqrt(2/pi)
}

template <class T>
void gelu_forward(cpu, T* out, const T* x, std::int64_t n) {
  constexpr T s = detail::gelu_scale<T>, c = T(0.044715);
  DECENTRAIN_OMP(parallel for simd if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + std::tanh(s * (v + c * v * v * v)));
  }
}

// dx += dout * gelu'(x)
template <class T>
void gelu_backward(cpu, T* dx, const T* x, const T* dout, std::int64_t n) {
  constexpr T s = detail::gelu_scale<T>, c = T(0.044715);
  DECENTRAIN_OMP(parallel for simd if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T inner = s * (v + c * v * v * v);
    const T t = std::tanh(inner);
    const T sech2 = T(1) - t * t;
    const T local = T(0.5) * (T(1) + t) + T(0.5) * v * sech2 * s * (T(1) + T(3) * c * v * v);
    dx[i] += local * dout[i];
  }
}

}  // namespace decentrain::kernels
