// The membership protocol of an elastic group: views (an epoch and its live peers, as world
// ranks) and how the survivors of a failure agree on the next one.
//
// Why a leader and not a consensus protocol: the failures to survive are crashes, freezes and
// partitions of peers that otherwise follow the protocol (peers that lie are the robust
// aggregation's business), so a rotating leader is enough: the lowest rank that a peer does not
// suspect. Every survivor reports to it where it stands (its step and phase, and the peers it
// knows departed); the leader waits for each member that did not depart (a dead one fails fast:
// its connection closed; a frozen one at the agreement's deadline), then sends the next view. A leader that dies is suspected in turn and the
// next lowest rank leads. No coordinator outside the group is needed, and no peer is special
// for longer than one agreement.
//
// After the view, every member sends every other a marker: what a peer sent before its marker
// belongs to the old view and is dropped (so a collective of the new view never pairs with a
// message of the old, and nothing of the old piles up), and the markers double as the check
// that every member of the view is alive. Members that were behind (a collective finished on
// some peers and not on others) then take the state of the member that got furthest: every
// member of a view continues from the same step with the same parameters.
//
// A view must keep a majority of the previous view's peers that did not depart for certain
// (closed connection, killed): a side of a partition with fewer stops with an error instead of
// training on as a second model. Half exactly: the side with the lowest rank goes on.
//
// A peer that sent poison (failure_cause::convicted: its contributions were dropped or far from
// the aggregate too often) is alive and would take part: the peers that accuse it neither wait
// for it nor let it lead, and the leader excludes it when it accuses it itself or when more than
// half of the other members it heard from do (so one lying member cannot have an honest one
// excluded).
// The view then bars it for good (view::barred): every member refuses it, also as a joiner.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault {

struct view {
  std::uint64_t epoch = 0;
  std::vector<int> members;  // world ranks, ascending
  std::vector<int> barred;   // world ranks excluded from the run for good (convicted), ascending
  bool contains(int r) const { return std::binary_search(members.begin(), members.end(), r); }
  bool bars(int r) const { return std::binary_search(barred.begin(), barred.end(), r); }
};

// Where a peer stands in training: the step, and the phase within it (train::phase as a
// number: start, evaluation, stop check, step, stepped), ordered as the trainer goes through them.
struct position {
  std::int64_t step = 0;
  std::int8_t phase = 0;
  auto operator<=>(const position&) const = default;
};

struct agreement_settings {
  // How long a peer waits for another's report, view, marker or state: the deadline for a peer
  // that is alive (it answers heartbeats) but does not take part; a dead one fails at once.
  std::chrono::milliseconds timeout{60000};
  bool require_majority = true;
  std::size_t state_chunk_bytes = std::size_t{16} << 20;
  // Members at the target that serve the state to those behind, each a share of its chunks.
  int max_donors = 4;
  // The largest state a peer behind accepts from a donor (it holds all of it at once).
  std::uint64_t max_state_bytes = std::uint64_t{64} << 30;
};

// Thrown by agree() on a peer that the next view leaves out while it is alive: its side of a
// partition has no majority, or the others went on without it (they did not hear from it in
// time). fault::elastic may then wait to be taken in again (elastic::left_out).
class left_out_error : public decentrain::error {
 public:
  using decentrain::error::error;
};

// What the survivors agreed on.
struct decision {
  view next;
  position target;              // where every member continues from
  int donor = -1;               // a member at `target`: the others behind it take its state
  std::vector<int> behind;      // members not at `target` (those who joined among them)
  std::vector<int> removed;     // members of the previous view left out
  std::vector<int> joined;      // members new to the group (they joined it running)
  std::vector<int> marked;      // members whose marker of `next` this peer took already (a joiner)
};

