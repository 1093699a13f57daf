// Which peer holds which stage of which copy of a pipeline, from the links between the peers.
// DTFM (Yuan et al. 2022, "Decentralized Training of Foundation Models in Heterogeneous
// Environments") models a step's communication as the pipeline's transfers along each copy plus
// the averaging among each stage's copies, and searches the assignments of peers to (stage,
// copy) for the one that makes it shortest; here the same model, with the pipeline timed by the
// schedule simulator (each hop on its own link, the stages' compute given), and a local search:
// from random assignments and the rank order, swap two peers while a swap shortens the step.
// The result goes into parallel::pipeline::ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"

namespace decentrain::parallel {

// A link a -> b: the time before the first byte arrives and the rate after it.
struct link_estimate {
  double latency_s = 0;
  double bytes_per_s = 1e30;
  double seconds(double bytes) const { return latency_s + bytes / bytes_per_s; }
};

// Every ordered pair's link among `world` peers (measured, or a simulator's).
class link_table {
 public:
  explicit link_table(int world) : world_(world), links_(static_cast<std::size_t>(world) * static_cast<std::size_t>(world)) {
    decentrain::detail::check(world >= 1, "link_table: world must be >= 1, got ", world);
  }
  int world() const { return world_; }
  link_estimate& at(int a, int b) { return links_[index(a, b)]; }
  const link_estimate& at(int a, int b) const { return links_[index(a, b)]; }

 private:
  std::size_t index(int a, int b) const {
    decentrain::detail::check(a >= 0 && a < world_ && b >= 0 && b < world_, "link_table: link ", a, " -> ", b,
                              " is outside a world of ", world_);
    return static_cast<std::size_t>(a) * static_cast<std::size_t>(world_) + static_cast<std::size_t>(b);
  }
  int world_;
  std::vector<link_estimate> links_;
};

// What a step of one copy computes and moves, for the cost model.
struct pipeline_traffic {
  std::string schedule = "1f1b";  // one chunk per peer: gpipe, 1f1b or zb-h1
  int micro_batches = 1;
  double activation_bytes = 0;  // one micro-batch's stream between two stages (its gradient as large)
  std::vector<schedule::costs> compute;  // per stage, in microseconds (their `transfer` is not used)
  std::vector<double> parameter_bytes;   // per stage: what its copies average a step (0: nothing)
};

// ranks[s][c]: the world rank that holds stage s of copy c.
using stage_grid = std::vector<std::vector<int>>;

// Peer r at stage r % S of copy r / S (parallel::pipeline's placement without `ranks`).
inline stage_grid rank_order(int stages, int copies) {
  stage_grid g(static_cast<std::size_t>(stages), std::vector<int>(static_cast<std::size_t>(copies)));
  for (int c = 0; c < copies; ++c)
    for (int s = 0; s < stages; ++s) g[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)] = c * stages + s;
  return g;
}

// Throws unless `g` has `stages` rows of equal length holding each of world's ranks once.
inline void check_grid(const stage_grid& g, int stages, int world) {
  using decentrain::detail::check;
  check(g.size() == static_cast<std::size_t>(stages), "pipeline ranks: ", g.size(), " rows for ", stages, " stages");
  std::vector<int> seen;
  for (const auto& row : g) {
    check(row.size() == g.front().size() && !row.empty(), "pipeline ranks: every stage needs as many copies as stage 0 (",
          g.front().size(), "), got ", row.size());
    seen.insert(seen.end(), row.begin(), row.end());
  }
  std::sort(seen.begin(), seen.end());
  check(static_cast<int>(seen.size()) == world && seen.front() == 0 && seen.back() == world - 1 &&
            std::adjacent_find(seen.begin(), seen.end()) == seen.end(),
        "pipeline ranks: must hold each of the ", world, " ranks once");
}

namespace detail {

inline std::int64_t microseconds(double s) { return static_cast<std::int64_t>(std::llround(s * 1e6)); }

// A ring all-reduce of `bytes` among `group`: 2(R - 1) steps, each moving 1/R of the bytes to
// the next peer, paced by the ring's slowest link. The ring goes in rank order, as a replica
// group's does (its communicator holds its ranks ascending).
inline double ring_seconds(std::vector<int> ring, const link_table& links, double bytes) {
  std::sort(ring.begin(), ring.end());
  const auto R = static_cast<int>(ring.size());
  if (R < 2 || bytes <= 0) return 0;
  double slowest = 0;
  for (int i = 0; i < R; ++i)
    slowest = std::max(slowest, links.at(ring[static_cast<std::size_t>(i)], ring[static_cast<std::size_t>((i + 1) % R)]).seconds(bytes / R));
  return 2.0 * (R - 1) * slowest;
}

}  // namespace detail

