// Inverted dropout whose mask is a function of a key and each value's index: value i is kept
// (and scaled by 1 / (1 - p)) when its draw, detail::unit_draw_in of the key's word and i, is at
// least p. The forward and the backward make the same mask from the key without storing it,
// and the GPU kernel (kernels/cuda/dropout.cuh) makes the same mask as this one.
#pragma once

#include <algorithm>
#include <cstdint>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

// out = x * mask / (1 - p); `key` chooses the mask (one key per dropout call).
template <class T>
DECENTRAIN_VECTORIZE_SELECTS void dropout_apply(cpu, T* out, const T* x, std::int64_t n, float p, std::uint64_t key) {
  const T scale = p < 1.0f ? T(1) / (T(1) - T(p)) : T(0);
  constexpr std::int64_t word_span = std::int64_t{1} << 32;  // values drawn under one word of the key
  for (std::int64_t base = 0; base < n; base += word_span) {
    const std::uint32_t word = decentrain::detail::draw_word(key, static_cast<std::uint64_t>(base) >> 32);
    const std::int64_t len = std::min(n - base, word_span);
    T* o = out + base;
    const T* in = x + base;
    DECENTRAIN_OMP_FOR_SIMD(if (len >= detail::parallel_threshold))
    for (std::int64_t i = 0; i < len; ++i)
      o[i] = decentrain::detail::unit_draw_in(word, static_cast<std::uint32_t>(i)) >= p ? in[i] * scale : T(0);
  }
}

}  // namespace decentrain::kernels
