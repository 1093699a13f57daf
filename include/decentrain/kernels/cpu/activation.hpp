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

// tanh for GELU. libm's tanhf is a call per element that blocks vectorisation and was ~17% of
// a shakespeare-char training step; this one is branch-free arithmetic the compiler vectorises:
// tanh(u) = 1 - 2 / (1 + e^{2u}), with e^{2u} from a range-reduced polynomial. Its absolute
// error is ~1e-7, and GELU only ever uses 1 + tanh, so relative accuracy near 0 is not needed.
// double keeps std::tanh (gradient checks run in double).
DECENTRAIN_VECTORIZE_SELECTS inline float gelu_tanh(float u) {
  u = u < -9.f ? -9.f : (u > 9.f ? 9.f : u);  // tanh is +-1 to float precision beyond
  const float x = 2.f * u;
  // x = n ln2 + r, |r| <= ln2/2. n is rounded by adding and removing 1.5 * 2^23, which needs
  // only SSE2 adds (floorf is a libm call, and a call stops vectorisation).
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  // e^r, degree-6 Taylor on |r| <= 0.347 (error < 2e-8 relative)
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int bits = (static_cast<int>(n) + 127) << 23;  // 2^n, n in [-26, 26]
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return 1.f - 2.f / (1.f + p * scale);
}
inline double gelu_tanh(double u) { return std::tanh(u); }
}

template <class T>
DECENTRAIN_VECTORIZE_SELECTS void gelu_forward(cpu, T* out, const T* x, std::int64_t n) {
  constexpr T s = detail::gelu_scale<T>, c = T(0.044715);
  DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + detail::gelu_tanh(s * (v + c * v * v * v)));
  }
}

// dx = dout * gelu'(x) (written, not accumulated)
template <class T>
DECENTRAIN_VECTORIZE_SELECTS void gelu_backward(cpu, T* dx, const T* x, const T* dout, std::int64_t n) {
  constexpr T s = detail::gelu_scale<T>, c = T(0.044715);
  DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T inner = s * (v + c * v * v * v);
    const T t = detail::gelu_tanh(inner);
    const T sech2 = T(1) - t * t;
    const T local = T(0.5) * (T(1) + t) + T(0.5) * v * sech2 * s * (T(1) + T(3) * c * v * v);
    dx[i] = local * dout[i];
  }
}

}  // namespace decentrain::kernels