namespace detail {

inline constexpr transport::tag_type protocol_tag = transport::membership_tag(2);
inline constexpr transport::tag_type state_tag = transport::membership_tag(3);
inline constexpr std::size_t max_members = 1 << 16;

// hello: a joiner not admitted yet tells the members which peers it is connected to.
enum class kind : std::uint8_t { report = 1, view = 2, marker = 3, hello = 4 };

// Every protocol message: what it means depends on `what`.
struct message {
  kind what = kind::report;
  std::uint64_t epoch = 0;      // report: the view the sender leaves; view, marker: the new view
  std::int64_t step = 0;        // report: the sender's position; view: the target
  std::int8_t phase = 0;
  std::int32_t donor = -1;      // view
  std::vector<std::int32_t> ranks;     // view: the members; report: the joiners the sender is connected to;
                                       // hello: every peer the sender is connected to
  std::vector<std::int32_t> departed;  // report: the peers the sender knows departed; view: the removed
  std::vector<std::int32_t> behind;    // view
  std::vector<std::int32_t> convicted; // report: the peers the sender accuses of poison; view: the barred
  std::string reason;                  // view without members: why the group stops

  template <class Archive>
  void save(Archive& ar) const {
    ar(static_cast<std::uint8_t>(what), epoch, step, phase, donor);
    for (const auto* list : {&ranks, &departed, &behind, &convicted}) {
      ar(cereal::make_size_tag(static_cast<cereal::size_type>(list->size())));
      for (auto r : *list) ar(r);
    }
    transport::wire::save_string(ar, reason);
  }
  template <class Archive>
  void load(Archive& ar) {
    std::uint8_t k = 0;
    ar(k, epoch, step, phase, donor);
    decentrain::detail::check(k >= 1 && k <= 4, "membership: unknown message kind ", static_cast<int>(k));
    what = static_cast<kind>(k);
    for (auto* list : {&ranks, &departed, &behind, &convicted}) {
      cereal::size_type n = 0;
      ar(cereal::make_size_tag(n));
      decentrain::detail::check(n <= max_members, "membership: a list of ", n, " ranks is over the limit");
      list->resize(static_cast<std::size_t>(n));
      for (auto& r : *list) ar(r);
    }
    ar(transport::wire::bounded_string{reason, 4096});
  }
};

inline message decode(const transport::bytes& b, int from) {
  try {
    return transport::wire::decode_body<message>(b, "membership message");
  } catch (const decentrain::error& e) {
    transport::fail_peer(from, "membership", "membership: peer ", from, " sent a malformed message: ", e.what());
  }
}

template <class E>
void post(E& ep, int to, const message& m) {
  const auto b = transport::wire::encode_body(m);
  ep.send(to, protocol_tag, std::span<const std::byte>(b.data(), b.size()));
}

// The next message from `from` that `wanted` accepts; older ones are stale and skipped.
template <class E, class Wanted>
message await(E& ep, int from, std::chrono::steady_clock::time_point deadline, Wanted&& wanted) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transport::now(ep));
    auto m = decode(ep.recv_within(from, protocol_tag, std::max(left, std::chrono::milliseconds(1))), from);
    if (wanted(m)) return m;
  }
}

inline std::vector<std::int32_t> as_list(const std::vector<int>& v) { return {v.begin(), v.end()}; }

// Of `joiners` (every member reaches them), the lowest and each next one that reaches every
// one taken before, both ways, as the joiners' latest hellos say (a joiner whose hello has not
// come is taken only alone).
template <class E>
std::set<int> reaching_one_another(E& ep, const std::set<int>& joiners) {
  std::map<int, std::set<int>> reach;
  for (int j : joiners)
    for (;;) {  // what it sent: hellos only, as it is no member yet; the latest counts
      try {
        const auto m = decode(ep.recv_within(j, protocol_tag, std::chrono::milliseconds(1)), j);
        if (m.what == kind::hello) reach[j] = std::set<int>(m.ranks.begin(), m.ranks.end());
      } catch (const transport::peer_error&) {
        break;  // nothing more queued (or it is gone: the markers will tell)
      }
    }
  std::set<int> out;
  for (int j : joiners)
    if (out.empty() || std::all_of(out.begin(), out.end(), [&](int c) { return reach[j].count(c) && reach[c].count(j); }))
      out.insert(j);
  return out;
}
inline std::vector<int> as_ints(const std::vector<std::int32_t>& v) { return {v.begin(), v.end()}; }

