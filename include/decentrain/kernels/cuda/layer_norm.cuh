// Layer normalisation over the last dim on the GPU: one warp per row for the row statistics
// and the input gradient, and a column-tiled reduction for the gain and bias gradients (a fixed
// order, no atomics). f32 rows whose pointers allow it are read and written 16 bytes a lane, and
// their backward pass (up to 1024 columns) is one kernel that reads each row once.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/cuda/reduce.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int rows_per_block = 8;  // one warp each
inline constexpr int column_row_groups_ln = 16;  // warps that split the rows of a column tile

__device__ inline float device_rsqrt(float x) { return rsqrtf(x); }
__device__ inline double device_rsqrt(double x) { return rsqrt(x); }

// A lane handles V adjacent columns at a time (V = 4 where every row pointer allows 16-byte
// loads of f32, V = 1 elsewhere), so a warp reads 512 contiguous bytes of f32 per step.

template <int V, class T, class O, class R>
__global__ void layer_norm_forward_kernel(O* out, T* mean, T* rstd, const T* x, const T* weight,
                                          const T* bias, std::int64_t rows, std::int64_t cols, T eps,
                                          const R* residual, T* sum) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(rows_per_block) + threadIdx.y;
  if (r >= rows) return;
  const std::int64_t first = threadIdx.x * V, step = 32 * V;
  const T* in = x + r * cols;
  T m = 0;
  if (residual != nullptr) {
    // Each lane re-reads only the sums it wrote itself, so no barrier is needed.
    const R* res = residual + r * cols;
    T* h = sum + r * cols;
    for (std::int64_t c = first; c < cols; c += step) {
      const auto a = load<V>(in + c);
      const auto b = load<V>(res + c);
      packed<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        o.v[j] = a.v[j] + widen<T>(b.v[j]);
        m += o.v[j];
      }
      store<V>(h + c, o);
    }
    in = h;
  } else {
    for (std::int64_t c = first; c < cols; c += step) {
      const auto a = load<V>(in + c);
#pragma unroll
      for (int j = 0; j < V; ++j) m += a.v[j];
    }
  }
  m = warp_reduce(m, sum_op{}) / static_cast<T>(cols);
  T v = 0;
  for (std::int64_t c = first; c < cols; c += step) {
    const auto a = load<V>(in + c);
#pragma unroll
    for (int j = 0; j < V; ++j) v += (a.v[j] - m) * (a.v[j] - m);
  }
  v = warp_reduce(v, sum_op{}) / static_cast<T>(cols);
  const T s = device_rsqrt(v + eps);
  O* o = out + r * cols;
  for (std::int64_t c = first; c < cols; c += step) {
    const auto a = load<V>(in + c), w = load<V>(weight + c), b = load<V>(bias + c);
    packed<O, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = O((a.v[j] - m) * s * w.v[j] + b.v[j]);
    store<V>(o + c, y);
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

template <int V, class T, class G>
__global__ void layer_norm_dx_kernel(T* dx, const G* dout, const T* x, const T* weight, const T* mean,
                                     const T* rstd, std::int64_t rows, std::int64_t cols) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(rows_per_block) + threadIdx.y;
  if (r >= rows) return;
  const std::int64_t first = threadIdx.x * V, step = 32 * V;
  const G* g = dout + r * cols;
  const T* in = x + r * cols;
  const T m = mean[r], s = rstd[r];
  T mean_dn = 0, mean_dn_xhat = 0;
  for (std::int64_t c = first; c < cols; c += step) {
    const auto w = load<V>(weight + c);
    const auto gs = load<V>(g + c);
    const auto a = load<V>(in + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const T dn = w.v[j] * widen<T>(gs.v[j]);
      mean_dn += dn;
      mean_dn_xhat += dn * (a.v[j] - m) * s;
    }
  }
  mean_dn = warp_reduce(mean_dn, sum_op{}) / static_cast<T>(cols);
  mean_dn_xhat = warp_reduce(mean_dn_xhat, sum_op{}) / static_cast<T>(cols);
  T* d = dx + r * cols;
  for (std::int64_t c = first; c < cols; c += step) {
    const auto w = load<V>(weight + c);
    const auto gs = load<V>(g + c);
    const auto a = load<V>(in + c);
    auto out = load<V>(d + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const T xhat = (a.v[j] - m) * s;
      out.v[j] += (w.v[j] * widen<T>(gs.v[j]) - mean_dn - xhat * mean_dn_xhat) * s;
    }
    store<V>(d + c, out);
  }
}

