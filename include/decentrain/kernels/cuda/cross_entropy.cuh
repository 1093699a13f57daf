// Cross-entropy with logits on the GPU, fused with the softmax: one block per row, logits stored
// as f32, f64 or bf16 (kernels/native_bf16.hpp). The forward writes each row's loss (in double),
// summed in a fixed order, and its logsumexp; the backward then reads the logits once and writes
// the gradient once, instead of keeping (N, V) probabilities alive.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/cuda/softmax.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
// S is the stored type of the logits (float, double or bf16); the arithmetic runs in
// compute_type_t<S> (f32 for bf16).
template <class S>
__global__ void cross_entropy_rows_kernel(double* row_loss, compute_type_t<S>* row_lse, const S* logits,
                                          const std::int32_t* targets, std::int64_t V, std::int32_t ignore_index) {
  using M = compute_type_t<S>;
  const std::int64_t i = blockIdx.x;
  const std::int32_t target = targets[i];
  if (target == ignore_index) {  // uniform over the block: no thread reaches a barrier
    if (threadIdx.x == 0) row_loss[i] = 0.0;
    return;
  }
  const S* row = logits + i * V;
  const auto s = block_row_stats<softmax_threads, M>(row, V);
  if (threadIdx.x == 0) {
    const M lse = s.max + device_log(s.sum);
    row_lse[i] = lse;
    row_loss[i] = static_cast<double>(lse - static_cast<M>(row[target]));
  }
}

template <class S>
__global__ void cross_entropy_backward_kernel(S* dlogits, const S* logits, const compute_type_t<S>* row_lse,
                                              const std::int32_t* targets, std::int64_t V,
                                              std::int32_t ignore_index, compute_type_t<S> dloss_per_row) {
  using M = compute_type_t<S>;
  const std::int64_t i = blockIdx.x;
  const std::int32_t target = targets[i];
  S* d = dlogits + i * V;
  if (target == ignore_index) {
    for (std::int64_t c = threadIdx.x; c < V; c += softmax_threads) d[c] = S(0);
    return;
  }
  const S* row = logits + i * V;
  const M lse = row_lse[i];
  for (std::int64_t c = threadIdx.x; c < V; c += softmax_threads) {
    const M p = device_exp(static_cast<M>(row[c]) - lse);
    d[c] = S(dloss_per_row * (c == target ? p - M(1) : p));
  }
}
}  // namespace cuda_detail

// Writes each row's loss (in double; 0 for ignored rows) to row_loss and each counted row's
// logsumexp to row_lse, both device arrays of N entries, without waiting for the device.
// Targets (a device array) must already be validated.
template <class T>
void cross_entropy_rows(cuda, const T* logits, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                        std::int32_t ignore_index, compute_type_t<T>* row_lse, double* row_loss) {
  if (N == 0) return;
  decentrain::detail::check(N < (std::int64_t{1} << 31), "cuda cross_entropy: ", N, " rows is too many");
  cuda_detail::cross_entropy_rows_kernel<<<static_cast<unsigned>(N), cuda_detail::softmax_threads, 0,
                                           cuda_rt::current_stream()>>>(row_loss, row_lse, logits, targets, V,
                                                                        ignore_index);
  cuda_rt::check_launch("cross_entropy_rows_kernel");
}

// Returns the summed loss over the rows whose target is not ignore_index (read back: one
// synchronisation; summed in a fixed order) and writes row_lse as cross_entropy_rows.
template <class T>
double cross_entropy_forward(cuda, const T* logits, const std::int32_t* targets, std::int64_t N,
                             std::int64_t V, std::int32_t ignore_index, compute_type_t<T>* row_lse) {
  if (N == 0) return 0.0;
  cuda_detail::scratch<double> row_loss(N);
  cross_entropy_rows(cuda{}, logits, targets, N, V, ignore_index, row_lse, row_loss.get());
  return cuda_detail::sum_to_host(row_loss.get(), N);
}

// dlogits = dloss_per_row * (softmax(logits) - onehot(target)) for counted rows, 0 for ignored
// ones (written, not accumulated); row_lse from the forward.
template <class T>
void cross_entropy_backward(cuda, T* dlogits, const T* logits, const compute_type_t<T>* row_lse,
                            const std::int32_t* targets, std::int64_t N, std::int64_t V, std::int32_t ignore_index,
                            compute_type_t<T> dloss_per_row) {
  if (N == 0) return;
  cuda_detail::cross_entropy_backward_kernel<<<static_cast<unsigned>(N), cuda_detail::softmax_threads, 0,
                                               cuda_rt::current_stream()>>>(dlogits, logits, row_lse, targets, V,
                                                                            ignore_index, dloss_per_row);
  cuda_rt::check_launch("cross_entropy_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
