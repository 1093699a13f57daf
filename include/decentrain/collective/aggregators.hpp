// How the peers' contributions to an averaged value combine: the aggregator slot of the
// communication policies. An aggregator is a value type of settings with
//   void combine(std::span<const std::span<const float>> contributions, std::span<float> out)
//       writes the aggregate of one or more contributions, each out.size() finite values (a
//       contribution holding a non-finite value never gets here: the collective drops it)
// and may add
//   void combine_weighted(contributions, std::span<const double> weights, std::span<float> out)
//       the same with each contribution weighing weights[i] (> 0, finite: a step's or a round's
//       weight, the rows a replica took; the robust all-reduce drops and caps what a peer claims)
//   std::string describe() const             its settings, compared across peers
//   bool per_partition() const               aggregate per partition (robust_all_reduce)
//   bool averages_in_flight() const          a plain mean: the collective may sum on the way
// Against peers that send poison (Byzantine peers), the mean is ruined by a single one; the
// coordinate-wise median and trimmed mean, and centered clipping (Karimireddy, He and Jaggi,
// "Learning from History for Byzantine Robust Optimization", 2021), bound what a minority can
// do. bucketing<A> (Karimireddy, He and Jaggi, "Byzantine-Robust Learning on Heterogeneous
// Datasets via Bucketing", 2022) averages random small groups first, which brings honest
// contributions closer together when the peers' data differ. Users write their own the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"

