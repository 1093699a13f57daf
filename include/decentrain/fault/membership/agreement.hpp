// How the survivors of a failure agree on the next view (agree: a leader's part and a
// follower's), and how a view is installed (install: markers that end the old view's messages).
//
// A rotating leader, the lowest member a peer may follow: every survivor reports to it where it
// stands (its step and phase, the peers it knows departed, those it accuses of poison, the
// joiners it reaches); the leader waits for each member that did not depart (a dead one fails
// fast: its connection closed; a frozen one at the agreement's deadline), then sends the next
// view. A leader that fails is passed over and the next lowest leads. No coordinator outside the
// group is needed, and no peer is special for longer than one agreement.
//
// Peers that lie in the protocol (agreement_settings::liars; by default fewer than a third of a
// view of 4 or more): every report goes to every member, a departure or a conviction needs more
// than half of the view to say so, a follower echoes only a view that its reports justify, and a
// view is installed as in Bracha's reliable broadcast: a member that sees a quorum of the view
// echo a view is ready for it (as is one that hears more members ready for it than may lie), and
// every member installs the view a quorum is ready for, whichever leader it waits on meanwhile.
// A member is ready for one view per agreement, echoes no other after it and leads with it, so
// no two views are installed, and a view one honest member installs all do. A leader that shows
// two views is caught and barred, one that breaks the form is named. In a view of fewer than 4
// (or with liars = 0) the rules of crash faults hold: the leader's own accusation is enough and
// its view is followed at once.
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
// (closed connection, killed, convicted): a side of a partition with fewer does not train on as a
// second model. Against insiders it waits for the partition to heal (agreement_settings::
// patience); under crash rules it stops with an error, and with half exactly the side with the
// lowest rank goes on. A view bars the members it convicts for good (view::barred): every member
// refuses them, also as joiners.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
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

// The members of a view of `n` that may lie without harm to the others: fewer than a third
// (agreement_settings::liars). Below 4 members none can be tolerated, and the simpler rules of a
// group of crash faults hold.
inline int tolerated(std::size_t n, const agreement_settings& s) {
  const int most = n >= 4 ? static_cast<int>((n - 1) / 3) : 0;
  return s.liars < 0 ? most : std::min(s.liars, most);
}
// Echoes of one view that make it the next (Bracha's echo threshold) among `n` members that did
// not depart for certain: two such sets share more than `f` members, so an honest member echoed
// both, which it never does.
inline std::size_t echo_quorum(std::size_t n, int f) { return (n + static_cast<std::size_t>(f)) / 2 + 1; }
// More than half of the view accuse it.
inline bool by_majority(int accusers, std::size_t n) { return 2 * static_cast<std::size_t>(accusers) > n; }

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

// What this peer heard in one agreement (kept from one leader's turn to the next, as a member
// may run ahead of another by a turn): each member's latest report, the views leaders sent it,
// the views members echoed and those they are ready to install, the markers of the next view
// some sent already (install does not wait for those again).
struct heard {
  std::map<int, message> reports;
  std::map<int, message> views;  // per sender: the view of the next epoch it sent this peer
  std::map<std::pair<int, int>, std::uint64_t> echoes;  // (member, leader): the digest of that leader's view it echoed
  std::set<int> marked;
  std::map<int, std::string> invalid;  // members that sent something malformed or invalid, and what
  std::set<int> refused;  // leaders whose view this peer refused (invalid, unjustified, or one of two)
  std::map<int, int> objections;  // members whose omission from a view this peer refused it for, how often
  // Readies (Bracha's second phase), kept for the whole agreement whoever leads: per member the
  // digest of the view it is ready to install (its first counts), the views by digest, and the
  // view this peer said it is ready for (it echoes no other, and leads with it).
  std::map<int, std::uint64_t> readies;
  std::map<std::uint64_t, message> ready_views;
  std::optional<message> ready;
  int f = 0;  // members that may lie: f + 1 readies of a view hold an honest one's
  std::function<void(const message&)> say_ready;  // this peer's ready, to every member (agree sets it)

  // A leader's turn ended with no view here: what was said to the leaders goes; the readies,
  // the markers and the objections stay (they hold for the agreement, whoever leads).
  void next_round() {
    reports.clear();
    views.clear();
    echoes.clear();
    invalid.clear();
    refused.clear();
  }
};

// The digest a view is echoed and readied by (never the refusal's, below).
inline std::uint64_t echo_digest(const message& v);