// Partial gain and bias gradients of one chunk of rows, in reduce.cuh's column scheme: V
// adjacent columns a lane (4 where the rows allow 16-byte loads of f32 x, 1 elsewhere), each
// column's rows summed per row group in order, then the groups in order.
template <int V, class T, class G>
__global__ void layer_norm_params_kernel(double* partial_w, double* partial_b, const G* dout, const T* x,
                                         const T* mean, const T* rstd, std::int64_t rows, std::int64_t cols) {
  constexpr int width = 32 * V;
  const std::int64_t c = (blockIdx.x * std::int64_t{32} + threadIdx.x) * V;
  const std::int64_t per = chunk_rows(rows, gridDim.y), begin = blockIdx.y * per, end = min64(rows, begin + per);
  double dw[V] = {}, db[V] = {};
  if (c < cols) {
#pragma unroll 2
    for (std::int64_t r = begin + threadIdx.y; r < end; r += column_row_groups_ln) {
      const auto xs = load<V>(x + r * cols + c);
      const auto gs = load<V>(dout + r * cols + c);
      const T m = mean[r], s = rstd[r];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const double g = widen<double>(gs.v[j]);
        dw[j] += static_cast<double>((xs.v[j] - m) * s) * g;
        db[j] += g;
      }
    }
  }
  __shared__ double groups_w[column_row_groups_ln][width], groups_b[column_row_groups_ln][width];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    groups_w[threadIdx.y][threadIdx.x * V + j] = dw[j];
    groups_b[threadIdx.y][threadIdx.x * V + j] = db[j];
  }
  __syncthreads();
  for (int i = threadIdx.y * 32 + threadIdx.x; i < width; i += 32 * column_row_groups_ln) {
    const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(width) + i;
    if (col >= cols) continue;
    double tw = 0.0, tb = 0.0;
    for (int g = 0; g < column_row_groups_ln; ++g) {
      tw += groups_w[g][i];
      tb += groups_b[g][i];
    }
    partial_w[blockIdx.y * cols + col] = tw;
    partial_b[blockIdx.y * cols + col] = tb;
  }
}

// The whole backward pass of f32 rows of at most fused_ln_max_packs * 128 columns in one kernel:
// dx (added into) and each chunk's partial gain and bias gradients, so dout and x are read from
// memory once, not once for dx and again for the parameters. A warp takes the chunk's rows
// fused_ln_warps apart and holds its lanes' columns of the row (x, dout, dx) in registers, loaded
// together; each lane sums its columns' gain and bias gradients over its rows in f32, and the
// warps' sums are added in warp order in double: a fixed order, no atomics.
inline constexpr int fused_ln_max_packs = 8;  // up to 1024 columns, 4 a lane per pack
inline constexpr int fused_ln_warps = 4;
inline constexpr std::int64_t fused_ln_chunk_rows = 64;

template <class G>
__global__ void __launch_bounds__(32 * fused_ln_warps)
    layer_norm_backward_fused_kernel(float* dx, double* partial_w, double* partial_b, const G* dout, const float* x,
                                     const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                                     std::int64_t cols) {
  constexpr int K = fused_ln_max_packs;
  const int packs = static_cast<int>(cols / 128), lane = static_cast<int>(threadIdx.x);
  const std::int64_t per = chunk_rows(rows, gridDim.x), begin = blockIdx.x * per, end = min64(rows, begin + per);
  float dw[K][4] = {}, db[K][4] = {};
  for (std::int64_t r = begin + threadIdx.y; r < end; r += fused_ln_warps) {
    const float m = mean[r], s = rstd[r];
    packed<float, 4> xs[K], ds[K];
    packed<G, 4> gs[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < packs) {  // dx too, so a row costs one trip to memory, not two
        const std::int64_t c = k * 128 + lane * 4;
        xs[k] = load<4>(x + r * cols + c);
        gs[k] = load<4>(dout + r * cols + c);
        ds[k] = load<4>(dx + r * cols + c);
      }
    float sum_dn = 0, sum_dn_xhat = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < packs) {
        const auto w = load<4>(weight + k * 128 + lane * 4);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float dn = w.v[j] * widen<float>(gs[k].v[j]);
          sum_dn += dn;
          sum_dn_xhat += dn * (xs[k].v[j] - m) * s;
        }
      }
    const float mean_dn = warp_reduce(sum_dn, sum_op{}) / static_cast<float>(cols),
                mean_dn_xhat = warp_reduce(sum_dn_xhat, sum_op{}) / static_cast<float>(cols);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < packs) {
        const std::int64_t c = k * 128 + lane * 4;
        const auto w = load<4>(weight + c);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float g = widen<float>(gs[k].v[j]), xhat = (xs[k].v[j] - m) * s;
          ds[k].v[j] += (w.v[j] * g - mean_dn - xhat * mean_dn_xhat) * s;
          dw[k][j] += xhat * g;
          db[k][j] += g;
        }
        store<4>(dx + r * cols + c, ds[k]);
      }
  }
  // The warps' sums, one parameter at a time through the same shared rows.
  __shared__ float sums[fused_ln_warps][K * 128];
  for (int which = 0; which < 2; ++which) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (k < packs)