namespace decentrain::collective {

using contributions = std::span<const std::span<const float>>;

// One static_assert per member, so an aggregator that lacks one is told which.
template <class A>
constexpr bool check_aggregator() {
  static_assert(std::is_copy_constructible_v<A>, "aggregator: an aggregator must be copyable (a value type of settings)");
  static_assert(requires(A& a, contributions in, std::span<float> out) { a.combine(in, out); },
                "aggregator: needs `void combine(std::span<const std::span<const float>> contributions, std::span<float> out)`");
  return true;
}

template <class A>
constexpr bool can_weigh() {
  return requires(A& a, contributions in, std::span<const double> w, std::span<float> out) { a.combine_weighted(in, w, out); };
}

template <class A>
std::string describe_aggregator(const A& a) {
  if constexpr (requires { { a.describe() } -> std::convertible_to<std::string>; })
    return a.describe();
  else if constexpr (requires { { A::name } -> std::convertible_to<const char*>; })
    return A::name;
  else
    return "an aggregator without a name";
}
template <class A>
bool is_partitioned(const A& a) {
  if constexpr (requires { { a.per_partition() } -> std::convertible_to<bool>; })
    return a.per_partition();
  else
    return false;
}
template <class A>
bool averages_in_flight(const A& a) {
  if constexpr (requires { { a.averages_in_flight() } -> std::convertible_to<bool>; })
    return a.averages_in_flight();
  else
    return false;
}

namespace detail {
// "median" + "bucket=2" -> "median:bucket=2"; "trimmed-mean:trim=0.2" + ... -> "...,bucket=2"
// (the --aggregator spec that makes the same aggregator).
inline std::string with_setting(const std::string& spec, const std::string& setting) {
  return spec + (spec.find(':') == std::string::npos ? ":" : ",") + setting;
}

inline void check_shapes(contributions in, std::span<float> out, const char* who) {
  decentrain::detail::check(!in.empty(), who, ": no contributions to combine");
  for (const auto& c : in)
    decentrain::detail::check(c.size() == out.size(), who, ": a contribution has ", c.size(), " values, the output ", out.size());
}

// Calls f(i, values) for each coordinate i with the contributions' values at i in `values` (a
// buffer of in.size()), coordinates taken in tiles so that each contribution is read in order.
template <class F>
void by_coordinate(contributions in, std::size_t size, F&& f) {
  const std::size_t n = in.size();
  constexpr std::size_t tile = 256;
  std::vector<float> column(n), block(n * tile);
  for (std::size_t at = 0; at < size; at += tile) {
    const std::size_t m = std::min(tile, size - at);
    for (std::size_t p = 0; p < n; ++p)
      for (std::size_t j = 0; j < m; ++j) block[j * n + p] = in[p][at + j];
    for (std::size_t j = 0; j < m; ++j) f(at + j, std::span<float>(block.data() + j * n, n));
  }
}

// Sorts a handful of values in place (n is the number of peers: small).
inline void sort_small(std::span<float> v) {
  for (std::size_t i = 1; i < v.size(); ++i) {
    const float x = v[i];
    std::size_t j = i;
    for (; j > 0 && v[j - 1] > x; --j) v[j] = v[j - 1];
    v[j] = x;
  }
}

// Sorts a handful of values in place, each with its weight.
template <class T>
void sort_small(std::span<T> v, std::span<double> w) {
  for (std::size_t i = 1; i < v.size(); ++i) {
    const T x = v[i];
    const double wx = w[i];
    std::size_t j = i;
    for (; j > 0 && v[j - 1] > x; --j) {
      v[j] = v[j - 1];
      w[j] = w[j - 1];
    }
    v[j] = x;
    w[j] = wx;
  }
}

// The weighted median of sorted values: the first whose cumulative weight passes half the total
// (the mean of two where it lands on half exactly, as the median of an even count does; with
// `lower`, the first that reaches half, as sorted[(n - 1) / 2] is).
template <class T>
T weighted_median_sorted(std::span<const T> v, std::span<const double> w, double total, bool lower = false) {
  double below = 0;
  for (std::size_t j = 0; j < v.size(); ++j) {
    below += w[j];
    if (2 * below > total || j + 1 == v.size() || (lower && 2 * below == total)) return v[j];
    if (2 * below == total) return static_cast<T>(0.5 * (static_cast<double>(v[j]) + static_cast<double>(v[j + 1])));
  }
  return v.empty() ? T{} : v.back();
}

// Calls f(i, values, weights) per coordinate as by_coordinate does, with each contribution's
// weight beside its value (a fresh copy per coordinate: the callee may sort them together).
template <class F>
void by_coordinate_weighted(contributions in, std::span<const double> weights, std::size_t size, F&& f) {
  std::vector<double> w(weights.size());
  by_coordinate(in, size, [&](std::size_t i, std::span<float> v) {
    std::copy(weights.begin(), weights.end(), w.begin());
    f(i, v, std::span<double>(w));
  });
}

inline double total_weight(contributions in, std::span<const double> weights, const char* who) {
  decentrain::detail::check(weights.size() == in.size(), who, ": ", weights.size(), " weights for ", in.size(), " contributions");
  double total = 0;
  for (const double w : weights) {
    decentrain::detail::check(std::isfinite(w) && w > 0, who, ": a contribution's weight is ", w, ", not a positive number");
    total += w;
  }
  return total;
}

inline void weighted_median(contributions in, std::span<const double> weights, std::span<float> out) {
  const double total = total_weight(in, weights, "median");
  by_coordinate_weighted(in, weights, out.size(), [&](std::size_t i, std::span<float> v, std::span<double> w) {
    sort_small(v, w);
    out[i] = weighted_median_sorted<float>(v, w, total);
  });
}

// sum_i (a_i - b_i)^2, in double: the distances clipping and the reports are made of.
inline double squared_distance(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return s;
}

inline void coordinate_median(contributions in, std::span<float> out) {
  by_coordinate(in, out.size(), [&](std::size_t i, std::span<float> v) {
    sort_small(v);
    const std::size_t h = v.size() / 2;
    // (in double: two large finite values would overflow a float sum)
    out[i] = v.size() % 2 ? v[h] : static_cast<float>(0.5 * (static_cast<double>(v[h - 1]) + v[h]));
  });
}
}  // namespace detail

// Today's average: what a single peer sending 1e30 moves wherever it likes.
struct mean {
  static constexpr const char* name = "mean";
  bool averages_in_flight() const { return true; }
  void combine(contributions in, std::span<float> out) {
    detail::check_shapes(in, out, "mean");
    std::fill(out.begin(), out.end(), 0.0f);
    for (const auto& c : in)
      for (std::size_t i = 0; i < out.size(); ++i) out[i] += c[i];
    const float scale = 1.0f / static_cast<float>(in.size());
    for (auto& v : out) v *= scale;
  }
  void combine_weighted(contributions in, std::span<const double> weights, std::span<float> out) {
    detail::check_shapes(in, out, "mean");
    const double total = detail::total_weight(in, weights, "mean");
    std::vector<double> sum(out.size(), 0.0);
    for (std::size_t p = 0; p < in.size(); ++p)
      for (std::size_t i = 0; i < out.size(); ++i) sum[i] += weights[p] * in[p][i];
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(sum[i] / total);
  }
};

// Per coordinate, the mean of the contributions that hold a value there (non-zero), 0 where none
// does: for sparse payloads (top-k), where a peer that did not send a coordinate contributes a
// zero that means "not this round", not "zero". A coordinate sent by one peer of four moves by
// that peer's value, not a quarter of it (SparseLoCo's scatter-mean). Dense contributions, all
// non-zero, get the plain mean.
struct sender_mean {
  static constexpr const char* name = "sender-mean";
  void combine(contributions in, std::span<float> out) {
    detail::check_shapes(in, out, "sender-mean");
    std::fill(out.begin(), out.end(), 0.0f);
    std::vector<std::uint32_t> senders(out.size(), 0);
    for (const auto& c : in)
      for (std::size_t i = 0; i < out.size(); ++i)
        if (c[i] != 0.0f) {
          out[i] += c[i];
          ++senders[i];
        }
    for (std::size_t i = 0; i < out.size(); ++i)
      if (senders[i] > 1) out[i] /= static_cast<float>(senders[i]);
  }
};

// Per coordinate, the middle value (the mean of the two middle ones for an even count): robust
// to fewer than half the contributions, but noisier than the mean when all are honest.
struct median {
  static constexpr const char* name = "median";
  void combine(contributions in, std::span<float> out) {
    detail::check_shapes(in, out, "median");
    detail::coordinate_median(in, out);
  }
  // Per coordinate, the value where half the weight lies on each side.
  void combine_weighted(contributions in, std::span<const double> weights, std::span<float> out) {
    detail::check_shapes(in, out, "median");
    detail::weighted_median(in, weights, out);
  }
};

// Per coordinate, the mean after dropping the floor(trim x n) largest and smallest values (at
// most (n - 1) / 2 from each side, so one value always remains): with n = 8 and the default
// 0.25, two values off each end, which two attackers cannot move beyond the honest range.
struct trimmed_mean {
  static constexpr const char* name = "trimmed-mean";
  double trim = 0.25;

