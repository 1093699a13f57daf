// How the survivors of a failure agree on the next view (agree: a leader's part and a
// follower's), and how a view is installed (install: markers that end the old view's messages).
//
// Why a leader and not a consensus protocol: the failures to survive are crashes, freezes and
// partitions of peers that otherwise follow the protocol (peers that lie are the robust
// aggregation's business), so a rotating leader is enough: the lowest rank that a peer does not
// suspect. Every survivor reports to it where it stands (its step and phase, and the peers it
// knows departed); the leader waits for each member that did not depart (a dead one fails fast:
// its connection closed; a frozen one at the agreement's deadline), then sends the next view. A
// leader that dies is suspected in turn and the next lowest rank leads. No coordinator outside
// the group is needed, and no peer is special for longer than one agreement.
//
// After the view, every member sends every other a marker: what a peer sent before its marker
// belongs to the old view and is dropped (so a collective of the new view never pairs with a
// message of the old, and nothing of the old piles up), and the markers double as the check
// that every member of the view is alive. Members that were behind (a collective finished on
// some peers and not on others) then take the state of the member that got furthest
// (state_transfer.hpp): every member of a view continues from the same step with the same
// parameters.
//
// A view must keep a majority of the previous view's peers that did not depart for certain
// (closed connection, killed): a side of a partition with fewer stops with an error instead of
// training on as a second model. Half exactly: the side with the lowest rank goes on.
//
// A peer that sent poison (failure_cause::convicted: its contributions were dropped or far from
// the aggregate too often) is alive and would take part: the peers that accuse it neither wait
// for it nor let it lead, and the leader excludes it when it accuses it itself or when more than
// half of the other members it heard from do (so one lying member cannot have an honest one
// excluded). The view then bars it for good (view::barred): every member refuses it, also as a
// joiner.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/fault/membership/admission.hpp"
#include "decentrain/fault/membership/messages.hpp"
#include "decentrain/fault/membership/view.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault {

// Tells every member of `current` that this peer is not certain of, that `failed` failed: their
// waits outside the membership channel fail, and they come to agree too. A convicted member is
// told as well: it then learns in the agreement that it is excluded. Members a send fails to are
// added to `suspects`, and why to `why` when given.
template <class E>
void raise_alarm(E& ep, const view& current, int failed, suspicions& suspects, std::map<int, std::string>* why = nullptr) {
  const auto body = transport::wire::encode_alarm(current.epoch, failed);
  for (int j : current.members) {
    if (j == ep.rank() || (suspects.count(j) && suspects.at(j) != transport::failure_cause::convicted)) continue;
    try {
      ep.send(j, transport::alarm_tag, std::span<const std::byte>(body.data(), body.size()));
    } catch (const transport::peer_error& e) {
      suspects[j] = e.cause();
      if (why != nullptr) (*why)[j] = e.what();
    }
  }
}

