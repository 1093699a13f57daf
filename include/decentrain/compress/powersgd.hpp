// PowerSGD (Vogels, Karimireddy and Jaggi, 2019): each matrix M of the payload (rows x cols, from
// the policy's layout) is sent as a rank-r approximation P Q^T found by one step of power
// iteration from the previous round's Q (warm start):
//   P = M Q, all-reduced;  P orthonormalised (Gram-Schmidt);  Q = M^T P, all-reduced;  M ~ P Q^T
// Both all-reduces are linear in M, so every peer ends with P P^T mean(M), the same bits on all
// (P and Q are the collectives' results, identical everywhere). A matrix costs (rows + cols) r
// values instead of rows cols; vectors and matrices where that saves nothing go as they are in
// the first all-reduce. P, Q and those go through `Factors`, a dense codec (identity: f32;
// int8_blockwise shrinks them 4x more), so a round is two ring all-reduces.
// Error feedback is built in (`feedback`, the paper's setting): each peer keeps M - P P^T M, what
// its own share of the approximation missed, and adds it to the next round's M; the kept parts
// sum to what the group's approximation missed, with no per-peer drift. What Factors' rounding
// loses is not kept (wrap Factors in error_feedback for that).
// Outside that collective (encode / decode_add, the gathered path) it is one peer's own rank-r
// approximation in f32, without feedback.
// Every peer computes P's orthonormalisation and P Q^T itself, from the same collective results:
// the same bits on all as long as they run the same arithmetic (one build; a compiler that fuses
// multiply-adds on some peers and not others, e.g. -ffp-contract=fast on one architecture, would
// let them drift apart).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/error_feedback.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::compress {

template <class Factors = identity>
struct powersgd {
  static_assert(check_codec<Factors>());
  static constexpr const char* name = "powersgd";
  std::size_t rank = 4;
  bool feedback = true;                     // keep what the approximation missed for the next round
  std::uint64_t seed = 0x706f77657273ull;   // the first Q of every matrix, equal on every peer
  Factors factors{};                        // what P, Q and the uncompressed pieces travel through

  std::string describe() const {
    return "powersgd(rank=" + std::to_string(rank) + (feedback ? ",ef" : ",noef") + ",seed=" + std::to_string(seed) +
           ",factors=" + compress::describe(factors) + ")";
  }

  // A new layout starts its factors from the seed, or from a checkpoint loaded before it.
  void set_layout(const layout& l) {
    if (l == layout_) return;  // a second fit() with the same model keeps its warm start
    layout_ = l;
    q_.clear();
  }
  const layout& payload_layout() const { return layout_; }

  // The rank a piece is sent at, 0 when it goes as it is.
  std::size_t rank_of(const matrix_piece& m) const {
    check_settings();
    const std::size_t r = std::min({rank, m.rows, m.cols});
    return m.rows > 1 && m.cols > 1 && (m.rows + m.cols) * r < m.rows * m.cols ? r : 0;
  }
  // Values sent per round in the first and second all-reduce (P and the plain pieces; Q).
  std::size_t first_values() const {
    std::size_t s = 0;
    for (const auto& m : layout_) s += rank_of(m) ? m.rows * rank_of(m) : m.size();
    return s;
  }
  std::size_t second_values() const {
    std::size_t s = 0;
    for (const auto& m : layout_) s += m.cols * rank_of(m);
    return s;
  }

  std::size_t max_encoded_bytes(std::size_t n) const {
    return layout_.empty() ? 8 + 4 * n : 8 + 4 * (first_values() + second_values());
  }

