// Top-k sparsification: the k values of largest magnitude and where they are (zeros are never
// sent: fewer go where fewer than k are not zero). Indices go as
// gaps in LEB128 varints or as a bitmap, whichever is smaller for this payload; values as f32,
// or in 4 or 2 bits (`value_bits`): a sign and a magnitude of 1..L (L = 8 or 2) in L-ths of
// the absmax of each `block` of selected values, scale f32. No code means zero: every value
// top-k picks is among the largest, so the grid spends its codes on magnitudes (SparseLoCo sends
// 1-3% of the values at 2 bits). With `chunk`, the k largest are taken within each chunk of that
// many values (SparseLoCo's and DeMo's chunk-wise top-k): every part of the model sends its
// share, where one global cut can spend the whole budget on the few tensors whose updates run
// largest. Sent by gathering (every peer decodes every peer's payload),
// since sparse payloads do not add up on the way around a ring. Meant to run inside
// error_feedback<top_k>, which keeps what was not sent for the next round (Deep Gradient
// Compression, SparseLoCo).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"

namespace decentrain::compress {

struct top_k {
  static constexpr const char* name = "topk";
  static constexpr bool dense = false;
  double fraction = 0.01;  // of the values sent (at least one)
  std::int64_t count = 0;  // when > 0, exactly this many (at most all), per chunk where chunks are set
  int value_bits = 32;     // 32 (f32), 4 or 2
  std::size_t block = 64;  // selected values per scale, when value_bits < 32
  std::size_t chunk = 0;   // when > 0, top-k within each run of this many values (the last may be shorter)

