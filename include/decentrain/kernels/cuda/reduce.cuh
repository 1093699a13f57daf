// Row and column sums on the GPU, accumulated in double as on the CPU, in a fixed order (no
// atomics), so results repeat exactly from run to run.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int reduce_threads = 256;

// One block per row.
template <class T>
__global__ void sum_rows_kernel(T* out, const T* in, std::int64_t cols, double scale) {
  const T* row = in + blockIdx.x * cols;
  double acc = 0.0;
  for (std::int64_t c = threadIdx.x; c < cols; c += reduce_threads) acc += static_cast<double>(row[c]);
  acc = block_reduce<reduce_threads>(acc, sum_op{});
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<T>(acc * scale);
}

// 32 columns per block (one per lane, so loads are coalesced), the rows split over the
// block's 8 warps and combined through shared memory.
inline constexpr int column_tile = 32, column_row_groups = 8;
template <class T>
__global__ void sum_columns_kernel(T* out, const T* in, std::int64_t rows, std::int64_t cols, double scale) {
  __shared__ double partial[column_row_groups][column_tile];
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(column_tile) + threadIdx.x;
  double acc = 0.0;
  if (c < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += column_row_groups) acc += static_cast<double>(in[r * cols + c]);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double total = 0.0;
    for (int g = 0; g < column_row_groups; ++g) total += partial[g][threadIdx.x];
    out[c] = static_cast<T>(total * scale);
  }
}
}  // namespace cuda_detail

// out[r] = scale * sum_c in[r * cols + c]
template <class T>
void sum_rows(cuda, T* out, const T* in, std::int64_t rows, std::int64_t cols, T scale = T(1)) {
  if (rows == 0) return;
  decentrain::detail::check(rows < (std::int64_t{1} << 31), "cuda sum_rows: ", rows, " rows is too many");
  cuda_detail::sum_rows_kernel<<<static_cast<unsigned>(rows), cuda_detail::reduce_threads, 0,
                                 cuda_rt::current_stream()>>>(out, in, cols, static_cast<double>(scale));
  cuda_rt::check_launch("sum_rows_kernel");
}

// out[c] = scale * sum_r in[r * cols + c]
template <class T>
void sum_columns(cuda, T* out, const T* in, std::int64_t rows, std::int64_t cols, T scale = T(1)) {
  if (cols == 0) return;
  const dim3 block(cuda_detail::column_tile, cuda_detail::column_row_groups);
  const auto grid = static_cast<unsigned>((cols + cuda_detail::column_tile - 1) / cuda_detail::column_tile);
  cuda_detail::sum_columns_kernel<<<grid, block, 0, cuda_rt::current_stream()>>>(
      out, in, rows, cols, static_cast<double>(scale));
  cuda_rt::check_launch("sum_columns_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
