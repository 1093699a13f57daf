// Device memory for dt::cuda: a caching allocator over plain cudaMalloc (never managed
// memory), the byte-level moves the tensor type needs (strided copy with dtype conversion,
// fill, host transfers) and pinned host buffers for communication. Compiled only by nvcc.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "decentrain/core/caching_allocator.hpp"
#include "decentrain/core/cuda_runtime.cuh"
#include "decentrain/core/device.hpp"
#include "decentrain/core/dtype.hpp"

namespace decentrain {

template <class Device>
struct memory;

namespace detail {

// Segments straight from the driver. cudaMalloc and cudaFree synchronise the whole device and
// cost tens of microseconds, so a training step that allocated its activations afresh would be
// dominated by them: the caching allocator keeps what it takes.
struct cuda_segment_source {
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaSuccess) return p;
    (void)cudaGetLastError();  // clears the error so later calls do not report it
    if (status == cudaErrorMemoryAllocation) return nullptr;
    decentrain::detail::fail("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(status));
  }
  void free(void* p) noexcept { (void)cudaFree(p); }
  void synchronize() noexcept { (void)cudaDeviceSynchronize(); }
  std::string describe() const {
    int device = 0;
    std::size_t free_bytes = 0, total_bytes = 0;
    (void)cudaGetDevice(&device);
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    return "CUDA device " + std::to_string(device) + " has " + std::to_string(free_bytes >> 20) + " MiB free of " +
           std::to_string(total_bytes >> 20) + " MiB";
  }
};

// Blocks are reused only within the (device, stream) they were allocated on, without any
// event: work queued later on that stream runs after the block's last use. A block allocated
// on one stream and used on another must be synchronised by the caller (as in PyTorch).
// cudaStreamPerThread is one handle naming a different stream in every host thread, so for it
// the thread is part of the pool.
struct cuda_pool {
  int device;
  cudaStream_t stream;
  std::thread::id thread;
  auto operator<=>(const cuda_pool&) const = default;

  static cuda_pool current() {
    const cudaStream_t s = cuda_rt::current_stream();
    return {cuda_rt::current_device(), s, s == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id{}};
  }
};

using device_allocator = caching_allocator<cuda_segment_source, cuda_pool>;

// Never destroyed: the CUDA context may already be gone when statics are destroyed.
inline device_allocator& device_allocator_instance() {
  static auto* allocator = new device_allocator();
  return *allocator;
}

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
    return detail::device_allocator_instance().allocate(bytes, detail::cuda_pool::current());
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) (void)detail::device_allocator_instance().deallocate(p);
  }

  // What PyTorch calls memory_allocated / max_memory_allocated (bytes in live tensors, rounded
  // to 512) and memory_reserved / max_memory_reserved (bytes taken from the driver); the peaks
  // are the high-water marks since reset_peak(). cached_bytes() is reserved minus allocated.
  static std::size_t allocated_bytes() { return detail::device_allocator_instance().allocated_bytes(); }
  static std::size_t peak_allocated_bytes() { return detail::device_allocator_instance().peak_allocated_bytes(); }
  static std::size_t reserved_bytes() { return detail::device_allocator_instance().reserved_bytes(); }
  static std::size_t peak_reserved_bytes() { return detail::device_allocator_instance().peak_reserved_bytes(); }
  static std::size_t cached_bytes() { return detail::device_allocator_instance().cached_bytes(); }
  static void reset_peak() { detail::device_allocator_instance().reset_peak(); }
  // Gives every wholly free segment back to the driver.
  static void release_cached() { detail::device_allocator_instance().release(); }

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
