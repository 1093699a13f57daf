// Cross-entropy with logits on the GPU, fused with the softmax: one block per row. The
// forward writes each row's loss (in double) and sums them in a fixed order; the backward
// recomputes the row statistics instead of keeping (N, V) probabilities alive.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/cuda/softmax.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
template <class T>
__global__ void cross_entropy_rows_kernel(double* row_loss, const T* logits, const std::int32_t* targets,
                                          std::int64_t V, std::int32_t ignore_index) {
  const std::int64_t i = blockIdx.x;
  const std::int32_t target = targets[i];
  if (target == ignore_index) {  // uniform over the block: no thread reaches a barrier
    if (threadIdx.x == 0) row_loss[i] = 0.0;
    return;
  }
  const T* row = logits + i * V;
  const auto s = block_row_stats<softmax_threads>(row, V);
  if (threadIdx.x == 0) row_loss[i] = static_cast<double>(s.max + device_log(s.sum) - row[target]);
}

template <class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const std::int32_t* targets,
                                              std::int64_t V, std::int32_t ignore_index, T dloss_per_row) {
  const std::int64_t i = blockIdx.x;
  const std::int32_t target = targets[i];
  if (target == ignore_index) return;
  const T* row = logits + i * V;
  T* d = dlogits + i * V;
  const auto s = block_row_stats<softmax_threads>(row, V);
  const T inv = T(1) / s.sum;
  for (std::int64_t c = threadIdx.x; c < V; c += softmax_threads) {
    const T p = device_exp(row[c] - s.max) * inv;
    d[c] += dloss_per_row * (c == target ? p - T(1) : p);
  }
}
}  // namespace cuda_detail

// Returns the summed loss over the rows whose target is not ignore_index (read back: one
// synchronisation). Targets (a device array) must already be validated.
template <class T>
double cross_entropy_forward(cuda, const T* logits, const std::int32_t* targets, std::int64_t N,
                             std::int64_t V, std::int32_t ignore_index) {
  if (N == 0) return 0.0;
  decentrain::detail::check(N < (std::int64_t{1} << 31), "cuda cross_entropy: ", N, " rows is too many");
  cuda_detail::scratch<double> row_loss(N);
  cuda_detail::cross_entropy_rows_kernel<<<static_cast<unsigned>(N), cuda_detail::softmax_threads, 0,
                                           cuda_rt::current_stream()>>>(row_loss.get(), logits, targets, V,
                                                                        ignore_index);
  cuda_rt::check_launch("cross_entropy_rows_kernel");
  return cuda_detail::sum_to_host(row_loss.get(), N);
}

// dlogits += dloss_per_row * (softmax(logits) - onehot(target)) for counted rows.
template <class T>
void cross_entropy_backward(cuda, T* dlogits, const T* logits, const std::int32_t* targets, std::int64_t N,
                            std::int64_t V, std::int32_t ignore_index, T dloss_per_row) {
  if (N == 0) return;
  cuda_detail::cross_entropy_backward_kernel<<<static_cast<unsigned>(N), cuda_detail::softmax_threads, 0,
                                               cuda_rt::current_stream()>>>(dlogits, logits, targets, V,
                                                                            ignore_index, dloss_per_row);
  cuda_rt::check_launch("cross_entropy_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
