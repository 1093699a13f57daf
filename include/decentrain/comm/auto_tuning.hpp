// A periodic policy that picks its own settings (DiLoCo's `tune`; the command line's --auto).
// The replicas measure their links (a probe at the start, comm/link_probe.hpp, then each round's
// own exchange) and their compute (the slowest replica's seconds per inner step, which work sized
// to speed agrees on anyway), agree on the numbers (max all-reduces: every replica holds the same
// bits), and each picks the same settings from them with one pure function, choose():
//   - the least lossy codec among `codecs` whose exchange lets a round of at most
//     prefer_inner_steps inner steps keep the replicas computing `busy` of its time, and the
//     fewest inner steps H that do (between min_inner_steps and max_inner_steps);
//   - where no codec does within prefer_inner_steps, the codec that needs the fewest.
// Streaming DiLoCo's exchanges run beside the compute instead (choose_streaming): there the pick
// is also the fragments P and the overlap tau, up to a share of H, that hide each fragment's
// exchange behind tau inner steps, with H the fewest inner steps that keep the compute busy.
// Fewer inner steps and less compression both keep a run closer to synchronous training, so
// the pick is the closest that still keeps the compute busy. When the agreed measures of a
// round drift by more than `drift` from those the settings came from (a link slowed, a peer
// left or got busy), the settings are picked again. Every pick is kept with the measures it
// came from (choices()), for the metrics and the summary.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/policy.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::comm {

// What a pick comes from, agreed by every replica. An exchange of a model of n values through a
// codec costs fixed_s + per_byte_s x the bytes a replica of the group sends for it (a ring's
// 2 (N - 1) / N of the payload for a dense codec, (N - 1) payloads for one that is gathered).
struct tuning_measure {
  double step_s = 0;      // the slowest replica's compute seconds per inner step
  double fixed_s = 0;     // a round's exchange cost that does not grow with its bytes (latencies)
  double per_byte_s = 0;  // seconds per byte a replica sends
  // A small all-reduce's seconds (recursive doubling's latencies), where the exchange may take
  // it (exchange_seconds); 0: every exchange priced as above.
  double small_s = 0;
  // Recursive doubling's seconds per byte of a round's payload (Streaming DiLoCo's probe
  // measures it; DiLoCo's picks price every exchange as a ring and leave it 0; 0: per_byte_s's).
  // Its own: each round sends the whole payload to one partner, and where links differ each
  // round waits for its slowest pair.
  double rd_per_byte_s = 0;
};

// The rounds of recursive doubling among `world` replicas: log2 of the largest power of two in
// it, and two more where the world is none (the replicas beyond it hand their buffer in first
// and get the total back last).
inline double recursive_doubling_rounds(int world) {
  if (world <= 1) return 0;
  const auto p = std::bit_floor(static_cast<unsigned>(world));
  return std::bit_width(p) - 1 + (static_cast<int>(p) == world ? 0 : 2);
}

// One pick: the settings and what they were picked from.
struct tuning_choice {
  std::int64_t step = -1;        // made after this step
  std::int64_t inner_steps = 0;  // H
  std::size_t codec = 0;         // index into auto_tuning::codecs (0 where it has none)
  std::string codec_name;
  double exchange_s = 0;         // the exchange's predicted seconds
  double busy = 0;               // the round's predicted compute share
  std::int64_t fragments = 1;    // Streaming DiLoCo's P (1 otherwise)
  std::int64_t overlap = 0;      // Streaming DiLoCo's tau: inner steps an exchange runs beside (0 otherwise)
  tuning_measure measured;
  std::string why;               // "start", or which measure drifted and by how much
};

// The bytes one replica of `world` sends in an all-reduce of `values` values through `codec`.
template <class Codec>
double exchange_bytes(const Codec& codec, std::size_t values, int world) {
  if (world <= 1) return 0;
  const double payload = static_cast<double>(codec.max_encoded_bytes(values));
  const double w = world;
  return compress::is_dense(codec) ? 2.0 * (w - 1) / w * payload : (w - 1) * payload;
}

// Whether an exchange of `values` values through `codec` goes by recursive doubling, as priced
// by measures `m`: f32 (identity) payloads under `recursive_doubling_below` bytes, as the
// communicator's automatic all-reduce sends them, where m.small_s was measured.
template <class Codec>
bool by_recursive_doubling(const Codec& codec, std::size_t values, const tuning_measure& m, std::size_t recursive_doubling_below) {
  return m.small_s > 0 && static_cast<double>(codec.max_encoded_bytes(values)) < static_cast<double>(recursive_doubling_below) &&
         compress::describe(codec) == "identity";
}

