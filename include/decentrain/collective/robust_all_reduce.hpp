// Robust all-reduce: every peer's contribution, as sent, reaches the peers that aggregate it
// (straight from its sender: no peer relays another's values, which it could rewrite), a
// contribution holding a non-finite value is dropped, and the rest are combined by the
// aggregator. What happened to each peer's contribution is reported, so a policy can tell which
// peers send poison (aggregation_record::tally).
//   gathered (the default): every peer receives every whole contribution and aggregates it
//     itself: n - 1 times the buffer received per peer, and nobody has to be trusted.
//   partitioned<A>: peer k aggregates slice k of everyone's buffer and sends it to all (see
//     aggregators.hpp): the traffic of a ring all-reduce. A slice that comes back holding a
//     non-finite value is taken as zeros, and its aggregator is named when most peers saw it so.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "decentrain/collective/aggregators.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::collective {

enum class verdict : std::uint8_t {
  kept = 0,
  non_finite = 1,  // held a NaN or an infinity: left out
  malformed = 2,   // a payload its codec could not have written: left out
};

// One call's view of each peer's contribution (index = rank in the communicator used).
struct aggregation_report {
  std::vector<verdict> peers;
  // |contribution - aggregate| (Euclidean, over the values kept) for a kept peer, 0 otherwise;
  // empty when the contributions were summed on the way (mean over a ring) and never seen.
  std::vector<double> distance;
  // 1 when a kept peer lay more than peer_tally::far_factor times the typical distance from the
  // aggregate (what a scaled, flipped or noisy contribution does, and honest ones do not: they
  // scatter around the aggregate alike); 0 otherwise, and for all when the sum was never seen.
  std::vector<std::uint8_t> far;

  int kept() const { return static_cast<int>(std::count(peers.begin(), peers.end(), verdict::kept)); }
  // Whether the call found peer p's contribution dropped or far.
  bool suspicious(std::size_t p) const {
    return p < peers.size() && (peers[p] != verdict::kept || (p < far.size() && far[p] != 0));
  }
};

namespace detail {
// The median of the distances of the kept peers (0 when none): what "far" is measured against.
inline double typical_distance(std::span<const verdict> peers, std::span<const double> distance) {
  std::vector<double> d;
  for (std::size_t p = 0; p < peers.size() && p < distance.size(); ++p)
    if (peers[p] == verdict::kept) d.push_back(distance[p]);
  if (d.empty()) return 0;
  std::sort(d.begin(), d.end());
  return d[(d.size() - 1) / 2];
}
}  // namespace detail

// Across calls, per peer: how often its contribution was dropped, and how often it lay far from
// the aggregate (aggregation_report::far).
struct peer_tally {
  double far_factor = 3.0;
  std::int64_t calls = 0;
  std::vector<std::int64_t> non_finite, malformed, far;

  void add(const aggregation_report& r) {
    const std::size_t n = r.peers.size();
    if (non_finite.size() < n) {
      non_finite.resize(n);
      malformed.resize(n);
      far.resize(n);
    }
    ++calls;
    for (std::size_t p = 0; p < n; ++p) {
      non_finite[p] += r.peers[p] == verdict::non_finite;
      malformed[p] += r.peers[p] == verdict::malformed;
      far[p] += r.peers[p] == verdict::kept && p < r.far.size() && r.far[p] != 0;
    }
  }
  // Calls in which peer p's contribution was dropped or far away.
  std::int64_t suspicious(std::size_t p) const {
    return p < non_finite.size() ? non_finite[p] + malformed[p] + far[p] : 0;
  }
};

// What a policy keeps across robust all-reduces: the last report, the tally, and the buffers
// (reused, so a call allocates nothing once sizes settle).
struct aggregation_record {
  aggregation_report last;
  peer_tally tally;
  // Weighted contributions (a policy's `weighted`): one weighs at most weight_cap times the
  // median weight of those kept, so a peer that claims a huge weight (rows it did not take)
  // counts as two honest ones at most, and f such peers outweigh the honest only where
  // f x weight_cap >= the honest count (a third of the peers); honest weights a few times apart
  // (peers of different speeds) lose what lies beyond it. A negative weight, or one that is not
  // a number, drops its contribution (malformed).
  double weight_cap = 2.0;
  std::vector<float> workspace, own;
  std::vector<std::vector<std::byte>> payloads;
};