#pragma unroll
        for (int j = 0; j < 4; ++j) sums[threadIdx.y][k * 128 + lane * 4 + j] = which == 0 ? dw[k][j] : db[k][j];
    __syncthreads();
    double* partial = which == 0 ? partial_w : partial_b;
    for (std::int64_t c = threadIdx.y * 32 + lane; c < cols; c += 32 * fused_ln_warps) {
      double total = 0.0;
      for (int w = 0; w < fused_ln_warps; ++w) total += sums[w][c];
      partial[blockIdx.x * cols + c] = total;
    }
    __syncthreads();
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
  const auto stream = cuda_rt::current_stream();
  namespace cd = cuda_detail;
  if constexpr (std::is_same_v<T, float>) {
    if (cd::rows_packable<T, 4>(x, cols) && cd::rows_packable<T, 4>(weight, cols) && cd::rows_packable<T, 4>(bias, cols) &&
        cd::rows_packable<O, 4>(out, cols) && (!residual || (cd::rows_packable<R, 4>(residual, cols) &&
                                                             cd::rows_packable<T, 4>(sum, cols)))) {
      cd::layer_norm_forward_kernel<4><<<grid, block, 0, stream>>>(out, mean, rstd, x, weight, bias, rows, cols, eps,
                                                                  residual, sum);
      cuda_rt::check_launch("layer_norm_forward_kernel");
      return;
    }
  }
  cd::layer_norm_forward_kernel<1><<<grid, block, 0, stream>>>(out, mean, rstd, x, weight, bias, rows, cols, eps,
                                                              residual, sum);
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
  if constexpr (std::is_same_v<T, float>) {
    namespace cd = cuda_detail;
    if (dx && (dweight || dbias) && cols % 128 == 0 && cols <= 128 * cd::fused_ln_max_packs && cd::rows_packable<T, 4>(dx, cols) &&
        cd::rows_packable<G, 4>(dout, cols) && cd::rows_packable<T, 4>(x, cols) && cd::rows_packable<T, 4>(weight, cols)) {
      const std::int64_t chunks = std::min<std::int64_t>((rows + cd::fused_ln_chunk_rows - 1) / cd::fused_ln_chunk_rows, 1 << 20);
      cd::scratch<double> partial_w(chunks * cols), partial_b(chunks * cols);
      cd::layer_norm_backward_fused_kernel<<<static_cast<unsigned>(chunks), dim3(32, cd::fused_ln_warps), 0, stream>>>(
          dx, partial_w.get(), partial_b.get(), dout, x, weight, mean, rstd, rows, cols);
      cuda_rt::check_launch("layer_norm_backward_fused_kernel");
      if (dweight) cd::finish_columns(dweight, partial_w.get(), chunks, cols, 1.0, true, stream);
      if (dbias) cd::finish_columns(dbias, partial_b.get(), chunks, cols, 1.0, true, stream);
      return;
    }
  }
  if (dx) {
    const dim3 block(32, cuda_detail::rows_per_block);
    const auto grid = static_cast<unsigned>((rows + cuda_detail::rows_per_block - 1) / cuda_detail::rows_per_block);
    bool launched = false;
    if constexpr (std::is_same_v<T, float>) {
      namespace cd = cuda_detail;
      if (cd::rows_packable<T, 4>(dx, cols) && cd::rows_packable<G, 4>(dout, cols) && cd::rows_packable<T, 4>(x, cols) &&
          cd::rows_packable<T, 4>(weight, cols)) {
        cd::layer_norm_dx_kernel<4><<<grid, block, 0, stream>>>(dx, dout, x, weight, mean, rstd, rows, cols);
        launched = true;
      }
    }
    if (!launched) cuda_detail::layer_norm_dx_kernel<1><<<grid, block, 0, stream>>>(dx, dout, x, weight, mean, rstd, rows, cols);
    cuda_rt::check_launch("layer_norm_dx_kernel");
  }
  if (dweight || dbias) {
    const std::int64_t chunks = std::max<std::int64_t>(cuda_detail::column_chunks(rows), 1);
    cuda_detail::scratch<double> partial_w(chunks * cols), partial_b(chunks * cols);
    const dim3 block(32, cuda_detail::column_row_groups_ln);
    const auto launch = [&](auto lanes) {
      constexpr int V = decltype(lanes)::value;
      const dim3 grid(static_cast<unsigned>((cols + 32 * V - 1) / (32 * V)), static_cast<unsigned>(chunks));
      cuda_detail::layer_norm_params_kernel<V><<<grid, block, 0, stream>>>(partial_w.get(), partial_b.get(), dout, x,
                                                                         mean, rstd, rows, cols);
    };
    bool packed = false;
    if constexpr (std::is_same_v<T, float>) {
      packed = cuda_detail::rows_packable<T, 4>(x, cols) && cuda_detail::rows_packable<G, 4>(dout, cols);
      if (packed) launch(std::integral_constant<int, 4>{});
    }
    if (!packed) launch(std::integral_constant<int, 1>{});
    cuda_rt::check_launch("layer_norm_params_kernel");
    if (dweight) cuda_detail::finish_columns(dweight, partial_w.get(), chunks, cols, 1.0, true, stream);
    if (dbias) cuda_detail::finish_columns(dbias, partial_b.get(), chunks, cols, 1.0, true, stream);
  }
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
