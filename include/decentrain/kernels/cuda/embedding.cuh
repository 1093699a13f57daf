// Embedding lookup on the GPU and its gradient, a scatter-add. Ids must be validated by the
// caller (the op checks them on the host).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
template <class T>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* ids, const T* table, std::int64_t N,
                                         std::int64_t C) {
  for (std::int64_t i = thread_index(); i < N * C; i += thread_count()) {
    const std::int64_t row = i / C, c = i % C;
    out[i] = table[static_cast<std::int64_t>(ids[row]) * C + c];
  }
}

// Repeated ids add into the same row, so the adds are atomic. The order of float additions
// then varies between runs (last-bit differences in the table gradient).
template <class T>
__global__ void embedding_backward_kernel(T* dtable, const std::int32_t* ids, const T* dout, std::int64_t N,
                                          std::int64_t C) {
  for (std::int64_t i = thread_index(); i < N * C; i += thread_count()) {
    const std::int64_t row = i / C, c = i % C;
    atomicAdd(dtable + static_cast<std::int64_t>(ids[row]) * C + c, dout[i]);
  }
}
}  // namespace cuda_detail

template <class T>
void embedding_forward(cuda, T* out, const std::int32_t* ids, const T* table, std::int64_t N, std::int64_t C) {
  if (N * C == 0) return;
  cuda_detail::embedding_forward_kernel<<<cuda_rt::blocks_for(N * C), cuda_rt::threads_per_block, 0,
                                          cuda_rt::current_stream()>>>(out, ids, table, N, C);
  cuda_rt::check_launch("embedding_forward_kernel");
}

// dtable[ids[i]] += dout[i]
template <class T>
void embedding_backward(cuda, T* dtable, const std::int32_t* ids, const T* dout, std::int64_t N, std::int64_t C) {
  if (N * C == 0) return;
  cuda_detail::embedding_backward_kernel<<<cuda_rt::blocks_for(N * C), cuda_rt::threads_per_block, 0,
                                           cuda_rt::current_stream()>>>(dtable, ids, dout, N, C);
  cuda_rt::check_launch("embedding_backward_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