// Takes one protocol message `m` from member `j` into `h`: a valid report of `current`, a view,
// an echo or a marker of the next view; a report that breaks the rules is noted (others: stale,
// skipped).
inline void take(heard& h, int j, const message& m, const view& current, int capacity) {
  if (m.what == kind::report && m.epoch == current.epoch) {
    if (auto why = invalid_report(m, current, capacity)) h.invalid[j] = decentrain::detail::concat("its report was invalid: ", *why);
    else h.reports[j] = m;
  } else if (m.what == kind::view && m.epoch == current.epoch + 1) {
    h.views[j] = m;
  } else if (m.what == kind::echo && m.epoch == current.epoch + 1) {
    h.echoes.emplace(std::pair{j, static_cast<int>(m.donor)}, m.digest);  // the first echo of each leader's view counts
  } else if (m.what == kind::marker && m.epoch == current.epoch + 1) {
    h.marked.insert(j);
  } else if (m.what == kind::ready && m.epoch == current.epoch + 1 && !h.readies.count(j)) {
    // More members ready for one view than may lie: an honest one is, after a quorum echoed the
    // view, so this peer is ready for it too (unless it is for another): if any honest member
    // installs the view, every honest one comes to (Bracha's amplification).
    message v = m;
    v.what = kind::view;
    if (auto why = invalid_view(v, current, capacity)) {
      h.invalid[j] = decentrain::detail::concat("its ready names an invalid view: ", *why);
      return;
    }
    const auto d = echo_digest(v);
    h.readies[j] = d;
    h.ready_views.emplace(d, v);
    const auto count = std::count_if(h.readies.begin(), h.readies.end(), [&](const auto& r) { return r.second == d; });
    if (!h.ready && h.say_ready && count > h.f) h.say_ready(v);
  }
}

// The same for a message as it came: one that does not decode is noted like an invalid report,
// and its sender heard still (a member that sends anything is alive, and leaving it out for junk
// it sent one peer would have the others, who heard its report, refuse the view).
inline void take(heard& h, int j, const transport::bytes& b, const view& current, int capacity) {
  message m;
  try {
    m = transport::wire::decode_body<message>(b, "membership message");
  } catch (const decentrain::error& e) {
    h.invalid[j] = decentrain::detail::concat("it sent a malformed message: ", e.what());
    return;
  }
  take(h, j, m, current, capacity);
}

// Reads what the members of `from` sent on the protocol channel until `done()` holds or
// `deadline` passes, each in turn, waiting at most `slice` on one; a member whose connection
// failed is left out from then on.
template <class E, class Done>
void gather(E& ep, const std::vector<int>& from, const view& current, heard& h, std::chrono::steady_clock::time_point deadline,
            Done&& done, std::chrono::milliseconds slice = std::chrono::milliseconds(5)) {
  const int capacity = capacity_of(ep);
  std::vector<int> ask;
  for (int j : from)
    if (j != ep.rank()) ask.push_back(j);
  std::set<int> gone;
  // Each in turn: everything it has queued, waiting a slice for the first (a simulated network
  // delivers only to a wait on its clock, so every member's turn waits a little).
  for (std::size_t turn = 0; !done() && transport::now(ep) < deadline && gone.size() < ask.size(); ++turn) {
    const int j = ask[turn % ask.size()];
    if (gone.count(j)) continue;
    auto wait = slice;
    for (;;) {
      try {
        take(h, j, ep.recv_within(j, protocol_tag, wait), current, capacity);
      } catch (const transport::peer_error& e) {
        if (e.cause() != transport::failure_cause::silent) gone.insert(j);
        break;
      }
      wait = std::chrono::milliseconds(0);
      if (done()) return;
    }
  }
}

// Reads what member `j` sends into `h` until `done()` holds; throws peer_error when `deadline`
// passes first or `j` fails.
template <class E, class Done>
void pull(E& ep, int j, const view& current, heard& h, std::chrono::steady_clock::time_point deadline, Done&& done) {
  const int capacity = capacity_of(ep);
  while (!done()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transport::now(ep));
    take(h, j, ep.recv_within(j, protocol_tag, std::max(left, std::chrono::milliseconds(1))), current, capacity);
  }
}

// How many of the reports in `h` (and this peer's own suspicions) accuse `x`, of departing or
// of poison.
inline int accusations(const heard& h, const suspicions& mine, int me, int x) {
  int n = mine.count(x) && certain(mine.at(x)) ? 1 : 0;
  for (const auto& [j, r] : h.reports)
    if (j != me && j != x && (checks::contains(r.departed, x) || checks::contains(r.convicted, x))) ++n;
  return n;
}

