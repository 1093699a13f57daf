// GELU (tanh form) on the GPU, forward and backward; the same formula as the CPU kernels.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/kernels/cpu/activation.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
__device__ inline float device_tanh(float u) { return tanhf(u); }
__device__ inline double device_tanh(double u) { return tanh(u); }

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* x, std::int64_t n) {
  const T s = T(0.79788456080286535587989211986876), c = T(0.044715);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + device_tanh(s * (v + c * v * v * v)));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* x, const T* dout, std::int64_t n) {
  const T s = T(0.79788456080286535587989211986876), c = T(0.044715);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const T v = x[i];
    const T t = device_tanh(s * (v + c * v * v * v));
    const T local = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * s * (T(1) + T(3) * c * v * v);
    dx[i] += local * dout[i];
  }
}
}  // namespace cuda_detail

template <class T>
void gelu_forward(cuda, T* out, const T* x, std::int64_t n) {
  if (n == 0) return;
  cuda_detail::gelu_forward_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                                     cuda_rt::current_stream()>>>(out, x, n);
  cuda_rt::check_launch("gelu_forward_kernel");
}

// dx += dout * gelu'(x)
template <class T>
void gelu_backward(cuda, T* dx, const T* x, const T* dout, std::int64_t n) {
  if (n == 0) return;
  cuda_detail::gelu_backward_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                                      cuda_rt::current_stream()>>>(dx, x, dout, n);
  cuda_rt::check_launch("gelu_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