  std::string describe() const {
    std::string s = count > 0 ? "topk(count=" + std::to_string(count) : "topk(fraction=" + std::to_string(fraction);
    if (chunk > 0) s += ",chunk=" + std::to_string(chunk);
    if (value_bits < 32) s += ",int" + std::to_string(value_bits) + ",block=" + std::to_string(block);
    return s + ")";
  }
  std::size_t k_for(std::size_t n) const {
    check_settings();
    if (chunk == 0 || n <= chunk) return k_within(n);
    return n / chunk * k_within(chunk) + k_within(n % chunk);
  }
  static constexpr std::size_t header_bytes = 8 + 8 + 1 + 8;  // n, k, index format, index bytes
  std::size_t value_bytes(std::size_t k) const {
    return value_bits == 32 ? 4 * k : 4 * ((k + block - 1) / block) + (k * static_cast<std::size_t>(value_bits) + 7) / 8;
  }
  std::size_t max_encoded_bytes(std::size_t n) const {
    const std::size_t k = k_for(n);
    return header_bytes + std::min((n + 7) / 8, 5 * k) + value_bytes(k);
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    detail::check_finite(in, name);
    const std::size_t n = in.size();
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), std::uint32_t{0});
    // Largest magnitudes first; ties to the lower index, so every run picks the same. Each
    // chunk's picks, in index order, move to the front: the k indices end up ascending.
    auto larger = [&](std::uint32_t a, std::uint32_t b) {
      const float x = std::abs(in[a]), y = std::abs(in[b]);
      return x > y || (x == y && a < b);
    };
    const std::size_t step = chunk > 0 ? chunk : std::max<std::size_t>(n, 1);
    std::size_t picked = 0;
    for (std::size_t from = 0; from < n; from += step) {
      const std::size_t size = std::min(step, n - from), kc = k_within(size);
      const auto first = order_.begin() + static_cast<std::ptrdiff_t>(from);
      if (kc < size) std::nth_element(first, first + static_cast<std::ptrdiff_t>(kc), first + static_cast<std::ptrdiff_t>(size), larger);
      // Zeros carry nothing (and the 4- and 2-bit grids have no code for them): a chunk with
      // fewer than kc values that are not zero sends only those (a filter in front, such as
      // significance, zeroes what it holds back).
      const auto nonzero = std::partition(first, first + static_cast<std::ptrdiff_t>(kc), [&](std::uint32_t i) { return in[i] != 0.0f; });
      std::sort(first, nonzero);
      if (picked != from) std::copy(first, nonzero, order_.begin() + static_cast<std::ptrdiff_t>(picked));
      picked += static_cast<std::size_t>(nonzero - first);
    }
    const std::size_t k = picked;
    // Indices as varint gaps or as a bitmap.
    varints_.clear();
    std::int64_t previous = -1;
    for (std::size_t j = 0; j < k; ++j) {
      auto gap = static_cast<std::uint64_t>(static_cast<std::int64_t>(order_[j]) - previous - 1);
      previous = order_[j];
      do {
        const auto byte = static_cast<std::uint8_t>(gap & 0x7fu);
        gap >>= 7;
        varints_.push_back(static_cast<std::byte>(gap ? (byte | 0x80u) : byte));
      } while (gap);
    }
    const std::size_t bitmap = (n + 7) / 8;
    const bool use_bitmap = bitmap < varints_.size();
    const std::size_t index_bytes = use_bitmap ? bitmap : varints_.size();
    std::byte* p = out.data();
    put(p, static_cast<std::uint64_t>(n));
    put(p, static_cast<std::uint64_t>(k));
    *p++ = static_cast<std::byte>(use_bitmap ? 1 : 0);
    put(p, static_cast<std::uint64_t>(index_bytes));
    if (use_bitmap) {
      std::memset(p, 0, bitmap);
      for (std::size_t j = 0; j < k; ++j) p[order_[j] / 8] |= static_cast<std::byte>(1u << (order_[j] % 8));
    } else if (index_bytes) {
      std::memcpy(p, varints_.data(), index_bytes);
    }
    p += index_bytes;
    if (value_bits == 32) {
      for (std::size_t j = 0; j < k; ++j, p += 4) std::memcpy(p, &in[order_[j]], 4);
      return static_cast<std::size_t>(p - out.data());
    }
    const std::size_t nb = (k + block - 1) / block;
    auto* codes = reinterpret_cast<std::uint8_t*>(p + 4 * nb);
    std::memset(codes, 0, value_bytes(k) - 4 * nb);
    const int L = levels();
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t from = b * block, to = std::min(k, from + block);
      float absmax = 0;
      for (std::size_t j = from; j < to; ++j) absmax = std::max(absmax, std::abs(in[order_[j]]));
      const float scale = absmax / static_cast<float>(L);
      std::memcpy(p + 4 * b, &scale, 4);
      // In double: L / absmax overflows f32 for a denormal absmax.
      const double inv = absmax > 0 ? static_cast<double>(L) / static_cast<double>(absmax) : 0.0;
      for (std::size_t j = from; j < to; ++j) {
        const float x = in[order_[j]];
        const auto m = std::clamp(static_cast<int>(std::nearbyint(static_cast<double>(std::abs(x)) * inv)), 1, L);
        const unsigned code = static_cast<unsigned>(m - 1) | (std::signbit(x) ? static_cast<unsigned>(L) : 0u);
        const std::size_t bit = j * static_cast<std::size_t>(value_bits);
        codes[bit / 8] = static_cast<std::uint8_t>(codes[bit / 8] | (code << (bit % 8)));
      }
    }
    return static_cast<std::size_t>(p - out.data()) + value_bytes(k);
  }

  // Checks everything before adding anything: the count, the format, every index in range and
  // increasing, every value finite.
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    check_settings();
    const std::size_t n = into.size();
    auto fail = [&](auto&&... why) { decentrain::detail::fail("topk codec: ", why...); };
    if (in.size() < header_bytes) fail("a payload of ", in.size(), " bytes is shorter than its header");
    const std::byte* p = in.data();
    const auto sent_n = get(p), k = get(p);
    const auto format = static_cast<std::uint8_t>(*p++);
    const auto index_bytes = get(p);
    if (sent_n != n) fail("the payload is for ", sent_n, " values, the receiver has ", n);
    if (k > n) fail("the payload says ", k, " values of ", n);
    if (format > 1) fail("unknown index format ", int{format});
    if (index_bytes > in.size() - header_bytes || in.size() - header_bytes - index_bytes != value_bytes(k))
      fail("a payload of ", in.size(), " bytes cannot hold ", index_bytes, " index bytes and ", k, " values of ", value_bits,
           " bits");
    std::vector<std::uint32_t> at;
    at.reserve(static_cast<std::size_t>(k));
    if (format == 1) {
      if (index_bytes != (n + 7) / 8) fail("a bitmap of ", index_bytes, " bytes for ", n, " values");
      for (std::size_t i = 0; i < n; ++i)
        if ((static_cast<std::uint8_t>(p[i / 8]) >> (i % 8)) & 1u) at.push_back(static_cast<std::uint32_t>(i));
      if (n % 8 && (static_cast<std::uint8_t>(p[n / 8]) >> (n % 8))) fail("bitmap bits set past value ", n - 1);
    } else {
      std::size_t used = 0;
      std::int64_t previous = -1;
      while (used < index_bytes) {
        std::uint64_t gap = 0;
        int shift = 0;
        for (;;) {
          if (used == index_bytes || shift > 35) fail("a malformed index varint");
          const auto byte = static_cast<std::uint8_t>(p[used++]);
          gap |= static_cast<std::uint64_t>(byte & 0x7fu) << shift;
          shift += 7;
          if (!(byte & 0x80u)) break;
        }
        const auto index = previous + 1 + static_cast<std::int64_t>(gap);
        if (index >= static_cast<std::int64_t>(n)) fail("index ", index, " is outside ", n, " values");
        at.push_back(static_cast<std::uint32_t>(index));
        previous = index;
      }
    }
    if (at.size() != k) fail("the payload says ", k, " values but lists ", at.size(), " indices");
    p += index_bytes;
    if (value_bits == 32) {
      for (std::size_t j = 0; j < k; ++j)
        if (const float v = detail::load_f32(p + 4 * j); !std::isfinite(v)) fail("value ", j, " (index ", at[j], ") is ", v);
      for (std::size_t j = 0; j < k; ++j) into[at[j]] += detail::load_f32(p + 4 * j);
      return;
    }
    // Every code is a value; the scales are checked, and the bits after the last code are 0.
    const std::size_t nb = (k + block - 1) / block;
    detail::check_scales(p, nb, name, "value block");
    const auto* codes = reinterpret_cast<const std::uint8_t*>(p + 4 * nb);
    const std::size_t used_bits = static_cast<std::size_t>(k) * static_cast<std::size_t>(value_bits);
    if (used_bits % 8 && (codes[used_bits / 8] >> (used_bits % 8))) fail("the padding bits after value ", k - 1, " are not 0");
    const int L = levels();
    const unsigned mask = (1u << value_bits) - 1;
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t bit = j * static_cast<std::size_t>(value_bits);
      const unsigned code = (codes[bit / 8] >> (bit % 8)) & mask;
      const float m = static_cast<float>((code & static_cast<unsigned>(L - 1)) + 1);
      const float s = detail::load_f32(p + 4 * (j / block));
      into[at[j]] += (code & static_cast<unsigned>(L) ? -m : m) * s;
    }
  }

 private:
  void check_settings() const {
    decentrain::detail::check(count > 0 || (fraction > 0 && fraction <= 1), "topk codec: fraction must be in (0, 1], got ",
                              fraction);
    decentrain::detail::check(value_bits == 32 || value_bits == 4 || value_bits == 2,
                              "topk codec: value_bits must be 32, 4 or 2, got ", value_bits);
    decentrain::detail::check(block >= 1 && block <= (std::size_t{1} << 24), "topk codec: block must be in [1, 2^24], got ", block);
    decentrain::detail::check(chunk <= (std::size_t{1} << 32), "topk codec: chunk must be at most 2^32 values, got ", chunk);
  }
  // How many of `size` values (one chunk, or all) are sent.
  std::size_t k_within(std::size_t size) const {
    if (size == 0) return 0;
    const auto k = count > 0 ? static_cast<std::size_t>(count) : static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(size)));
    return std::clamp<std::size_t>(k, 1, size);
  }
  int levels() const { return 1 << (value_bits - 1); }  // magnitudes 1..L, and a sign bit
  static void put(std::byte*& p, std::uint64_t v) {
    std::memcpy(p, &v, 8);
    p += 8;
  }
  static std::uint64_t get(const std::byte*& p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    p += 8;
    return v;
  }
  std::vector<std::uint32_t> order_;
  std::vector<std::byte> varints_;
};

static_assert(check_codec<top_k>());

}  // namespace decentrain::compress
