// Raw memory per device: allocation and the few byte-level moves the tensor type needs
// (strided copy with dtype conversion, fill, host transfers). Specialised per device tag.
#pragma once

#include <algorithm>
#include <cstddef>
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
                "decentrain::memory<Device>: no memory backend for this device. For dt::cuda, "
                "compile with nvcc (DECENTRAIN_HAS_CUDA) and include the CUDA backend headers.");
};

template <>
struct memory<cpu> {
  // 64 bytes: one cache line and one AVX-512 register, so vector loads never split lines.
  static constexpr std::size_t alignment = 64;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  static void deallocate(void* p) noexcept {
    if (p) ::operator delete(p, std::align_val_t{alignment});
  }

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