// A view message as a decision (`joined` is the caller's: it knows the previous view).
inline decision decision_of(const message& m) {
  decision d;
  d.next = view{m.epoch, as_ints(m.ranks), as_ints(m.convicted)};
  d.target = position{m.step, m.phase};
  d.donor = m.donor;
  d.behind = as_ints(m.behind);
  d.removed = as_ints(m.departed);
  return d;
}

}  // namespace detail

// The failures a peer knows of: whom it suspects, and whether each departed for certain.
using suspicions = std::map<int, transport::failure_cause>;

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

// Runs the agreement from this peer's side and returns the next view with where every member
// continues from. Throws left_out_error when this peer is left out, or its side has no majority
// (the group stops here rather than splitting in two).
template <class E>
decision agree(E& ep, const view& current, suspicions suspects, position mine, const agreement_settings& s) {
  using detail::kind;
  const int me = ep.rank();
  decentrain::detail::check(current.contains(me), "membership: peer ", me, " is not in view ", current.epoch);
  // Only departures and convictions are certain. A peer that timed out on another may have been
  // waiting on a third (a frozen one) itself: whoever is silent must also fail to report within
  // the agreement's deadline to be left out.
  using transport::failure_cause;
  const auto certain = [](failure_cause c) { return c == failure_cause::departed || c == failure_cause::convicted; };
  int first_suspect = -1;  // named in the alarm even when this peer is not certain of it
  for (const auto& [j, cause] : suspects)
    if (j != me && first_suspect < 0) first_suspect = j;
  std::erase_if(suspects, [&](const auto& s_) { return s_.first == me || !certain(s_.second); });
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
  // Peers that joined the running group and are connected to this one (tcp; see join below).
  auto joiners = [&] {
    std::vector<int> out;
    // A connected peer outside the view is one that joins (a member left out is forgotten:
    // its connections are closed).
    if constexpr (requires { ep.connected(); })
      for (int j : ep.connected())
        if (!current.contains(j) && !current.bars(j)) out.push_back(j);
    return out;
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
      detail::message report;
      report.what = kind::report;
      report.epoch = current.epoch;
      report.step = mine.step;
      report.phase = mine.phase;
      // Only the certain: a leader this peer timed out on may be alive on the other side of a
      // partition, and counting it as departed would hand this side a majority it does not have.
      for (const auto& [j, cause] : suspects)
        if (certain(cause)) (cause == failure_cause::convicted ? report.convicted : report.departed).push_back(j);
      report.ranks = detail::as_list(joiners());
      try {
        detail::post(ep, leader, report);
        // The leader may wait a whole deadline on a frozen member before it sends the view.
        const auto v = detail::await(ep, leader, deadline + s.timeout, [&](const detail::message& m) {
          return m.what == kind::view && m.epoch > current.epoch;
        });
        return from_view(v);
      } catch (const transport::peer_error& e) {
        suspects.emplace(leader, e.cause());
        why[leader] = e.what();
        continue;  // the next lowest rank leads
      }
    }

    // The leader: a report from every member it does not suspect. It admits the joiners that every
    // reporting member and itself are connected to (the view's collectives need all pairs) and
    // that reach one another, as their hellos say (see await_admission): the lowest always, each
    // next one that every one admitted before reaches; the others at a later agreement.
    std::map<int, position> where{{me, mine}};
    const auto mine_joiners = joiners();
    std::set<int> admit(mine_joiners.begin(), mine_joiners.end());
    std::map<int, int> accusers;     // members accused of poison, by how many reporters
    for (std::size_t i = 0; i < alive.size(); ++i) {
      const int j = alive[i];
      if (j == me || suspects.count(j)) continue;
      try {
        const auto r = detail::await(ep, j, deadline, [&](const detail::message& m) {
          return (m.what == kind::report && m.epoch == current.epoch) || (m.what == kind::view && m.epoch > current.epoch);
        });
        if (r.what == kind::view) return from_view(r);  // a view this peer missed: follow it
        where[j] = position{r.step, r.phase};
        const std::set<int> theirs(r.ranks.begin(), r.ranks.end());
        std::erase_if(admit, [&](int x) { return !theirs.count(x); });
        // What the reporter knows departed for certain; its other suspicions this leader checks
        // itself, by waiting for their reports.
        for (const auto x : r.departed)
          if (x != me && current.contains(x)) suspects[x] = transport::failure_cause::departed;
        for (const auto x : r.convicted) ++accusers[x];
      } catch (const transport::peer_error& e) {
        suspects.emplace(j, e.cause());
        why[j] = e.what();
      }
    }

    for (const auto& [x, n] : accusers)  // by a majority of the others heard from (this leader counted)
      if (x != me && current.contains(x) && !suspects.count(x) && 2 * n > static_cast<int>(where.size() - where.count(x)))
        suspects[x] = failure_cause::convicted;

    detail::message v;
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
      admit = detail::reaching_one_another(ep, admit);
      for (int j : admit) {
        v.behind.push_back(j);
        next.push_back(j);
      }
      std::sort(next.begin(), next.end());
      std::sort(v.behind.begin(), v.behind.end());
      v.ranks = detail::as_list(next);
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
        detail::post(ep, j, v);
      } catch (const transport::peer_error&) {
        // it will fail the markers, and the next agreement leaves it out
      }
    }
    return from_view(v);
  }
}

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
        if (m.what != detail::kind::view) continue;
        decision d = detail::decision_of(m);
        if (!d.next.contains(me)) continue;  // a view of the members that did not admit it yet
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

