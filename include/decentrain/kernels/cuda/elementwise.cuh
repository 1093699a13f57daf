// Elementwise CUDA kernels: broadcasting binary ops (broadcast = stride 0, as on the CPU),
// scalar ops and accumulation. Kernels first, then the launchers the ops call.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cstdint>
#include <vector>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int max_rank = 8;

// The output's sizes and each operand's strides in the output's rank.
struct broadcast_layout {
  int rank;
  std::int64_t sizes[max_rank];
  std::int64_t a[max_rank];
  std::int64_t b[max_rank];
};

template <class T>
__global__ void binary_kernel(binary_op op, T* out, std::int64_t n, const T* a, const T* b,
                              broadcast_layout l) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    std::int64_t rem = i, oa = 0, ob = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
      const std::int64_t c = rem % l.sizes[d];
      rem /= l.sizes[d];
      oa += c * l.a[d];
      ob += c * l.b[d];
    }
    out[i] = detail::apply(op, a[oa], b[ob]);
  }
}

// Same-shape operands need no index arithmetic.
template <class T>
__global__ void binary_dense_kernel(binary_op op, T* out, std::int64_t n, const T* a, const T* b) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) out[i] = detail::apply(op, a[i], b[i]);
}

template <class T>
__global__ void affine_kernel(T* out, const T* x, std::int64_t n, T scale, T shift) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) out[i] = x[i] * scale + shift;
}

template <class T>
__global__ void reciprocal_kernel(T* out, const T* x, std::int64_t n, T numerator) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) out[i] = numerator / x[i];
}

// S is the stored type; bf16 adds in f32 and rounds once.
template <class S>
__global__ void axpy_kernel(S* dst, const S* src, std::int64_t n, compute_type_t<S> scale) {
  using M = compute_type_t<S>;
  for (std::int64_t i = thread_index(); i < n; i += thread_count())
    dst[i] = S(static_cast<M>(dst[i]) + scale * static_cast<M>(src[i]));
}

inline bool is_dense(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides) {
  std::int64_t expected = 1;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}
}  // namespace cuda_detail

template <class T>
void binary(cuda, binary_op op, T* out, const std::vector<std::int64_t>& sizes, const T* a,
            const std::vector<std::int64_t>& a_strides, const T* b,
            const std::vector<std::int64_t>& b_strides) {
  std::int64_t n = 1;
  for (auto s : sizes) n *= s;
  if (n == 0) return;
  const auto stream = cuda_rt::current_stream();
  const unsigned blocks = cuda_rt::blocks_for(n);
  if (cuda_detail::is_dense(sizes, a_strides) && cuda_detail::is_dense(sizes, b_strides)) {
    cuda_detail::binary_dense_kernel<<<blocks, cuda_rt::threads_per_block, 0, stream>>>(op, out, n, a, b);
    cuda_rt::check_launch("binary_dense_kernel");
    return;
  }
  decentrain::detail::check(sizes.size() <= static_cast<std::size_t>(cuda_detail::max_rank),
                            "cuda binary op: rank ", sizes.size(), " is above the supported ",
                            cuda_detail::max_rank);
  cuda_detail::broadcast_layout l{};
  l.rank = static_cast<int>(sizes.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    l.sizes[d] = sizes[d];
    l.a[d] = a_strides[d];
    l.b[d] = b_strides[d];
  }
  cuda_detail::binary_kernel<<<blocks, cuda_rt::threads_per_block, 0, stream>>>(op, out, n, a, b, l);
  cuda_rt::check_launch("binary_kernel");
}

template <class T>
void affine(cuda, T* out, const T* x, std::int64_t n, T scale, T shift) {
  if (n == 0) return;
  cuda_detail::affine_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                               cuda_rt::current_stream()>>>(out, x, n, scale, shift);
  cuda_rt::check_launch("affine_kernel");
}

template <class T>
void reciprocal(cuda, T* out, const T* x, std::int64_t n, T numerator) {
  if (n == 0) return;
  cuda_detail::reciprocal_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                                   cuda_rt::current_stream()>>>(out, x, n, numerator);
  cuda_rt::check_launch("reciprocal_kernel");
}

// dst += scale * src, for f32, f64 and bf16 storage (kernels/native_bf16.hpp).
template <class T>
void axpy(cuda, T* dst, const T* src, std::int64_t n, compute_type_t<T> scale = 1) {
  if (n == 0) return;
  cuda_detail::axpy_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                             cuda_rt::current_stream()>>>(dst, src, n, scale);
  cuda_rt::check_launch("axpy_kernel");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
