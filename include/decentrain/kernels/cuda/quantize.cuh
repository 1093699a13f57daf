// The codecs' GPU paths: blockwise int8/int4 quantisation and dequantisation, and top-k of
// magnitudes (CUB's radix sort), reading and writing the CPU codecs' formats byte for byte
// (compress/blockwise.hpp, compress/top_k.hpp), so a peer that encodes on its GPU talks to one
// that decodes on its CPU and both end with the same bits. Only the compressed bytes need to
// cross PCIe: a 124M-value pseudo-gradient leaves the GPU as 132 MB of int8 instead of 496 MB.
// Compiled only by nvcc, without --use_fast_math (denormal blocks and IEEE rounding must match
// the CPU's).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#if defined(__USE_FAST_MATH__)
#error "kernels/cuda/quantize.cuh: --use_fast_math flushes denormals and changes rounding; the payloads would differ from the CPU codecs'"
#endif
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "decentrain/detail/hash.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

// The settings of one blockwise encode call (compress::blockwise's, and its call number, which
// stochastic rounding draws from).
struct blockwise_settings {
  std::int64_t block = 64;
  bool stochastic = false;
  std::uint64_t seed = 0, call = 0;
};

namespace cuda_detail {

constexpr int codec_threads = 256;  // 8 warps, one quantisation block each at a time

template <int Bits>
__device__ inline int quantize_one(float x, float inv_f, double inv, bool tiny, const blockwise_settings& s, std::int64_t i) {
  constexpr float levels = Bits == 8 ? 127.0f : 7.0f;
  float v;
  if (tiny) v = static_cast<float>(static_cast<double>(x) * inv);  // a denormal block: scale in double
  else v = __fmul_rn(x, inv_f);                                     // no FMA: the CPU rounds the product
  if (s.stochastic && !tiny) v = __fadd_rn(v, decentrain::detail::unit_draw(s.seed, s.call, static_cast<std::uint64_t>(i)) - 0.5f);
  v = fminf(fmaxf(v, -levels), levels);
  return __float2int_rn(v);  // nearest, ties to even, as the CPU's magic-number rounding
}

// One warp per block of `s.block` values: absmax through the bits, the scale, the codes.
template <int Bits>
__global__ void blockwise_encode_kernel(const float* x, std::int64_t n, blockwise_settings s, float* scales,
                                        std::uint8_t* codes, int* nonfinite) {
  constexpr int levels = Bits == 8 ? 127 : 7;
  const std::int64_t warps = thread_count() / 32, nb = (n + s.block - 1) / s.block;
  const int lane = threadIdx.x % 32;
  for (std::int64_t b = thread_index() / 32; b < nb; b += warps) {
    const std::int64_t from = b * s.block, len = min64(n, from + s.block) - from;
    unsigned top = 0;
    bool bad = false;
    for (std::int64_t i = lane; i < len; i += 32) {
      const unsigned u = __float_as_uint(x[from + i]) & 0x7fffffffu;
      top = u > top ? u : top;
      bad |= u >= 0x7f800000u;
    }
    for (int d = 16; d > 0; d /= 2) {  // every lane runs the loop alike (b is the warp's), so all take part
      const unsigned other = __shfl_xor_sync(0xffffffffu, top, d);
      top = other > top ? other : top;
    }
    if (__any_sync(0xffffffffu, bad)) {
      if (lane == 0) atomicOr(nonfinite, 1);
      continue;
    }
    const float absmax = __uint_as_float(top);
    if (lane == 0) scales[b] = __fdiv_rn(absmax, static_cast<float>(levels));
    const double inv = absmax > 0 ? static_cast<double>(levels) / static_cast<double>(absmax) : 0.0;
    const bool tiny = inv > 1e30;
    const float inv_f = static_cast<float>(tiny ? 0.0 : inv);
    if constexpr (Bits == 8) {
      for (std::int64_t i = lane; i < len; i += 32)
        codes[from + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(quantize_one<8>(x[from + i], inv_f, inv, tiny, s, from + i)));
    } else {  // two codes a byte, low nibble first; the block is even, so a byte holds one block's codes
      for (std::int64_t p = lane; 2 * p < len; p += 32) {
        const std::int64_t i = from + 2 * p;
        const int lo = quantize_one<4>(x[i], inv_f, inv, tiny, s, i);
        const int hi = 2 * p + 1 < len ? quantize_one<4>(x[i + 1], inv_f, inv, tiny, s, i + 1) : 0;
        codes[i / 2] = static_cast<std::uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
      }
    }
  }
}

// Flags a scale that is not finite and >= 0, or a code the encoder never writes (-128 / -8).
template <int Bits>
__global__ void blockwise_check_kernel(const float* scales, std::int64_t nb, const std::uint8_t* codes, std::int64_t bytes,
                                       int* bad) {
  for (std::int64_t b = thread_index(); b < nb; b += thread_count())
    if (!(scales[b] >= 0.0f && scales[b] <= 3.402823466e38f)) atomicOr(bad, 1);
  for (std::int64_t i = thread_index(); i < bytes; i += thread_count()) {
    const unsigned c = codes[i];
    if (Bits == 8 ? c == 0x80u : ((c & 0xfu) == 0x8u || (c >> 4) == 0x8u)) atomicOr(bad, 2);
  }
}

template <int Bits>
__global__ void blockwise_decode_add_kernel(const float* scales, const std::uint8_t* codes, std::int64_t n, std::int64_t block,
                                            float* y) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    int code;
    if constexpr (Bits == 8) code = static_cast<std::int8_t>(codes[i]);
    else code = static_cast<std::int8_t>(static_cast<std::uint8_t>(((codes[i / 2] >> (4 * (i % 2))) & 0xfu) << 4)) >> 4;
    y[i] = __fadd_rn(y[i], __fmul_rn(static_cast<float>(code), scales[i / block]));  // no FMA: the CPU rounds the product
  }
}