// Recursive doubling's seconds per byte by measures `m` (the ring's where it was not measured).
inline double rd_per_byte(const tuning_measure& m) { return m.rd_per_byte_s > 0 ? m.rd_per_byte_s : m.per_byte_s; }

// A ring's latencies by measures `m`: fixed_s less the small all-reduce it counts (a DiLoCo round
// has one beside its exchange, the sizing's agreement; an exchange alone has none).
inline double ring_latency_s(const tuning_measure& m) { return std::max(0.0, m.fixed_s - m.small_s); }

// The seconds an exchange of `values` values through `codec` among `world` replicas takes by
// measures `m`: by recursive doubling (by_recursive_doubling), its latencies and a payload a
// round at its own seconds per byte; anything else by the ring as exchange_bytes counts its
// bytes, with the ring's latencies.
template <class Codec>
double exchange_seconds(const Codec& codec, std::size_t values, int world, const tuning_measure& m, std::size_t recursive_doubling_below) {
  if (world <= 1) return 0;
  if (by_recursive_doubling(codec, values, m, recursive_doubling_below)) {
    const double payload = static_cast<double>(codec.max_encoded_bytes(values));
    return m.small_s + rd_per_byte(m) * recursive_doubling_rounds(world) * payload;
  }
  return ring_latency_s(m) + m.per_byte_s * exchange_bytes(codec, values, world);
}

// The seconds exchanges of `sizes` values each take when they run at once, each on a lane of
// its own (Streaming DiLoCo's last exchange): their latencies overlap, their bytes share the
// links. Each as exchange_seconds prices it alone; the longest latencies and every byte.
template <class Codec>
double exchanges_at_once_seconds(const Codec& codec, std::span<const std::size_t> sizes, int world, const tuning_measure& m,
                                 std::size_t recursive_doubling_below) {
  tuning_measure latencies = m;
  latencies.per_byte_s = latencies.rd_per_byte_s = 0;
  double longest = 0, bytes = 0;
  for (const auto n : sizes) {
    const double fixed = exchange_seconds(codec, n, world, latencies, recursive_doubling_below);
    longest = std::max(longest, fixed);
    bytes += exchange_seconds(codec, n, world, m, recursive_doubling_below) - fixed;
  }
  return longest + bytes;
}

// `m` with the figures of the algorithm an exchange took scaled by `ratio` (what it took over
// what `m` predicted): recursive doubling's latencies and seconds per byte where `rd`, else the
// ring's; the other algorithm's as they were (an exchange by one says nothing of the other).
inline tuning_measure scaled_for(tuning_measure m, bool rd, double ratio) {
  if (rd) {
    m.rd_per_byte_s = rd_per_byte(m) * ratio;
    const double ring = ring_latency_s(m);  // (kept: small_s is part of fixed_s)
    m.small_s *= ratio;
    m.fixed_s = m.small_s + ring;
  } else {
    const double ring = ring_latency_s(m);
    m.fixed_s += ring * (ratio - 1);
    m.per_byte_s *= ratio;
  }
  return m;
}

template <class Codec>
struct auto_tuning {
  // What it may pick from, least lossy first (each a fresh copy: a codec picked anew starts
  // without the state, an error-feedback residual, of the one it replaces). Empty: the policy's
  // own codec, only H tuned.
  std::vector<Codec> codecs{};
  double busy = 0.97;                   // the compute share a round should keep
  std::int64_t min_inner_steps = 10;    // H's range
  std::int64_t max_inner_steps = 1000;
  std::int64_t prefer_inner_steps = 100;  // a codec needing more gives way to the next one
  std::int64_t min_rounds = 4;          // H at most the run's steps / min_rounds (at least min_inner_steps)
  double drift = 0.3;                   // a measure this far off the pick's (relative) picks again
  // Each round's share in the measures judged for drift (an exponential average since the last
  // pick): one round's noise, a peer's arrival late by part of an inner step, picks nothing.
  double smoothing = 0.3;
  std::size_t probe_values = 1 << 17;   // f32 values of the start's probe (at most an eighth of the model)
  // Streaming DiLoCo's fragment counts to pick from (those above the model's layers left out),
  // and the most of a round its exchanges may overlap (tau <= max_overlap x H).
  std::vector<std::int64_t> fragment_counts{1, 2, 4};
  double max_overlap = 0.1;