namespace detail {
// Whether every value is finite: x * 0 is 0 for a finite x and NaN otherwise. Eight sums so the
// additions need not wait for each other.
inline bool all_finite(std::span<const float> v) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= v.size(); i += 8)
    for (std::size_t k = 0; k < 8; ++k) acc[k] += v[i + k] * 0.0f;
  for (; i < v.size(); ++i) acc[0] += v[i] * 0.0f;
  float total = 0;
  for (float a : acc) total += a;
  return total == 0.0f;
}

// Drops the contributions that are not finite (verdicts already malformed stay so), and with
// `weights` (one per contribution; empty: unweighted) those whose weight is negative or not a
// number (malformed; one of weight 0 is left out, as a peer that took no rows), caps the rest's
// weights (aggregation_record::weight_cap), aggregates what is left into `out` (zeros when none
// is), and writes each kept one's squared distance to the result into `squared`.
template <class Aggregator>
void combine_kept(Aggregator& aggregator, contributions parts, std::span<float> out, std::span<verdict> verdicts,
                  std::span<double> squared, std::span<const double> weights = {}, double weight_cap = 0) {
  std::vector<std::span<const float>> kept;
  std::vector<double> kept_weights;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    squared[p] = 0;
    if (verdicts[p] == verdict::kept && !all_finite(parts[p])) verdicts[p] = verdict::non_finite;
    if (verdicts[p] == verdict::kept && !weights.empty() && !(std::isfinite(weights[p]) && weights[p] >= 0))
      verdicts[p] = verdict::malformed;
    if (verdicts[p] != verdict::kept || (!weights.empty() && weights[p] == 0)) continue;  // (weight 0: took no rows)
    kept.push_back(parts[p]);
    if (!weights.empty()) kept_weights.push_back(weights[p]);
  }
  if (kept.empty()) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  if (weights.empty()) {
    aggregator.combine(contributions(kept), out);
  } else if constexpr (can_weigh<Aggregator>()) {
    auto sorted = kept_weights;
    std::sort(sorted.begin(), sorted.end());
    if (const double cap = weight_cap * sorted[(sorted.size() - 1) / 2]; weight_cap > 0)
      for (auto& w : kept_weights) w = std::min(w, cap);
    aggregator.combine_weighted(contributions(kept), kept_weights, out);
  } else {
    decentrain::detail::fail("aggregator '", describe_aggregator(aggregator), "' cannot weigh contributions");
  }
  for (std::size_t p = 0; p < parts.size(); ++p)
    if (verdicts[p] == verdict::kept) squared[p] = squared_distance(parts[p], out);
}

// Distances from the squared ones, and which kept peers lie far (compared with the typical one).
inline void finish_report(aggregation_report& r, double far_factor) {
  for (auto& d : r.distance) d = std::sqrt(d);
  r.far.assign(r.peers.size(), 0);
  const double typical = typical_distance(r.peers, r.distance);
  if (typical > 0)
    for (std::size_t p = 0; p < r.peers.size(); ++p)
      r.far[p] = r.peers[p] == verdict::kept && r.distance[p] > far_factor * typical;
}
}  // namespace detail

// Aggregates the contributions `parts` (one per rank, each values.size()) into `values`, filling
// the record's report: the step every robust path ends with, once the contributions are here.
// `verdicts` may mark some as malformed beforehand.
template <class Aggregator>
void aggregate_gathered(Aggregator& aggregator, contributions parts, std::span<float> values, aggregation_record& record,
                        std::span<const verdict> verdicts = {}, std::span<const double> weights = {}) {
  auto& r = record.last;
  r.peers.assign(parts.size(), verdict::kept);
  std::copy(verdicts.begin(), verdicts.end(), r.peers.begin());
  r.distance.assign(parts.size(), 0.0);
  detail::combine_kept(aggregator, parts, values, std::span<verdict>(r.peers), std::span<double>(r.distance), weights,
                       record.weight_cap);
  detail::finish_report(r, record.tally.far_factor);
  record.tally.add(r);
}