// Why a view that `leader` sent (valid in form) may not be followed by this peer, against
// insiders: it removes a member that reported here, that this peer does not suspect and that
// fewer than half the view accuse, or it bars one without a majority accusing it of poison.
// A member that reports here but not to the leaders (a liar, or a link down) would have this
// peer refuse every view, as each leader in turn leaves it out: its omission is objected to at
// most `objections` times in one agreement (f + 1: one more than the views liars lead in a
// round), after which it counts as silent: it can delay an agreement, not bar or split anyone.
struct objection {
  std::string why;
  int omitted = -1;  // the member left out, when that is the objection
};
inline std::optional<objection> unjustified(const message& v, const view& current, const heard& h, const suspicions& mine, int me,
                                            int objections) {
  const std::size_t n = current.members.size();
  for (int x : current.members) {
    if (x == me || checks::contains(v.ranks, x)) continue;
    const bool barred = checks::contains(v.convicted, x) && !current.bars(x);
    int poison = mine.count(x) && mine.at(x) == transport::failure_cause::convicted ? 1 : 0;
    for (const auto& [j, r] : h.reports)
      if (j != me && j != x && checks::contains(r.convicted, x)) ++poison;
    if (barred && !by_majority(poison, n))
      return objection{decentrain::detail::concat("it bars peer ", x, ", which ", poison, " of the ", n, " members accuse of poison here")};
    const auto objected = h.objections.find(x);
    if (!mine.count(x) && h.reports.count(x) && !by_majority(accusations(h, mine, me, x), n) &&
        (objected == h.objections.end() || objected->second < objections))
      return objection{decentrain::detail::concat("it leaves out peer ", x, ", which reported here and which fewer than half of the view accuse"),
                       x};
  }
  return std::nullopt;
}

// The echo that refuses a leader's view (it broke the rules here): said at once, so that the
// others need not wait out the deadline for a quorum that cannot come.
inline constexpr std::uint64_t refusal = 0;

// Where the echoes of `leader`'s view `digest` stand, among the members of `current` that did not
// depart for certain and are not convicted (more than half of the view said so, in what this
// peer heard): a member the view bars does not echo it.
struct echo_tally {
  std::size_t same = 0, other = 0, refused = 0, quorum = 0, voters = 0;
  bool conflict = false;  // more members than may lie echoed another view of this leader: it sent two
  bool reached() const { return same >= quorum && !conflict; }
  bool decided() const { return reached() || conflict || same + (voters - std::min(voters, same + other + refused)) < quorum; }
};
// The members of `current` that departed or are convicted: more than half of the view say so.
inline std::set<int> out_by_majority(const view& current, const heard& h, const suspicions& mine, int me) {
  const std::size_t n = current.members.size();
  std::set<int> departed;
  for (int x : current.members) {
    int gone = mine.count(x) && mine.at(x) == transport::failure_cause::departed ? 1 : 0;
    int poison = mine.count(x) && mine.at(x) == transport::failure_cause::convicted ? 1 : 0;
    for (const auto& [j, r] : h.reports)
      if (j != me && j != x) {
        gone += checks::contains(r.departed, x) ? 1 : 0;
        poison += checks::contains(r.convicted, x) ? 1 : 0;
      }
    if (by_majority(gone, n) || by_majority(poison, n)) departed.insert(x);
  }
  return departed;
}

inline echo_tally tally(const view& current, int leader, std::uint64_t digest, const heard& h, const suspicions& mine, int f, int me) {
  const std::size_t n = current.members.size();
  const auto departed = out_by_majority(current, h, mine, me);
  echo_tally t;
  t.voters = n - departed.size();
  t.quorum = echo_quorum(t.voters, f);
  for (const auto& [who, d] : h.echoes)
    if (who.second == leader && current.contains(who.first) && !departed.count(who.first))
      (d == digest ? t.same : d == refusal ? t.refused : t.other) += 1;
  t.conflict = t.other > static_cast<std::size_t>(f);
  return t;
}

inline std::uint64_t echo_digest(const message& v) {
  const auto d = digest_of(v);
  return d == refusal ? 1 : d;  // (one view in 2^64)
}

// The view of this agreement that a quorum of the view is ready to install: the next view,
// whoever led it and whoever refused it here. Each honest member is ready for one view only, and
// two quorums share more members than may lie, so no two views reach one.
inline std::optional<message> delivered(const view& current, const heard& h, const suspicions& mine, int f, int me) {
  if (h.readies.empty()) return std::nullopt;
  const auto out = out_by_majority(current, h, mine, me);
  const std::size_t quorum = echo_quorum(current.members.size() - out.size(), f);
  std::map<std::uint64_t, std::size_t> count;
  for (const auto& [j, d] : h.readies)
    if (current.contains(j) && !out.count(j) && ++count[d] >= quorum) return h.ready_views.at(d);
  return std::nullopt;
}

// Sends `m` to every member of `current` but this peer and those departed for certain; one a send
// fails to misses it (the quorum does without it).
template <class E>
void tell_members(E& ep, const view& current, const suspicions& suspects, const message& m) {
  for (int j : current.members) {
    if (j == ep.rank() || (suspects.count(j) && suspects.at(j) == transport::failure_cause::departed)) continue;
    try {
      post(ep, j, m);
    } catch (const transport::peer_error&) {
    }
  }
}

// This peer is ready to install `v`: it tells every member not departed, the view in the message.
template <class E>
void say_ready(E& ep, const view& current, const suspicions& suspects, const message& v, heard& h) {
  if (h.ready) return;
  h.ready = v;
  h.ready->what = kind::view;
  const auto d = echo_digest(*h.ready);
  h.readies[ep.rank()] = d;
  h.ready_views.emplace(d, *h.ready);
  message r = *h.ready;
  r.what = kind::ready;
  tell_members(ep, current, suspects, r);
}