// Installs `d` on this peer: alarms of older views are cleared, removed peers forgotten, and
// markers exchanged with every member (what each sent before its marker is dropped). Returns a
// member that failed meanwhile (the caller then agrees again, from the new view), if one did.
template <class E>
std::optional<transport::peer_error> install(E& ep, const decision& d, const agreement_settings& s) {
  const int me = ep.rank();
  ep.set_epoch(d.next.epoch);
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

// Which members serve the state to those behind: members at the target (not behind), at most
// `max_donors`, from the agreed donor on in the order of the view (wrapping around), so that
// the donors turn with the agreed one.
inline std::vector<int> donors_of(const decision& d, int max_donors) {
  std::vector<int> out;
  if (d.donor < 0) return out;
  std::vector<int> at_target;
  for (int j : d.next.members)
    if (std::find(d.behind.begin(), d.behind.end(), j) == d.behind.end()) at_target.push_back(j);
  const auto first = std::find(at_target.begin(), at_target.end(), d.donor);
  if (first == at_target.end()) return {d.donor};
  const auto at = static_cast<std::size_t>(first - at_target.begin());
  for (std::size_t k = 0; k < at_target.size() && static_cast<int>(out.size()) < max_donors; ++k)
    out.push_back(at_target[(at + k) % at_target.size()]);
  return out;
}

namespace detail {

// A donor's offer: its encoded state's size, its checksum, where each chunk ends (at the
// encoding's pieces, at most state_chunk_bytes), (when there are several donors) each chunk's
// XXH3, so that a peer behind can tell which chunks other donors hold alike, and where each
// tensor's bytes lie, so that a peer behind lands them in its own tensor of that name.
struct state_offer {
  std::uint64_t size = 0, checksum = 0;
  std::vector<std::uint64_t> ends, hashes;
  std::vector<io::encoded_checkpoint::placed_tensor> tensors;
  std::uint64_t chunks() const { return ends.size(); }
  std::uint64_t begin(std::uint64_t i) const { return i == 0 ? 0 : ends[static_cast<std::size_t>(i - 1)]; }
  std::uint64_t length(std::uint64_t i) const { return ends[static_cast<std::size_t>(i)] - begin(i); }
  bool same_layout(const state_offer& o) const { return size == o.size && ends == o.ends; }
};

// A tensor of a longer name is not placed (a taker receives it in its buffer).
inline constexpr std::size_t max_tensor_name_bytes = 4096;

// Words: size, checksum, chunks, hashes (0 or 1), tensors; each chunk's end; each chunk's hash;
// per tensor: where, bytes, the name's length, the name (padded to 8 bytes).
inline std::string encode_offer(const state_offer& o) {
  std::string b;
  auto word = [&](std::uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); };
  for (const std::uint64_t v : {o.size, o.checksum, std::uint64_t{o.ends.size()}, std::uint64_t{o.hashes.empty() ? 0u : 1u},
                                std::uint64_t{o.tensors.size()}})
    word(v);
  for (const auto v : o.ends) word(v);
  for (const auto v : o.hashes) word(v);
  for (const auto& t : o.tensors) {
    word(t.at);
    word(t.bytes);
    word(t.name.size());
    b += t.name;
    b.append((8 - t.name.size() % 8) % 8, '\0');
  }
  return b;
}

inline state_offer decode_offer(const transport::bytes& b, int from, const agreement_settings& s) {
  state_offer o;
  std::size_t at = 0;
  auto malformed = [&](const auto&... what) {
    transport::fail_peer(from, "state", "elastic: peer ", from, " sent a state offer of ", b.size(), " bytes", what...);
  };
  auto word = [&] {
    if (b.size() - at < 8) malformed(", cut short at byte ", at);
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + at, 8);
    at += 8;
    return v;
  };
  if (b.size() < 40 || b.size() % 8 != 0) malformed();
  o.size = word();
  o.checksum = word();
  const std::uint64_t n = word(), hashed = word(), placed = word();
  if (o.size > s.max_state_bytes)
    transport::fail_peer(from, "state", "elastic: peer ", from, " announced a state of ", o.size, " bytes (at most ",
                         s.max_state_bytes, " are accepted: agreement_settings::max_state_bytes)");
  const std::uint64_t words = (b.size() - at) / 8;
  // (Chunks are asked for by 32-bit index.)
  if (n == 0 || n >= (std::uint64_t{1} << 32) || hashed > 1 || n > words / (1 + hashed) || placed > n)
    malformed(" (", n, " chunks, ", placed, " tensors)");
  o.ends.resize(static_cast<std::size_t>(n));
  for (auto& e : o.ends) e = word();
  for (std::uint64_t i = 0; i < n; ++i)
    if (o.ends[static_cast<std::size_t>(i)] <= o.begin(i) || (i + 1 == n && o.ends.back() != o.size))
      transport::fail_peer(from, "state", "elastic: peer ", from, " sent a state offer whose chunk ", i, " ends at ",
                           o.ends[static_cast<std::size_t>(i)], " (chunks must follow one another to the state's ", o.size,
                           " bytes)");
  if (hashed) {
    o.hashes.resize(static_cast<std::size_t>(n));
    for (auto& h : o.hashes) h = word();
  }
  std::uint64_t after = 0;  // where the previous tensor ends: they follow one another
  for (std::uint64_t k = 0; k < placed; ++k) {
    io::encoded_checkpoint::placed_tensor t;
    t.at = word();
    t.bytes = word();
    const std::uint64_t name = word();
    if (t.at < after || t.bytes == 0 || t.at > o.size || t.bytes > o.size - t.at || name > max_tensor_name_bytes ||
        b.size() - at < (name + 7) / 8 * 8)
      malformed(", tensor ", k, " of ", t.bytes, " bytes at ", t.at, " with a name of ", name, " bytes");
    t.name.assign(reinterpret_cast<const char*>(b.data() + at), static_cast<std::size_t>(name));
    at += static_cast<std::size_t>((name + 7) / 8 * 8);
    after = t.at + t.bytes;
    o.tensors.push_back(std::move(t));
  }
  if (at != b.size()) malformed(", ", b.size() - at, " of them after its end");
  return o;
}

