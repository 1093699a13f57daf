// How long a schedule (action.hpp) takes when each action's cost is given: each peer runs its
// list in order, an action starts once its peer is free and what it waits on is done (plus a
// transfer time when that was on another peer). The bubble is the share of the peers' time
// spent waiting: 1 - (time all peers were busy) / (peers x makespan), communication not counted
// as busy. Costs are integers (units of the caller's choosing), so that the bubbles the papers
// give in closed form can be checked exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "decentrain/parallel/schedule/action.hpp"
#include "decentrain/parallel/schedule/check.hpp"

namespace decentrain::parallel::schedule {

// What each action costs on one stage: a forward, the input half and the weight half of a
// backward (a whole backward costs both), and a transfer between peers.
struct costs {
  std::int64_t forward = 1;
  std::int64_t backward_input = 1;
  std::int64_t backward_weight = 1;
  std::int64_t transfer = 0;

  std::int64_t of(op o) const {
    switch (o) {
      case op::forward: return forward;
      case op::backward: return backward_input + backward_weight;
      case op::backward_input: return backward_input;
      case op::backward_weight: return backward_weight;
    }
    return 0;
  }
};

struct span {
  action what;
  std::int64_t start = 0, end = 0;
};

struct timeline {
  std::int64_t makespan = 0;
  std::vector<std::int64_t> busy;            // per peer: time spent computing
  std::vector<int> peak_stash;               // per peer: most micro-batches whose activations it held
                                             // at once (forward done, backward not yet; a split
                                             // backward's weight half needs some of them)
  std::vector<std::vector<span>> spans;      // per peer, in its order

  // Time the peers spent waiting, in all: peers x makespan - busy.
  std::int64_t idle() const {
    std::int64_t all = makespan * static_cast<std::int64_t>(busy.size());
    for (auto b : busy) all -= b;
    return all;
  }
  double bubble() const {
    return makespan == 0 ? 0.0 : static_cast<double>(idle()) / static_cast<double>(makespan * static_cast<std::int64_t>(busy.size()));
  }
};

// Times `p` with each stage's own costs, `per_stage[s]` for stage s, and a transfer from stage
// `from` to stage `to` (on different peers) costing `transfer(from, to)` (a link's delay: the
// transfers do not queue behind each other); checked first: a schedule that cannot run is
// refused, naming why.
inline timeline simulate(const program& p, const std::vector<costs>& per_stage,
                         const std::function<std::int64_t(int from, int to)>& transfer) {
  check(p);
  decentrain::detail::check(per_stage.size() == static_cast<std::size_t>(p.stages()), "schedule: ", per_stage.size(),
                            " stages' costs for a program of ", p.stages(), " stages");
  for (const auto& c : per_stage)
    decentrain::detail::check(c.forward >= 0 && c.backward_input >= 0 && c.backward_weight >= 0 && c.transfer >= 0,
                              "schedule: costs must be >= 0");
  timeline t;
  const auto peers = static_cast<std::size_t>(p.peers());
  t.busy.assign(peers, 0);
  t.peak_stash.assign(peers, 0);
  t.spans.resize(peers);
  std::vector<std::int64_t> free_at(peers, 0);
  std::vector<int> stash(peers, 0);
  std::map<std::tuple<int, int, int>, std::int64_t> end_of;  // (op, micro, stage) -> end
  detail::in_dependency_order(p, [&](int peer, const action& a) {
    const auto i = static_cast<std::size_t>(peer);
    const auto& c = per_stage[static_cast<std::size_t>(a.stage)];
    std::int64_t start = free_at[i];
    for (const auto& w : detail::needs(p, a)) {
      const bool elsewhere = p.peer_of[static_cast<std::size_t>(w.stage)] != peer;
      start = std::max(start, end_of.at(detail::key_of(w)) + (elsewhere ? transfer(w.stage, a.stage) : 0));
    }
    const std::int64_t end = start + c.of(a.what);
    end_of[detail::key_of(a)] = end;
    free_at[i] = end;
    t.busy[i] += end - start;
    t.makespan = std::max(t.makespan, end);
    t.spans[i].push_back({a, start, end});
    if (a.what == op::forward) t.peak_stash[i] = std::max(t.peak_stash[i], ++stash[i]);
    if (a.what == op::backward || a.what == op::backward_weight) --stash[i];
  });
  return t;
}

// Each stage's own costs, a transfer costing what the receiving stage's say.
inline timeline simulate(const program& p, const std::vector<costs>& per_stage) {
  return simulate(p, per_stage, [&per_stage](int, int to) {
    return to >= 0 && static_cast<std::size_t>(to) < per_stage.size() ? per_stage[static_cast<std::size_t>(to)].transfer : 0;
  });
}

// The same costs on every stage.
inline timeline simulate(const program& p, const costs& c = {}) {
  return simulate(p, std::vector<costs>(static_cast<std::size_t>(std::max(p.stages(), 0)), c));
}

}  // namespace decentrain::parallel::schedule