// (Templates, as every kernel in a header: a plain __global__ function would be defined once per
// translation unit.)
template <class T>
__global__ void magnitude_kernel(const T* x, std::int64_t n, T* out, std::int32_t* order, int* nonfinite) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float a = fabsf(x[i]);
    if (!(a <= 3.402823466e38f)) atomicOr(nonfinite, 1);
    out[i] = a;
    order[i] = static_cast<std::int32_t>(i);
  }
}

template <class T>
__global__ void gather_kernel(const T* x, const std::int32_t* at, std::int64_t k, T* out) {
  for (std::int64_t j = thread_index(); j < k; j += thread_count()) out[j] = x[at[j]];
}

// One int on the device that kernels OR their findings into, zero at first.
struct device_flag {
  scratch<int> flag{1};
  device_flag() {
    cuda_rt::check(cudaMemsetAsync(flag.get(), 0, sizeof(int), cuda_rt::current_stream()), "cudaMemsetAsync (codec flag)");
  }
  int* get() const { return flag.get(); }
  int read() const {
    int v = 0;
    cuda_rt::check(cudaMemcpyAsync(&v, flag.get(), sizeof v, cudaMemcpyDeviceToHost, cuda_rt::current_stream()),
                   "cudaMemcpyAsync (codec flag)");
    cuda_rt::synchronize();
    return v;
  }
};
inline unsigned warp_blocks(std::int64_t warps) {
  const std::int64_t blocks = (warps * 32 + codec_threads - 1) / codec_threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

}  // namespace cuda_detail

// The payload of compress::blockwise<Bits> for x[0..n) (device memory) into `payload` (device
// memory, max_encoded_bytes(n) of it: the scales, then the codes). Throws on a value that is not
// finite, as the CPU codec does.
template <int Bits>
void blockwise_encode(cuda, const float* x, std::int64_t n, const blockwise_settings& s, std::byte* payload) {
  static_assert(Bits == 8 || Bits == 4, "blockwise_encode: 8 or 4 bits");
  decentrain::detail::check(n >= 0 && s.block >= 1 && s.block <= (std::int64_t{1} << 24) && (Bits == 8 || s.block % 2 == 0),
                            "blockwise_encode: ", n, " values with block ", s.block, " (block in [1, 2^24], even for int4)");
  if (n == 0) return;
  const std::int64_t nb = (n + s.block - 1) / s.block;
  cuda_detail::device_flag flag;
  cuda_detail::blockwise_encode_kernel<Bits><<<cuda_detail::warp_blocks(nb), cuda_detail::codec_threads, 0,
                                               cuda_rt::current_stream()>>>(
      x, n, s, reinterpret_cast<float*>(payload), reinterpret_cast<std::uint8_t*>(payload + 4 * nb), flag.get());
  cuda_rt::check_launch("blockwise_encode_kernel");
  decentrain::detail::check(flag.read() == 0, Bits == 8 ? "int8" : "int4",
                            " codec: a value on the GPU is not finite");
}