  // The most inner steps a pick may take in a run of `run_steps` steps (0: unknown).
  std::int64_t longest_round(std::int64_t run_steps) const {
    return run_steps > 0 ? std::clamp(run_steps / min_rounds, min_inner_steps, max_inner_steps) : max_inner_steps;
  }

  void validate(const char* who) const {
    decentrain::detail::check(busy > 0 && busy < 1, who, ": tune.busy must be in (0, 1), got ", busy);
    decentrain::detail::check(min_inner_steps >= 2 && min_inner_steps <= prefer_inner_steps && prefer_inner_steps <= max_inner_steps,
                              who, ": tune needs 2 <= min_inner_steps <= prefer_inner_steps <= max_inner_steps, got ",
                              min_inner_steps, ", ", prefer_inner_steps, " and ", max_inner_steps);
    decentrain::detail::check(drift > 0 && std::isfinite(drift), who, ": tune.drift must be > 0, got ", drift);
    decentrain::detail::check(min_rounds >= 1, who, ": tune.min_rounds must be >= 1, got ", min_rounds);
    decentrain::detail::check(smoothing > 0 && smoothing <= 1, who, ": tune.smoothing must be in (0, 1], got ", smoothing);
    decentrain::detail::check(probe_values >= 1024, who, ": tune.probe_values must be >= 1024, got ", probe_values);
    decentrain::detail::check(!fragment_counts.empty(), who, ": tune.fragment_counts is empty (1 picks no fragments)");
    decentrain::detail::check(max_overlap > 0 && max_overlap < 1, who, ": tune.max_overlap must be in (0, 1), got ", max_overlap);
    for (const auto p : fragment_counts)
      decentrain::detail::check(p >= 1 && p <= 1024, who, ": tune.fragment_counts holds ", p, " (each must be in [1, 1024])");
  }
  // Compared across the replicas with the policy's other settings.
  std::string describe() const {
    std::string out = "tune(busy=" + std::to_string(busy) + ",rounds>=" + std::to_string(min_rounds) + ",H=" + std::to_string(min_inner_steps) + ".." +
                      std::to_string(prefer_inner_steps) + ".." + std::to_string(max_inner_steps) + ",drift=" + std::to_string(drift) +
                      ",smoothing=" + std::to_string(smoothing) + ",fragments=";
    for (std::size_t i = 0; i < fragment_counts.size(); ++i) out += (i ? ";" : "") + std::to_string(fragment_counts[i]);
    out += ",overlap<=" + std::to_string(max_overlap) + ",codecs=";
    for (std::size_t i = 0; i < codecs.size(); ++i) out += (i ? ";" : "") + compress::describe(codecs[i]);
    return out + ")";
  }

  // The pick for measures `m`, a model of `values` values and `world` replicas, from `own` when
  // codecs is empty, in a run of `run_steps` steps (0: unknown). The same inputs give the same
  // pick on every replica.
  tuning_choice choose(const tuning_measure& m, std::size_t values, int world, const Codec& own, std::int64_t run_steps = 0) const {
    const std::size_t n = codecs.empty() ? 1 : codecs.size();
    const std::int64_t most = longest_round(run_steps);
    const double ratio = busy / (1 - busy);
    tuning_choice best;
    double best_needed = 0;  // (unclamped: at max_inner_steps, the codec that would need fewest)
    for (std::size_t i = 0; i < n; ++i) {
      const Codec& c = codecs.empty() ? own : codecs[i];
      tuning_choice pick;
      pick.codec = i;
      pick.codec_name = compress::describe(c);
      pick.exchange_s = world > 1 ? m.fixed_s + m.per_byte_s * exchange_bytes(c, values, world) : 0.0;
      const double needed = m.step_s > 0 ? std::ceil(ratio * pick.exchange_s / m.step_s) : 0.0;
      pick.inner_steps = std::clamp<std::int64_t>(needed > 1e15 ? most : static_cast<std::int64_t>(needed), min_inner_steps, most);
      const double compute = static_cast<double>(pick.inner_steps) * m.step_s;
      pick.busy = compute + pick.exchange_s > 0 ? compute / (compute + pick.exchange_s) : 1.0;
      pick.measured = m;
      if (needed <= static_cast<double>(std::min(prefer_inner_steps, most))) return pick;  // (it keeps `busy`)
      if (i == 0 || needed < best_needed) {
        best = pick;
        best_needed = needed;
      }
    }
    return best;
  }

