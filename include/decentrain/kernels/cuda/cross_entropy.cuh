// Cross-entropy with logits on the GPU, fused with the softmax: one block per row, logits stored
// as f32, f64 or bf16 (kernels/native_bf16.hpp). The forward writes each row's loss (in double),
// summed in a fixed order, and its logsumexp; the backward then reads the logits once and writes
// the gradient once, instead of keeping (N, V) probabilities alive. The forward reads each row
// once (an online softmax), 16 bytes a thread where the rows allow it, as does the backward.
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
// The row's max and sum(exp(x - max)) in one pass over the logits (an online softmax: the sum
// is rescaled when the running max rises), V logits a thread per 16-byte load.
template <class M>
struct online_stats {
  M max, sum;
};
struct online_merge {
  template <class M>
  __device__ online_stats<M> operator()(const online_stats<M>& a, const online_stats<M>& b) const {
    const M mx = a.max > b.max ? a.max : b.max;
    if (mx == lowest<M>()) return {mx, M(0)};
    return {mx, a.sum * device_exp(a.max - mx) + b.sum * device_exp(b.max - mx)};
  }
};
template <int Threads, int V, class M, class S>
__device__ online_stats<M> block_online_stats(const S* x, std::int64_t cols) {
  online_stats<M> acc{lowest<M>(), M(0)};
  for (std::int64_t c = threadIdx.x * V; c < cols; c += Threads * V) {
    const auto xs = load<V>(x + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M v = static_cast<M>(xs.v[j]);
      if (v > acc.max) {
        acc.sum = acc.sum * device_exp(acc.max - v) + M(1);
        acc.max = v;
      } else {  // -inf adds nothing (and would be NaN against a max of -inf); NaN still spreads
        acc.sum += v == lowest<M>() ? M(0) : device_exp(v - acc.max);
      }
    }
  }
  return block_reduce<Threads>(acc, online_merge{});
}

// V > 1 for rows of 16-byte aligned logits whose width is a multiple of V; V = 1 for any rows.
template <int V, class S>
__global__ void cross_entropy_rows_kernel(double* row_loss, compute_type_t<S>* row_lse, const S* logits,
                                          const std::int32_t* targets, std::int64_t cols, std::int32_t ignore_index) {
  using M = compute_type_t<S>;
  const std::int64_t i = blockIdx.x;
  const std::int32_t target = targets[i];
  if (target == ignore_index) {  // uniform over the block: no thread reaches a barrier
    if (threadIdx.x == 0) row_loss[i] = 0.0;
    return;
  }
  const S* row = logits + i * cols;
  const auto s = block_online_stats<softmax_threads, V, M>(row, cols);
  if (threadIdx.x == 0) {
    const M lse = s.max + device_log(s.sum);
    row_lse[i] = lse;
    row_loss[i] = static_cast<double>(lse - static_cast<M>(row[target]));
  }
}

// In place (dlogits == logits) is allowed: every element is read by the thread that writes it.
template <int V, class S>
__global__ void cross_entropy_backward_kernel(S* dlogits, const S* logits, const compute_type_t<S>* row_lse,
                                              const std::int32_t* targets, std::int64_t cols,
                                              std::int32_t ignore_index, compute_type_t<S> dloss_per_row) {
  using M = compute_type_t<S>;
  const std::int64_t i = blockIdx.x;
  const std::int32_t target = targets[i];
  S* d = dlogits + i * cols;
  if (target == ignore_index) {
    packed<S, V> zero;
#pragma unroll
    for (int j = 0; j < V; ++j) zero.v[j] = S(0);
    for (std::int64_t c = threadIdx.x * V; c < cols; c += softmax_threads * V) store<V>(d + c, zero);
    return;
  }
  const S* row = logits + i * cols;
  const M lse = row_lse[i];
  for (std::int64_t c = threadIdx.x * V; c < cols; c += softmax_threads * V) {
    const auto xs = load<V>(row + c);
    packed<S, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M p = device_exp(static_cast<M>(xs.v[j]) - lse);
      out.v[j] = S(dloss_per_row * (c + j == target ? p - M(1) : p));
    }
    store<V>(d + c, out);
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
  namespace cd = cuda_detail;
  const auto blocks = static_cast<unsigned>(N);
  const auto stream = cuda_rt::current_stream();
  if (cd::rows_packable<T, cd::pack_of<T>>(logits, V))
    cd::cross_entropy_rows_kernel<cd::pack_of<T>><<<blocks, cd::softmax_threads, 0, stream>>>(row_loss, row_lse, logits,
                                                                                             targets, V, ignore_index);
  else
    cd::cross_entropy_rows_kernel<1><<<blocks, cd::softmax_threads, 0, stream>>>(row_loss, row_lse, logits, targets, V,
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
  namespace cd = cuda_detail;
  const auto blocks = static_cast<unsigned>(N);
  const auto stream = cuda_rt::current_stream();
  if (cd::rows_packable<T, cd::pack_of<T>>(logits, V) && cd::rows_packable<T, cd::pack_of<T>>(dlogits, V))
    cd::cross_entropy_backward_kernel<cd::pack_of<T>><<<blocks, cd::softmax_threads, 0, stream>>>(
        dlogits, logits, row_lse, targets, V, ignore_index, dloss_per_row);
  else
    cd::cross_entropy_backward_kernel<1><<<blocks, cd::softmax_threads, 0, stream>>>(dlogits, logits, row_lse, targets, V,
                                                                                    ignore_index, dloss_per_row);
  cuda_rt::check_launch("cross_entropy_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
