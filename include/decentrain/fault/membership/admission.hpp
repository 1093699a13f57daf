// Joiners: a peer that joined a running group waits here to be admitted (await_admission), and
// the leader of an agreement picks the joiners it admits (reaching_one_another).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/fault/membership/messages.hpp"
#include "decentrain/fault/membership/view.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault {

// What the joiners connected to this peer say they reach (their latest hellos), read as they
// come: a member starts an agreement for a joiner only once it reaches every member, and the
// leader admits together joiners that reach one another.
using joiner_reach = std::map<int, std::set<int>>;

// Reads the hellos `joiner` has queued here into `reach` (the latest counts; what else a joiner
// sends before it is a member is stale or malformed: dropped, as the transport bounds it).
template <class E>
void read_hellos(E& ep, int joiner, joiner_reach& reach) {
  for (;;) {
    try {
      const auto m = detail::decode(ep.recv_within(joiner, detail::protocol_tag, std::chrono::milliseconds(0)), joiner);
      if (m.what != detail::kind::hello || !detail::checks::sorted_unique(m.ranks) ||
          !detail::checks::within(m.ranks, std::numeric_limits<int>::max()))
        continue;
      reach[joiner] = std::set<int>(m.ranks.begin(), m.ranks.end());
    } catch (const transport::peer_error&) {
      return;  // nothing more queued (or it is gone: the markers will tell)
    }
  }
}

// Whether `joiner` says it reaches every member of `v` (it is worth an agreement).
inline bool reaches_all(const joiner_reach& reach, int joiner, const view& v) {
  const auto it = reach.find(joiner);
  return it != reach.end() && std::all_of(v.members.begin(), v.members.end(), [&](int m) { return it->second.count(m) > 0; });
}

namespace detail {

// Of `joiners` (every member reaches them), the lowest and each next one that reaches every
// one taken before, both ways, as the joiners' latest hellos say (a joiner whose hello has not
// come is taken only alone).
template <class E>
std::set<int> reaching_one_another(E& ep, const std::set<int>& joiners, joiner_reach& reach) {
  for (int j : joiners) read_hellos(ep, j, reach);
  std::set<int> out;
  for (int j : joiners)
    if (out.empty() || std::all_of(out.begin(), out.end(), [&](int c) { return reach[j].count(c) && reach[c].count(j); }))
      out.insert(j);
  return out;
}

}  // namespace detail

// A peer that joined a running group (tcp: connect() found it running) waits here for a view
// that lists it: one of its members leads the agreement that admits it, at a step of the
// group's choosing, and sends it the view. It is then a member like the others (install, then
// take the state from those at the target).
template <class E>
decision await_admission(E& ep, std::chrono::milliseconds patience) {
  const int me = ep.rank();
  const auto deadline = transport::now(ep) + patience;
  std::map<int, std::string> gone;  // peers whose connection closed while it waited, and why
  std::map<int, std::uint64_t> markers;  // members that sent it a marker (of the view that admits it)
  auto next_look = transport::now(ep), next_hello = next_look;
  std::vector<int> told;  // the peers its last hello listed
  for (;;) {
    // The leader is whichever member is lowest and alive: listen to every connected peer.
    const auto peers = ep.connected();
    // Hellos: every connected peer hears which peers this one reaches, when that changes and
    // every second (the leader of an agreement takes those it has in; a leader that took a hello
    // in an agreement that failed needs it again), so that joiners who reach one another are
    // admitted together.
    if (peers != told || transport::now(ep) >= next_hello) {
      detail::message hello;
      hello.what = detail::kind::hello;
      hello.ranks = detail::as_list(peers);
      for (int j : peers) {
        try {
          detail::post(ep, j, hello);
        } catch (const transport::peer_error&) {
          // gone: found below
        }
      }
      told = peers;
      next_hello = transport::now(ep) + std::chrono::seconds(1);
    }
    for (int j : peers) {
      if (gone.count(j)) continue;
      try {
        const auto m = detail::decode(ep.recv_within(j, detail::protocol_tag, std::chrono::milliseconds(20)), j);
        if (m.what == detail::kind::marker) markers[j] = m.epoch;  // a member that had the view first
        if (m.what != detail::kind::view || !detail::checks::contains(m.ranks, me))
          continue;  // a view of the members that did not admit it yet
        if (detail::invalid_admission(m, j, me, detail::capacity_of(ep))) continue;  // not from a member of it: dropped
        decision d = detail::decision_of(m);
        d.joined = {me};
        for (const auto& [k, e] : markers)
          if (e == m.epoch) d.marked.push_back(k);
        return d;
      } catch (const transport::peer_error& e) {
        if (e.cause() != transport::failure_cause::silent) gone[j] = e.what();
      }
    }
    if (transport::now(ep) >= deadline || (!peers.empty() && gone.size() == peers.size())) {
      std::string why;
      for (const auto& [j, w] : gone) why += decentrain::detail::concat(" (peer ", j, ": ", w, ")");
      decentrain::detail::fail("elastic: peer ", me, " joined the running group but was not admitted within ",
                               patience.count(), " ms (connected to ", peers.size(), " peer(s))", why);
    }
    if (peers.empty()) transport::pause(ep, std::chrono::milliseconds(20));
    if constexpr (requires { ep.rediscover(); })
      if (transport::now(ep) >= next_look) {
        ep.rediscover();  // joiners after this one: the group admits it only once it reaches every member
        next_look = transport::now(ep) + std::chrono::milliseconds(250);
      }
  }
}

}  // namespace decentrain::fault