// The factor that makes a mean of scaled contributions their weighted mean: each peer scales
// its values by mine x R / (the weights' sum), so that the mean over the R peers is
// sum w_i v_i / sum w_i (one all-reduce of a number).
template <class Comm>
float weight_factor(Comm& comm, double mine) {
  double total = mine;
  comm.all_reduce(std::span<double>(&total, 1), reduce_op::sum);
  decentrain::detail::check(std::isfinite(total) && total > 0, "weighted averaging: the peers' weights add up to ", total,
                            "; it needs a positive sum");
  return static_cast<float>(mine * static_cast<double>(comm.world()) / total);
}

// Every peer's `mine`, on every peer (one all-to-all of a number; empty without one).
template <class Comm>
std::vector<double> exchange_weights(Comm& comm, std::optional<double> mine) {
  if (!mine) return {};
  const auto nn = static_cast<std::size_t>(comm.world());
  std::vector<double> all(nn);
  std::vector<std::span<const double>> out(nn, std::span<const double>(&*mine, 1));
  std::vector<std::span<double>> in(nn);
  for (std::size_t p = 0; p < nn; ++p) in[p] = std::span<double>(&all[p], 1);
  comm.all_to_all(std::span<const std::span<const double>>(out), std::span<const std::span<double>>(in));
  return all;
}

