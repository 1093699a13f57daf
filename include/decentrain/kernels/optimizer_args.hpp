// What a multi-tensor optimizer step is given, shared by every device's kernels: one entry per
// tensor (its buffers and its own step count and weight decay, which differ between tensors)
// and the factors AdamW derives from them, computed once on the host in double and rounded to
// the tensor's type, so every device does the same arithmetic.
#pragma once

#include <cmath>
#include <cstdint>

namespace decentrain::kernels {

template <class T>
struct adamw_tensor {
  T* param;
  const T* grad;
  T* m;  // first moment
  T* v;  // second moment
  std::int64_t n;
  std::int64_t step;  // counts from 1
  double weight_decay;
};

struct adamw_hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

// PyTorch's single-tensor AdamW: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
template <class T>
struct adamw_factors {
  T decay, b1, b2, one_minus_b1, one_minus_b2, step_size, bias2_sqrt, eps;

  static adamw_factors make(const adamw_hyper& h, std::int64_t step, double weight_decay) {
    const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
    const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
    return {static_cast<T>(1.0 - h.lr * weight_decay), static_cast<T>(h.beta1), static_cast<T>(h.beta2),
            static_cast<T>(1.0 - h.beta1),             static_cast<T>(1.0 - h.beta2),
            static_cast<T>(h.lr / bias1),              static_cast<T>(std::sqrt(bias2)),
            static_cast<T>(h.eps)};
  }
};

}  // namespace decentrain::kernels