// Which donor serves each chunk to each peer behind, the same on every one of them (they all
// hold the same offers): each peer behind takes the state of its own donor (the donors in turn:
// DiLoCo's members at one step share their global parameters but not their inner optimizer's
// moments), and a chunk that other donors hold alike (the same hash) goes to whichever of them
// has been given the fewest bytes so far. Returns, for peer behind `place`, the chunks to ask
// of each donor (indices into offers).
inline std::vector<std::vector<std::uint32_t>> assign_chunks(const std::vector<state_offer>& offers, std::size_t behind,
                                                            std::size_t place, std::uint64_t epoch) {
  const std::size_t n = offers.size();
  std::vector<std::uint64_t> load(n, 0);
  std::vector<std::vector<std::uint32_t>> mine(n);
  for (std::size_t p = 0; p <= place && p < behind; ++p) {
    const std::size_t own = static_cast<std::size_t>((p + epoch) % n);
    const auto& ref = offers[own];
    for (std::uint64_t i = 0; i < ref.chunks(); ++i) {
      const std::uint64_t len = ref.length(i);
      std::size_t best = ref.hashes.empty() ? own : n;  // n: none yet (own holds every chunk)
      if (!ref.hashes.empty())
        for (std::size_t t = 0; t < n; ++t) {
          const std::size_t k = (own + t + static_cast<std::size_t>(i)) % n;  // ties: each chunk starts elsewhere
          const bool holds = k == own || (offers[k].same_layout(ref) && !offers[k].hashes.empty() &&
                                          offers[k].hashes[static_cast<std::size_t>(i)] == ref.hashes[static_cast<std::size_t>(i)]);
          if (holds && (best == n || load[k] < load[best])) best = k;
        }
      load[best] += len;
      if (p == place) mine[best].push_back(static_cast<std::uint32_t>(i));
    }
  }
  return mine;
}

}  // namespace detail

