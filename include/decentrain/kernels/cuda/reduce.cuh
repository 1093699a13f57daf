// Row and column sums on the GPU, accumulated in double as on the CPU, in a fixed order (no
// atomics), so results repeat exactly from run to run. f32, f64 or bf16 storage
// (kernels/native_bf16.hpp).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int reduce_threads = 256;

// One block per row.
template <class T>
__global__ void sum_rows_kernel(T* out, const T* in, std::int64_t cols, double scale) {
  const T* row = in + blockIdx.x * cols;
  double acc = 0.0;
  for (std::int64_t c = threadIdx.x; c < cols; c += reduce_threads) acc += static_cast<double>(static_cast<compute_type_t<T>>(row[c]));
  acc = block_reduce<reduce_threads>(acc, sum_op{});
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<T>(acc * scale);
}

// 32 V columns per block (V adjacent ones per lane, so loads are coalesced), the rows split
// over the block's 8 warps and combined through shared memory. Tall inputs (a bias gradient over
// B*T rows) are cut into chunks of rows, one block row each, so the whole GPU takes part; the
// chunks' partial sums (double) are then added in chunk order: still no atomics.
inline constexpr int column_tile = 32, column_row_groups = 8;
inline constexpr std::int64_t column_chunk_rows = 256;

inline std::int64_t column_chunks(std::int64_t rows) {
  return std::min<std::int64_t>((rows + column_chunk_rows - 1) / column_chunk_rows, 65535);
}

__device__ inline std::int64_t chunk_rows(std::int64_t rows, std::int64_t chunks) { return (rows + chunks - 1) / chunks; }

// Partial column sums of one chunk of rows, V adjacent columns a lane read as one load (V =
// pack_of<T> where the rows allow 16-byte loads: a warp then reads 512 contiguous bytes of a
// row, not 64 of bf16; V = 1 elsewhere). Per column: the rows of each row group in order, then
// the groups in order.
template <int V, class T>
__global__ void sum_columns_kernel(double* partial, const T* in, std::int64_t rows, std::int64_t cols) {
  constexpr int width = column_tile * V;
  const std::int64_t c = (blockIdx.x * static_cast<std::int64_t>(column_tile) + threadIdx.x) * V;
  const std::int64_t per = chunk_rows(rows, gridDim.y), begin = blockIdx.y * per, end = min64(rows, begin + per);
  double acc[V] = {};
  if (c < cols) {
#pragma unroll 4
    for (std::int64_t r = begin + threadIdx.y; r < end; r += column_row_groups) {
      const auto p = load<V>(in + r * cols + c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += static_cast<double>(static_cast<compute_type_t<T>>(p.v[j]));
    }
  }
  __shared__ double groups[column_row_groups][width];
#pragma unroll
  for (int j = 0; j < V; ++j) groups[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  for (int i = threadIdx.y * column_tile + threadIdx.x; i < width; i += column_tile * column_row_groups) {
    const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(width) + i;
    if (col >= cols) continue;
    double total = 0.0;
    for (int g = 0; g < column_row_groups; ++g) total += groups[g][i];
    partial[blockIdx.y * cols + col] = total;
  }
}

// out[c] (= or +=) scale * sum over chunks of partial[chunk, c]: 32 columns a block, the
// block's 8 row groups taking every 8th chunk in order, then the groups added in order (a
// fixed order; a thread walks chunks / 8 partial sums, not all of them).
template <class T>
__global__ void finish_columns_kernel(T* out, const double* partial, std::int64_t chunks, std::int64_t cols,
                                      double scale, bool accumulate) {
  const std::int64_t c = blockIdx.x * std::int64_t{column_tile} + threadIdx.x;
  double acc = 0.0;
  if (c < cols)
#pragma unroll 4
    for (std::int64_t k = threadIdx.y; k < chunks; k += column_row_groups) acc += partial[k * cols + c];
  __shared__ double groups[column_row_groups][column_tile];
  groups[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  double total = 0.0;
  for (int g = 0; g < column_row_groups; ++g) total += groups[g][threadIdx.x];
  using M = compute_type_t<T>;
  out[c] = accumulate ? T(static_cast<M>(out[c]) + static_cast<M>(total * scale)) : static_cast<T>(total * scale);
}

template <class T>
void finish_columns(T* out, const double* partial, std::int64_t chunks, std::int64_t cols, double scale, bool accumulate,
                    cudaStream_t stream) {
  const auto grid = static_cast<unsigned>((cols + column_tile - 1) / column_tile);
  finish_columns_kernel<<<grid, dim3(column_tile, column_row_groups), 0, stream>>>(out, partial, chunks, cols, scale,
                                                                                 accumulate);
  cuda_rt::check_launch("finish_columns_kernel");
}
}  // namespace cuda_detail

// out[r] = scale * sum_c in[r * cols + c]
template <class T>
void sum_rows(cuda, T* out, const T* in, std::int64_t rows, std::int64_t cols, compute_type_t<T> scale = 1) {
  if (rows == 0) return;
  decentrain::detail::check(rows < (std::int64_t{1} << 31), "cuda sum_rows: ", rows, " rows is too many");
  cuda_detail::sum_rows_kernel<<<static_cast<unsigned>(rows), cuda_detail::reduce_threads, 0,
                                 cuda_rt::current_stream()>>>(out, in, cols, static_cast<double>(scale));
  cuda_rt::check_launch("sum_rows_kernel");
}

// out[c] = scale * sum_r in[r * cols + c]
template <class T>
void sum_columns(cuda, T* out, const T* in, std::int64_t rows, std::int64_t cols, compute_type_t<T> scale = 1) {
  if (cols == 0) return;
  const auto stream = cuda_rt::current_stream();
  const std::int64_t chunks = std::max<std::int64_t>(cuda_detail::column_chunks(rows), 1);
  cuda_detail::scratch<double> partial(chunks * cols);
  const dim3 block(cuda_detail::column_tile, cuda_detail::column_row_groups);
  const auto launch = [&](auto lanes) {
    constexpr int V = decltype(lanes)::value;
    const std::int64_t width = cuda_detail::column_tile * V;
    const dim3 grid(static_cast<unsigned>((cols + width - 1) / width), static_cast<unsigned>(chunks));
    cuda_detail::sum_columns_kernel<V><<<grid, block, 0, stream>>>(partial.get(), in, rows, cols);
  };
  if (cuda_detail::rows_packable<T, cuda_detail::pack_of<T>>(in, cols)) launch(std::integral_constant<int, cuda_detail::pack_of<T>>{});
  else launch(std::integral_constant<int, 1>{});
  cuda_rt::check_launch("sum_columns_kernel");
  cuda_detail::finish_columns(out, partial.get(), chunks, cols, static_cast<double>(scale), false, stream);
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