// After a quorum echoed `v` here: this peer is ready for it and waits until a quorum is ready for
// one view (returned), or `deadline` passes.
template <class E>
std::optional<message> ready_for(E& ep, const view& current, const message& v, heard& h, const suspicions& mine, int f,
                                 std::chrono::steady_clock::time_point deadline) {
  h.say_ready(v);
  const auto done = [&] { return delivered(current, h, mine, f, ep.rank()); };
  gather(ep, current.members, current, h, deadline, [&] { return done().has_value(); });
  return done();
}

// Waits until a quorum echoed `leader`'s view `digest` (true), the quorum is out of reach, or
// more members than may lie echoed another view of that leader, or `deadline` passes (false).
template <class E>
bool echoed(E& ep, const view& current, int leader, std::uint64_t digest, heard& h, const suspicions& mine, int f,
            std::chrono::steady_clock::time_point deadline, bool& conflict) {
  auto done = [&] { return tally(current, leader, digest, h, mine, f, ep.rank()).decided(); };
  gather(ep, current.members, current, h, deadline, done);
  const auto t = tally(current, leader, digest, h, mine, f, ep.rank());
  conflict = t.conflict;
  return t.reached();
}

template <class E>
void echo(E& ep, const view& current, const suspicions& suspects, int leader, std::uint64_t digest, heard& h) {
  message e;
  e.what = kind::echo;
  e.epoch = current.epoch + 1;
  e.donor = leader;
  e.digest = digest;
  h.echoes[{ep.rank(), leader}] = digest;
  tell_members(ep, current, suspects, e);
}

// This peer's report in agreement on `current` to `leader`: where it stands, what it knows for
// certain, the joiners connected here. Against insiders every member hears it (each judges the
// leader's view by the reports), otherwise only the leader.
template <class E>
void report(E& ep, const view& current, int leader, const suspicions& suspects, position mine, bool insiders, heard& h) {
  message r;
  r.what = kind::report;
  r.epoch = current.epoch;
  r.step = mine.step;
  r.phase = mine.phase;
  // Only the certain: a leader this peer timed out on may be alive on the other side of a
  // partition, and counting it as departed would hand this side a majority it does not have.
  for (const auto& [j, cause] : suspects)
    if (certain(cause)) (cause == transport::failure_cause::convicted ? r.convicted : r.departed).push_back(j);
  r.ranks = as_list(joiners_of(ep, current));
  r.donor = leader;  // the leader it reports to: that leader waits for one so addressed
  h.reports[ep.rank()] = r;
  for (int j : current.members) {
    // (an accused member hears it too: it judges the view that bars it by the accusations)
    if (j == ep.rank() || (!insiders && j != leader) ||
        (j != leader && suspects.count(j) && suspects.at(j) == transport::failure_cause::departed))
      continue;
    try {
      post(ep, j, r);
    } catch (const transport::peer_error&) {
      if (j == leader) throw;
    }
  }
}

// The leader's view failed (it lied, or no quorum followed it): the caller suspects it.
struct leader_failed {
  transport::failure_cause cause;
  std::string why;
};

