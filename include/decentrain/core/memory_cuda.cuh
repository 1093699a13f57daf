// Device memory for dt::cuda: a caching allocator over plain cudaMalloc (never managed
// memory), the byte-level moves the tensor type needs (strided copy with dtype conversion,
// fill, host transfers) and pinned host buffers for communication. Compiled only by nvcc.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "decentrain/core/cuda_runtime.cuh"
#include "decentrain/core/device.hpp"
#include "decentrain/core/dtype.hpp"

namespace decentrain {

template <class Device>
struct memory;

namespace detail {

// cudaMalloc and cudaFree synchronise the whole device and cost tens of microseconds, so a
// training step that allocates its activations afresh would be dominated by them. Freed blocks
// are kept per (device, stream, size class) and handed out again. Reuse is safe on the same
// stream without any event: work queued later on that stream runs after the last use of the
// block. cudaStreamPerThread is one handle naming a different stream in every host thread, so
// for it the thread is part of the key. A block allocated on one stream and used on another must be synchronised by the
// caller (as in PyTorch). On out-of-memory the cache is emptied and the allocation retried.
class device_block_cache {
 public:
  static device_block_cache& instance() {
    static device_block_cache cache;
    return cache;
  }

  // 512-byte granules below 1 MiB, 8 classes per power of two above (<= 12.5% slack).
  static std::size_t size_class(std::size_t bytes) {
    constexpr std::size_t granule = 512, small = std::size_t{1} << 20;
    if (bytes < small) return (bytes + granule - 1) / granule * granule;
    const std::size_t top = std::size_t{1} << (63 - __builtin_clzll(bytes));
    const std::size_t step = top / 8;
    return (bytes + step - 1) / step * step;
  }

  void* allocate(std::size_t bytes) {
    const std::size_t size = size_class(bytes);
    const int device = cuda_rt::current_device();
    const stream_id stream = current_stream_id();
    std::lock_guard lock(mutex_);
    const auto key = std::make_tuple(device, stream, size);
    if (auto it = free_.find(key); it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      held_ -= size;
      live_.emplace(p, block{device, stream, size});
      count_allocated(size);
      return p;
    }
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_locked();
      status = cudaMalloc(&p, size);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      decentrain::detail::fail("CUDA out of memory: could not allocate ", size, " bytes on device ",
                               device, " (", free_bytes >> 20, " MiB free of ", total_bytes >> 20,
                               " MiB; decentrain holds ", in_use_ >> 20, " MiB in tensors): ",
                               cudaGetErrorString(status));
    }
    live_.emplace(p, block{device, stream, size});
    in_use_ += size;
    count_allocated(size);
    return p;
  }

  void deallocate(void* p) noexcept {
    std::lock_guard lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours (or already freed): never hand it out twice
    const block b = it->second;
    live_.erase(it);
    allocated_ -= b.size;
    free_.emplace(std::make_tuple(b.device, b.stream, b.size), p);
    held_ += b.size;
  }

  // Gives every cached block back to the driver (after the device finished with them).
  void release() noexcept {
    std::lock_guard lock(mutex_);
    release_locked();
  }

  std::size_t held_bytes() const {
    std::lock_guard lock(mutex_);
    return held_;
  }
  // Bytes in blocks handed out or cached: what this process holds through decentrain.
  std::size_t reserved_bytes() const {
    std::lock_guard lock(mutex_);
    return in_use_;
  }
  // Bytes in blocks handed out (live tensors), and the most there were since reset_peak().
  std::size_t allocated_bytes() const {
    std::lock_guard lock(mutex_);
    return allocated_;
  }
  std::size_t peak_allocated_bytes() const {
    std::lock_guard lock(mutex_);
    return peak_;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = allocated_;
  }

 private:
  struct stream_id {
    cudaStream_t stream;
    std::thread::id thread;  // only for cudaStreamPerThread
    friend bool operator<(const stream_id& a, const stream_id& b) {
      return std::tie(a.stream, a.thread) < std::tie(b.stream, b.thread);
    }
  };
  static stream_id current_stream_id() {
    const cudaStream_t s = cuda_rt::current_stream();
    return {s, s == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id{}};
  }
  struct block {
    int device;
    stream_id stream;
    std::size_t size;
  };
  device_block_cache() = default;
  void count_allocated(std::size_t size) {  // under mutex_
    allocated_ += size;
    peak_ = std::max(peak_, allocated_);
  }
  // Not released at exit: the CUDA context may already be gone when statics are destroyed.
  ~device_block_cache() = default;