namespace detail {

// Only departures and convictions are certain. A peer that timed out on another may have been
// waiting on a third (a frozen one) itself: whoever is silent must also fail to report within
// the agreement's deadline to be left out.
inline bool certain(transport::failure_cause c) {
  return c == transport::failure_cause::departed || c == transport::failure_cause::convicted;
}

// Peers that joined the running group and are connected to this one (tcp; see await_admission):
// a connected peer outside the view is one that joins (a member left out is forgotten: its
// connections are closed).
template <class E>
std::vector<int> joiners_of(E& ep, const view& current) {
  std::vector<int> out;
  if constexpr (requires { ep.connected(); })
    for (int j : ep.connected())
      if (!current.contains(j) && !current.bars(j)) out.push_back(j);
  return out;
}

// The follower's part: reports where this peer stands to `leader` and waits for its view.
// Throws peer_error when the leader fails (the caller then suspects it: the next lowest leads).
template <class E>
message follow(E& ep, const view& current, int leader, const suspicions& suspects, position mine,
               std::chrono::steady_clock::time_point deadline, const agreement_settings& s) {
  message report;
  report.what = kind::report;
  report.epoch = current.epoch;
  report.step = mine.step;
  report.phase = mine.phase;
  // Only the certain: a leader this peer timed out on may be alive on the other side of a
  // partition, and counting it as departed would hand this side a majority it does not have.
  for (const auto& [j, cause] : suspects)
    if (certain(cause)) (cause == transport::failure_cause::convicted ? report.convicted : report.departed).push_back(j);
  report.ranks = as_list(joiners_of(ep, current));
  post(ep, leader, report);
  // The leader may wait a whole deadline on a frozen member before it sends the view.
  return await(ep, leader, deadline + s.timeout, [&](const message& m) { return m.what == kind::view && m.epoch > current.epoch; });
}

// The leader's part: a report from every member it does not suspect, then the next view, sent
// to everyone of the old view that may be listening and to the joiners it admits. Returns that
// view (or one this peer missed, sent by a leader before it).
template <class E>
message lead(E& ep, const view& current, suspicions& suspects, std::map<int, std::string>& why, const std::vector<int>& alive,
             position mine, std::chrono::steady_clock::time_point deadline, const agreement_settings& s) {
  using transport::failure_cause;
  const int me = ep.rank();
  // It admits the joiners that every reporting member and itself are connected to (the view's
  // collectives need all pairs) and that reach one another, as their hellos say (see
  // await_admission): the lowest always, each next one that every one admitted before reaches;
  // the others at a later agreement.
  std::map<int, position> where{{me, mine}};
  const auto mine_joiners = joiners_of(ep, current);
  std::set<int> admit(mine_joiners.begin(), mine_joiners.end());
  std::map<int, int> accusers;  // members accused of poison, by how many reporters
  for (std::size_t i = 0; i < alive.size(); ++i) {
    const int j = alive[i];
    if (j == me || suspects.count(j)) continue;
    try {
      const auto r = await(ep, j, deadline, [&](const message& m) {
        return (m.what == kind::report && m.epoch == current.epoch) || (m.what == kind::view && m.epoch > current.epoch);
      });
      if (r.what == kind::view) return r;  // a view this peer missed: follow it
      where[j] = position{r.step, r.phase};
      const std::set<int> theirs(r.ranks.begin(), r.ranks.end());
      std::erase_if(admit, [&](int x) { return !theirs.count(x); });
      // What the reporter knows departed for certain; its other suspicions this leader checks
      // itself, by waiting for their reports.
      for (const auto x : r.departed)
        if (x != me && current.contains(x)) suspects[x] = failure_cause::departed;
      for (const auto x : r.convicted) ++accusers[x];
    } catch (const transport::peer_error& e) {
      suspects.emplace(j, e.cause());
      why[j] = e.what();
    }
  }

  for (const auto& [x, n] : accusers)  // by a majority of the others heard from (this leader counted)
    if (x != me && current.contains(x) && !suspects.count(x) && 2 * n > static_cast<int>(where.size() - where.count(x)))
      suspects[x] = failure_cause::convicted;

  message v;
  v.what = kind::view;
  v.epoch = current.epoch + 1;
  std::vector<int> next;
  for (int j : current.members)
    if (!suspects.count(j) && where.count(j)) next.push_back(j);
    else v.departed.push_back(j);
  // Quorum: a majority of the previous view less the peers that departed or were convicted.
  int departed = 0;
  for (const auto& [j, cause] : suspects) departed += certain(cause) ? 1 : 0;
  const int voters = static_cast<int>(current.members.size()) - departed;
  const int have = static_cast<int>(next.size());
  const bool majority = 2 * have > voters || (2 * have == voters && [&] {
    for (int j : current.members)
      if (!suspects.count(j) || !certain(suspects.at(j))) return j == next.front();
    return false;
  }());
  if (s.require_majority && !majority) {
    v.ranks.clear();
    v.reason = decentrain::detail::concat("only ", have, " of the ", voters,
                                          " peers that did not depart for certain can reach each other; without a "
                                          "majority this side stops rather than train a second model");
    for (const auto& [j, w] : why) v.reason += decentrain::detail::concat(" (peer ", j, ": ", w, ")");
    for (const auto& [j, c] : suspects)
      if (!why.count(j)) v.reason += decentrain::detail::concat(" (peer ", j, ": ", transport::describe(c), ")");
  } else {
    position target = where.at(next.front());
    for (int j : next) target = std::max(target, where.at(j));
    v.step = target.step;
    v.phase = target.phase;
    for (int j : next)
      if (where.at(j) != target) v.behind.push_back(j);
    // The agreed donor turns with the epoch, so that successive joiners are served by
    // different members.
    std::vector<int> at_target;
    for (int j : next)
      if (where.at(j) == target) at_target.push_back(j);
    v.donor = at_target[static_cast<std::size_t>(v.epoch % at_target.size())];
    admit = reaching_one_another(ep, admit);
    for (int j : admit) {
      v.behind.push_back(j);
      next.push_back(j);
    }
    std::sort(next.begin(), next.end());
    std::sort(v.behind.begin(), v.behind.end());
    v.ranks = as_list(next);
    std::set<int> barred(current.barred.begin(), current.barred.end());
    for (const auto& [j, cause] : suspects)
      if (cause == failure_cause::convicted) barred.insert(j);
    v.convicted.assign(barred.begin(), barred.end());
  }
  // Everyone of the old view that may be listening hears it, the left-out ones included, and
  // the joiners it admits.
  std::vector<int> told = current.members;
  if (!v.ranks.empty()) told.insert(told.end(), admit.begin(), admit.end());
  for (int j : told) {
    if (j == me) continue;
    if (suspects.count(j) && suspects.at(j) == failure_cause::departed) continue;
    try {
      post(ep, j, v);
    } catch (const transport::peer_error&) {
      // it will fail the markers, and the next agreement leaves it out
    }
  }
  return v;
}

}  // namespace detail