// The follower's part: reports where this peer stands to every member (against insiders, so
// each can judge the leader's view) or to `leader`, waits for the leader's view, and (against
// insiders) echoes it only when it is justified by what this peer heard (and is the view this
// peer is ready for, if it is ready for one), is ready for it once a quorum of the view echoed
// it, and follows the view a quorum is ready for. Throws peer_error when the leader fails or
// lied (the caller suspects it: the next lowest leads).
template <class E>
message follow(E& ep, const view& current, int leader, const suspicions& suspects, position mine,
               std::chrono::steady_clock::time_point deadline, const agreement_settings& s, heard& h) {
  const int f = tolerated(current.members.size(), s);
  const bool insiders = f > 0;
  const auto agreed = [&] { return insiders ? delivered(current, h, suspects, f, ep.rank()) : std::nullopt; };
  report(ep, current, leader, suspects, mine, insiders, h);
  // The leader may wait a whole deadline on a frozen member before it sends the view. Against
  // insiders a leader that installed a view (its marker came) sends none: this peer follows the
  // view a quorum is ready for.
  // A leader that reports later than this peer (it was held up, or led another turn first) is
  // given the same allowance from its report.
  const auto view_in = [&] { return h.views.count(leader) > 0 || (insiders && (h.marked.count(leader) > 0 || agreed())); };
  const auto leader_reported = [&] { return h.reports.count(leader) && h.reports.at(leader).donor == leader; };
  pull(ep, leader, current, h, deadline + s.timeout, [&] { return view_in() || (insiders && leader_reported()); });
  if (!view_in()) pull(ep, leader, current, h, std::max(deadline, transport::now(ep)) + s.timeout, view_in);
  if (auto v = agreed()) return *v;
  const auto fail = [&](transport::failure_cause cause, const auto&... why) {
    transport::fail_peer_because(cause, leader, "membership", "membership: leader ", leader, " ", why...);
  };
  if (!h.views.count(leader)) {
    gather(ep, current.members, current, h, deadline + s.timeout, [&] { return agreed().has_value(); });
    if (auto v = agreed()) return *v;
    fail(transport::failure_cause::silent, "installed a view of epoch ", current.epoch + 1, " that no quorum is ready for here");
  }
  const auto v = h.views.at(leader);
  // A view that breaks the form convicts its leader (no honest one sends it); one this peer
  // finds unjustified only passes it over (it may have heard what this peer did not).
  const auto refuse = [&](transport::failure_cause cause, const auto&... why) {
    h.refused.insert(leader);
    if (insiders) echo(ep, current, suspects, leader, refusal, h);
    fail(cause, why...);
  };
  if (auto why = invalid_view(v, current, capacity_of(ep))) refuse(transport::failure_cause::convicted, "sent an invalid view: ", *why);
  if (!insiders) return v;
  const auto digest = echo_digest(v);
  if (h.ready && echo_digest(*h.ready) != digest)
    refuse(transport::failure_cause::other, "sent a view other than the one a quorum echoed here, which this peer is ready to install");
  // The others' reports, to judge the view by (each sent its own to every member): all of them,
  // or those that came within half a second if they justify it (a member that failed sends none).
  std::vector<int> others;
  for (int j : current.members)
    if (j != ep.rank() && !(suspects.count(j) && suspects.at(j) == transport::failure_cause::departed)) others.push_back(j);
  const auto judged_from = transport::now(ep);
  // (The view this peer is ready for it found justified already.)
  if (!h.ready) {
    gather(ep, others, current, h, deadline + s.timeout, [&] {
      return std::all_of(others.begin(), others.end(), [&](int j) { return h.reports.count(j) && h.reports.at(j).donor == leader; }) ||
             (transport::now(ep) - judged_from >= std::chrono::milliseconds(500) && !unjustified(v, current, h, suspects, ep.rank(), f + 1)) ||
             agreed();
    });
    if (auto d = agreed()) return *d;
    if (auto why = unjustified(v, current, h, suspects, ep.rank(), f + 1)) {
      if (why->omitted >= 0) ++h.objections[why->omitted];
      refuse(transport::failure_cause::other, "sent a view that ", why->why);
    }
  }
  echo(ep, current, suspects, leader, digest, h);
  h.echoes[{leader, leader}] = digest;  // the view it sent is its echo
  bool conflict = false;
  if (!echoed(ep, current, leader, digest, h, suspects, f, transport::now(ep) + s.timeout, conflict)) {
    if (auto d = agreed()) return *d;
    if (conflict) h.refused.insert(leader);
    fail(conflict ? transport::failure_cause::convicted : transport::failure_cause::silent,
         conflict ? "sent different views of epoch " : "sent a view that too few members echoed, of epoch ", v.epoch);
  }
  if (auto d = ready_for(ep, current, v, h, suspects, f, transport::now(ep) + s.timeout)) return *d;
  transport::fail_peer_because(transport::failure_cause::silent, leader, "membership", "membership: leader ", leader,
                               " sent a view that a quorum echoed but too few members are ready to install, of epoch ", v.epoch);
}

