// signSGD-style: one bit per value (its sign) and, per block, the mean magnitude as the scale:
// 32x fewer bytes than f32 at large blocks. Very lossy on its own; meant to run inside
// error_feedback<sign>, which carries what it drops into the next round.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"

namespace decentrain::compress {

struct sign {
  static constexpr const char* name = "sign";
  static constexpr bool dense = true;
  std::size_t block = 256;  // a multiple of 8, so a block's bits are whole bytes

  std::string describe() const { return "sign(block=" + std::to_string(block) + ")"; }
  std::size_t blocks(std::size_t n) const { return (n + block - 1) / block; }
  std::size_t max_encoded_bytes(std::size_t n) const {
    check_settings();
    return 4 * blocks(n) + (n + 7) / 8;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    check_settings();
    detail::check_finite(in, name);
    const std::size_t n = in.size(), nb = blocks(n);
    auto* bits = reinterpret_cast<std::uint8_t*>(out.data() + 4 * nb);
    std::memset(bits, 0, (n + 7) / 8);
    const auto nblocks = static_cast<std::int64_t>(nb);
    DECENTRAIN_OMP(parallel for if (n >= (1 << 16)))
    for (std::int64_t b = 0; b < nblocks; ++b) {
      const std::size_t from = static_cast<std::size_t>(b) * block, to = std::min(n, from + block);
      double total = 0;
      for (std::size_t i = from; i < to; ++i) {
        total += std::abs(in[i]);
        if (!std::signbit(in[i])) bits[i / 8] = static_cast<std::uint8_t>(bits[i / 8] | (1u << (i % 8)));
      }
      const float scale = static_cast<float>(total / static_cast<double>(to - from));
      std::memcpy(out.data() + 4 * static_cast<std::size_t>(b), &scale, 4);
    }
    return 4 * nb + (n + 7) / 8;
  }

  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    check_settings();
    const std::size_t n = into.size(), nb = blocks(n);
    decentrain::detail::check(in.size() == 4 * nb + (n + 7) / 8, "sign codec: a payload of ", in.size(), " bytes for ", n,
                              " values (expected ", 4 * nb + (n + 7) / 8, ")");
    detail::check_scales(in.data(), nb, name);
    const auto* bits = reinterpret_cast<const std::uint8_t*>(in.data() + 4 * nb);
    for (std::size_t i = 0; i < n; ++i) {
      const float s = detail::load_f32(in.data() + 4 * (i / block));
      into[i] += (bits[i / 8] >> (i % 8)) & 1u ? s : -s;
    }
    if (n % 8) decentrain::detail::check((bits[n / 8] >> (n % 8)) == 0, "sign codec: padding bits after value ", n - 1, " are not 0");
  }

 private:
  void check_settings() const {
    decentrain::detail::check(block >= 8 && block % 8 == 0 && block <= (std::size_t{1} << 24),
                              "sign codec: block must be a multiple of 8 in [8, 2^24], got ", block);
  }
};

static_assert(check_codec<sign>());

}  // namespace decentrain::compress
