// Whether a schedule (action.hpp) can run: every micro-batch goes forward and backward once on
// every stage, each peer runs only its own stages, and the peers' orders never wait on one
// another in a circle. A schedule that breaks one is refused with the action that breaks it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

namespace detail {

// The actions `a` waits for, on its own peer or another: the forward of the stage before; for a
// backward (or its input half), this stage's forward and the input gradient of the stage after;
// for a weight half, this stage's input half.
inline std::vector<action> needs(const program& p, const action& a) {
  std::vector<action> out;
  const int last = p.stages() - 1;
  switch (a.what) {
    case op::forward:
      if (a.stage > 0) out.push_back({op::forward, a.micro, a.stage - 1});
      break;
    case op::backward:
    case op::backward_input:
      out.push_back({op::forward, a.micro, a.stage});
      if (a.stage < last) out.push_back({op::backward_input, a.micro, a.stage + 1});  // or the whole backward
      break;
    case op::backward_weight:
      out.push_back({op::backward_input, a.micro, a.stage});
      break;
  }
  return out;
}

// The key of what another action waits for: a whole backward gives the input gradient too.
inline std::tuple<int, int, int> key_of(const action& a) {
  const op what = a.what == op::backward ? op::backward_input : a.what;
  return {static_cast<int>(what), a.micro, a.stage};
}

// Runs the peers' lists in an order that respects every wait, calling `run(peer, action)` for
// each; throws when the peers are stuck (each waits on something that waits on it), naming what
// each stuck peer waits on.
inline void in_dependency_order(const program& p, const std::function<void(int, const action&)>& run) {
  std::map<std::tuple<int, int, int>, bool> done;
  std::vector<std::size_t> next(static_cast<std::size_t>(p.peers()), 0);
  std::size_t left = 0;
  for (const auto& list : p.actions) left += list.size();
  while (left > 0) {
    bool moved = false;
    for (int peer = 0; peer < p.peers(); ++peer) {
      const auto& list = p.actions[static_cast<std::size_t>(peer)];
      auto& i = next[static_cast<std::size_t>(peer)];
      for (; i < list.size(); ++i) {
        const auto wait = needs(p, list[i]);
        bool ready = true;
        for (const auto& w : wait) ready = ready && done.count(key_of(w));
        if (!ready) break;
        run(peer, list[i]);
        done[key_of(list[i])] = true;
        --left;
        moved = true;
      }
    }
    if (!moved) {
      std::string stuck;
      for (int peer = 0; peer < p.peers(); ++peer) {
        const auto& list = p.actions[static_cast<std::size_t>(peer)];
        const auto i = next[static_cast<std::size_t>(peer)];
        if (i == list.size()) continue;
        stuck += decentrain::detail::concat(stuck.empty() ? "" : "; ", "peer ", peer, " at ", to_string(list[i]), " waits on");
        for (const auto& w : needs(p, list[i]))
          if (!done.count(key_of(w))) stuck += decentrain::detail::concat(" ", to_string(w));
      }
      decentrain::detail::fail("schedule: the peers wait on one another and none can go on: ", stuck);
    }
  }
}

}  // namespace detail

// Throws decentrain::error naming the first problem: a stage without a peer, an action of a
// stage its peer does not hold, a micro-batch out of range, a forward or backward missing or
// twice (a backward is whole, or an input half and a weight half), or peers stuck on each other.
inline void check(const program& p) {
  using decentrain::detail::check;
  check(p.micro_batches >= 1, "schedule: needs at least one micro-batch, got ", p.micro_batches);
  check(p.stages() >= 1 && p.peers() >= 1, "schedule: needs at least one stage and one peer");
  for (int s = 0; s < p.stages(); ++s)
    check(p.peer_of[static_cast<std::size_t>(s)] >= 0 && p.peer_of[static_cast<std::size_t>(s)] < p.peers(), "schedule: stage ", s,
          " is held by peer ", p.peer_of[static_cast<std::size_t>(s)], ", outside [0, ", p.peers(), ")");
  std::map<std::tuple<int, int, int>, int> count;
  for (int peer = 0; peer < p.peers(); ++peer)
    for (const auto& a : p.actions[static_cast<std::size_t>(peer)]) {
      check(a.stage >= 0 && a.stage < p.stages(), "schedule: peer ", peer, " runs ", to_string(a), ", of a stage outside [0, ",
            p.stages(), ")");
      check(p.peer_of[static_cast<std::size_t>(a.stage)] == peer, "schedule: peer ", peer, " runs ", to_string(a), " but stage ",
            a.stage, " is held by peer ", p.peer_of[static_cast<std::size_t>(a.stage)]);
      check(a.micro >= 0 && a.micro < p.micro_batches, "schedule: peer ", peer, " runs ", to_string(a), ", of a micro-batch outside [0, ",
            p.micro_batches, ")");
      ++count[{static_cast<int>(a.what), a.micro, a.stage}];
    }
  for (int s = 0; s < p.stages(); ++s)
    for (int m = 0; m < p.micro_batches; ++m) {
      const auto n = [&](op o) {
        const auto it = count.find({static_cast<int>(o), m, s});
        return it == count.end() ? 0 : it->second;
      };
      const auto where = decentrain::detail::concat("micro-batch ", m, " on stage ", s);
      check(n(op::forward) == 1, "schedule: ", where, " goes forward ", n(op::forward), " times (once expected)");
      const bool whole = n(op::backward) == 1 && n(op::backward_input) == 0 && n(op::backward_weight) == 0;
      const bool halves = n(op::backward) == 0 && n(op::backward_input) == 1 && n(op::backward_weight) == 1;
      check(whole || halves, "schedule: ", where, " goes backward ", n(op::backward), " times whole, ", n(op::backward_input),
            " times for its input gradient and ", n(op::backward_weight),
            " for its weight gradient (once whole, or once each half, expected)");
    }
  detail::in_dependency_order(p, [](int, const action&) {});
}

}  // namespace decentrain::parallel::schedule
