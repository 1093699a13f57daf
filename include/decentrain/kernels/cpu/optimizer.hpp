// Fused optimizer updates on the CPU: one pass over a parameter, its gradient and its state.
// Arithmetic follows PyTorch's single-tensor implementations operation for operation, so
// trajectories agree to float rounding.
#pragma once

#include <cmath>
#include <cstdint>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

// AdamW (decoupled weight decay); `step` counts from 1.
template <class T>
void adamw_update(cpu, T* param, const T* grad, T* m, T* v, std::int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, std::int64_t step) {
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
  const T one_minus_b1 = static_cast<T>(1.0 - beta1), one_minus_b2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(lr / bias1);
  const T bias2_sqrt = static_cast<T>(std::sqrt(bias2));
  const T e = static_cast<T>(eps);
  DECENTRAIN_OMP(parallel for simd if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) {
    param[i] *= decay;
    m[i] = m[i] * b1 + grad[i] * one_minus_b1;
    v[i] = v[i] * b2 + grad[i] * grad[i] * one_minus_b2;
    const T denom = std::sqrt(v[i]) / bias2_sqrt + e;
    param[i] += -step_size * m[i] / denom;
  }
}

// SGD with optional (Nesterov) momentum and coupled weight decay. `first` marks the first
// step, on which the momentum buffer is the gradient itself.
template <class T>
void sgd_update(cpu, T* param, const T* grad, T* buffer, std::int64_t n, double lr, double momentum,
                double dampening, bool nesterov, double weight_decay, bool first) {
  const T mu = static_cast<T>(momentum), keep = static_cast<T>(1.0 - dampening);
  const T wd = static_cast<T>(weight_decay), rate = static_cast<T>(lr);
  DECENTRAIN_OMP(parallel for simd if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) {
    T d = grad[i];
    if (weight_decay != 0.0) d += wd * param[i];
    if (momentum != 0.0) {
      buffer[i] = first ? d : buffer[i] * mu + d * keep;
      d = nesterov ? d + mu * buffer[i] : buffer[i];
    }
    param[i] += -rate * d;
  }
}

// *out = sum of squares, accumulated in double. `out` is memory of the same device, so a GPU
// can collect one value per tensor and read them back once.
template <class T>
void sum_of_squares(cpu, const T* x, std::int64_t n, double* out) {
  double total = 0.0;
  DECENTRAIN_OMP(parallel for simd reduction(+ : total) if (n >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  *out = total;
}

}  // namespace decentrain::kernels
