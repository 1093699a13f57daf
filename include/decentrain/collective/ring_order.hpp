// The ring's order from measured links (PCCL orders its ring from measured bandwidths too). A
// ring all-reduce takes 2 (N - 1) steps, and in each a peer sends on what it received from its
// left neighbour in the step before: a chain of hops that runs around the ring about twice, so
// the all-reduce takes about twice the ring's hops added up (bench/RESULTS.md, "ring order").
// Over links that differ per pair (peers at two sites, peers with slow and fast connections),
// rank order can cross a slow link at many hops, where an order along the near pairs crosses it
// the fewest times it must. So:
//   - measure_links: every pair's round trip (collective::measure_round_trips), and with a
//     probe size, every pair's bandwidth (a round-robin of timed transfers, each peer with one
//     partner a round);
//   - hop_seconds: what one hop of a given size costs on each pair: half the round trip plus
//     the bytes over the bandwidth;
//   - best_ring: the order whose hops add up to least (a travelling salesman's tour), among
//     those the one whose slowest hop is fastest: exact for up to 16 peers, a heuristic search
//     beyond;
//   - order_ring: all three, then communicator::set_ring_order. Every peer measures the same
//     figures (they are all-gathered) and runs the same pure function on them, so every peer
//     sets the same order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/sites.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::collective {

// What was measured of every pair of n peers, row-major n x n, the same on every peer.
struct measured_links {
  int world = 0;
  std::vector<double> round_trip_s;
  std::vector<double> bytes_per_s;  // empty: not measured (the hops priced by their latency alone)

  double round_trip(int a, int b) const { return round_trip_s[static_cast<std::size_t>(a * world + b)]; }
  // One hop of `bytes` from a to b: half the round trip, plus the bytes over the pair's bandwidth.
  double hop(int a, int b, double bytes) const {
    double s = round_trip(a, b) / 2;
    if (!bytes_per_s.empty() && bytes > 0) {
      const double bw = bytes_per_s[static_cast<std::size_t>(a * world + b)];
      s += bw > 0 ? bytes / bw : 0.0;
    }
    return s;
  }
};

// Every pair's hop of `bytes`, row-major n x n (0 on the diagonal).
inline std::vector<double> hop_seconds(const measured_links& links, double bytes) {
  const int n = links.world;
  std::vector<double> out(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0.0);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) out[static_cast<std::size_t>(a * n + b)] = links.hop(a, b, bytes);
  return out;
}

// The hops of the ring `order` (from each to the next, the last to the first) under `cost`
// (row-major n x n): their sum and the slowest. One ring is better than another when its hops
// add up to less, or, as much (within rounding: sums of the same hops in another order), when
// its slowest hop is faster.
struct ring_cost {
  double total = 0;
  double slowest = 0;
  bool operator<(const ring_cost& o) const {
    if (std::abs(total - o.total) > 1e-12 * std::max(std::abs(total), std::abs(o.total))) return total < o.total;
    return slowest < o.slowest;
  }
};
inline ring_cost cost_of_ring(std::span<const double> cost, int n, std::span<const int> order) {
  ring_cost c;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int a = order[i], b = order[(i + 1) % order.size()];
    if (a == b) continue;
    const double h = cost[static_cast<std::size_t>(a * n + b)];
    c.slowest = std::max(c.slowest, h);
    c.total += h;
  }
  return c;
}