  std::size_t trimmed(std::size_t n) const {
    decentrain::detail::check(trim >= 0 && trim < 0.5, "trimmed_mean: trim must be in [0, 0.5), got ", trim);
    return std::min(static_cast<std::size_t>(std::floor(trim * static_cast<double>(n))), (n - 1) / 2);
  }
  std::string describe() const { return "trimmed-mean:trim=" + std::to_string(trim); }
  void combine(contributions in, std::span<float> out) {
    detail::check_shapes(in, out, "trimmed_mean");
    const std::size_t b = trimmed(in.size()), kept = in.size() - 2 * b;
    detail::by_coordinate(in, out.size(), [&](std::size_t i, std::span<float> v) {
      detail::sort_small(v);
      double sum = 0;  // a float sum of large finite values could overflow; their mean cannot
      for (std::size_t j = b; j < b + kept; ++j) sum += v[j];
      out[i] = static_cast<float>(sum / static_cast<double>(kept));
    });
  }
  // Per coordinate, the weighted mean of what lies between the lightest `trim` of the total
  // weight at each end (a value straddling the cut counts with the part of its weight inside).
  void combine_weighted(contributions in, std::span<const double> weights, std::span<float> out) {
    detail::check_shapes(in, out, "trimmed_mean");
    (void)trimmed(in.size());  // (checks trim)
    const double total = detail::total_weight(in, weights, "trimmed_mean"), cut = trim * total;
    detail::by_coordinate_weighted(in, weights, out.size(), [&](std::size_t i, std::span<float> v, std::span<double> w) {
      detail::sort_small(v, w);
      double below = 0, sum = 0, kept = 0;
      for (std::size_t j = 0; j < v.size(); ++j) {
        const double inside = std::max(0.0, std::min(below + w[j], total - cut) - std::max(below, cut));
        sum += inside * v[j];
        kept += inside;
        below += w[j];
      }
      out[i] = kept > 0 ? static_cast<float>(sum / kept) : detail::weighted_median_sorted<float>(v, w, total);
    });
  }
};

// Centered clipping: from a starting point v, `iterations` times
//   v <- v + (1/n) sum_i (x_i - v) min(1, radius / |x_i - v|)
// so a contribution far from v pulls it by at most radius / n, however far it is. Karimireddy et
// al. start from the previous round's aggregate; starting from the coordinate-wise median needs
// no state across rounds (nor per partition) and is already close to the honest mean. radius 0
// takes the median distance to the starting point, which scales with the contributions (a fixed
// radius fits gradients or pseudo-gradients, not both).
struct centered_clip {
  static constexpr const char* name = "centered-clip";
  int iterations = 3;
  double radius = 0.0;  // 0: the median of |x_i - v0|

