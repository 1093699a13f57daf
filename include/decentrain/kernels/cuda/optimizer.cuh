// Optimizer updates on the GPU: AdamW fused over all parameters (a few launches per step, not
// one per tensor) with the same arithmetic as the CPU kernels (PyTorch's single-tensor order
// of operations), SGD, and the sum of squares for gradient clipping over all gradients,
// reduced in a fixed order.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cmath>
#include <cstdint>
#include <span>

#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/optimizer_args.hpp"

namespace decentrain::kernels {

namespace cuda_detail {
__device__ inline float device_sqrt(float x) { return sqrtf(x); }
__device__ inline double device_sqrt(double x) { return sqrt(x); }

// Multi-tensor launches (as apex's multi_tensor_apply): up to `batch_tensors` tensors travel in
// the kernel's parameters, each cut into chunks of `chunk_elements`; a block takes chunks in a
// grid-stride loop and finds its tensor by binary search over the chunk offsets. One launch
// then updates many small tensors (biases, gains) without a launch each, and nothing is copied
// to the device first (so no synchronisation).
inline constexpr int batch_tensors = 32;
inline constexpr std::int64_t chunk_elements = 4096;
inline constexpr int multi_threads = 256;
inline constexpr std::int64_t max_multi_blocks = 2048;

template <class Entry>
struct tensor_batch {
  Entry entries[batch_tensors];
  std::int64_t first_chunk[batch_tensors + 1];  // first_chunk[count] = chunks in the batch
  int count;
};

template <class Batch>
__device__ int entry_of_chunk(const Batch& batch, std::int64_t chunk) {
  int lo = 0, hi = batch.count - 1;  // the last entry whose first chunk is <= chunk
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.first_chunk[mid] <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The batch's chunks this block takes (a grid-stride loop), each as f(entry, begin, end): its
// tensor's entry and the range of that tensor's elements the chunk covers.
template <class Batch, class F>
__device__ void for_each_chunk(const Batch& batch, F&& f) {
  const std::int64_t chunks = batch.first_chunk[batch.count];
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int k = entry_of_chunk(batch, c);
    const auto& e = batch.entries[k];
    const std::int64_t begin = (c - batch.first_chunk[k]) * chunk_elements;
    f(e, begin, min64(e.n, begin + chunk_elements));
  }
}

template <class T>
struct adamw_entry {
  T* param;
  const T* grad;
  T* m;
  T* v;
  std::int64_t n;
  adamw_factors<T> f;
};

template <class T>
__global__ void __launch_bounds__(multi_threads) adamw_kernel(const __grid_constant__ tensor_batch<adamw_entry<T>> batch) {
  for_each_chunk(batch, [](const adamw_entry<T>& e, std::int64_t begin, std::int64_t end) {
    const adamw_factors<T> f = e.f;
    for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const T p = e.param[i] * f.decay;
      const T g = e.grad[i];
      const T mi = e.m[i] * f.b1 + g * f.one_minus_b1;
      const T vi = e.v[i] * f.b2 + g * g * f.one_minus_b2;
      e.m[i] = mi;
      e.v[i] = vi;
      const T denom = device_sqrt(vi) / f.bias2_sqrt + f.eps;
      e.param[i] = p + -f.step_size * mi / denom;
    }
  });
}

template <class T>
struct squares_entry {
  const T* x;
  std::int64_t n;
};

// One partial per block, for the batch's chunks in a fixed order (deterministic).
template <class T>
__global__ void __launch_bounds__(multi_threads) sum_of_squares_kernel(double* partial,
                                                                       const __grid_constant__ tensor_batch<squares_entry<T>> batch) {
  double acc = 0.0;
  for_each_chunk(batch, [&acc](const squares_entry<T>& e, std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const double v = static_cast<double>(e.x[i]);
      acc += v * v;
    }
  });
  acc = block_reduce<multi_threads>(acc, sum_op{});
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class T>
struct scale_entry {
  T* x;
  std::int64_t n;
};

template <class T>
__global__ void __launch_bounds__(multi_threads) scale_kernel(const __grid_constant__ tensor_batch<scale_entry<T>> batch, T factor) {
  for_each_chunk(batch, [factor](const scale_entry<T>& e, std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) e.x[i] *= factor;
  });
}

// Cuts `count` entries into batches and calls launch(batch, blocks) for each; `make(i, entry)`
// fills entry i and returns its element count. Empty tensors take no chunk.
template <class Entry, class Make, class Launch>
void for_each_batch(std::size_t count, Make&& make, Launch&& launch) {
  tensor_batch<Entry> batch{};
  auto flush = [&] {
    if (batch.count == 0) return;
    const std::int64_t chunks = batch.first_chunk[batch.count];
    if (chunks > 0) launch(batch, std::min(chunks, max_multi_blocks));
    batch.count = 0;
    batch.first_chunk[0] = 0;
  };
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t n = make(i, batch.entries[batch.count]);
    if (n == 0) continue;
    batch.first_chunk[batch.count + 1] = batch.first_chunk[batch.count] + (n + chunk_elements - 1) / chunk_elements;
    if (++batch.count == batch_tensors) flush();
  }
  flush();
}