// An encoded state as received: each tensor's bytes landed in this peer's own tensor of that
// name and size (`own`: views of its memory, io::checkpoint::views), where there is one, so that
// nothing is allocated for them (fresh memory is what a large heal pays for most on a VM:
// bench/RESULTS.md, the heal of a GPT-2 124M state); the rest (names, counters, tensors it has
// not) in a buffer, not zeroed first (the chunks land in it straight from the sockets).
class received_state {
 public:
  // Where each chunk of `offer` lands: in `own`'s tensor of the name the offer places it in, when
  // that tensor has as many bytes and is contiguous, else in the buffer.
  received_state(const detail::state_offer& offer, io::checkpoint own) : own_(std::move(own)) {
    std::map<std::string_view, const tensor<cpu>*> mine;
    for (const auto& [name, t] : own_.tensors)
      if (t.defined() && t.is_contiguous() && t.nbytes() > 0) mine.emplace(name, &t);
    // Per chunk: the tensor it lies in (the offer's are in order), or none: the buffer.
    std::vector<std::pair<char*, std::size_t>> where(static_cast<std::size_t>(offer.chunks()), {nullptr, 0});
    std::size_t placed = 0;
    for (std::uint64_t i = 0; i < offer.chunks(); ++i) {
      const std::uint64_t from = offer.begin(i), len = offer.length(i);
      while (placed < offer.tensors.size() && offer.tensors[placed].at + offer.tensors[placed].bytes <= from) ++placed;
      auto& w = where[static_cast<std::size_t>(i)];
      if (placed < offer.tensors.size() && offer.tensors[placed].at <= from &&
          from + len <= offer.tensors[placed].at + offer.tensors[placed].bytes) {
        const auto& t = offer.tensors[placed];
        const auto it = mine.find(t.name);
        if (it != mine.end() && it->second->nbytes() == t.bytes) {
          w.first = static_cast<char*>(it->second->raw_data()) + (from - t.at);
          landed_ += len;
          continue;
        }
      }
      w.second = buffered_;
      buffered_ += static_cast<std::size_t>(len);
    }
    for (const auto& t : offer.tensors) {
      const auto it = mine.find(t.name);
      tensors_buffered_ += it == mine.end() || it->second->nbytes() != t.bytes ? 1 : 0;
    }
    buffer_ = std::make_unique_for_overwrite<char[]>(buffered_);
    for (std::uint64_t i = 0; i < offer.chunks(); ++i) {
      const auto& w = where[static_cast<std::size_t>(i)];
      chunks_.emplace_back(w.first ? w.first : buffer_.get() + w.second, static_cast<std::size_t>(offer.length(i)));
    }
  }