// The leader's part: a report from every member it does not suspect, then the next view, sent
// to everyone of the old view that may be listening and to the joiners it admits; against
// insiders, once a quorum echoed it. Returns that view; throws leader_failed when no quorum
// followed it.
template <class E>
message lead(E& ep, const view& current, suspicions& suspects, std::map<int, std::string>& why, const std::vector<int>& alive,
             position mine, std::chrono::steady_clock::time_point deadline, const agreement_settings& s, heard& h,
             joiner_reach& reach) {
  using transport::failure_cause;
  const int me = ep.rank();
  const std::size_t n = current.members.size();
  const int f = tolerated(n, s);
  const bool insiders = f > 0;
  // It admits the joiners that every reporting member and itself are connected to (the view's
  // collectives need all pairs) and that reach one another, as their hellos say (see
  // await_admission): the lowest always, each next one that every one admitted before reaches;
  // the others at a later agreement.
  std::map<int, position> where{{me, mine}};
  const auto mine_joiners = joiners_of(ep, current);
  std::set<int> admit(mine_joiners.begin(), mine_joiners.end());
  std::map<int, int> departures, accusers;  // members reported departed, accused of poison, by how many reporters
  for (const auto& [x, cause] : suspects)
    if (cause == failure_cause::departed) ++departures[x];
  const auto agreed = [&] { return insiders ? delivered(current, h, suspects, f, me) : std::nullopt; };
  if (insiders) report(ep, current, me, suspects, mine, true, h);  // its own voice, heard by every member
  // Against insiders this leader's own accusations are one voice among the view's: it asks
  // every member, the accused too; otherwise it waits for no member it suspects.
  for (std::size_t i = 0; i < (insiders ? current.members.size() : alive.size()); ++i) {
    const int j = insiders ? current.members[i] : alive[i];
    if (j == me || (suspects.count(j) && (!insiders || suspects.at(j) == failure_cause::departed))) continue;
    try {
      // An invalid report is noted (decision::named) and its sender waited for still: a member
      // that sends anything is alive, and leaving it out for what it sent here alone would let it
      // have the followers, to whom it reported, refuse every view.
      // Against insiders, a member that reported in this agreement to another leader only (it
      // was following that one while this peer led: their turns drifted apart) is alive too, and
      // its report stands.
      try {
        pull(ep, j, current, h, deadline, [&] { return (h.reports.count(j) && h.reports.at(j).donor == me) || agreed(); });
      } catch (const transport::peer_error& e) {
        if (!insiders || e.cause() != failure_cause::silent || !h.reports.count(j)) throw;
      }
      if (auto d = agreed()) return *d;
      const auto& r = h.reports.at(j);
      where[j] = position{r.step, r.phase};
      const std::set<int> theirs(r.ranks.begin(), r.ranks.end());
      std::erase_if(admit, [&](int x) { return !theirs.count(x); });
      // What the reporter knows departed for certain; its other suspicions this leader checks
      // itself, by waiting for their reports. Against insiders a departure, like a conviction,
      // is certain only when more than half of the view say so.
      for (const auto x : r.departed)
        if (x != me && current.contains(x)) {
          if (!insiders) suspects[x] = failure_cause::departed;
          else if (++departures[x]; by_majority(departures[x], n)) suspects[x] = failure_cause::departed;
        }
      for (const auto x : r.convicted) ++accusers[x];
    } catch (const transport::peer_error& e) {
      suspects.emplace(j, e.cause());
      why[j] = e.what();
    }
  }
  for (const auto& [x, cause] : suspects)
    if (cause == failure_cause::convicted && x != me) ++accusers[x];  // this leader's own accusation
  for (const auto& [x, k] : accusers) {
    if (x == me || !current.contains(x)) continue;
    // Against insiders: more than half of the view; a lone accusation (this leader's too) is not
    // enough. Otherwise: this leader's own accusation (it did not wait for the accused), or more
    // than half of the others heard from.
    const bool convicted = insiders ? by_majority(k, n)
                                    : (suspects.count(x) && suspects.at(x) == failure_cause::convicted) ||
                                          2 * k > static_cast<int>(where.size() - where.count(x));
    if (convicted) suspects[x] = failure_cause::convicted;
    else if (insiders && suspects.count(x) && suspects.at(x) == failure_cause::convicted) suspects.erase(x);
  }

  message v;
  v.what = kind::view;
  v.epoch = current.epoch + 1;
  std::vector<int> next;
  for (int j : current.members)
    if (where.count(j) && (!suspects.count(j) || (insiders && !certain(suspects.at(j))))) next.push_back(j);
    else v.departed.push_back(j);
  // Quorum: a majority of the previous view less the peers that departed or were convicted.
  int departed = 0;
  for (const auto& [j, cause] : suspects) departed += certain(cause) ? 1 : 0;
  const int voters = static_cast<int>(n) - departed;
  const int have = static_cast<int>(next.size());
  const bool majority = have > 0 && (2 * have > voters || (2 * have == voters && [&] {
    for (int j : current.members)
      if (!suspects.count(j) || !certain(suspects.at(j))) return j == next.front();
    return false;
  }()));
  if (s.require_majority && !majority && insiders)  // no view of this side: wait for the partition to heal (agree)
    throw leader_failed{failure_cause::silent,
                        decentrain::detail::concat("only ", have, " of the ", voters, " peers that did not depart for certain reached this leader")};
  if (s.require_majority && !majority) {
    v.ranks.clear();
    v.reason = decentrain::detail::concat("only ", have, " of the ", voters,
                                          " peers that did not depart for certain can reach each other; without a "
                                          "majority this side stops rather than train a second model");
    for (const auto& [j, w] : why) v.reason += decentrain::detail::concat(" (peer ", j, ": ", w, ")");
    for (const auto& [j, c] : suspects)
      if (!why.count(j)) v.reason += decentrain::detail::concat(" (peer ", j, ": ", transport::describe(c), ")");
  } else {
    // The target: the furthest position that more members reach than may lie (all of them
    // below 4), so a liar claiming a step no one else reached does not make itself the donor.
    std::vector<position> reached;
    for (int j : next) reached.push_back(where.at(j));
    std::sort(reached.begin(), reached.end(), std::greater<>());
    const position target = reached[std::min(reached.size() - 1, static_cast<std::size_t>(f))];
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
    admit = reaching_one_another(ep, admit, reach);
    for (int j : admit) {
      v.behind.push_back(j);
      next.push_back(j);
    }
    std::sort(next.begin(), next.end());
    std::sort(v.behind.begin(), v.behind.end());
    v.ranks = as_list(next);
    std::set<int> barred(current.barred.begin(), current.barred.end());
    for (const auto& [j, cause] : suspects)
      if (cause == failure_cause::convicted && current.contains(j) && j != me) barred.insert(j);
    v.convicted.assign(barred.begin(), barred.end());
  }
  // Against insiders, a leader ready for a view (a quorum echoed it here, or more members than
  // may lie are ready for it) leads with that one: it echoes no other, and the honest members
  // ready for it are too. A leader that heard a member ready for a view it finds justified leads
  // with that one as well, so that a view some are ready for is not left for another.
  // (At the target this leader found: a liar's ready cannot move the group to a step of its own.)
  if (insiders) {
    if (h.ready) {
      v = *h.ready;
    } else if (!v.ranks.empty()) {
      const message own = v;
      std::map<std::uint64_t, std::size_t> votes;
      for (const auto& [j, d] : h.readies) ++votes[d];
      std::size_t most = 0;
      for (const auto& [d, k] : votes) {
        const auto& other = h.ready_views.at(d);
        if (k > most && other.step == own.step && other.phase == own.phase && !unjustified(other, current, h, suspects, me, f + 1)) {
          most = k;
          v = other;
        }
      }
    }
  }
  // Everyone of the old view that may be listening hears it, the left-out ones included, and
  // the joiners it admits.
  std::vector<int> told = current.members;
  for (const auto j : v.ranks)
    if (!current.contains(j)) told.push_back(j);
  for (int j : told) {
    if (j == me) continue;
    if (suspects.count(j) && suspects.at(j) == failure_cause::departed) continue;
    try {
      post(ep, j, v);
    } catch (const transport::peer_error&) {
      // it will fail the markers, and the next agreement leaves it out
    }
  }
  if (!insiders) return v;
  const auto digest = echo_digest(v);
  h.echoes[{me, me}] = digest;
  bool conflict = false;
  if (!echoed(ep, current, me, digest, h, suspects, f, transport::now(ep) + s.timeout, conflict)) {
    if (auto d = agreed()) return *d;
    throw leader_failed{failure_cause::silent,
                        decentrain::detail::concat("too few members echoed the view this peer led to (epoch ", v.epoch, ")")};
  }
  if (auto d = ready_for(ep, current, v, h, suspects, f, transport::now(ep) + s.timeout)) return *d;
  throw leader_failed{failure_cause::silent,
                      decentrain::detail::concat("a quorum echoed the view this peer led to (epoch ", v.epoch,
                                                 ") but too few members are ready to install it")};
}

}  // namespace detail

