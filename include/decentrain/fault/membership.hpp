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
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "decentrain/detail/error.hpp"
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

enum class kind : std::uint8_t { report = 1, view = 2, marker = 3 };

// Every protocol message: what it means depends on `what`.
struct message {
  kind what = kind::report;
  std::uint64_t epoch = 0;      // report: the view the sender leaves; view, marker: the new view
  std::int64_t step = 0;        // report: the sender's position; view: the target
  std::int8_t phase = 0;
  std::int32_t donor = -1;      // view
  std::vector<std::int32_t> ranks;     // view: the members; report: the joiners the sender is connected to
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
    decentrain::detail::check(k >= 1 && k <= 3, "membership: unknown message kind ", static_cast<int>(k));
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
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto m = decode(ep.recv_within(from, protocol_tag, std::max(left, std::chrono::milliseconds(1))), from);
    if (wanted(m)) return m;
  }
}

inline std::vector<std::int32_t> as_list(const std::vector<int>& v) { return {v.begin(), v.end()}; }
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
// continues from. Throws decentrain::error when this peer is left out, or its side has no
// majority (the group stops here rather than splitting in two).
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
      decentrain::detail::fail("elastic: the group stopped at view ", current.epoch, ": ", m.reason);
    decision d = detail::decision_of(m);
    decentrain::detail::check(!d.next.bars(me), "elastic: peer ", me, " was excluded from the run in view ", m.epoch,
                              ": the others found what it sent dropped as non-finite or malformed, or far from the "
                              "aggregate, too often (fault::elastic::exclusion); it stops here");
    decentrain::detail::check(d.next.contains(me), "elastic: peer ", me, " was left out of view ", m.epoch,
                              " (the others did not hear from it in time); it stops here");
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
    const auto deadline = std::chrono::steady_clock::now() + s.timeout;
    raise_alarm(ep, current, suspects.empty() ? first_suspect : suspects.begin()->first, suspects, &why);  // wake everyone

    if (leader != me) {
      detail::message report;
      report.what = kind::report;
      report.epoch = current.epoch;
      report.step = mine.step;
      report.phase = mine.phase;
      for (const auto& [j, cause] : suspects)  // only the certain are kept
        (cause == failure_cause::convicted ? report.convicted : report.departed).push_back(j);
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

    // The leader: a report from every member it does not suspect. It admits a joiner that every
    // reporting member and itself are connected to (the view's collectives need all pairs), the
    // lowest if several: whether two joiners reach each other no member can tell, and the next
    // joiner, once connected to this one too, is taken in at the next agreement.
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
        if (where.at(j) == target) {
          if (v.donor < 0) v.donor = j;
        } else {
          v.behind.push_back(j);
        }
      if (!admit.empty()) {
        const int j = *admit.begin();
        admit = {j};
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
  const auto deadline = std::chrono::steady_clock::now() + patience;
  std::map<int, std::string> gone;  // peers whose connection closed while it waited, and why
  std::map<int, std::uint64_t> markers;  // members that sent it a marker (of the view that admits it)
  auto next_look = std::chrono::steady_clock::now();
  for (;;) {
    // The leader is whichever member is lowest and alive: listen to every connected peer.
    const auto peers = ep.connected();
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
    if (std::chrono::steady_clock::now() >= deadline || (!peers.empty() && gone.size() == peers.size())) {
      std::string why;
      for (const auto& [j, w] : gone) why += decentrain::detail::concat(" (peer ", j, ": ", w, ")");
      decentrain::detail::fail("elastic: peer ", me, " joined the running group but was not admitted within ",
                               patience.count(), " ms (connected to ", peers.size(), " peer(s))", why);
    }
    if (peers.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if constexpr (requires { ep.rediscover(); })
      if (std::chrono::steady_clock::now() >= next_look) {
        ep.rediscover();  // joiners after this one: the group admits it only once it reaches every member
        next_look = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
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
    const auto deadline = std::chrono::steady_clock::now() + s.timeout;
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

// Which members serve the state to those behind: members at the target (not behind), the
// agreed donor first, at most `max_donors`.
inline std::vector<int> donors_of(const decision& d, int max_donors) {
  std::vector<int> out;
  if (d.donor < 0) return out;
  out.push_back(d.donor);
  for (int j : d.next.members)
    if (static_cast<int>(out.size()) < max_donors && j != d.donor &&
        std::find(d.behind.begin(), d.behind.end(), j) == d.behind.end())
      out.push_back(j);
  return out;
}

// What a state transfer did on this peer.
struct transfer_report {
  std::optional<std::string> state;   // the encoded state it received (it was behind)
  std::uint64_t bytes_served = 0;     // what it sent as a donor
  std::vector<int> donors;            // receiving: the donors it took chunks from
};

// Members behind take the state of members at the target, in chunks from several donors at
// once (hivemind #169: every joiner hit one donor). Each donor offers its encoded state's size
// and checksum (`state()` is an encoded checkpoint: its header holds its body's XXH3); each
// member behind asks every donor whose offer equals the agreed donor's for its share of the
// chunks (shifted by its place among those behind, so each donor starts on a different one),
// and the decode verifies the whole. Donors with a different state (DiLoCo peers at the same
// step hold different inner parameters) are asked for nothing, so the result is always one
// donor's state, bit for bit.
template <class E>
transfer_report transfer_state(E& ep, const decision& d, const std::function<std::string()>& state,
                               const agreement_settings& s) {
  using decentrain::detail::check;
  transfer_report out;
  const int me = ep.rank();
  if (d.behind.empty()) return out;
  const auto donors = donors_of(d, std::max(s.max_donors, 1));
  check(!donors.empty(), "elastic: members are behind but no member is at the target (no donor)");
  const bool donor = std::find(donors.begin(), donors.end(), me) != donors.end();
  const auto place = std::find(d.behind.begin(), d.behind.end(), me);
  const auto as_span = [](const auto& v) { return std::as_bytes(std::span(v)); };

  if (donor) {
    const std::string blob = state();
    const std::uint64_t chunk = std::max<std::size_t>(s.state_chunk_bytes, 1024);
    const std::uint64_t chunks = (blob.size() + chunk - 1) / chunk;
    const std::array<std::uint64_t, 3> offer{blob.size(), chunk, io::stored_checksum(blob)};
    for (int j : d.behind) ep.send(j, detail::state_tag, as_span(offer));
    for (int j : d.behind) {
      const auto request = ep.recv_within(j, detail::state_tag, s.timeout);
      const std::size_t n = request.size() / 4;
      if (request.size() % 4 != 0 || n > chunks)
        transport::fail_peer(j, "state", "elastic: peer ", j, " sent a malformed state request of ", request.size(), " bytes");
      for (std::size_t k = 0; k < n; ++k) {
        std::uint32_t i = 0;
        std::memcpy(&i, request.data() + 4 * k, 4);
        if (i >= chunks) transport::fail_peer(j, "state", "elastic: peer ", j, " asked for chunk ", i, " of ", chunks);
        const std::size_t at = static_cast<std::size_t>(i) * chunk;
        const std::size_t len = std::min<std::size_t>(chunk, blob.size() - at);
        ep.send(j, detail::state_tag, std::as_bytes(std::span<const char>(blob.data() + at, len)));
        out.bytes_served += len;
      }
    }
  }
  if (place == d.behind.end()) return out;

  // Offers: every donor's; the agreed donor's is the one to take.
  std::vector<std::array<std::uint64_t, 3>> offers;
  for (int j : donors) {
    const auto b = ep.recv_within(j, detail::state_tag, s.timeout);
    if (b.size() != 24) transport::fail_peer(j, "state", "elastic: peer ", j, " sent a state offer of ", b.size(), " bytes");
    std::array<std::uint64_t, 3> o{};
    std::memcpy(o.data(), b.data(), 24);
    offers.push_back(o);
  }
  const std::uint64_t size = offers.front()[0], chunk = offers.front()[1];
  check(chunk >= 1024 && size <= s.max_state_bytes, "elastic: peer ",
        d.donor, " announced a state of ", size, " bytes in chunks of ", chunk, " (at most ", s.max_state_bytes,
        " bytes are accepted: agreement_settings::max_state_bytes)");
  std::vector<int> serving;  // indices into donors
  for (std::size_t k = 0; k < donors.size(); ++k)
    if (offers[k] == offers.front()) serving.push_back(static_cast<int>(k));
  const std::uint64_t chunks = (size + chunk - 1) / chunk;
  check(chunks < (std::uint64_t{1} << 32), "elastic: a state of ", chunks, " chunks is over the limit");
  std::vector<std::vector<std::uint32_t>> asks(donors.size());
  const auto shift = static_cast<std::uint64_t>(place - d.behind.begin());
  for (std::uint64_t i = 0; i < chunks; ++i)
    asks[static_cast<std::size_t>(serving[(i + shift) % serving.size()])].push_back(static_cast<std::uint32_t>(i));
  for (std::size_t k = 0; k < donors.size(); ++k) {
    ep.send(donors[k], detail::state_tag, as_span(asks[k]));
    if (!asks[k].empty()) out.donors.push_back(donors[k]);
  }
  std::string blob(static_cast<std::size_t>(size), '\0');
  // Chunks arrive from every donor at once (the transport queues each donor's); take them in
  // turn, each donor's in the order asked.
  std::vector<std::size_t> next(donors.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (std::size_t k = 0; k < donors.size(); ++k) {
      if (next[k] == asks[k].size()) continue;
      const std::uint64_t i = asks[k][next[k]++];
      const std::size_t at = static_cast<std::size_t>(i * chunk);
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, size - at));
      const auto part = ep.recv_within(donors[k], detail::state_tag, s.timeout);
      if (part.size() != len)
        transport::fail_peer(donors[k], "state", "elastic: peer ", donors[k], " sent a state chunk of ", part.size(),
                             " bytes, ", len, " were due");
      std::memcpy(blob.data() + at, part.data(), len);
      more = more || next[k] < asks[k].size();
    }
  }
  out.state = std::move(blob);
  return out;
}

}  // namespace decentrain::fault