  // Where chunk i lands.
  std::span<char> chunk(std::size_t i) { return chunks_[i]; }
  // Bytes that landed in this peer's own tensors, and tensors of the state that did not (this
  // peer has none of that name and size).
  std::uint64_t landed_bytes() const { return landed_; }
  std::size_t tensors_buffered() const { return tensors_buffered_; }
  bool in_place() const { return landed_ > 0 && tensors_buffered_ == 0; }
  // The state received, in order (io::decode_checkpoint), and what to decode it into: this
  // peer's own tensors, the ones its bytes landed in among them.
  std::vector<std::string_view> pieces() const {
    std::vector<std::string_view> out;
    for (const auto c : chunks_) {
      if (!out.empty() && out.back().data() + out.back().size() == c.data())
        out.back() = std::string_view(out.back().data(), out.back().size() + c.size());  // contiguous: one piece
      else
        out.emplace_back(c.data(), c.size());
    }
    return out;
  }
  const io::checkpoint& into() const { return own_; }

 private:
  io::checkpoint own_;
  std::unique_ptr<char[]> buffer_;
  std::size_t buffered_ = 0;
  std::vector<std::span<char>> chunks_;
  std::uint64_t landed_ = 0;
  std::size_t tensors_buffered_ = 0;
};

// What a state transfer did on this peer.
struct transfer_report {
  std::optional<received_state> state;  // the encoded state it received (it was behind)
  std::uint64_t bytes_served = 0;     // what it sent as a donor
  std::vector<int> donors;            // receiving: the donors it took chunks from
};