namespace detail {
inline double hop_of(std::span<const double> cost, int n, int a, int b) { return cost[static_cast<std::size_t>(a * n + b)]; }

// The ring from 0 through every peer whose hops add up to least, the slowest hop breaking a tie
// (Held and Karp's dynamic programme over the sets of peers visited). The lowest rank wins a
// tie of both, so the same figures give the same ring.
inline std::vector<int> exact_ring(std::span<const double> cost, int n) {
  const std::size_t sets = std::size_t{1} << n, w = static_cast<std::size_t>(n);
  const ring_cost none{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  std::vector<ring_cost> path(sets * w, none);  // [set * n + j]: the best path from 0 through `set`, ending at j
  const auto extend = [](const ring_cost& c, double h) { return ring_cost{c.total + h, std::max(c.slowest, h)}; };
  path[1 * w + 0] = {0, 0};
  for (std::size_t set = 1; set < sets; set += 2)  // (the sets that hold 0)
    for (int j = 0; j < n; ++j) {
      const ring_cost here = path[set * w + static_cast<std::size_t>(j)];
      if (!(here < none)) continue;
      for (int k = 1; k < n; ++k) {
        if (set >> k & 1) continue;
        ring_cost& there = path[(set | std::size_t{1} << k) * w + static_cast<std::size_t>(k)];
        if (const auto c = extend(here, hop_of(cost, n, j, k)); c < there) there = c;
      }
    }
  const std::size_t all = sets - 1;
  int last = 1;
  ring_cost best = none;
  for (int j = 1; j < n; ++j)
    if (const auto c = extend(path[all * w + static_cast<std::size_t>(j)], hop_of(cost, n, j, 0)); c < best) {
      best = c;
      last = j;
    }
  std::vector<int> order(w);
  std::size_t set = all;
  for (std::size_t at = w - 1; at > 0; --at) {  // back from the last peer: a predecessor whose path extends to this one's
    order[at] = last;
    const std::size_t before = set & ~(std::size_t{1} << last);
    const ring_cost want = path[set * w + static_cast<std::size_t>(last)];
    int from = 0;
    for (int i = 0; i < n; ++i)
      if (before >> i & 1) {
        const auto c = extend(path[before * w + static_cast<std::size_t>(i)], hop_of(cost, n, i, last));
        if (c.total == want.total && c.slowest == want.slowest) {
          from = i;
          break;
        }
      }
    set = before;
    last = from;
  }
  order[0] = 0;
  return order;
}

// Beyond 16 peers (and for tests, on fewer): nearest-neighbour tours from up to 16 peers, each
// improved by reversing stretches (2-opt) and moving single peers while a move makes the ring
// better, the best of them. Beyond 32 peers, 4 tours and 4 passes each, so that every peer's
// pick stays well under a second at a few hundred peers.
inline std::vector<int> search_ring(std::span<const double> cost, int n) {
  const auto improve = [&](std::vector<int>& order) {
    auto best = cost_of_ring(cost, n, order);
    std::vector<int> trial;
    for (int pass = 0; pass < (n <= 32 ? 4 * n : 4); ++pass) {
      bool better = false;
      const auto take = [&] {
        if (const auto c = cost_of_ring(cost, n, trial); c < best) {
          best = c;
          order = trial;
          better = true;
        }
      };
      for (int i = 1; i < n - 1; ++i)
        for (int j = i + 1; j < n; ++j) {
          trial = order;
          std::reverse(trial.begin() + i, trial.begin() + j + 1);
          take();
        }
      for (int i = 1; i < n; ++i)
        for (int j = 1; j < n; ++j) {
          if (i == j) continue;
          trial = order;
          const int moved = trial[static_cast<std::size_t>(i)];
          trial.erase(trial.begin() + i);
          trial.insert(trial.begin() + j, moved);
          take();
        }
      if (!better) return;
    }
  };
  std::vector<int> best(static_cast<std::size_t>(n));
  std::iota(best.begin(), best.end(), 0);
  ring_cost best_cost = cost_of_ring(cost, n, best);
  const int starts = n <= 32 ? std::min(n, 16) : 4;  // (bounded: a pass tries about 1.5 n^2 moves of n hops each)
  for (int k = 0; k < starts; ++k) {
    const int start = k * n / starts;
    std::vector<int> tour{start};
    std::vector<char> used(static_cast<std::size_t>(n), 0);
    used[static_cast<std::size_t>(start)] = 1;
    while (static_cast<int>(tour.size()) < n) {
      const int at = tour.back();
      int next = -1;
      for (int b = 0; b < n; ++b)
        if (!used[static_cast<std::size_t>(b)] && (next < 0 || hop_of(cost, n, at, b) < hop_of(cost, n, at, next))) next = b;
      used[static_cast<std::size_t>(next)] = 1;
      tour.push_back(next);
    }
    std::rotate(tour.begin(), std::find(tour.begin(), tour.end(), 0), tour.end());  // (rank 0 first)
    improve(tour);
    if (const auto c = cost_of_ring(cost, n, tour); c < best_cost) {
      best_cost = c;
      best = tour;
    }
  }
  return best;
}
}  // namespace detail

// The ring order for `cost` (row-major n x n: cost[a n + b] is a hop from a to b), starting at
// rank 0: the least sum of hops, then the fastest slowest hop (ring_cost). Exact for up to 16 peers;
// beyond, a heuristic search (detail::search_ring: good, not proven best). The same figures give
// the same order.
inline constexpr int exact_ring_peers = 16;
inline std::vector<int> best_ring(std::span<const double> cost, int n) {
  decentrain::detail::check(n >= 1 && cost.size() == static_cast<std::size_t>(n) * static_cast<std::size_t>(n), "ring order: ",
                            cost.size(), " hop costs for ", n, " peers (n x n)");
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      decentrain::detail::check(a == b || (std::isfinite(detail::hop_of(cost, n, a, b)) && detail::hop_of(cost, n, a, b) >= 0),
                                "ring order: the hop from peer ", a, " to ", b, " costs ", detail::hop_of(cost, n, a, b),
                                " (not a time)");
  if (n <= 3) {  // (every ring of three is the same up to its direction)
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  return n <= exact_ring_peers ? detail::exact_ring(cost, n) : detail::search_ring(cost, n);
}

// Every pair's round trip and, with probe_bytes > 0, bandwidth, the same on every peer of `comm`
// (every peer calls it). The bandwidths come from n - 1 rounds (n rounded up to even), in which
// every peer has one partner (a round-robin tournament): the lower rank of the pair sends a
// byte and waits for the answer (both have reached the round), then sends probe_bytes and
// waits for the answer that they all arrived, so the time is two one-way latencies and the
// transfer; less the pair's round trip, the transfer's. One direction per pair is measured
// and taken for both. `probe` numbers the call (the same on every peer; tags of its own).
template <class Comm>
measured_links measure_links(Comm& comm, std::size_t probe_bytes = 0, std::uint32_t probe = 0) {
  measured_links out;
  const int n = comm.world(), me = comm.rank();
  out.world = n;
  out.round_trip_s = measure_round_trips(comm, probe);
  if (probe_bytes == 0 || n == 1) return out;
  auto& ep = comm.endpoint();
  const auto clock = [&] { return ep.stats().clock_seconds; };
  const transport::tag_type tag = (transport::tag_type{0x62776964u} << 32) | probe;  // "bwid"
  const int m = n + (n % 2);  // (with an odd n, the partner m - 1 is a bye)
  std::vector<double> mine(static_cast<std::size_t>(n), 0.0);
  std::vector<std::byte> payload(probe_bytes, std::byte{0});
  const std::byte one[1] = {std::byte{1}};
  for (int round = 0; round < m - 1; ++round) {
    // The circle method: m - 1 is fixed, the others meet where their indices add to 2 round.
    const int partner = me == m - 1 ? round : me == round ? m - 1 : ((2 * round - me) % (m - 1) + (m - 1)) % (m - 1);
    if (partner >= n) continue;
    const auto reply = [&](std::size_t expected, const char* what) {
      const auto got = ep.recv(partner, tag);
      decentrain::detail::check(got.size() == expected, "ring order: peer ", partner, " sent ", got.size(), " bytes where ", what,
                                " (", expected, " bytes) belongs");
    };
    if (me < partner) {
      ep.send(partner, tag, std::span<const std::byte>(one));
      reply(1, "an answer");
      const double t0 = clock();
      ep.send(partner, tag, std::span<const std::byte>(payload));
      reply(1, "an answer");
      const double took = clock() - t0 - out.round_trip(me, partner);
      mine[static_cast<std::size_t>(partner)] = took > 0 ? static_cast<double>(probe_bytes) / took : 0.0;
    } else {
      transport::expect(ep, partner, tag, 1);
      reply(1, "a start");
      transport::expect(ep, partner, tag, probe_bytes);  // (before the answer lets it come)
      ep.send(partner, tag, std::span<const std::byte>(one));
      reply(probe_bytes, "the probe");
      ep.send(partner, tag, std::span<const std::byte>(one));
    }
  }
  const auto all = comm.all_gather(std::span<const double>(mine));
  out.bytes_per_s.assign(all.size(), 0.0);
  // A pair whose transfer took no longer than its round trip (jitter, a round trip measured
  // while every peer pinged every other at once) has no figure: it is priced at the slowest
  // pair's bandwidth, not as free.
  double slowest = std::numeric_limits<double>::infinity();
  for (const double x : all)
    if (std::isfinite(x) && x > 0) slowest = std::min(slowest, x);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const double x = all[static_cast<std::size_t>(std::min(a, b) * n + std::max(a, b))];  // (the lower rank measured it)
      out.bytes_per_s[static_cast<std::size_t>(a * n + b)] = std::isfinite(x) && x > 0 ? x : std::isfinite(slowest) ? slowest : 0.0;
    }
  return out;
}

// What order_ring picked, and why.
struct ring_pick {
  std::vector<int> order;
  ring_cost cost;             // the order's hops, as measured
  ring_cost rank_order_cost;  // rank order's
  measured_links links;
};

// Measures the links of `comm`'s peers, picks the order for hops of `hop_bytes` (a ring
// all-reduce's segment: its buffer over the world) and sets it on `comm`. Every peer calls it,
// and every peer sets the same order.
template <class Comm>
ring_pick order_ring(Comm& comm, double hop_bytes, std::size_t probe_bytes = 0, std::uint32_t probe = 0) {
  ring_pick pick;
  pick.links = measure_links(comm, probe_bytes, probe);
  const auto cost = hop_seconds(pick.links, hop_bytes);
  pick.order = best_ring(cost, comm.world());
  std::vector<int> ranks(static_cast<std::size_t>(comm.world()));
  std::iota(ranks.begin(), ranks.end(), 0);
  pick.cost = cost_of_ring(cost, comm.world(), pick.order);
  pick.rank_order_cost = cost_of_ring(cost, comm.world(), ranks);
  comm.set_ring_order(pick.order);
  return pick;
}

}  // namespace decentrain::collective