  // Streaming DiLoCo's pick for measures `m` (exchanges beside the compute): `largest[k]` is the
  // most values one fragment holds when the model is cut into fragment_counts[k] (0: that count
  // cannot be cut). For each codec, least lossy first, and each count P, the fewest inner steps H
  // whose round keeps the compute `busy`: each fragment's exchange overlaps tau steps, as many as
  // hide it (its predicted seconds over `busy` x the slowest replica's inner step, rounded up)
  // but at most max_overlap x H (a merge brings values tau steps old: more staleness costs more
  // than more inner steps), at least 1; what tau does not hide of the P exchanges, or what the
  // link cannot carry in the round, is exposed. The least H + tau wins, then the fewest
  // fragments; the first codec whose H is within prefer_inner_steps is taken, else the one that
  // needs the fewest (where none keeps `busy` within the most allowed: the busiest at the most).
  // The same inputs give the same pick on every replica.
  tuning_choice choose_streaming(const tuning_measure& m, std::span<const std::size_t> largest, int world, const Codec& own,
                                 std::int64_t run_steps = 0, std::size_t recursive_doubling_below = 0) const {
    decentrain::detail::check(largest.size() == fragment_counts.size(), "auto_tuning: ", largest.size(),
                              " fragment sizes for ", fragment_counts.size(), " fragment counts");
    const std::size_t n = codecs.empty() ? 1 : codecs.size();
    const std::int64_t most = longest_round(run_steps);
    // A round of H inner steps for exchanges of `exchange_s` in P fragments, each `hide` steps
    // from hidden: its overlap and busy share.
    const auto round_of = [&](tuning_choice pick, std::int64_t H, std::int64_t hide) {
      pick.inner_steps = H;
      const auto cap = static_cast<std::int64_t>(std::floor(max_overlap * static_cast<double>(H)));
      pick.overlap = std::clamp<std::int64_t>(std::min(hide, cap), 1, H - 1);
      const double compute = static_cast<double>(H) * m.step_s, P = static_cast<double>(pick.fragments);
      const double exposed = std::max(P * std::max(0.0, pick.exchange_s - static_cast<double>(pick.overlap) * m.step_s),
                                      P * pick.exchange_s - compute);
      pick.busy = compute + exposed > 0 ? compute / (compute + exposed) : 1.0;
      return pick;
    };
    struct candidate {
      tuning_choice pick;
      bool keeps = false;  // busy within the most allowed
      double cost() const { return static_cast<double>(pick.inner_steps + pick.overlap); }
    };
    const auto better = [](const candidate& a, const candidate& b) {
      if (a.keeps != b.keeps) return a.keeps;
      if (!a.keeps && a.pick.busy != b.pick.busy) return a.pick.busy > b.pick.busy;
      if (a.cost() != b.cost()) return a.cost() < b.cost();
      return a.pick.fragments < b.pick.fragments;
    };
    candidate best;
    bool have = false;
    for (std::size_t i = 0; i < n; ++i) {
      const Codec& c = codecs.empty() ? own : codecs[i];
      candidate codec_best;
      bool codec_have = false;
      for (std::size_t k = 0; k < fragment_counts.size(); ++k) {
        if (largest[k] == 0) continue;
        tuning_choice pick;
        pick.codec = i;
        pick.codec_name = compress::describe(c);
        pick.fragments = fragment_counts[k];
        pick.exchange_s = exchange_seconds(c, largest[k], world, m, recursive_doubling_below);
        pick.measured = m;
        const double steps = m.step_s > 0 ? std::ceil(pick.exchange_s / (busy * m.step_s)) : 0.0;
        const auto hide = static_cast<std::int64_t>(std::min(steps, 1e15));
        const std::int64_t least = std::max<std::int64_t>({min_inner_steps, 2, pick.fragments});  // (a fragment a step at most)
        if (least > most) continue;
        candidate here{round_of(pick, most, hide), false};
        for (std::int64_t H = least; H <= most; ++H) {  // (busy grows with H)
          const auto r = round_of(pick, H, hide);
          if (r.busy >= busy) {
            here = {r, true};
            break;
          }
        }
        if (!codec_have || better(here, codec_best)) codec_best = here;
        codec_have = true;
      }
      if (!codec_have) continue;
      if (codec_best.keeps && codec_best.pick.inner_steps <= std::min(prefer_inner_steps, most)) return codec_best.pick;
      if (!have || better(codec_best, best)) best = codec_best;
      have = true;
    }
    decentrain::detail::check(have, "auto_tuning: no fragment count of ", describe(), " fits the model");
    return best.pick;
  }