  std::string describe() const {
    return "centered-clip:iterations=" + std::to_string(iterations) + ",radius=" + std::to_string(radius);
  }
  void combine(contributions in, std::span<float> out) { clip(in, {}, out); }
  // The same from the weighted median, each contribution pulling by its share of the weight, the
  // radius the weighted median distance.
  void combine_weighted(contributions in, std::span<const double> weights, std::span<float> out) { clip(in, weights, out); }

 private:
  void clip(contributions in, std::span<const double> weights, std::span<float> out) {
    detail::check_shapes(in, out, "centered_clip");
    decentrain::detail::check(iterations >= 1, "centered_clip: iterations must be >= 1, got ", iterations);
    decentrain::detail::check(radius >= 0 && std::isfinite(radius), "centered_clip: radius must be finite and >= 0, got ", radius);
    const std::size_t n = in.size();
    const bool weighed = !weights.empty();
    const double total = weighed ? detail::total_weight(in, weights, "centered_clip") : 0.0;
    if (weighed)
      detail::weighted_median(in, weights, out);
    else
      detail::coordinate_median(in, out);
    std::vector<double> distance(n), weight(n);
    auto distances = [&] {
      for (std::size_t p = 0; p < n; ++p) distance[p] = std::sqrt(detail::squared_distance(in[p], out));
    };
    distances();
    double tau = radius;
    if (tau == 0 && !weighed) {
      auto sorted = distance;
      std::sort(sorted.begin(), sorted.end());
      tau = sorted[(n - 1) / 2];
    } else if (tau == 0) {
      auto d = distance;
      std::vector<double> w(weights.begin(), weights.end());
      detail::sort_small<double>(d, w);
      tau = detail::weighted_median_sorted<double>(d, w, total, true);
    }
    if (tau == 0) return;  // half or more of the contributions sit on the median: it is the answer
    // In double: a difference of two finite floats can overflow a float. The step is a convex
    // combination of v and the x_i (the weights add up to at most 1), so v stays finite.
    std::vector<double> step(out.size());
    for (int it = 0; it < iterations; ++it) {
      if (it) distances();
      for (std::size_t p = 0; p < n; ++p)
        weight[p] = weighed ? (distance[p] > tau ? tau / distance[p] : 1.0) * (weights[p] / total)
                            : (distance[p] > tau ? tau / distance[p] : 1.0) / static_cast<double>(n);
      std::fill(step.begin(), step.end(), 0.0);
      for (std::size_t p = 0; p < n; ++p) {
        const double w = weight[p];
        for (std::size_t i = 0; i < out.size(); ++i) step[i] += w * (static_cast<double>(in[p][i]) - out[i]);
      }
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(out[i] + step[i]);
    }
  }
};

// Averages the contributions in random groups of `size` (the same grouping on every peer: drawn
// from `seed` and the number of calls so far), then combines the group means with `inner`. With
// n contributions and f attackers at most f groups hold one, and the groups' means vary less
// than single contributions, which helps the inner aggregator tell honest from not.
template <class Inner>
struct bucketing {
  static_assert(check_aggregator<Inner>());
  std::size_t size = 2;
  std::uint64_t seed = 0x6275636bu;  // "buck"
  Inner inner{};