// Adds the values of a blockwise<Bits> payload (device memory, exactly its size) into y[0..n);
// a scale or code the encoder could not have written is an error, and then nothing is added.
template <int Bits>
void blockwise_decode_add(cuda, const std::byte* payload, std::size_t payload_bytes, std::int64_t n, std::int64_t block, float* y) {
  const char* name = Bits == 8 ? "int8" : "int4";
  decentrain::detail::check(n >= 0 && block >= 1 && block <= (std::int64_t{1} << 24) && (Bits == 8 || block % 2 == 0), name,
                            " codec: decode of ", n, " values with block ", block, " (block in [1, 2^24], even for int4)");
  const std::int64_t nb = (n + block - 1) / block, bytes = Bits == 8 ? n : (n + 1) / 2;
  decentrain::detail::check(payload_bytes == static_cast<std::size_t>(4 * nb + bytes), name, " codec: a payload of ", payload_bytes,
                            " bytes for ", n, " values (expected ", 4 * nb + bytes, ")");
  if (n == 0) return;
  const auto* scales = reinterpret_cast<const float*>(payload);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(payload + 4 * nb);
  const auto stream = cuda_rt::current_stream();
  cuda_detail::device_flag flag;
  cuda_detail::blockwise_check_kernel<Bits><<<cuda_rt::blocks_for(bytes), cuda_rt::threads_per_block, 0, stream>>>(
      scales, nb, codes, bytes, flag.get());
  cuda_rt::check_launch("blockwise_check_kernel");
  const int bad = flag.read();
  decentrain::detail::check(!(bad & 1), name, " codec: a block's scale is not finite and >= 0");
  decentrain::detail::check(!(bad & 2), name, " codec: a code below -", Bits == 8 ? 127 : 7);
  if constexpr (Bits == 4) {
    if (n % 2) {
      std::uint8_t last = 0;
      cuda_rt::check(cudaMemcpyAsync(&last, codes + n / 2, 1, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (int4 padding)");
      cuda_rt::synchronize();
      decentrain::detail::check((last >> 4) == 0, name, " codec: the padding nibble after value ", n - 1, " is not 0");
    }
  }
  cuda_detail::blockwise_decode_add_kernel<Bits><<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, stream>>>(
      scales, codes, n, block, y);
  cuda_rt::check_launch("blockwise_decode_add_kernel");
}

// The k values of largest magnitude of x[0..n) (device memory): indices[0..k) ascending and
// values[0..k) at them, as compress::top_k picks them (ties to the lower index: the radix sort is
// stable). Throws on a value that is not finite.
inline void top_k_magnitude(cuda, const float* x, std::int64_t n, std::int64_t k, std::int32_t* indices, float* values) {
  decentrain::detail::check(k >= 0 && k <= n && n < (std::int64_t{1} << 31), "top_k_magnitude: k = ", k, " of n = ", n);
  if (k == 0) return;
  const auto stream = cuda_rt::current_stream();
  cuda_detail::scratch<float> mag(n), sorted(n);
  cuda_detail::scratch<std::int32_t> order_in(n), order_out(n);
  cuda_detail::device_flag flag;
  cuda_detail::magnitude_kernel<float><<<cuda_rt::blocks_for(n), cuda_rt::threads_per_block, 0, stream>>>(x, n, mag.get(),
                                                                                                   order_in.get(), flag.get());
  cuda_rt::check_launch("magnitude_kernel");
  std::size_t temp_bytes = 0, sort_bytes = 0;
  cuda_rt::check(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, mag.get(), sorted.get(), order_in.get(),
                                                            order_out.get(), n, 0, 32, stream),
                 "cub::DeviceRadixSort::SortPairsDescending (size query)");
  cuda_rt::check(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, order_out.get(), indices, k, 0, 32, stream),
                 "cub::DeviceRadixSort::SortKeys (size query)");
  cuda_detail::scratch<unsigned char> temp(static_cast<std::int64_t>(std::max(temp_bytes, sort_bytes)));
  cuda_rt::check(cub::DeviceRadixSort::SortPairsDescending(temp.get(), temp_bytes, mag.get(), sorted.get(), order_in.get(),
                                                            order_out.get(), n, 0, 32, stream),
                 "cub::DeviceRadixSort::SortPairsDescending");
  // The k chosen indices in ascending order (the payload sends them as gaps).
  cuda_rt::check(cub::DeviceRadixSort::SortKeys(temp.get(), sort_bytes, order_out.get(), indices, k, 0, 32, stream),
                 "cub::DeviceRadixSort::SortKeys");
  cuda_detail::gather_kernel<float><<<cuda_rt::blocks_for(k), cuda_rt::threads_per_block, 0, stream>>>(x, indices, k, values);
  cuda_rt::check_launch("gather_kernel");
  decentrain::detail::check(flag.read() == 0, "topk codec: a value on the GPU is not finite");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
