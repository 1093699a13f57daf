// GELU (tanh form) on the GPU, forward and backward; the same formula as the CPU kernels, for
// f32, f64 and bf16 storage (kernels/native_bf16.hpp).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cpu/activation.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
__device__ inline float device_tanh(float u) { return tanhf(u); }
__device__ inline double device_tanh(double u) { return tanh(u); }

template <class M>
__device__ M gelu_value(M v) {
  const M s = M(0.79788456080286535587989211986876), c = M(0.044715);
  return M(0.5) * v * (M(1) + device_tanh(s * (v + c * v * v * v)));
}
template <class M>
__device__ M gelu_slope(M v) {
  const M s = M(0.79788456080286535587989211986876), c = M(0.044715);
  const M t = device_tanh(s * (v + c * v * v * v));
  return M(0.5) * (M(1) + t) + M(0.5) * v * (M(1) - t * t) * s * (M(1) + M(3) * c * v * v);
}

// S is the stored type (float, double or bf16); the arithmetic runs in M (f32 for bf16). V
// elements a thread as one 16-byte load where all pointers allow it (V = 1 otherwise); the
// last n % V elements go one a thread.
template <int V, class S>
__global__ void gelu_forward_kernel(S* out, const S* x, std::int64_t n) {
  using M = compute_type_t<S>;
  const std::int64_t packs = n / V;
  for (std::int64_t i = thread_index(); i < packs; i += thread_count()) {
    const auto xs = load<V>(x + i * V);
    packed<S, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = S(gelu_value(static_cast<M>(xs.v[j])));
    store<V>(out + i * V, o);
  }
  const std::int64_t tail = packs * V + thread_index();
  if (tail < n) out[tail] = S(gelu_value(static_cast<M>(x[tail])));
}

template <int V, class S>
__global__ void gelu_backward_kernel(S* dx, const S* x, const S* dout, std::int64_t n) {
  using M = compute_type_t<S>;
  const std::int64_t packs = n / V;
  for (std::int64_t i = thread_index(); i < packs; i += thread_count()) {
    const auto xs = load<V>(x + i * V), gs = load<V>(dout + i * V);
    packed<S, V> d;
#pragma unroll
    for (int j = 0; j < V; ++j) d.v[j] = S(gelu_slope(static_cast<M>(xs.v[j])) * static_cast<M>(gs.v[j]));
    store<V>(dx + i * V, d);
  }
  const std::int64_t tail = packs * V + thread_index();
  if (tail < n) dx[tail] = S(gelu_slope(static_cast<M>(x[tail])) * static_cast<M>(dout[tail]));
}

// Whether every pointer is 16-byte aligned, so the kernels above may run with V = pack_of<T>.
template <class T>
bool all_packable(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!rows_packable<T, pack_of<T>>(p, pack_of<T>)) return false;
  return true;
}
}  // namespace cuda_detail

template <class T>
void gelu_forward(cuda, T* out, const T* x, std::int64_t n) {
  if (n == 0) return;
  constexpr int V = cuda_detail::pack_of<T>;
  const auto stream = cuda_rt::current_stream();
  if (cuda_detail::all_packable<T>({out, x}))
    cuda_detail::gelu_forward_kernel<V><<<cuda_rt::blocks_for(std::max<std::int64_t>(n / V, 1)), cuda_rt::threads_per_block, 0,
                                          stream>>>(out, x, n);
  else
    cuda_detail::gelu_forward_kernel<1><<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, stream>>>(out, x, n);
  cuda_rt::check_launch("gelu_forward_kernel");
}

// dx = dout * gelu'(x) (written, not accumulated)
template <class T>
void gelu_backward(cuda, T* dx, const T* x, const T* dout, std::int64_t n) {
  if (n == 0) return;
  constexpr int V = cuda_detail::pack_of<T>;
  const auto stream = cuda_rt::current_stream();
  if (cuda_detail::all_packable<T>({dx, x, dout}))
    cuda_detail::gelu_backward_kernel<V><<<cuda_rt::blocks_for(std::max<std::int64_t>(n / V, 1)), cuda_rt::threads_per_block,
                                           0, stream>>>(dx, x, dout, n);
  else
    cuda_detail::gelu_backward_kernel<1><<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, stream>>>(dx, x, dout, n);
  cuda_rt::check_launch("gelu_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