  void release_locked() noexcept {
    if (free_.empty()) return;
    (void)cudaDeviceSynchronize();
    for (auto& [key, p] : free_) {
      (void)cudaFree(p);
      in_use_ -= std::get<2>(key);
    }
    free_.clear();
    held_ = 0;
  }

  mutable std::mutex mutex_;
  std::multimap<std::tuple<int, stream_id, std::size_t>, void*> free_;
  std::unordered_map<void*, block> live_;
  std::size_t held_ = 0, in_use_ = 0, allocated_ = 0, peak_ = 0;
};

namespace cuda_copy {

inline constexpr int max_rank = 8;

// Sizes and both sides' strides, passed to the kernel by value.
struct strided_layout {
  int rank;
  std::int64_t sizes[max_rank];
  std::int64_t dst[max_rank];
  std::int64_t src[max_rank];
};

template <class To, class From>
__global__ void copy_strided_kernel(To* dst, const From* src, std::int64_t n, strided_layout l) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rem = i, od = 0, os = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
      const std::int64_t c = rem % l.sizes[d];
      rem /= l.sizes[d];
      od += c * l.dst[d];
      os += c * l.src[d];
    }
    dst[od] = convert_element<To>(src[os]);
  }
}

// Four elements a thread, as one load and one store of four when both sides are aligned for it
// (dtype conversions of whole tensors: the bf16 <-> f32 casts of mixed precision).
template <class T>
struct alignas(4 * sizeof(T)) quad {
  T v[4];
};

template <class To, class From>
__global__ void convert_dense_kernel(To* dst, const From* src, std::int64_t n) {
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x, quads = n / 4;
  for (std::int64_t i = first; i < quads; i += step) {
    const quad<From> in = reinterpret_cast<const quad<From>*>(src)[i];
    quad<To> out;
#pragma unroll
    for (int j = 0; j < 4; ++j) out.v[j] = convert_element<To>(in.v[j]);
    reinterpret_cast<quad<To>*>(dst)[i] = out;
  }
  if (first < n - 4 * quads) dst[4 * quads + first] = convert_element<To>(src[4 * quads + first]);
}

// Rows of contiguous elements (a slice of the last dimension, a cast of one): no index
// arithmetic beyond a row offset.
template <class To, class From>
__global__ void copy_rows_kernel(To* dst, const From* src, std::int64_t rows, std::int64_t cols, std::int64_t dst_row,
                                 std::int64_t src_row) {
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < cols;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
      dst[r * dst_row + c] = convert_element<To>(src[r * src_row + c]);
}

template <class T>
__global__ void fill_kernel(T* dst, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = value;
}

}  // namespace cuda_copy
}  // namespace detail

