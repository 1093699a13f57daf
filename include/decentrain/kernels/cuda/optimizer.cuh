// Optimizer updates on the GPU: one pass over a parameter, its gradient and its state, with
// the same arithmetic as the CPU kernels (PyTorch's single-tensor order of operations), and
// the sum of squares for gradient clipping, reduced in a fixed order.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cmath>
#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
__device__ inline float device_sqrt(float x) { return sqrtf(x); }
__device__ inline double device_sqrt(double x) { return sqrt(x); }

template <class T>
__global__ void adamw_kernel(T* param, const T* grad, T* m, T* v, std::int64_t n, T decay, T b1, T b2,
                             T one_minus_b1, T one_minus_b2, T step_size, T bias2_sqrt, T eps) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    T p = param[i] * decay;
    const T g = grad[i];
    const T mi = m[i] * b1 + g * one_minus_b1;
    const T vi = v[i] * b2 + g * g * one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    const T denom = device_sqrt(vi) / bias2_sqrt + eps;
    param[i] = p + -step_size * mi / denom;
  }
}

template <class T>
__global__ void sgd_kernel(T* param, const T* grad, T* buffer, std::int64_t n, T lr, T mu, T keep,
                           bool nesterov, T wd, bool first) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    T d = grad[i];
    if (wd != T(0)) d += wd * param[i];
    if (mu != T(0)) {
      buffer[i] = first ? d : buffer[i] * mu + d * keep;
      d = nesterov ? d + mu * buffer[i] : buffer[i];
    }
    param[i] += -lr * d;
  }
}

inline constexpr int squares_threads = 256, squares_blocks = 512;
template <class T>
__global__ void sum_of_squares_kernel(double* partial, const T* x, std::int64_t n) {
  double acc = 0.0;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  acc = block_reduce<squares_threads>(acc, sum_op{});
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
}  // namespace cuda_detail

// AdamW (decoupled weight decay); `step` counts from 1.
template <class T>
void adamw_update(cuda, T* param, const T* grad, T* m, T* v, std::int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, std::int64_t step) {
  if (n == 0) return;
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  cuda_detail::adamw_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, cuda_rt::current_stream()>>>(
      param, grad, m, v, n, static_cast<T>(1.0 - lr * weight_decay), static_cast<T>(beta1),
      static_cast<T>(beta2), static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2),
      static_cast<T>(lr / bias1), static_cast<T>(std::sqrt(bias2)), static_cast<T>(eps));
  cuda_rt::check_launch("adamw_kernel");
}

// SGD with optional (Nesterov) momentum and coupled weight decay.
template <class T>
void sgd_update(cuda, T* param, const T* grad, T* buffer, std::int64_t n, double lr, double momentum,
                double dampening, bool nesterov, double weight_decay, bool first) {
  if (n == 0) return;
  cuda_detail::sgd_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, cuda_rt::current_stream()>>>(
      param, grad, buffer, n, static_cast<T>(lr), static_cast<T>(momentum), static_cast<T>(1.0 - dampening),
      nesterov, static_cast<T>(weight_decay), first);
  cuda_rt::check_launch("sgd_kernel");
}

// *out (device memory) = sum of squares, accumulated in double in a fixed order; no
// synchronisation.
template <class T>
void sum_of_squares(cuda, const T* x, std::int64_t n, double* out) {
  if (n == 0) {
    memory<cuda>::fill(out, dtype::f64, 1, 0.0);
    return;
  }
  const auto blocks = std::min<std::int64_t>(cuda_detail::squares_blocks,
                                             (n + cuda_detail::squares_threads - 1) / cuda_detail::squares_threads);
  cuda_detail::scratch<double> partial(blocks);
  cuda_detail::sum_of_squares_kernel<<<static_cast<unsigned>(blocks), cuda_detail::squares_threads, 0,
                                       cuda_rt::current_stream()>>>(partial.get(), x, n);
  cuda_rt::check_launch("sum_of_squares_kernel");
  cuda_detail::sum_array_kernel<1024><<<1, 1024, 0, cuda_rt::current_stream()>>>(out, partial.get(), blocks);
  cuda_rt::check_launch("sum_array_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