// Members behind take the state of members at the target, in chunks from several donors at once
// (hivemind #169: every joiner hit one donor). Each donor offers its encoded state (`state()`,
// read in place chunk by chunk: it must not change until this returns) with its checksum, where
// each of its tensors lies and, with several donors, each chunk's hash; each member behind takes
// the state of one donor (the donors in turn), asking the other donors for the chunks they hold
// alike (detail::assign_chunks), and checks each chunk's hash as it comes; the decode verifies
// the whole. The result is always one donor's state, bit for bit.
//
// With `own` (views of this peer's memory: io::checkpoint::views), a member behind lands each
// tensor's chunks in its own tensor of that name and size (received_state), and sets *torn
// before the first lands: until the caller has loaded a state taken whole, this peer's own state
// is not whole, and a view that has it at the target (no member left to take the state from)
// makes this throw rather than go on from it.
template <class E>
transfer_report transfer_state(E& ep, const decision& d, const std::function<io::encoded_checkpoint()>& state,
                               const agreement_settings& s, const std::function<io::checkpoint()>& own = {},
                               bool* torn = nullptr) {
  using decentrain::detail::check;
  transfer_report out;
  const int me = ep.rank();
  const auto place = std::find(d.behind.begin(), d.behind.end(), me);
  check(!torn || !*torn || place != d.behind.end(), "elastic: peer ", me,
        "'s state was overwritten in part by a state transfer that failed, and view ", d.next.epoch,
        " has no member ahead of it to take the state from again; it stops rather than train on a torn state (its "
        "checkpoints are intact)");
  if (d.behind.empty()) return out;
  const auto donors = donors_of(d, std::max(s.max_donors, 1));
  check(!donors.empty(), "elastic: members are behind but no member is at the target (no donor)");
  const bool donor = std::find(donors.begin(), donors.end(), me) != donors.end();

  if (donor) {
    const io::encoded_checkpoint blob = state();
    std::string scratch;  // (unused: every chunk lies in one piece)
    detail::state_offer offer;
    offer.size = blob.size();
    offer.checksum = blob.checksum();
    offer.tensors = blob.placed_tensors();
    std::erase_if(offer.tensors, [](const auto& t) { return t.name.size() > detail::max_tensor_name_bytes; });  // sent whole
    // Chunks end at the encoding's pieces and are small enough that several donors share a small
    // state, at most state_chunk_bytes.
    const std::uint64_t spread = (offer.size + 4 * donors.size() - 1) / (4 * donors.size());
    const std::uint64_t most = std::max<std::uint64_t>(std::min<std::uint64_t>(s.state_chunk_bytes, spread), 1024);
    for (const std::uint64_t end : blob.piece_ends()) {
      for (std::uint64_t at = offer.ends.empty() ? 0 : offer.ends.back(); end - at > most; at += most) offer.ends.push_back(at + most);
      offer.ends.push_back(end);
    }
    const std::uint64_t chunks = offer.chunks();
    auto chunk_bytes = [&](std::uint64_t i) { return blob.bytes(offer.begin(i), static_cast<std::size_t>(offer.length(i)), scratch); };
    if (donors.size() > 1)
      for (std::uint64_t i = 0; i < chunks; ++i) offer.hashes.push_back(decentrain::detail::xxh3(chunk_bytes(i)));
    const auto encoded = detail::encode_offer(offer);
    for (int j : d.behind) ep.send(j, detail::state_tag, std::as_bytes(std::span(encoded)));
    for (int j : d.behind) {
      const auto request = ep.recv_within(j, detail::state_tag, s.timeout);
      const std::size_t n = request.size() / 4;
      if (request.size() % 4 != 0 || n > chunks)
        transport::fail_peer(j, "state", "elastic: peer ", j, " sent a malformed state request of ", request.size(), " bytes");
      for (std::size_t k = 0; k < n; ++k) {
        std::uint32_t i = 0;
        std::memcpy(&i, request.data() + 4 * k, 4);
        if (i >= chunks) transport::fail_peer(j, "state", "elastic: peer ", j, " asked for chunk ", i, " of ", chunks);
        const auto bytes = chunk_bytes(i);
        ep.send(j, detail::state_tag, std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
        out.bytes_served += bytes.size();
      }
    }
  }
  if (place == d.behind.end()) return out;

  // This peer's own tensors, to land the state in (taken while the donors encode theirs).
  io::checkpoint mine = own ? own() : io::checkpoint{};
  std::vector<detail::state_offer> offers;
  for (int j : donors) offers.push_back(detail::decode_offer(ep.recv_within(j, detail::state_tag, s.timeout), j, s));
  const auto p = static_cast<std::size_t>(place - d.behind.begin());
  const auto asks = detail::assign_chunks(offers, d.behind.size(), p, d.next.epoch);
  const auto& ref = offers[static_cast<std::size_t>((p + d.next.epoch) % offers.size())];
  for (std::size_t k = 0; k < donors.size(); ++k) {
    ep.send(donors[k], detail::state_tag, std::as_bytes(std::span(asks[k])));
    if (!asks[k].empty()) out.donors.push_back(donors[k]);
  }
  received_state got(ref, std::move(mine));
  if (got.landed_bytes() > 0) {
    check(torn != nullptr, "elastic: transfer_state lands a state in this peer's own tensors only given `torn`");
    *torn = true;
  }
  // Each donor's chunks land straight where they go (transport::exchange posts the memory), one
  // donor after the other; what the others send meanwhile the transport queues.
  for (std::size_t k = 0; k < donors.size(); ++k) {
    if (asks[k].empty()) continue;
    std::vector<std::span<std::byte>> ins;
    for (const auto i : asks[k]) ins.push_back(std::as_writable_bytes(got.chunk(i)));
    std::vector<std::size_t> sizes(ins.size(), 0);
    transport::exchange(ep, -1, {}, donors[k], ins, detail::state_tag, [&](std::size_t n, std::size_t size) { sizes[n] = size; });
    for (std::size_t n = 0; n < ins.size(); ++n) {  // checked once every posting is settled
      const std::uint32_t i = asks[k][n];
      if (sizes[n] != ins[n].size())
        transport::fail_peer(donors[k], "state", "elastic: peer ", donors[k], " sent a state chunk of ", sizes[n], " bytes, ",
                             ins[n].size(), " were due");
      const auto chunk = std::string_view(reinterpret_cast<const char*>(ins[n].data()), ins[n].size());
      if (!ref.hashes.empty() && decentrain::detail::xxh3(chunk) != ref.hashes[i])
        transport::fail_peer(donors[k], "state", "elastic: peer ", donors[k], " sent chunk ", i,
                             " of the state unlike the one announced (its hash differs)");
    }
  }
  out.state.emplace(std::move(got));
  return out;
}

}  // namespace decentrain::fault
