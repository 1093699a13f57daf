// DCT top-k, after DeMo (Peng, Quesnelle and Kingma, 2024): the payload is cut into chunks of
// `chunk` values, each chunk goes through an orthonormal DCT-II, and the largest coefficients of
// the whole payload are sent by `select` (a top_k: its fraction or count, its compact indices and
// value bits). Smooth or correlated stretches of a pseudo-gradient put their energy into few
// coefficients, so the same bytes carry more of it than top-k of the raw values. The receiver
// adds the inverse DCT of the coefficients it was sent. The last chunk is padded with zeros.
// Sparse, so gathered; meant to run inside error_feedback<dct_top_k>, whose residual keeps, in
// values, what the coefficients sent did not carry.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/top_k.hpp"

namespace decentrain::compress {

struct dct_top_k {
  static constexpr const char* name = "dct";
  static constexpr bool dense = false;
  std::size_t chunk = 64;                   // values per transform (at most 4096)
  top_k select = [] {                       // which coefficients go, and how (2% by default)
    top_k t;
    t.fraction = 0.02;
    return t;
  }();

  std::string describe() const { return "dct(chunk=" + std::to_string(chunk) + "," + compress::describe(select) + ")"; }
  std::size_t padded(std::size_t n) const {
    check_settings();
    return (n + chunk - 1) / chunk * chunk;
  }
  std::size_t max_encoded_bytes(std::size_t n) const { return select.max_encoded_bytes(padded(n)); }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    detail::check_finite(in, name);
    const auto& basis = make_basis();
    coefficients_.assign(padded(in.size()), 0.0f);
    std::vector<float> x(chunk);
    for (std::size_t at = 0; at < in.size(); at += chunk) {
      const std::size_t len = std::min(chunk, in.size() - at);
      std::fill(x.begin(), x.end(), 0.0f);
      std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(at), len, x.begin());
      float* c = coefficients_.data() + at;
      for (std::size_t k = 0; k < chunk; ++k) {
        const float* b = basis.data() + k * chunk;
        float s = 0;
        for (std::size_t i = 0; i < len; ++i) s += b[i] * x[i];
        c[k] = s;
      }
    }
    return select.encode(std::span<const float>(coefficients_), out);
  }

  // top_k's decode checks the payload (count, indices, values); only the coefficients it set
  // are transformed back.
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    const auto& basis = make_basis();
    std::vector<float> c(padded(into.size()), 0.0f);
    select.decode_add(in, std::span<float>(c));
    // Into a buffer of its own, checked whole before anything is added.
    std::vector<float> x(c.size(), 0.0f);
    for (std::size_t at = 0; at < into.size(); at += chunk)
      for (std::size_t k = 0; k < chunk; ++k) {
        const float ck = c[at + k];
        if (ck == 0.0f) continue;
        const float* b = basis.data() + k * chunk;
        for (std::size_t i = 0; i < chunk; ++i) x[at + i] += ck * b[i];
      }
    for (std::size_t i = 0; i < into.size(); ++i)
      if (!std::isfinite(x[i])) decentrain::detail::fail("dct codec: the decoded value ", i, " is ", x[i]);
    for (std::size_t i = 0; i < into.size(); ++i) into[i] += x[i];
  }

 private:
  void check_settings() const {
    decentrain::detail::check(chunk >= 2 && chunk <= 4096, "dct codec: chunk must be in [2, 4096], got ", chunk);
  }
  // Row k: the k-th orthonormal DCT-II basis vector, sqrt(2/N) cos(pi (i + 1/2) k / N) (k = 0:
  // sqrt(1/N)); its transpose is the inverse. Computed in double, rounded once, and kept (a codec
  // object is used by one thread at a time, as every codec).
  const std::vector<float>& make_basis() const {
    check_settings();
    if (basis_chunk_ == chunk) return basis_;
    auto& b = basis_;
    b.assign(chunk * chunk, 0.0f);
    const double n = static_cast<double>(chunk);
    for (std::size_t k = 0; k < chunk; ++k)
      for (std::size_t i = 0; i < chunk; ++i)
        b[k * chunk + i] = static_cast<float>((k ? std::sqrt(2.0 / n) : std::sqrt(1.0 / n)) *
                                              std::cos(3.141592653589793 * (static_cast<double>(i) + 0.5) *
                                                       static_cast<double>(k) / n));
    basis_chunk_ = chunk;
    return b;
  }
  std::vector<float> coefficients_;
  mutable std::vector<float> basis_;
  mutable std::size_t basis_chunk_ = 0;
};

static_assert(check_codec<dct_top_k>());

}  // namespace decentrain::compress