  std::string describe() const {
    return detail::with_setting(describe_aggregator(inner), "bucket=" + std::to_string(size) + ",seed=" + std::to_string(seed));
  }
  bool per_partition() const { return is_partitioned(inner); }
  void combine(contributions in, std::span<float> out) { group(in, {}, out); }
  // Each group's weighted mean, weighing the group's total for the inner aggregator.
  void combine_weighted(contributions in, std::span<const double> weights, std::span<float> out)
    requires(can_weigh<Inner>())
  {
    (void)detail::total_weight(in, weights, "bucketing");
    group(in, weights, out);
  }

 private:
  void group(contributions in, std::span<const double> weights, std::span<float> out) {
    detail::check_shapes(in, out, "bucketing");
    decentrain::detail::check(size >= 1, "bucketing: size must be >= 1");
    const std::size_t n = in.size(), groups = (n + size - 1) / size;
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    const std::uint64_t round = calls_++;
    for (std::size_t i = n; i > 1; --i)  // Fisher-Yates, from a counter-based stream
      std::swap(order[i - 1], order[decentrain::detail::splitmix64(seed ^ decentrain::detail::splitmix64(round) ^ i) % i]);
    means_.resize(groups * out.size());
    sum_.resize(out.size());  // in double: a group's float sum of large finite values could overflow
    std::vector<std::span<const float>> parts;
    std::vector<double> group_weights;
    for (std::size_t g = 0; g < groups; ++g) {
      std::span<float> m(means_.data() + g * out.size(), out.size());
      std::fill(sum_.begin(), sum_.end(), 0.0);
      const std::size_t from = g * size, to = std::min(n, from + size);
      double count = 0;
      for (std::size_t k = from; k < to; ++k) {
        const double w = weights.empty() ? 1.0 : weights[order[k]];
        for (std::size_t i = 0; i < m.size(); ++i) sum_[i] += weights.empty() ? in[order[k]][i] : w * in[order[k]][i];
        count += w;
      }
      for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(sum_[i] / count);
      parts.push_back(m);
      group_weights.push_back(count);
    }
    if (weights.empty())
      inner.combine(contributions(parts), out);
    else if constexpr (can_weigh<Inner>())
      inner.combine_weighted(contributions(parts), group_weights, out);
  }

  std::uint64_t calls_ = 0;
  std::vector<float> means_;
  std::vector<double> sum_;
};

// The same aggregation, done per partition (the idea of BTARD, Gorbunov et al. 2022): peer k
// receives every peer's k-th slice of the buffer, aggregates it and sends the result to all, so
// no peer receives every whole contribution (the traffic of a ring all-reduce, not n times it).
// The price: peer k alone aggregates slice k, so a Byzantine peer can spoil its own slice of the
// result with finite values (BTARD adds random re-checks of the aggregators for that; not done
// here); a slice it returns non-finite is taken as zeros and reported (robust_all_reduce.hpp).
// Clipping radii are per slice.
template <class Inner>
struct partitioned {
  static_assert(check_aggregator<Inner>());
  Inner inner{};

  std::string describe() const { return detail::with_setting(describe_aggregator(inner), "partitioned"); }
  bool per_partition() const { return true; }
  bool averages_in_flight() const { return false; }
  void combine(contributions in, std::span<float> out) { inner.combine(in, out); }
  void combine_weighted(contributions in, std::span<const double> weights, std::span<float> out)
    requires(can_weigh<Inner>())
  {
    inner.combine_weighted(in, weights, out);
  }
};

}  // namespace decentrain::collective