// The aggregate of every peer's `values`, left in `values` on every peer; the same bits on
// every peer when all are honest (a peer that sends different peers different values makes
// them differ; their aggregates still stay within what the aggregator allows). With `weight`,
// each peer's contribution weighs what it says (capped: aggregation_record::weight_cap).
template <class Aggregator, class Comm>
void robust_all_reduce(Aggregator& aggregator, Comm& comm, std::span<float> values, aggregation_record& record,
                       std::optional<double> weight = std::nullopt) {
  static_assert(check_aggregator<Aggregator>());
  const int n = comm.world(), me = comm.rank();
  const auto nn = static_cast<std::size_t>(n);
  const std::size_t size = values.size();
  const auto weights = exchange_weights(comm, weight);
  std::vector<std::span<const float>> out(nn);
  std::vector<std::span<float>> in(nn);
  auto& ws = record.workspace;
  if (!is_partitioned(aggregator)) {
    ws.resize(nn * size);
    for (std::size_t p = 0; p < nn; ++p) {
      out[p] = values;
      in[p] = std::span<float>(ws).subspan(p * size, size);
    }
    comm.all_to_all(std::span<const std::span<const float>>(out), std::span<const std::span<float>>(in));
    std::vector<std::span<const float>> parts(in.begin(), in.end());
    aggregate_gathered(aggregator, contributions(parts), values, record, {}, weights);
    return;
  }
  // Slices as the ring cuts them: the first size % n one value longer.
  const std::size_t base = size / nn, extra = size % nn;
  auto begin = [&](std::size_t k) { return k * base + std::min(k, extra); };
  auto slice = [&](std::size_t k) { return values.subspan(begin(k), base + (k < extra ? 1 : 0)); };
  const auto mine = slice(static_cast<std::size_t>(me));
  ws.resize((nn + 1) * mine.size());
  for (std::size_t p = 0; p < nn; ++p) {
    out[p] = slice(p);
    in[p] = std::span<float>(ws).subspan(p * mine.size(), mine.size());
  }
  comm.all_to_all(std::span<const std::span<const float>>(out), std::span<const std::span<float>>(in));
  // This peer's slice of the result, its verdicts and squared distances (as doubles: 0, 1, 2).
  const std::span<float> result = std::span<float>(ws).subspan(nn * mine.size(), mine.size());
  std::vector<verdict> verdicts(nn, verdict::kept);
  std::vector<double> squared(nn);
  {
    std::vector<std::span<const float>> parts(in.begin(), in.end());
    detail::combine_kept(aggregator, contributions(parts), result, std::span<verdict>(verdicts), std::span<double>(squared),
                         weights, record.weight_cap);
  }
  for (std::size_t p = 0; p < nn; ++p) {
    out[p] = result;
    in[p] = slice(p);
  }
  comm.all_to_all(std::span<const std::span<const float>>(out), std::span<const std::span<float>>(in));
  // An aggregate slice holding a NaN or an infinity is taken as zeros (no update there this
  // call): a bad aggregator cannot put a non-finite value into the model, and when it sends the
  // same slice to all, the honest peers still hold the same bits.
  std::vector<std::uint8_t> bad_result(nn);
  for (std::size_t k = 0; k < nn; ++k)
    if (const auto got = slice(k); !detail::all_finite(got)) {
      bad_result[k] = 1;
      std::fill(got.begin(), got.end(), 0.0f);
    }
  // Each aggregator's view of every peer (2 doubles each: verdict, squared distance), then
  // whether each aggregate slice reached this peer non-finite (1 double each), to every peer.
  const std::size_t width = 3 * nn;
  std::vector<double> view(width), views(width * nn);
  for (std::size_t p = 0; p < nn; ++p) {
    view[2 * p] = static_cast<double>(verdicts[p]);
    view[2 * p + 1] = squared[p];
    view[2 * nn + p] = bad_result[p];
  }
  std::vector<std::span<const double>> vout(nn, std::span<const double>(view));
  std::vector<std::span<double>> vin(nn);
  for (std::size_t k = 0; k < nn; ++k) vin[k] = std::span<double>(views).subspan(k * width, width);
  comm.all_to_all(std::span<const std::span<const double>>(vout), std::span<const std::span<double>>(vin));
  // Each slice's aggregator votes on every peer: dropped (its verdict) or far in that slice. A
  // verdict stands only when more than half of the aggregators give it, so a minority that lie
  // in their views (naming an honest peer non-finite, say) cannot make the others report it; a
  // peer that poisons one slice only is dropped there and goes unreported. The same majority
  // names an aggregator whose slice came back non-finite.
  auto& r = record.last;
  r.peers.assign(nn, verdict::kept);
  r.distance.assign(nn, 0.0);
  r.far.assign(nn, 0);
  std::vector<int> non_finite(nn), malformed(nn), far(nn), bad_result_reports(nn);
  std::vector<bool> lying(nn);  // aggregators whose view is not one
  std::vector<verdict> slice_verdicts(nn);
  std::vector<double> slice_distances(nn);
  for (std::size_t k = 0; k < nn; ++k) {  // slice k's aggregator
    const double* sent = views.data() + k * width;
    for (std::size_t p = 0; p < nn && !lying[k]; ++p) {
      const double v = sent[2 * p], sq = sent[2 * p + 1], b = sent[2 * nn + p];
      // A view that is not one of the three verdicts, or not a finite distance, is itself a sign
      // of a bad aggregator: it counts against the aggregator, not against peer p.
      lying[k] = !(v == 0 || v == 1 || v == 2) || !std::isfinite(sq) || sq < 0 || !(b == 0 || b == 1);
      slice_verdicts[p] = lying[k] ? verdict::kept : static_cast<verdict>(static_cast<int>(v));
      slice_distances[p] = lying[k] ? 0.0 : std::sqrt(sq);
    }
    if (lying[k]) continue;
    for (std::size_t p = 0; p < nn; ++p) bad_result_reports[p] += p != k && sent[2 * nn + p] == 1;
    const double typical = detail::typical_distance(slice_verdicts, slice_distances);
    for (std::size_t p = 0; p < nn; ++p) {
      non_finite[p] += slice_verdicts[p] == verdict::non_finite;
      malformed[p] += slice_verdicts[p] == verdict::malformed;
      if (slice_verdicts[p] != verdict::kept) continue;
      r.distance[p] += slice_distances[p] * slice_distances[p];
      far[p] += typical > 0 && slice_distances[p] > record.tally.far_factor * typical;
    }
  }
  for (std::size_t p = 0; p < nn; ++p) {
    if (2 * (non_finite[p] + malformed[p]) > n) r.peers[p] = non_finite[p] >= malformed[p] ? verdict::non_finite : verdict::malformed;
    if (2 * bad_result_reports[p] > n) r.peers[p] = verdict::non_finite;
    if (lying[p]) r.peers[p] = verdict::malformed;
    if (r.peers[p] != verdict::kept) {
      r.distance[p] = 0;
      continue;
    }
    r.distance[p] = std::sqrt(r.distance[p]);
    r.far[p] = 2 * (non_finite[p] + malformed[p] + far[p]) > n;
  }
  record.tally.add(r);
}

}  // namespace decentrain::collective
