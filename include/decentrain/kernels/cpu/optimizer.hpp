// Fused optimizer updates on the CPU: one pass over a parameter, its gradient and its state.
// Arithmetic follows PyTorch's single-tensor implementations operation for operation, so
// trajectories agree to float rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"
#include "decentrain/kernels/optimizer_args.hpp"

namespace decentrain::kernels {

// AdamW (decoupled weight decay) over every tensor of a step, one after the other.
template <class T>
void adamw_update(cpu, std::span<const adamw_tensor<T>> tensors, const adamw_hyper& hyper) {
  for (const auto& t : tensors) {
    const auto f = adamw_factors<T>::make(hyper, t.step, t.weight_decay);
    T *param = t.param, *m = t.m, *v = t.v;
    const T* grad = t.grad;
    const std::int64_t n = t.n;
    DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
    for (std::int64_t i = 0; i < n; ++i) {
      param[i] *= f.decay;
      m[i] = m[i] * f.b1 + grad[i] * f.one_minus_b1;
      v[i] = v[i] * f.b2 + grad[i] * grad[i] * f.one_minus_b2;
      const T denom = std::sqrt(v[i]) / f.bias2_sqrt + f.eps;
      param[i] += -f.step_size * m[i] / denom;
    }
  }
}

// SGD with optional (Nesterov) momentum and coupled weight decay. `first` marks the first
// step, on which the momentum buffer is the gradient itself.
template <class T>
void sgd_update(cpu, T* param, const T* grad, T* buffer, std::int64_t n, double lr, double momentum,
                double dampening, bool nesterov, double weight_decay, bool first) {
  const T mu = static_cast<T>(momentum), keep = static_cast<T>(1.0 - dampening);
  const T wd = static_cast<T>(weight_decay), rate = static_cast<T>(lr);
  DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
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

// *out = the sum of squares of every tensor together, accumulated in double. `out` is memory
// of the same device, so a GPU keeps the value until someone reads it.
template <class T>
void sum_of_squares(cpu, std::span<const std::span<const T>> tensors, double* out) {
  double total = 0.0;
  for (const auto& x : tensors) {
    const T* p = x.data();
    const auto n = static_cast<std::int64_t>(x.size());
    double part = 0.0;
    DECENTRAIN_OMP_FOR_SIMD(reduction(+ : part) if (n >= detail::parallel_threshold))
    for (std::int64_t i = 0; i < n; ++i) part += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    total += part;
  }
  *out = total;
}

// Every tensor's values times `factor`, in place (gradient clipping's scaling).
template <class T>
void scale_all(cpu, std::span<const std::span<T>> tensors, T factor) {
  for (const auto& x : tensors) {
    T* p = x.data();
    const auto n = static_cast<std::int64_t>(x.size());
    DECENTRAIN_OMP_FOR_SIMD(if (n >= detail::parallel_threshold))
    for (std::int64_t i = 0; i < n; ++i) p[i] *= factor;
  }
}

}  // namespace decentrain::kernels
