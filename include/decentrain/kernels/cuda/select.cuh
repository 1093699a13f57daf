// Selection on the GPU through CUB: a descending radix sort of (value, index) pairs, of which
// the first k are kept. Radix sort is stable and orders floats by their bit patterns, which is
// the order the CPU kernel reproduces (ties by lower index).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>

#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
template <class I>
__global__ void iota_kernel(I* out, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) out[i] = static_cast<I>(i);
}
}  // namespace cuda_detail

// values[0..k) and indices[0..k) = the k largest of x[0..n), largest first; 0 <= k <= n.
template <class T>
void top_k(cuda, const T* x, std::int64_t n, std::int64_t k, T* values, std::int32_t* indices) {
  if (k == 0) return;
  const auto stream = cuda_rt::current_stream();
  cuda_detail::scratch<std::int32_t> order_in(n), order_out(n);
  cuda_detail::scratch<T> sorted(n);
  cuda_detail::iota_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, stream>>>(order_in.get(), n);
  cuda_rt::check_launch("iota_kernel");
  std::size_t temp_bytes = 0;
  cuda_rt::check(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, x, sorted.get(), order_in.get(),
                                                            order_out.get(), n, 0, static_cast<int>(8 * sizeof(T)),
                                                            stream),
                 "cub::DeviceRadixSort::SortPairsDescending (size query)");
  cuda_detail::scratch<unsigned char> temp(static_cast<std::int64_t>(temp_bytes));
  cuda_rt::check(cub::DeviceRadixSort::SortPairsDescending(temp.get(), temp_bytes, x, sorted.get(), order_in.get(),
                                                            order_out.get(), n, 0, static_cast<int>(8 * sizeof(T)),
                                                            stream),
                 "cub::DeviceRadixSort::SortPairsDescending");
  cuda_rt::check(cudaMemcpyAsync(values, sorted.get(), sizeof(T) * static_cast<std::size_t>(k), cudaMemcpyDeviceToDevice,
                                 stream),
                 "cudaMemcpyAsync (top_k values)");
  cuda_rt::check(cudaMemcpyAsync(indices, order_out.get(), sizeof(std::int32_t) * static_cast<std::size_t>(k),
                                 cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (top_k indices)");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
