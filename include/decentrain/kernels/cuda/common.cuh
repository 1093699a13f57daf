// Building blocks of the CUDA kernels: grid-stride indices, warp and block reductions (CUB),
// and a deterministic sum of a device array to one host value. Compiled only by nvcc.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cub/block/block_reduce.cuh>

#include <cstdint>
#include <vector>

#include "decentrain/core/cuda_runtime.cuh"
#include "decentrain/core/dtype.hpp"
#include "decentrain/core/memory.hpp"

namespace decentrain::kernels::cuda_detail {

__device__ inline std::int64_t thread_index() {
  return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
}
__device__ inline std::int64_t thread_count() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__device__ inline std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }

struct sum_op {
  template <class T>
  __device__ T operator()(const T& a, const T& b) const { return a + b; }
};
struct max_op {
  template <class T>
  __device__ T operator()(const T& a, const T& b) const { return a > b ? a : b; }
};

// A stored value (f32, f64 or bf16) as the arithmetic type T: bf16 widens through f32, the one
// type it converts to.
template <class T, class S>
__device__ T widen(S value) {
  return static_cast<T>(static_cast<compute_type_t<S>>(value));
}

// V adjacent elements moved as one load or store (16 bytes: 8 bf16, 4 f32, 2 f64), for data
// whose address is a multiple of the size.
template <class T, int V>
struct alignas(sizeof(T) * V) packed {
  T v[V];
};

template <int V, class T>
__device__ packed<T, V> load(const T* p) {
  return *reinterpret_cast<const packed<T, V>*>(p);
}
template <int V, class T>
__device__ void store(T* p, const packed<T, V>& v) {
  *reinterpret_cast<packed<T, V>*>(p) = v;
}

// Whether p is aligned for packed<T, V> and every row of `cols` elements after it is too.
template <class T, int V>
bool rows_packable(const void* p, std::int64_t cols) {
  return cols % V == 0 && reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * V) == 0;
}

// Elements per 16-byte load of T.
template <class T>
inline constexpr int pack_of = static_cast<int>(16 / sizeof(T));

template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The reduction of v over the block, returned to every thread. Safe to call several times in
// a row: the leading barrier keeps one call's broadcast from overwriting what another thread
// has not read yet.
template <int Threads, class T, class Op>
__device__ T block_reduce(T v, Op op) {
  using reduce = cub::BlockReduce<T, Threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ T result;
  __syncthreads();
  const T r = reduce(storage).Reduce(v, op);
  if (threadIdx.x == 0) result = r;
  __syncthreads();
  return result;
}

// A scratch device array that returns to the cache when it goes out of scope.
template <class T>
class scratch {
 public:
  explicit scratch(std::int64_t n)
      : n_(static_cast<std::size_t>(n)), data_(static_cast<T*>(memory<cuda>::allocate(sizeof(T) * n_))) {}
  ~scratch() { memory<cuda>::deallocate(data_, sizeof(T) * n_); }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  T* get() const { return data_; }

 private:
  std::size_t n_;
  T* data_;
};

template <int Threads>
__global__ void sum_array_kernel(double* out, const double* in, std::int64_t n) {
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += Threads) acc += in[i];
  acc = block_reduce<Threads>(acc, sum_op{});
  if (threadIdx.x == 0) *out = acc;
}

// Sum of n doubles on the device, read back to the host. One block in a fixed order, so the
// result is the same on every run (an atomic sum would not be).
inline double sum_to_host(const double* values, std::int64_t n) {
  if (n == 0) return 0.0;
  scratch<double> out(1);
  sum_array_kernel<1024><<<1, 1024, 0, cuda_rt::current_stream()>>>(out.get(), values, n);
  cuda_rt::check_launch("sum_array_kernel");
  double host = 0.0;
  memory<cuda>::copy_to_host(&host, out.get(), sizeof(double));
  return host;
}

}  // namespace decentrain::kernels::cuda_detail

#endif  // DECENTRAIN_HAS_CUDA