  // One peer's own approximation: n, then per piece P and Q (or the values), all f32.
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    ready(in.size());
    detail::check_finite(in, name);
    std::byte* p = out.data();
    const std::uint64_t n = in.size();
    std::memcpy(p, &n, 8);
    p += 8;
    auto put = [&](const std::vector<float>& v) {
      std::memcpy(p, v.data(), 4 * v.size());
      p += 4 * v.size();
    };
    std::vector<float> P, Q;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& m = layout_[i];
      const float* M = in.data() + m.offset;
      if (const std::size_t r = rank_of(m)) {
        refresh(i, r);
        multiply(M, m, q_[i], r, P);
        orthonormalise(P, m.rows, r);
        multiply_transposed(M, m, P, r, Q);
        put(P);
        put(Q);
      } else {
        std::memcpy(p, M, 4 * m.size());
        p += 4 * m.size();
      }
    }
    return static_cast<std::size_t>(p - out.data());
  }

  // Checks the size and every value, and that the product stays finite, before adding anything.
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    auto fail = [&](auto&&... why) { decentrain::detail::fail("powersgd codec: ", why...); };
    if (layout_.empty()) fail("no layout: set_layout() first (the communication policies do it in start())");
    check_layout(layout_, into.size(), "powersgd codec");
    const std::size_t want = max_encoded_bytes(into.size());
    if (in.size() != want) fail("a payload of ", in.size(), " bytes, expected ", want, " for ", into.size(), " values");
    std::uint64_t n;
    std::memcpy(&n, in.data(), 8);
    if (n != into.size()) fail("the payload is for ", n, " values, the receiver has ", into.size());
    std::vector<float> all((in.size() - 8) / 4);
    std::memcpy(all.data(), in.data() + 8, 4 * all.size());
    for (std::size_t j = 0; j < all.size(); ++j)
      if (!std::isfinite(all[j])) fail("value ", j, " is ", all[j]);
    std::vector<float> out(into.size());
    const float* at = all.data();
    for (const auto& m : layout_) {
      if (const std::size_t r = rank_of(m)) {
        product(at, at + m.rows * r, m, r, out.data() + m.offset);
        at += (m.rows + m.cols) * r;
      } else {
        std::copy(at, at + m.size(), out.begin() + static_cast<std::ptrdiff_t>(m.offset));
        at += m.size();
      }
    }
    for (std::size_t j = 0; j < out.size(); ++j)
      if (!std::isfinite(out[j])) fail("the decoded value ", j, " is ", out[j], " (factors too large)");
    for (std::size_t j = 0; j < out.size(); ++j) into[j] += out[j];
  }

  // One round of the group's approximation, in three parts around two all-reduces (which
  // collective::encoded_all_reduce runs through p_codec() and q_codec()):
  //   round_first(values)   values (+ the residual) -> P = M Q per low-rank piece, the others as they are
  //   round_second()        P orthonormalised (the same P on every peer) -> Q = M^T P; the residual
  //   round_finish(values)  P Q^T (and the plain pieces) -> values; Q kept for the next round's warm start
  // A round where nothing is sent (one peer) calls round_first's check only: ready(values.size()).
  void ready(std::size_t n) {
    decentrain::detail::check(!layout_.empty() || n == 0, "powersgd codec: no layout: it needs the payload's matrices "
                              "(set_layout(); the communication policies do it in start())");
    check_layout(layout_, n, "powersgd codec");
    set_factors();
    decentrain::detail::check(residual_.empty() || residual_.size() == n, "powersgd codec: the residual holds ",
                              residual_.size(), " values, the payload has ", n);
    if (q_.size() == layout_.size() && q_rank_ == rank) return;
    q_rank_ = rank;
    q_.assign(layout_.size(), {});
    std::size_t at = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const std::size_t len = layout_[i].cols * rank_of(layout_[i]);
      if (loaded_q_.empty()) {
        q_[i].assign(len, 0.0f);  // drawn from the seed on first use (refresh)
      } else {
        decentrain::detail::check(at + len <= loaded_q_.size(), "powersgd codec: the checkpoint's factors hold ",
                                  loaded_q_.size(), " values, fewer than this layout at rank ", rank, " needs");
        q_[i].assign(loaded_q_.begin() + static_cast<std::ptrdiff_t>(at), loaded_q_.begin() + static_cast<std::ptrdiff_t>(at + len));
      }
      at += len;
    }
    decentrain::detail::check(loaded_q_.empty() || at == loaded_q_.size(), "powersgd codec: the checkpoint's factors hold ",
                              loaded_q_.size(), " values, this layout at rank ", rank, " needs ", at);
    loaded_q_.clear();
  }
  std::span<float> round_first(std::span<const float> values) {
    ready(values.size());
    detail::check_finite(values, name);
    wanted_.assign(values.begin(), values.end());
    if (feedback) {
      if (residual_.empty()) residual_.assign(values.size(), 0.0f);
      for (std::size_t j = 0; j < values.size(); ++j) wanted_[j] += residual_[j];
    }
    first_.resize(first_values());
    float* at = first_.data();
    std::vector<float> P;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& m = layout_[i];
      const float* M = wanted_.data() + m.offset;
      if (const std::size_t r = rank_of(m)) {
        refresh(i, r);
        multiply(M, m, q_[i], r, P);
        at = std::copy(P.begin(), P.end(), at);
      } else {
        at = std::copy(M, M + m.size(), at);
      }
    }
    return first_;
  }
  std::span<float> round_second() {
    second_.resize(second_values());
    float* p_at = first_.data();
    float* q_at = second_.data();
    std::vector<float> P, Q;
    for (const auto& m : layout_) {
      if (const std::size_t r = rank_of(m)) {
        P.assign(p_at, p_at + m.rows * r);
        orthonormalise(P, m.rows, r);
        std::copy(P.begin(), P.end(), p_at);
        multiply_transposed(wanted_.data() + m.offset, m, P, r, Q);
        q_at = std::copy(Q.begin(), Q.end(), q_at);
        p_at += m.rows * r;
      } else {
        p_at += m.size();
      }
    }
    // What this peer's share misses: M - P (M^T P)^T, with its own (not yet reduced) Q.
    if (feedback) {
      std::fill(residual_.begin(), residual_.end(), 0.0f);
      const float* first = first_.data();
      const float* mine = second_.data();
      for (const auto& m : layout_) {
        const std::size_t r = rank_of(m);
        if (!r) {
          first += m.size();
          continue;
        }
        float* e = residual_.data() + m.offset;
        product(first, mine, m, r, e);
        const float* M = wanted_.data() + m.offset;
        for (std::size_t j = 0; j < m.size(); ++j) e[j] = M[j] - e[j];
        first += m.rows * r;
        mine += m.cols * r;
      }
    }
    return second_;
  }
  void round_finish(std::span<float> values) {
    const float* p_at = first_.data();
    const float* q_at = second_.data();
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& m = layout_[i];
      float* out = values.data() + m.offset;
      if (const std::size_t r = rank_of(m)) {
        product(p_at, q_at, m, r, out);
        q_[i].assign(q_at, q_at + m.cols * r);  // the next round's warm start
        p_at += m.rows * r;
        q_at += m.cols * r;
      } else {
        std::copy(p_at, p_at + m.size(), out);
        p_at += m.size();
      }
    }
    ++rounds_;
  }
  // The two all-reduces' codecs: copies of `factors`, each with its own state.
  Factors& p_codec() {
    set_factors();
    return p_codec_;
  }
  Factors& q_codec() {
    set_factors();
    return q_codec_;
  }

  const std::vector<float>& residual() const { return residual_; }

  void save(io::checkpoint& c, const std::string& prefix) const {
    std::vector<float> qs = loaded_q_;
    for (const auto& q : q_) qs.insert(qs.end(), q.begin(), q.end());
    c.tensors[prefix + "q"] = from_vector<cpu>(qs, shape{static_cast<std::int64_t>(qs.size())});
    c.tensors[prefix + "own.residual"] = from_vector<cpu>(residual_, shape{static_cast<std::int64_t>(residual_.size())});
    c.counters[prefix + "rounds"] = static_cast<std::int64_t>(rounds_);
    if constexpr (requires { p_codec_.save(c, prefix); }) {
      p_codec_.save(c, prefix + "p.");
      q_codec_.save(c, prefix + "q.");
    }
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    auto vector = [&](const std::string& key) {
      auto it = c.tensors.find(prefix + key);
      decentrain::detail::check(it != c.tensors.end(), "powersgd codec: the checkpoint has no '", prefix, key, "'");
      decentrain::detail::check(it->second.dtype() == dtype::f32 && it->second.rank() == 1, "powersgd codec: '", prefix, key,
                                "' must be a 1-D f32 tensor");
      return it->second.template to_vector<float>();
    };
    const auto qs = vector("q");
    if (!io::leaves_out_own_state(c)) residual_ = detail::load_residual(c, prefix, "powersgd codec");
    auto it = c.counters.find(prefix + "rounds");
    decentrain::detail::check(it != c.counters.end(), "powersgd codec: the checkpoint has no '", prefix, "rounds'");
    rounds_ = static_cast<std::uint64_t>(it->second);
    q_.clear();
    loaded_q_ = qs;  // split per matrix once the layout is known
    set_factors();
    if constexpr (requires { p_codec_.load(c, prefix); }) {
      p_codec_.load(c, prefix + "p.");
      q_codec_.load(c, prefix + "q.");
    }
  }

 private:
  void check_settings() const {
    decentrain::detail::check(rank >= 1 && rank <= 4096, "powersgd codec: rank must be in [1, 4096], got ", rank);
  }
  // The two all-reduces' codecs start as copies of `factors` (each keeps its own state).
  void set_factors() {
    if (factors_set_) return;
    p_codec_ = factors;
    q_codec_ = factors;
    factors_set_ = true;
  }
  // Q's columns scaled to unit length, so P = M Q stays of M's size (Q = M^T P grew by |M| each
  // round: P would by |M|^2, out of fp16's range for factors=fp16); P's directions do not change.
  // A column that is all zero (a matrix that was zero, so M^T P was) would stay zero forever: it
  // is drawn again from the seed, the round and the piece. Alike on every peer (Q is).
  void refresh(std::size_t piece, std::size_t r) {
    auto& q = q_[piece];
    const std::size_t cols = layout_[piece].cols;
    for (std::size_t j = 0; j < r; ++j) {
      double norm = 0;
      for (std::size_t c = 0; c < cols; ++c) norm += static_cast<double>(q[c * r + j]) * q[c * r + j];
      if (norm == 0) {
        std::uint64_t s = decentrain::detail::splitmix64(seed ^ decentrain::detail::splitmix64(rounds_ * 0x10000u + piece) ^ j);
        for (std::size_t c = 0; c < cols; ++c) q[c * r + j] = normal(s);
        norm = 0;
        for (std::size_t c = 0; c < cols; ++c) norm += static_cast<double>(q[c * r + j]) * q[c * r + j];
      }
      const auto inv = static_cast<float>(1.0 / std::sqrt(norm));
      for (std::size_t c = 0; c < cols; ++c) q[c * r + j] *= inv;
    }
  }
  // A standard normal from a counter (Box-Muller on two splitmix64 draws): the same on every
  // platform, unlike std::normal_distribution.
  static float normal(std::uint64_t& s) {
    s = decentrain::detail::splitmix64(s);
    const double u1 = (static_cast<double>(s >> 11) + 1.0) * 0x1.0p-53;
    s = decentrain::detail::splitmix64(s);
    const double u2 = static_cast<double>(s >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  // P (rows x r) = M Q, M rows x cols, Q cols x r; all row-major.
  static void multiply(const float* M, const matrix_piece& m, const std::vector<float>& Q, std::size_t r, std::vector<float>& P) {
    P.assign(m.rows * r, 0.0f);
    for (std::size_t i = 0; i < m.rows; ++i) {
      float* p = P.data() + i * r;
      for (std::size_t c = 0; c < m.cols; ++c) {
        const float x = M[i * m.cols + c];
        const float* q = Q.data() + c * r;
        for (std::size_t j = 0; j < r; ++j) p[j] += x * q[j];
      }
    }
  }
  // Q (cols x r) = M^T P.
  static void multiply_transposed(const float* M, const matrix_piece& m, const std::vector<float>& P, std::size_t r,
                                  std::vector<float>& Q) {
    Q.assign(m.cols * r, 0.0f);
    for (std::size_t i = 0; i < m.rows; ++i) {
      const float* p = P.data() + i * r;
      for (std::size_t c = 0; c < m.cols; ++c) {
        const float x = M[i * m.cols + c];
        float* q = Q.data() + c * r;
        for (std::size_t j = 0; j < r; ++j) q[j] += x * p[j];
      }
    }
  }
  // out (rows x cols) = P Q^T.
  static void product(const float* P, const float* Q, const matrix_piece& m, std::size_t r, float* out) {
    for (std::size_t i = 0; i < m.rows; ++i)
      for (std::size_t c = 0; c < m.cols; ++c) {
        float s = 0;
        for (std::size_t j = 0; j < r; ++j) s += P[i * r + j] * Q[c * r + j];
        out[i * m.cols + c] = s;
      }
  }
  // Gram-Schmidt on P's columns (sums in double); a column with nothing left is set to zero.
  static void orthonormalise(std::vector<float>& P, std::size_t rows, std::size_t r) {
    for (std::size_t j = 0; j < r; ++j) {
      for (std::size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(P[i * r + j]) * P[i * r + k];
        for (std::size_t i = 0; i < rows; ++i) P[i * r + j] -= static_cast<float>(dot) * P[i * r + k];
      }
      double norm = 0;
      for (std::size_t i = 0; i < rows; ++i) norm += static_cast<double>(P[i * r + j]) * P[i * r + j];
      norm = std::sqrt(norm);
      const float inv = norm > 1e-30 ? static_cast<float>(1.0 / norm) : 0.0f;
      for (std::size_t i = 0; i < rows; ++i) P[i * r + j] *= inv;
    }
  }

  layout layout_;
  std::vector<std::vector<float>> q_;
  std::vector<float> loaded_q_;
  std::vector<float> residual_, wanted_, first_, second_;
  std::uint64_t rounds_ = 0;
  Factors p_codec_{}, q_codec_{};
  bool factors_set_ = false;
  std::size_t q_rank_ = 0;  // the rank q_ was built for (a changed rank starts again from the seed)
};

static_assert(check_codec<powersgd<>>());

}  // namespace decentrain::compress