// A placement's times in seconds: `step`, the slowest copy's pipeline (the schedule simulated
// with the stages' compute and each hop's transfer on its own link) plus the slowest stage's ring
// all-reduce among its copies; `total`, every copy's and every stage's added up (what the search
// also shortens, so that it can move on where a swap leaves the slowest as slow).
struct placement_cost {
  double step = 0, total = 0;
  bool operator<(const placement_cost& o) const {
    constexpr double margin = 1e-9;
    if (step < o.step * (1 - margin)) return true;
    if (o.step < step * (1 - margin)) return false;
    return total < o.total * (1 - margin);
  }
};

inline placement_cost cost_of(const stage_grid& g, const link_table& links, const pipeline_traffic& t,
                              const schedule::program& program) {
  const auto S = g.size();
  decentrain::detail::check(t.compute.size() == S, "pipeline traffic: ", t.compute.size(), " stages' compute for ", S, " stages");
  placement_cost out;
  double slowest_copy = 0, slowest_group = 0;
  for (std::size_t c = 0; c < g.front().size(); ++c) {
    const auto hop = [&](int from, int to) {
      return detail::microseconds(links.at(g[static_cast<std::size_t>(from)][c], g[static_cast<std::size_t>(to)][c]).seconds(t.activation_bytes));
    };
    const double copy = 1e-6 * static_cast<double>(schedule::simulate(program, t.compute, hop).makespan);
    slowest_copy = std::max(slowest_copy, copy);
    out.total += copy;
  }
  for (std::size_t s = 0; s < S; ++s) {
    const double group = detail::ring_seconds(g[s], links, s < t.parameter_bytes.size() ? t.parameter_bytes[s] : 0.0);
    slowest_group = std::max(slowest_group, group);
    out.total += group;
  }
  out.step = slowest_copy + slowest_group;
  return out;
}

// The step's time under `g`, in seconds (placement_cost::step).
inline double step_seconds(const stage_grid& g, const link_table& links, const pipeline_traffic& t) {
  return cost_of(g, links, t, schedule::by_name(t.schedule, static_cast<int>(g.size()), t.micro_batches)).step;
}

// A placement of world = stages x copies peers drawn at random (a uniform permutation).
inline stage_grid random_grid(int stages, int copies, std::mt19937_64& gen) {
  std::vector<int> ranks(static_cast<std::size_t>(stages * copies));
  std::iota(ranks.begin(), ranks.end(), 0);
  std::shuffle(ranks.begin(), ranks.end(), gen);
  stage_grid g = rank_order(stages, copies);
  for (auto& row : g)
    for (auto& r : row) r = ranks[static_cast<std::size_t>(r)];
  return g;
}

// The placement of the links' world into `stages` x world / stages that the search finds
// shortest: from the rank order and `restarts` random placements, each improved by swapping two
// peers while a swap shortens the step, or keeps it and shortens the total (every pair tried in
// turn, the first that does taken), the best of them. Deterministic for a seed.
inline stage_grid place_by_links(const link_table& links, const pipeline_traffic& t, int stages, std::uint64_t seed = 0,
                                 int restarts = 8) {
  const int world = links.world();
  decentrain::detail::check(stages >= 1 && world % stages == 0, "place_by_links: ", world, " peers do not divide into copies of ",
                            stages, " stages");
  decentrain::detail::check(schedule::default_chunks(t.schedule) == 1, "place_by_links: schedule ", t.schedule,
                            " runs several chunks a peer; the cost model places one stage a peer (gpipe, 1f1b, zb-h1)");
  const int copies = world / stages;
  const auto program = schedule::by_name(t.schedule, stages, t.micro_batches);
  std::mt19937_64 gen(seed);
  stage_grid best;
  placement_cost best_cost{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (int start = 0; start <= restarts; ++start) {
    auto g = start == 0 ? rank_order(stages, copies) : random_grid(stages, copies, gen);
    auto now = cost_of(g, links, t, program);
    for (bool improved = true; improved;) {
      improved = false;
      for (int a = 0; a < world && !improved; ++a)
        for (int b = a + 1; b < world && !improved; ++b) {
          auto& x = g[static_cast<std::size_t>(a % stages)][static_cast<std::size_t>(a / stages)];
          auto& y = g[static_cast<std::size_t>(b % stages)][static_cast<std::size_t>(b / stages)];
          std::swap(x, y);
          const auto tried = cost_of(g, links, t, program);
          if (tried < now) {
            now = tried;
            improved = true;
          } else {
            std::swap(x, y);
          }
        }
    }
    if (now < best_cost) {
      best_cost = now;
      best = g;
    }
  }
  return best;
}

}  // namespace decentrain::parallel