// Runs the agreement from this peer's side and returns the next view with where every member
// continues from. Throws left_out_error when this peer is left out, or its side has no majority
// (the group stops here rather than splitting in two).
//
// Against insiders (agreement_settings::liars: by default fewer than a third of a view of 4 or
// more may lie, the leader included), a departure or a conviction needs more than half of the
// view to say so, every member hears every report, a member echoes its leader's view only when
// what it heard justifies it, and installs the view a quorum of the view is ready for (Bracha's
// echo and ready phases): a leader that shows different views to different members, or leaves
// out one that reported, is followed by no one, and is named.
// `reach`: what joiners said they reach (read_hellos), kept between agreements by the caller.
template <class E>
decision agree(E& ep, const view& current, suspicions suspects, position mine, const agreement_settings& s,
               joiner_reach* reach = nullptr) {
  joiner_reach none;
  joiner_reach& known = reach != nullptr ? *reach : none;
  const int me = ep.rank();
  decentrain::detail::check(current.contains(me), "membership: peer ", me, " is not in view ", current.epoch);
  int first_suspect = -1;  // named in the alarm even when this peer is not certain of it
  for (const auto& [j, cause] : suspects)
    if (j != me && first_suspect < 0) first_suspect = j;
  std::erase_if(suspects, [&](const auto& s_) { return s_.first == me || !detail::certain(s_.second); });
  detail::heard h;
  // Members this peer could not reach or hear from in the agreement, and why: a view without a
  // majority names them (the reason may be the one that explains it: "excluded it from the run").
  std::map<int, std::string> why;
  std::map<int, std::string> caught;  // leaders whose view broke the rules here, and how (decision::named)
  auto from_view = [&](const detail::message& m) -> decision {
    if (m.ranks.empty())
      throw left_out_error(decentrain::detail::concat("elastic: the group stopped at view ", current.epoch, ": ", m.reason));
    decision d = detail::decision_of(m);
    decentrain::detail::check(!d.next.bars(me), "elastic: peer ", me, " was excluded from the run in view ", m.epoch,
                              ": the group convicted it (of poison: what it sent was dropped as non-finite or "
                              "malformed, or far from the aggregate, too often, fault::elastic::exclusion; or of breaking "
                              "the membership protocol); it stops here");
    if (!d.next.contains(me))
      throw left_out_error(decentrain::detail::concat("elastic: peer ", me, " was left out of view ", m.epoch,
                                                      " (the others did not hear from it in time)"));
    for (int j : d.next.members)
      if (!current.contains(j)) d.joined.push_back(j);
    for (int j : h.marked)  // markers of this view taken already while waiting for echoes
      if (d.next.contains(j)) d.marked.push_back(j);
    d.named = caught;
    for (const auto& [j, bad] : h.invalid) d.named.emplace(j, bad);
    return d;
  };

  const int f = detail::tolerated(current.members.size(), s);
  const bool insiders = f > 0;
  h.f = f;
  if (insiders) h.say_ready = [&](const detail::message& v) { detail::say_ready(ep, current, suspects, v, h); };
  // Against insiders, after a leader failed here: a view that a quorum is ready for (this peer
  // refused it, or gave up on its leader too early) is the next view all the same.
  auto agreed_meanwhile = [&]() -> std::optional<detail::message> {
    if (!insiders) return std::nullopt;
    const auto agreed = [&] { return detail::delivered(current, h, suspects, f, me); };
    detail::gather(ep, current.members, current, h, transport::now(ep) + std::chrono::milliseconds(50), [&] { return agreed().has_value(); });
    return agreed();
  };
  std::set<int> passed_over;  // members this peer does not follow in this agreement: their view failed
  const auto started = transport::now(ep);
  for (;;) {
    // The leader: the lowest member this peer may follow. Against insiders an accusation of
    // poison is a voice in the report, not a reason to follow another: only a member that
    // departed, or whose view failed here, is passed over.
    std::vector<int> alive;
    for (int j : current.members)
      if (!suspects.count(j) || (insiders && suspects.at(j) == transport::failure_cause::convicted)) alive.push_back(j);
    auto candidate = std::find_if(alive.begin(), alive.end(), [&](int j) { return !passed_over.count(j); });
    if (candidate == alive.end()) {
      // Every member's view failed here: against insiders no side of a partition may go on
      // without a quorum, so this one waits for it to heal and agrees again from the start.
      std::string last;
      for (const auto& [j, w] : why) last += decentrain::detail::concat(" (peer ", j, ": ", w, ")");
      if (!insiders || transport::now(ep) - started >= s.patience)
        throw left_out_error(decentrain::detail::concat("elastic: peer ", me, " found no member of view ", current.epoch,
                                                        " whose view a quorum followed",
                                                        insiders ? decentrain::detail::concat(" within ", s.patience.count(), " ms")
                                                                 : std::string(),
                                                        last));
      // Every member may lead again, those this peer gave up on as silent too (a leader it
      // timed out on may have been waiting on another): only the certain stay passed over.
      passed_over.clear();
      std::erase_if(suspects, [](const auto& x) { return !detail::certain(x.second); });
      h.next_round();  // (a leader that leads again may send another view)
      transport::pause(ep, std::min(s.timeout, std::chrono::milliseconds(1000)));
      if (auto v = agreed_meanwhile()) return from_view(*v);
      continue;
    }
    const int leader = *candidate;
    const auto deadline = transport::now(ep) + s.timeout;
    raise_alarm(ep, current, suspects.empty() ? first_suspect : suspects.begin()->first, suspects, &why);  // wake everyone
    if (leader != me) {
      try {
        return from_view(detail::follow(ep, current, leader, suspects, mine, deadline, s, h));
      } catch (const transport::peer_error& e) {
        suspects.emplace(leader, e.cause());
        if (insiders && e.cause() == transport::failure_cause::convicted) suspects[leader] = e.cause();  // it lied here
        if (h.refused.count(leader)) caught.emplace(leader, e.what());  // named: what it sent broke the rules here
        passed_over.insert(leader);
        why[leader] = e.what();
        if (auto v = agreed_meanwhile()) return from_view(*v);
        continue;  // the next lowest rank leads
      }
    }
    try {
      return from_view(detail::lead(ep, current, suspects, why, alive, mine, deadline, s, h, known));
    } catch (const detail::leader_failed& failed) {
      why[me] = failed.why;
      if (auto v = agreed_meanwhile()) return from_view(*v);
      passed_over.insert(me);
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
  if constexpr (requires { ep.set_members(d.next.members); }) ep.set_members(d.next.members);
  for (int j : d.removed)
    if (j != me && !d.next.bars(j)) ep.forget(j);
  for (int j : d.next.barred)  // also when this peer joined since: it refuses them too
    if (j != me)
      ep.bar(j, decentrain::detail::concat("the group convicted it of poison (what it sent was dropped or far from the "
                                           "aggregate too often) or of breaking the membership protocol (view ",
                                           d.next.epoch, ")"));
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
