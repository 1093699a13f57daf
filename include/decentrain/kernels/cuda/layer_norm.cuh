// Layer normalisation over the last dim on the GPU: one warp per row for the row statistics
// and the input gradient, and a column-tiled reduction for the gain and bias gradients (a fixed
// order, no atomics).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/cuda/reduce.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int rows_per_block = 8;  // one warp each
inline constexpr int column_row_groups_ln = 16;  // warps that split the rows of a column tile

__device__ inline float device_rsqrt(float x) { return rsqrtf(x); }
__device__ inline double device_rsqrt(double x) { return rsqrt(x); }

template <class T, class O, class R>
__global__ void layer_norm_forward_kernel(O* out, T* mean, T* rstd, const T* x, const T* weight,
                                          const T* bias, std::int64_t rows, std::int64_t cols, T eps,
                                          const R* residual, T* sum) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(rows_per_block) + threadIdx.y;
  if (r >= rows) return;
  const T* in = x + r * cols;
  T m = 0;
  if (residual != nullptr) {
    // Each lane re-reads only the sums it wrote itself, so no barrier is needed.
    const R* res = residual + r * cols;
    T* h = sum + r * cols;
    for (std::int64_t c = threadIdx.x; c < cols; c += 32) {
      h[c] = in[c] + widen<T>(res[c]);
      m += h[c];
    }
    in = h;
  } else {
    for (std::int64_t c = threadIdx.x; c < cols; c += 32) m += in[c];
  }
  m = warp_reduce(m, sum_op{}) / static_cast<T>(cols);
  T v = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += 32) v += (in[c] - m) * (in[c] - m);
  v = warp_reduce(v, sum_op{}) / static_cast<T>(cols);
  const T s = device_rsqrt(v + eps);
  O* o = out + r * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += 32) o[c] = O((in[c] - m) * s * weight[c] + bias[c]);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

template <class T, class G>
__global__ void layer_norm_dx_kernel(T* dx, const G* dout, const T* x, const T* weight, const T* mean,
                                     const T* rstd, std::int64_t rows, std::int64_t cols) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(rows_per_block) + threadIdx.y;
  if (r >= rows) return;
  const G* g = dout + r * cols;
  const T* in = x + r * cols;
  const T m = mean[r], s = rstd[r];
  T mean_dn = 0, mean_dn_xhat = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += 32) {
    const T dn = weight[c] * widen<T>(g[c]);
    mean_dn += dn;
    mean_dn_xhat += dn * (in[c] - m) * s;
  }
  mean_dn = warp_reduce(mean_dn, sum_op{}) / static_cast<T>(cols);
  mean_dn_xhat = warp_reduce(mean_dn_xhat, sum_op{}) / static_cast<T>(cols);
  T* d = dx + r * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += 32) {
    const T xhat = (in[c] - m) * s;
    d[c] += (weight[c] * widen<T>(g[c]) - mean_dn - xhat * mean_dn_xhat) * s;
  }
}

// Partial gain and bias gradients of one chunk of rows (reduce.cuh's column scheme).
template <class T, class G>
__global__ void layer_norm_params_kernel(double* partial_w, double* partial_b, const G* dout, const T* x,
                                         const T* mean, const T* rstd, std::int64_t rows, std::int64_t cols) {
  const std::int64_t c = blockIdx.x * std::int64_t{32} + threadIdx.x;
  const std::int64_t per = chunk_rows(rows, gridDim.y), begin = blockIdx.y * per, end = min64(rows, begin + per);
  const double dw = column_sum<column_row_groups_ln>(begin, end, c < cols, [&](std::int64_t r) {
    return static_cast<double>((x[r * cols + c] - mean[r]) * rstd[r]) * widen<double>(dout[r * cols + c]);
  });
  const double db = column_sum<column_row_groups_ln>(begin, end, c < cols,
                                                     [&](std::int64_t r) { return widen<double>(dout[r * cols + c]); });
  if (threadIdx.y == 0 && c < cols) {
    partial_w[blockIdx.y * cols + c] = dw;
    partial_b[blockIdx.y * cols + c] = db;
  }
}
}  // namespace cuda_detail

// With `residual`, normalises x + residual and writes that sum to `sum`; O and R as on the CPU
// (T, or bf16 read and written by the kernel itself).
template <class T, class O, class R = T>
void layer_norm_forward(cuda, O* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias,
                        std::int64_t rows, std::int64_t cols, T eps, const R* residual = nullptr,
                        T* sum = nullptr) {
  if (rows == 0) return;
  const dim3 block(32, cuda_detail::rows_per_block);
  const auto grid = static_cast<unsigned>((rows + cuda_detail::rows_per_block - 1) / cuda_detail::rows_per_block);
  cuda_detail::layer_norm_forward_kernel<<<grid, block, 0, cuda_rt::current_stream()>>>(
      out, mean, rstd, x, weight, bias, rows, cols, eps, residual, sum);
  cuda_rt::check_launch("layer_norm_forward_kernel");
}

// dx, dweight, dbias are accumulated into (+=); any of them may be null when not needed. dout
// is T or bf16.
template <class T, class G>
void layer_norm_backward(cuda, T* dx, T* dweight, T* dbias, const G* dout, const T* x,
                         const T* weight, const T* mean, const T* rstd, std::int64_t rows,
                         std::int64_t cols) {
  if (rows == 0) return;
  const auto stream = cuda_rt::current_stream();
  if (dx) {
    const dim3 block(32, cuda_detail::rows_per_block);
    const auto grid = static_cast<unsigned>((rows + cuda_detail::rows_per_block - 1) / cuda_detail::rows_per_block);
    cuda_detail::layer_norm_dx_kernel<<<grid, block, 0, stream>>>(dx, dout, x, weight, mean, rstd, rows, cols);
    cuda_rt::check_launch("layer_norm_dx_kernel");
  }
  if (dweight || dbias) {
    const std::int64_t chunks = std::max<std::int64_t>(cuda_detail::column_chunks(rows), 1);
    cuda_detail::scratch<double> partial_w(chunks * cols), partial_b(chunks * cols);
    const dim3 block(32, cuda_detail::column_row_groups_ln);
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(chunks));
    cuda_detail::layer_norm_params_kernel<<<grid, block, 0, stream>>>(partial_w.get(), partial_b.get(), dout, x, mean,
                                                                      rstd, rows, cols);
    cuda_rt::check_launch("layer_norm_params_kernel");
    const auto finish_grid = cuda_rt::blocks_for(cols);
    if (dweight)
      cuda_detail::finish_columns_kernel<<<finish_grid, cuda_rt::threads_per_block, 0, stream>>>(
          dweight, partial_w.get(), chunks, cols, 1.0, true);
    if (dbias)
      cuda_detail::finish_columns_kernel<<<finish_grid, cuda_rt::threads_per_block, 0, stream>>>(
          dbias, partial_b.get(), chunks, cols, 1.0, true);
    cuda_rt::check_launch("finish_columns_kernel");
  }
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
