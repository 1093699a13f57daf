// Dropout on the GPU: the mask of kernels/cpu/dropout.hpp (the same key and index give the same
// draw), for f32, f64 and bf16 storage, made as the values pass instead of copied from the host.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <cstdint>

#include "decentrain/detail/hash.hpp"
#include "decentrain/kernels/cpu/dropout.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
// One thread a value; `word` is the key's word for the 2^32 values from `base`.
template <class S>
__global__ void dropout_kernel(S* out, const S* x, std::int64_t n, float p, std::uint64_t key) {
  using M = compute_type_t<S>;
  const M scale = p < 1.0f ? M(1) / (M(1) - M(p)) : M(0);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const std::uint32_t word = decentrain::detail::draw_word(key, static_cast<std::uint64_t>(i) >> 32);
    const bool keep = decentrain::detail::unit_draw_in(word, static_cast<std::uint32_t>(i)) >= p;
    out[i] = keep ? S(static_cast<M>(x[i]) * scale) : S(M(0));
  }
}
}  // namespace cuda_detail

template <class T>
void dropout_apply(cuda, T* out, const T* x, std::int64_t n, float p, std::uint64_t key) {
  if (n == 0) return;
  cuda_detail::dropout_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, cuda_rt::current_stream()>>>(out, x, n, p,
                                                                                                                     key);
  cuda_rt::check_launch("dropout_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
