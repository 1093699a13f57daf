// Raw memory per device: allocation and the few byte-level moves the tensor type needs
// (strided copy with dtype conversion, fill, host transfers). Specialised per device tag.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "decentrain/core/device.hpp"
#include "decentrain/core/dtype.hpp"

namespace decentrain {

template <class Device>
struct memory {
  static_assert(detail::dependent_false<Device>,
                "decentrain::memory<Device>: no memory backend for this device. dt::cuda needs the "
                "CUDA backend, which is compiled only by nvcc (DECENTRAIN_HAS_CUDA == 1).");
};

namespace detail {

// Keeps freed large CPU blocks for reuse. A fresh block costs a page fault per 4 KiB on first
// touch, which a training step would pay for every activation it allocates; reusing blocks
// removes that (bench/gemm).
// Sizes are rounded up to one of 8 classes per power of two (at most 12.5% slack), blocks
// under 64 KiB go straight to the system (malloc serves them well), and at most `limit`
// bytes are held. The cache is process-wide, as malloc is: it holds no values, only memory.
class block_cache {
 public:
  static constexpr std::size_t min_cached = std::size_t{64} << 10;
  // One cache line and one AVX-512 register: vector loads never split a line.
  static constexpr std::size_t alignment = 64;

  static block_cache& instance() {
    static block_cache cache;
    return cache;
  }

  static std::size_t size_class(std::size_t bytes) {
    if (bytes < min_cached) return bytes;
    std::size_t top = std::size_t{1} << (63 - __builtin_clzll(bytes));
    const std::size_t step = top / 8;
    return (bytes + step - 1) / step * step;
  }

  void* allocate(std::size_t bytes) {
    const std::size_t size = size_class(bytes);
    void* p = nullptr;
    if (size >= min_cached) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
        held_ -= size;
      }
    }
    if (!p) p = ::operator new(size, std::align_val_t{alignment});
    count_allocated(size);
    return p;
  }

  void deallocate(void* p, std::size_t bytes) noexcept {
    const std::size_t size = size_class(bytes);
    allocated_.fetch_sub(size, std::memory_order_relaxed);
    if (size >= min_cached) {
      std::lock_guard lock(mutex_);
      if (held_ + size <= limit_) {
        free_.emplace(size, p);
        held_ += size;
        return;
      }
    }
    ::operator delete(p, std::align_val_t{alignment});
  }

  // Returns every held block to the system.
  void release() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& [size, p] : free_) ::operator delete(p, std::align_val_t{alignment});
    free_.clear();
    held_ = 0;
  }

  std::size_t held_bytes() const {
    std::lock_guard lock(mutex_);
    return held_;
  }
  // Bytes in live blocks (by size class), and the most there were since the last reset_peak().
  std::size_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }
  std::size_t peak_allocated_bytes() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(allocated_bytes(), std::memory_order_relaxed); }
  // At most this many freed bytes are kept; 0 disables caching.
  void set_limit(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      limit_ = bytes;
    }
    if (held_bytes() > bytes) release();
  }

  ~block_cache() { release(); }

 private:
  block_cache() = default;

  void count_allocated(std::size_t size) {
    const std::size_t now = allocated_.fetch_add(size, std::memory_order_relaxed) + size;
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  mutable std::mutex mutex_;
  std::atomic<std::size_t> allocated_{0}, peak_{0};
  std::multimap<std::size_t, void*> free_;
  std::size_t held_ = 0;
  std::size_t limit_ = std::size_t{1} << 30;
};

}  // namespace detail

template <>
struct memory<cpu> {
  static constexpr std::size_t alignment = detail::block_cache::alignment;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return detail::block_cache::instance().allocate(bytes);
  }
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (p) detail::block_cache::instance().deallocate(p, bytes);
  }

  // Freed blocks kept for reuse, and the way to hand them back or bound them.
  static std::size_t cached_bytes() { return detail::block_cache::instance().held_bytes(); }
  // Bytes in live tensors (rounded to size classes), and their high-water mark since
  // reset_peak(): what PyTorch calls memory_allocated and max_memory_allocated.
  static std::size_t allocated_bytes() { return detail::block_cache::instance().allocated_bytes(); }
  static std::size_t peak_allocated_bytes() { return detail::block_cache::instance().peak_allocated_bytes(); }
  static void reset_peak() { detail::block_cache::instance().reset_peak(); }
  static void release_cached() { detail::block_cache::instance().release(); }
  static void set_cache_limit(std::size_t bytes) { detail::block_cache::instance().set_limit(bytes); }

  // Copies a strided view into another view of the same sizes, converting dtypes on the way.
  // Strides are in elements of each side's own dtype.
  static void copy_strided(void* dst, dtype dst_type, const std::int64_t* dst_strides,
                           const void* src, dtype src_type, const std::int64_t* src_strides,
                           const std::int64_t* sizes, std::size_t rank) {
    visit_dtype(dst_type, [&](auto dst_tag) {
      using To = decltype(dst_tag);
      visit_dtype(src_type, [&](auto src_tag) {
        using From = decltype(src_tag);
        copy_typed(static_cast<To*>(dst), dst_strides, static_cast<const From*>(src), src_strides,
                   sizes, rank);
      });
    });
  }

  static void fill(void* dst, dtype type, std::size_t count, double value) {
    visit_dtype(type, [&](auto tag) {
      using T = decltype(tag);
      T v = convert_element<T>(value);
      std::fill_n(static_cast<T*>(dst), count, v);
    });
  }

  static void copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  static void copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }

 private:
  template <class To, class From>
  static void copy_typed(To* dst, const std::int64_t* dst_strides, const From* src,
                         const std::int64_t* src_strides, const std::int64_t* sizes,
                         std::size_t rank) {
    std::int64_t count = 1;
    for (std::size_t d = 0; d < rank; ++d) count *= sizes[d];
    if (count == 0) return;
    if (rank == 0) {
      dst[0] = convert_element<To>(src[0]);
      return;
    }
    // Walk the outer dims with an odometer; the innermost dim is a tight loop.
    const std::int64_t inner = sizes[rank - 1];
    const std::int64_t si = src_strides[rank - 1], di = dst_strides[rank - 1];
    std::vector<std::int64_t> index(rank, 0);
    std::int64_t src_offset = 0, dst_offset = 0;
    for (std::int64_t done = 0; done < count; done += inner) {
      const From* s = src + src_offset;
      To* o = dst + dst_offset;
      if (si == 1 && di == 1) {
        for (std::int64_t i = 0; i < inner; ++i) o[i] = convert_element<To>(s[i]);
      } else {
        for (std::int64_t i = 0; i < inner; ++i) o[i * di] = convert_element<To>(s[i * si]);
      }
      for (std::size_t d = rank - 1; d-- > 0;) {
        src_offset += src_strides[d];
        dst_offset += dst_strides[d];
        if (++index[d] < sizes[d]) break;
        src_offset -= src_strides[d] * sizes[d];
        dst_offset -= dst_strides[d] * sizes[d];
        index[d] = 0;
      }
    }
  }
};

}  // namespace decentrain

// dt::cuda memory, when nvcc compiles this (the whole header is empty otherwise).
#include "decentrain/core/memory_cuda.cuh"