template <>
struct memory<cuda> {
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return detail::device_block_cache::instance().allocate(bytes);
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) detail::device_block_cache::instance().deallocate(p);
  }

  static std::size_t cached_bytes() { return detail::device_block_cache::instance().held_bytes(); }
  static std::size_t reserved_bytes() { return detail::device_block_cache::instance().reserved_bytes(); }
  // Bytes in live tensors (by size class) and their high-water mark since reset_peak(): what
  // PyTorch calls memory_allocated and max_memory_allocated (reserved_bytes() adds the cache).
  static std::size_t allocated_bytes() { return detail::device_block_cache::instance().allocated_bytes(); }
  static std::size_t peak_allocated_bytes() { return detail::device_block_cache::instance().peak_allocated_bytes(); }
  static void reset_peak() { detail::device_block_cache::instance().reset_peak(); }
  static void release_cached() { detail::device_block_cache::instance().release(); }

  // Copies a strided view into another view of the same sizes, converting dtypes on the way.
  // Strides are in elements of each side's own dtype.
  static void copy_strided(void* dst, dtype dst_type, const std::int64_t* dst_strides,
                           const void* src, dtype src_type, const std::int64_t* src_strides,
                           const std::int64_t* sizes, std::size_t rank) {
    std::int64_t n = 1;
    for (std::size_t d = 0; d < rank; ++d) n *= sizes[d];
    if (n == 0) return;
    if (dst_type == src_type && is_dense(dst_strides, sizes, rank) && is_dense(src_strides, sizes, rank)) {
      cuda_rt::check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(dst_type),
                                     cudaMemcpyDeviceToDevice, cuda_rt::current_stream()),
                     "cudaMemcpyAsync (device to device)");
      return;
    }
    detail::check(rank <= static_cast<std::size_t>(detail::cuda_copy::max_rank),
                  "cuda copy: tensors of rank ", rank, " are not supported (at most ",
                  detail::cuda_copy::max_rank, ")");
    // Dimensions of size 1 go, and neighbours that are contiguous on both sides merge, so most
    // copies become one dense run or rows of one (the general kernel divides per element).
    detail::cuda_copy::strided_layout layout{};
    for (std::size_t d = 0; d < rank; ++d) {
      if (sizes[d] == 1) continue;
      const int last = layout.rank - 1;
      if (last >= 0 && layout.dst[last] == dst_strides[d] * sizes[d] && layout.src[last] == src_strides[d] * sizes[d]) {
        layout.sizes[last] *= sizes[d];
        layout.dst[last] = dst_strides[d];
        layout.src[last] = src_strides[d];
        continue;
      }
      layout.sizes[layout.rank] = sizes[d];
      layout.dst[layout.rank] = dst_strides[d];
      layout.src[layout.rank] = src_strides[d];
      ++layout.rank;
    }
    if (layout.rank == 0) {  // a single element
      layout.rank = 1;
      layout.sizes[0] = 1;
      layout.dst[0] = layout.src[0] = 1;
    }
    const int r = layout.rank;
    const bool inner_contiguous = layout.dst[r - 1] == 1 && layout.src[r - 1] == 1;
    const auto stream = cuda_rt::current_stream();
    visit_dtype(dst_type, [&](auto dst_tag) {
      using To = decltype(dst_tag);
      visit_dtype(src_type, [&](auto src_tag) {
        using From = decltype(src_tag);
        auto* out = static_cast<To*>(dst);
        const auto* in = static_cast<const From*>(src);
        namespace cc = detail::cuda_copy;
        if (r == 1 && inner_contiguous && reinterpret_cast<std::uintptr_t>(out) % alignof(cc::quad<To>) == 0 &&
            reinterpret_cast<std::uintptr_t>(in) % alignof(cc::quad<From>) == 0) {
          cc::convert_dense_kernel<<<cuda_rt::blocks_for(std::max<std::int64_t>(n / 4, 1)), cuda_rt::threads_per_block,
                                     0, stream>>>(out, in, n);
          cuda_rt::check_launch("convert_dense_kernel");
        } else if (r <= 2 && inner_contiguous) {
          const std::int64_t rows = r == 2 ? layout.sizes[0] : 1, cols = layout.sizes[r - 1];
          const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((cols + 255) / 256, 64)),
                          static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
          cc::copy_rows_kernel<<<grid, 256, 0, stream>>>(out, in, rows, cols, r == 2 ? layout.dst[0] : 0,
                                                         r == 2 ? layout.src[0] : 0);
          cuda_rt::check_launch("copy_rows_kernel");
        } else {
          cc::copy_strided_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, stream>>>(out, in, n, layout);
          cuda_rt::check_launch("copy_strided_kernel");
        }
      });
    });
  }

  static void fill(void* dst, dtype type, std::size_t count, double value) {
    if (count == 0) return;
    visit_dtype(type, [&](auto tag) {
      using T = decltype(tag);
      const auto n = static_cast<std::int64_t>(count);
      detail::cuda_copy::fill_kernel<<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0,
                                       cuda_rt::current_stream()>>>(static_cast<T*>(dst), n,
                                                                    convert_element<T>(value));
      cuda_rt::check_launch("fill_kernel");
    });
  }

  // Host transfers wait for the copy: the host buffer may be pageable and the caller may
  // reuse it as soon as this returns.
  static void copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    cuda_rt::check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cuda_rt::current_stream()),
                   "cudaMemcpyAsync (device to host)");
    cuda_rt::synchronize();
  }
  static void copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
    if (!bytes) return;
    cuda_rt::check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cuda_rt::current_stream()),
                   "cudaMemcpyAsync (host to device)");
    cuda_rt::synchronize();
  }

 private:
  static bool is_dense(const std::int64_t* strides, const std::int64_t* sizes, std::size_t rank) {
    std::int64_t expected = 1;
    for (std::size_t d = rank; d-- > 0;) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
};

// Page-locked host memory: device copies from and to it run at full PCIe/NVLink speed and
// can be asynchronous, which is what communication buffers need. Move-only.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) cuda_rt::check(cudaMallocHost(&data_, bytes), "cudaMallocHost");
  }
  pinned_buffer(pinned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { reset(); }

  void* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  void reset() noexcept {
    if (data_) (void)cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace decentrain

#endif  // DECENTRAIN_HAS_CUDA