  // The codec of a run's last exchange, which nothing is left to hide (Streaming DiLoCo's: every
  // fragment at once, of `sizes` values each: exchanges_at_once_seconds): the rounds' codec, codecs[at],
  // where that exchange takes at most `spare_s`; else the least lossy dense codec after it that
  // does, else the quickest of those and the rounds' own. Only dense codecs: each value rounded,
  // none left out (a top-k would drop most of the last round, its residual has no round to go to).
  // Never one before `at`: a run that took a lossier codec for its rounds took it to fit the link.
  // The same inputs give the same pick on every replica.
  tuning_choice choose_last_exchange(const tuning_measure& m, std::span<const std::size_t> sizes, int world, std::size_t at,
                                     double spare_s, std::size_t recursive_doubling_below = 0) const {
    decentrain::detail::check(at < codecs.size(), "auto_tuning: codec ", at, " of ", codecs.size(), " for the last exchange");
    const auto priced = [&](std::size_t i) {
      tuning_choice c;
      c.codec = i;
      c.codec_name = compress::describe(codecs[i]);
      c.fragments = static_cast<std::int64_t>(sizes.size());
      c.exchange_s = exchanges_at_once_seconds(codecs[i], sizes, world, m, recursive_doubling_below);
      c.measured = m;
      return c;
    };
    tuning_choice best = priced(at);
    if (best.exchange_s <= spare_s) return best;
    for (std::size_t i = at + 1; i < codecs.size(); ++i) {
      if (!compress::is_dense(codecs[i])) continue;
      auto c = priced(i);
      if (c.exchange_s <= spare_s) return c;
      if (c.exchange_s < best.exchange_s) best = std::move(c);
    }
    return best;
  }

  // `recent` moved toward a round's `now` by `smoothing`.
  tuning_measure smoothed(const tuning_measure& recent, const tuning_measure& now) const {
    const auto mix = [this](double a, double b) { return a + smoothing * (b - a); };
    return {mix(recent.step_s, now.step_s), mix(recent.fixed_s, now.fixed_s), mix(recent.per_byte_s, now.per_byte_s),
            mix(recent.small_s, now.small_s), mix(recent.rd_per_byte_s, now.rd_per_byte_s)};
  }
  // How far `now` is off `then`, relative, in the measure furthest off, and which: the compute,
  // or the link (the exchange of `bytes` a replica sends, as each predicts it, relative to at
  // least `floor_s`).
  static std::pair<double, const char*> drift_of(const tuning_measure& now, const tuning_measure& then, double bytes,
                                                 double floor_s = 0) {
    return drift_of(now, then, now.fixed_s + now.per_byte_s * bytes, then.fixed_s + then.per_byte_s * bytes, floor_s);
  }
  // The same, with the exchange as each measure predicts it given: `is` by `now`, `was` by `then`.
  static std::pair<double, const char*> drift_of(const tuning_measure& now, const tuning_measure& then, double is, double was,
                                                 double floor_s) {
    const auto off = [](double a, double b) { return b > 0 ? std::abs(a / b - 1) : (a > 0 ? 1e300 : 0.0); };
    const double compute = off(now.step_s, then.step_s);
    const double link = was >= floor_s ? off(is, was) : off(floor_s + (is - was), floor_s);
    return compute >= link ? std::pair{compute, "compute"} : std::pair{link, "link"};
  }
};

// A pick's measures in a checkpoint, exactly (a resumed run drifts from the same numbers).
inline void save_measure(io::checkpoint& c, const std::string& prefix, const tuning_measure& m) {
  save_exact(c, prefix + "step_s", m.step_s);
  save_exact(c, prefix + "fixed_s", m.fixed_s);
  save_exact(c, prefix + "per_byte_s", m.per_byte_s);
  if (m.small_s > 0) save_exact(c, prefix + "small_s", m.small_s);
  if (m.rd_per_byte_s > 0) save_exact(c, prefix + "rd_per_byte_s", m.rd_per_byte_s);
}
inline tuning_measure load_measure(const io::checkpoint& c, const std::string& prefix) {
  return {load_exact(c, prefix + "step_s", "a number of seconds").value_or(0.0),
          load_exact(c, prefix + "fixed_s", "a number of seconds").value_or(0.0),
          load_exact(c, prefix + "per_byte_s", "a number of seconds").value_or(0.0),
          load_exact(c, prefix + "small_s", "a number of seconds").value_or(0.0),
          load_exact(c, prefix + "rd_per_byte_s", "a number of seconds").value_or(0.0)};
}

}  // namespace decentrain::comm
