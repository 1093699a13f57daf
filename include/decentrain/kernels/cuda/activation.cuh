// GELU (tanh form) on the GPU, forward and backward; the same formula as the CPU kernels, for
// f32, f64 and bf16 storage (kernels/native_bf16.hpp).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cpu/activation.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
__device__ inline float device_tanh(float u) { return tanhf(u); }
__device__ inline double device_tanh(double u) { return tanh(u); }

// S is the stored type (float, double or bf16); the arithmetic runs in M (f32 for bf16).
template <class S>
__global__ void gelu_forward_kernel(S* out, const S* x, std::int64_t n) {
  using M = compute_type_t<S>;
  const M s = M(0.79788456080286535587989211986876), c = M(0.044715);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const M v = static_cast<M>(x[i]);
    out[i] = S(M(0.5) * v * (M(1) + device_tanh(s * (v + c * v * v * v))));
  }
}

template <class S>
__global__ void gelu_backward_kernel(S* dx, const S* x, const S* dout, std::int64_t n) {
  using M = compute_type_t<S>;
  const M s = M(0.79788456080286535587989211986876), c = M(0.044715);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const M v = static_cast<M>(x[i]);
    const M t = device_tanh(s * (v + c * v * v * v));
    const M local = M(0.5) * (M(1) + t) + M(0.5) * v * (M(1) - t * t) * s * (M(1) + M(3) * c * v * v);
    dx[i] = S(local * static_cast<M>(dout[i]));
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

// dx = dout * gelu'(x) (written, not accumulated)
template <class T>
void gelu_backward(cuda, T* dx, const T* x, const T* dout, std::int64_t n) {
  if (n == 0) return;
  cuda_detail::gelu_backward_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                                      cuda_rt::current_stream()>>>(dx, x, dout, n);
  cuda_rt::check_launch("gelu_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