// for_each_batch over plain spans: each entry is {data, size} (squares_entry, scale_entry).
template <class Entry, class T, class Launch>
void for_each_span_batch(std::span<const std::span<T>> tensors, Launch&& launch) {
  for_each_batch<Entry>(
      tensors.size(),
      [&](std::size_t i, Entry& e) {
        e = {tensors[i].data(), static_cast<std::int64_t>(tensors[i].size())};
        return e.n;
      },
      launch);
}

template <class T>
__global__ void sgd_kernel(T* param, const T* grad, T* buffer, std::int64_t n, T lr, T mu, T keep,
                           bool nesterov, T wd, bool first) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    T d = grad[i];
    if (wd != T(0)) d += wd * param[i];
    if (mu != T(0)) {
      buffer[i] = first ? d : buffer[i] * mu + d * keep;
      d = nesterov ? d + mu * buffer[i] : buffer[i];
    }
    param[i] += -lr * d;
  }
}

}  // namespace cuda_detail

// AdamW (decoupled weight decay) over every tensor of a step, in as few launches as fit
// (cuda_detail::batch_tensors tensors per launch).
template <class T>
void adamw_update(cuda, std::span<const adamw_tensor<T>> tensors, const adamw_hyper& hyper) {
  using entry = cuda_detail::adamw_entry<T>;
  cuda_detail::for_each_batch<entry>(
      tensors.size(),
      [&](std::size_t i, entry& e) {
        const auto& t = tensors[i];
        e = {t.param, t.grad, t.m, t.v, t.n, adamw_factors<T>::make(hyper, t.step, t.weight_decay)};
        return t.n;
      },
      [](const cuda_detail::tensor_batch<entry>& batch, std::int64_t blocks) {
        cuda_detail::adamw_kernel<T><<<static_cast<unsigned>(blocks), cuda_detail::multi_threads, 0,
                                      cuda_rt::current_stream()>>>(batch);
        cuda_rt::check_launch("adamw_kernel");
      });
}

// SGD with optional (Nesterov) momentum and coupled weight decay.
template <class T>
void sgd_update(cuda, T* param, const T* grad, T* buffer, std::int64_t n, double lr, double momentum,
                double dampening, bool nesterov, double weight_decay, bool first) {
  if (n == 0) return;
  cuda_detail::sgd_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, cuda_rt::current_stream()>>>(
      param, grad, buffer, n, static_cast<T>(lr), static_cast<T>(momentum), static_cast<T>(1.0 - dampening),
      nesterov, static_cast<T>(weight_decay), first);
  cuda_rt::check_launch("sgd_kernel");
}

// *out (device memory) = the sum of squares of every tensor together, accumulated in double in
// a fixed order (one partial per block of each launch, then one block sums them); no
// synchronisation.
template <class T>
void sum_of_squares(cuda, std::span<const std::span<const T>> tensors, double* out) {
  using entry = cuda_detail::squares_entry<T>;
  std::int64_t partials = 0;  // an upper bound first: every launch's blocks
  cuda_detail::for_each_span_batch<entry>(
      tensors, [&](const cuda_detail::tensor_batch<entry>&, std::int64_t blocks) { partials += blocks; });
  if (partials == 0) {
    memory<cuda>::fill(out, dtype::f64, 1, 0.0);
    return;
  }
  cuda_detail::scratch<double> partial(partials);
  std::int64_t at = 0;
  cuda_detail::for_each_span_batch<entry>(
      tensors, [&](const cuda_detail::tensor_batch<entry>& batch, std::int64_t blocks) {
        cuda_detail::sum_of_squares_kernel<T><<<static_cast<unsigned>(blocks), cuda_detail::multi_threads, 0,
                                               cuda_rt::current_stream()>>>(partial.get() + at, batch);
        cuda_rt::check_launch("sum_of_squares_kernel");
        at += blocks;
      });
  cuda_detail::sum_array_kernel<1024><<<1, 1024, 0, cuda_rt::current_stream()>>>(out, partial.get(), partials);
  cuda_rt::check_launch("sum_array_kernel");
}

// Every tensor's values times `factor`, in place, in as few launches as fit (the clip's scaling:
// one launch a batch of tensors, not one a gradient).
template <class T>
void scale_all(cuda, std::span<const std::span<T>> tensors, T factor) {
  using entry = cuda_detail::scale_entry<T>;
  cuda_detail::for_each_span_batch<entry>(
      tensors, [&](const cuda_detail::tensor_batch<entry>& batch, std::int64_t blocks) {
        cuda_detail::scale_kernel<T><<<static_cast<unsigned>(blocks), cuda_detail::multi_threads, 0,
                                      cuda_rt::current_stream()>>>(batch, factor);
        cuda_rt::check_launch("scale_kernel");
      });
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
