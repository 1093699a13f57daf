// Softmax and log-softmax over the last dim on the GPU: one block per row, the row maximum
// subtracted before exponentiating (as on the CPU).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int softmax_threads = 256;

__device__ inline float device_exp(float x) { return expf(x); }
__device__ inline double device_exp(double x) { return exp(x); }
__device__ inline float device_log(float x) { return logf(x); }
__device__ inline double device_log(double x) { return log(x); }
template <class T>
__device__ T lowest() { return -static_cast<T>(INFINITY); }

// Row max and sum(exp(x - max)) in M, every thread of the block gets both; x is stored as S
// (M itself, or bf16 read into f32).
template <class T>
struct row_stats {
  T max, sum;
};
template <int Threads, class M, class S>
__device__ row_stats<M> block_row_stats(const S* x, std::int64_t cols) {
  M mx = lowest<M>();
  for (std::int64_t c = threadIdx.x; c < cols; c += Threads) {
    const M v = static_cast<M>(x[c]);
    mx = v > mx ? v : mx;
  }
  mx = block_reduce<Threads>(mx, max_op{});
  M sum = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += Threads) sum += device_exp(static_cast<M>(x[c]) - mx);
  sum = block_reduce<Threads>(sum, sum_op{});
  return {mx, sum};
}

template <class T>
__global__ void softmax_forward_kernel(T* out, const T* x, std::int64_t cols, bool log) {
  const T* in = x + blockIdx.x * cols;
  T* o = out + blockIdx.x * cols;
  const auto s = block_row_stats<softmax_threads, T>(in, cols);
  if (log) {
    const T lse = s.max + device_log(s.sum);
    for (std::int64_t c = threadIdx.x; c < cols; c += softmax_threads) o[c] = in[c] - lse;
  } else {
    const T inv = T(1) / s.sum;
    for (std::int64_t c = threadIdx.x; c < cols; c += softmax_threads) o[c] = device_exp(in[c] - s.max) * inv;
  }
}

template <class T>
__global__ void softmax_backward_kernel(T* dx, const T* y, const T* dout, std::int64_t cols, bool log) {
  const T* yr = y + blockIdx.x * cols;
  const T* g = dout + blockIdx.x * cols;
  T* d = dx + blockIdx.x * cols;
  T dot = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += softmax_threads) dot += log ? g[c] : g[c] * yr[c];
  dot = block_reduce<softmax_threads>(dot, sum_op{});
  for (std::int64_t c = threadIdx.x; c < cols; c += softmax_threads)
    d[c] += log ? g[c] - device_exp(yr[c]) * dot : yr[c] * (g[c] - dot);
}
}  // namespace cuda_detail

template <class T>
void softmax_forward(cuda, T* out, const T* x, std::int64_t rows, std::int64_t cols, bool log) {
  if (rows == 0) return;
  cuda_detail::softmax_forward_kernel<<<static_cast<unsigned>(rows), cuda_detail::softmax_threads, 0,
                                        cuda_rt::current_stream()>>>(out, x, cols, log);
  cuda_rt::check_launch("softmax_forward_kernel");
}

// dx += softmax'(y) dout; for log=true, y is the log-softmax output.
template <class T>
void softmax_backward(cuda, T* dx, const T* y, const T* dout, std::int64_t rows, std::int64_t cols, bool log) {
  if (rows == 0) return;
  cuda_detail::softmax_backward_kernel<<<static_cast<unsigned>(rows), cuda_detail::softmax_threads, 0,
                                         cuda_rt::current_stream()>>>(dx, y, dout, cols, log);
  cuda_rt::check_launch("softmax_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