// Runs the agreement from this peer's side and returns the next view with where every member
// continues from. Throws left_out_error when this peer is left out, or its side has no majority
// (the group stops here rather than splitting in two).
template <class E>
decision agree(E& ep, const view& current, suspicions suspects, position mine, const agreement_settings& s) {
  const int me = ep.rank();
  decentrain::detail::check(current.contains(me), "membership: peer ", me, " is not in view ", current.epoch);
  int first_suspect = -1;  // named in the alarm even when this peer is not certain of it
  for (const auto& [j, cause] : suspects)
    if (j != me && first_suspect < 0) first_suspect = j;
  std::erase_if(suspects, [&](const auto& s_) { return s_.first == me || !detail::certain(s_.second); });
  auto from_view = [&](const detail::message& m) -> decision {
    if (m.ranks.empty())
      throw left_out_error(decentrain::detail::concat("elastic: the group stopped at view ", current.epoch, ": ", m.reason));
    decision d = detail::decision_of(m);
    decentrain::detail::check(!d.next.bars(me), "elastic: peer ", me, " was excluded from the run in view ", m.epoch,
                              ": the others found what it sent dropped as non-finite or malformed, or far from the "
                              "aggregate, too often (fault::elastic::exclusion); it stops here");
    if (!d.next.contains(me))
      throw left_out_error(decentrain::detail::concat("elastic: peer ", me, " was left out of view ", m.epoch,
                                                      " (the others did not hear from it in time)"));
    for (int j : d.next.members)
      if (!current.contains(j)) d.joined.push_back(j);
    return d;
  };

  // Members this peer could not reach or hear from in the agreement, and why: a view without a
  // majority names them (the reason may be the one that explains it: "excluded it from the run").
  std::map<int, std::string> why;
  for (;;) {
    std::vector<int> alive;
    for (int j : current.members)
      if (!suspects.count(j)) alive.push_back(j);
    const int leader = alive.front();  // `me` is in alive, so never empty
    const auto deadline = transport::now(ep) + s.timeout;
    raise_alarm(ep, current, suspects.empty() ? first_suspect : suspects.begin()->first, suspects, &why);  // wake everyone
    if (leader != me) {
      try {
        return from_view(detail::follow(ep, current, leader, suspects, mine, deadline, s));
      } catch (const transport::peer_error& e) {
        suspects.emplace(leader, e.cause());
        why[leader] = e.what();
        continue;  // the next lowest rank leads
      }
    }
    return from_view(detail::lead(ep, current, suspects, why, alive, mine, deadline, s));
  }
}

// Installs `d` on this peer: alarms of older views are cleared, removed peers forgotten, and
// markers exchanged with every member (what each sent before its marker is dropped). Returns a
// member that failed meanwhile (the caller then agrees again, from the new view), if one did.
template <class E>
std::optional<transport::peer_error> install(E& ep, const decision& d, const agreement_settings& s) {
  const int me = ep.rank();
  ep.set_epoch(d.next.epoch);
  if constexpr (requires { ep.set_members(d.next.members); }) ep.set_members(d.next.members);
  for (int j : d.removed)
    if (j != me && !d.next.bars(j)) ep.forget(j);
  for (int j : d.next.barred)  // also when this peer joined since: it refuses them too
    if (j != me)
      ep.bar(j, decentrain::detail::concat("what it sent was dropped as non-finite or malformed, or far from the aggregate, "
                                           "too often (view ", d.next.epoch, ")"));
  // So are ranks outside the view that are not connected: a joiner whose connection here closed
  // before it was admitted would otherwise be refused as the previous holder of its rank (tcp's
  // welcome) and, as the leader admits only joiners every member reaches, never get in.
  if constexpr (requires { ep.connected(); ep.capacity(); }) {
    const auto connected = ep.connected();
    for (int j = 0; j < ep.capacity(); ++j)
      if (j != me && !d.next.contains(j) && !d.next.bars(j) && !std::binary_search(connected.begin(), connected.end(), j))
        ep.forget(j);
  }
  detail::message marker;
  marker.what = detail::kind::marker;
  marker.epoch = d.next.epoch;
  try {
    for (int j : d.next.members)
      if (j != me) detail::post(ep, j, marker);
    const auto deadline = transport::now(ep) + s.timeout;
    for (int j : d.next.members) {
      if (j == me) continue;
      if (std::find(d.marked.begin(), d.marked.end(), j) == d.marked.end())
        detail::await(ep, j, deadline, [&](const detail::message& m) {
          return m.what == detail::kind::marker && m.epoch == d.next.epoch;
        });
      ep.discard_before(j, detail::protocol_tag);
    }
  } catch (const transport::peer_error& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace decentrain::fault
