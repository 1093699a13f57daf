// The membership protocol's messages (reports, views, echoes, markers, joiners' hellos), how
// they are encoded, what makes one valid where it arrives, and how one is awaited from a given
// peer.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/fault/membership/view.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault::detail {

inline constexpr transport::tag_type protocol_tag = transport::membership_tag(2);
inline constexpr transport::tag_type state_tag = transport::membership_tag(3);
inline constexpr std::size_t max_members = 1 << 16;

// hello: a joiner not admitted yet tells the members which peers it is connected to; echo: a
// member tells the others which view its leader sent it; ready: a member tells the others the
// view it will install, the view itself in the message (agreement.hpp).
enum class kind : std::uint8_t { report = 1, view = 2, marker = 3, hello = 4, echo = 5, ready = 6 };
inline constexpr std::uint8_t last_kind = 6;
inline constexpr std::int8_t last_phase = 15;  // (train::phase has 5; room for more)

// Every protocol message: what it means depends on `what`.
struct message {
  kind what = kind::report;
  std::uint64_t epoch = 0;      // report: the view the sender leaves; view, marker: the new view
  std::int64_t step = 0;        // report: the sender's position; view, ready: the target
  std::int8_t phase = 0;
  std::int32_t donor = -1;      // view; report: the leader it is sent to; echo: the leader whose view is echoed
  std::vector<std::int32_t> ranks;     // view: the members; report: the joiners the sender is connected to;
                                       // hello: every peer the sender is connected to
  std::vector<std::int32_t> departed;  // report: the peers the sender knows departed; view: the removed
  std::vector<std::int32_t> behind;    // view
  std::vector<std::int32_t> convicted; // report: the peers the sender accuses of poison; view: the barred
  std::string reason;                  // view without members: why the group stops
  std::uint64_t digest = 0;            // echo: the digest of the view echoed

  template <class Archive>
  void save(Archive& ar) const {
    ar(static_cast<std::uint8_t>(what), epoch, step, phase, donor);
    for (const auto* list : {&ranks, &departed, &behind, &convicted}) {
      ar(cereal::make_size_tag(static_cast<cereal::size_type>(list->size())));
      for (auto r : *list) ar(r);
    }
    transport::wire::save_string(ar, reason);
    ar(digest);
  }
  template <class Archive>
  void load(Archive& ar) {
    std::uint8_t k = 0;
    ar(k, epoch, step, phase, donor);
    decentrain::detail::check(k >= 1 && k <= last_kind, "membership: unknown message kind ", static_cast<int>(k));
    what = static_cast<kind>(k);
    for (auto* list : {&ranks, &departed, &behind, &convicted}) {
      cereal::size_type n = 0;
      ar(cereal::make_size_tag(n));
      decentrain::detail::check(n <= max_members, "membership: a list of ", n, " ranks is over the limit");
      list->resize(static_cast<std::size_t>(n));
      for (auto& r : *list) ar(r);
    }
    ar(transport::wire::bounded_string{reason, 4096}, digest);
  }
};

// A view's identity for echoes and readies: the digest of its encoding as a view.
inline std::uint64_t digest_of(message view) {
  view.what = kind::view;
  const auto b = transport::wire::encode_body(view);
  return decentrain::detail::xxh3(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}

// ---- what makes a message valid where it arrives (a reason when it is not) ----

namespace checks {
inline bool sorted_unique(const std::vector<std::int32_t>& v) { return std::adjacent_find(v.begin(), v.end(), std::greater_equal<>()) == v.end(); }
inline bool within(const std::vector<std::int32_t>& v, int capacity) {
  return std::all_of(v.begin(), v.end(), [&](std::int32_t r) { return r >= 0 && r < capacity; });
}
inline bool members_of(const std::vector<std::int32_t>& v, const view& current) {
  return std::all_of(v.begin(), v.end(), [&](std::int32_t r) { return current.contains(r); });
}
inline bool contains(const std::vector<std::int32_t>& v, int r) { return std::binary_search(v.begin(), v.end(), r); }
// A list of ranks as a message may carry it: ascending, each once, below `capacity`.
inline std::optional<std::string> ranks(const char* what, const std::vector<std::int32_t>& v, int capacity) {
  if (!sorted_unique(v)) return decentrain::detail::concat("its ", what, " are not ascending, each once");
  if (!within(v, capacity)) return decentrain::detail::concat("its ", what, " name a rank outside [0, ", capacity, ")");
  return std::nullopt;
}
}  // namespace checks

// A report of a member of `current` (ranks below `capacity`).
inline std::optional<std::string> invalid_report(const message& m, const view& current, int capacity) {
  if (m.epoch != current.epoch) return decentrain::detail::concat("a report of view ", m.epoch, " in view ", current.epoch);
  if (m.step < 0 || m.phase < 0 || m.phase > last_phase) return decentrain::detail::concat("a report of step ", m.step, " phase ", int{m.phase});
  if (!current.contains(m.donor) || !m.behind.empty()) return std::string("a report to a leader outside the view, or with a view's fields");
  for (const auto& [what, list] : {std::pair{"joiners", &m.ranks}, std::pair{"departed", &m.departed}, std::pair{"accused", &m.convicted}})
    if (auto why = checks::ranks(what, *list, capacity)) return why;
  if (!checks::members_of(m.departed, current) || !checks::members_of(m.convicted, current))
    return std::string("a report that names peers outside the view as departed or accused");
  if (std::any_of(m.ranks.begin(), m.ranks.end(), [&](int r) { return current.contains(r) || current.bars(r); }))
    return std::string("a report that names a member or a barred peer as a joiner");
  return std::nullopt;
}

// The next view after `current` (ranks below `capacity`): its members ascending, each once, the
// old view's members either kept or listed as removed, the barred kept barred and none a member,
// those behind among the members and the donor a member at the target.
inline std::optional<std::string> invalid_view(const message& m, const view& current, int capacity) {
  if (m.epoch != current.epoch + 1) return decentrain::detail::concat("a view of epoch ", m.epoch, " after view ", current.epoch);
  if (m.step < 0 || m.phase < 0 || m.phase > last_phase) return decentrain::detail::concat("a view at step ", m.step, " phase ", int{m.phase});
  for (const auto& [what, list] : {std::pair{"members", &m.ranks}, std::pair{"removed", &m.departed}, std::pair{"behind", &m.behind},
                                   std::pair{"barred", &m.convicted}})
    if (auto why = checks::ranks(what, *list, capacity)) return why;
  if (!checks::members_of(m.departed, current)) return std::string("a view that removes peers that were not members");
  for (int j : current.members)
    if (checks::contains(m.ranks, j) == checks::contains(m.departed, j))
      return decentrain::detail::concat("a view that neither keeps nor removes member ", j, " (or both)");
  for (int j : current.barred)
    if (!checks::contains(m.convicted, j)) return decentrain::detail::concat("a view that lifts the bar on peer ", j);
  for (const auto j : m.convicted)
    if (checks::contains(m.ranks, j)) return decentrain::detail::concat("a view that bars its own member ", j);
  if (m.ranks.empty()) return std::nullopt;  // the group stops (m.reason says why)
  for (const auto j : m.behind)
    if (!checks::contains(m.ranks, j)) return decentrain::detail::concat("a view with peer ", j, " behind but not a member");
  if (!checks::contains(m.ranks, m.donor) || checks::contains(m.behind, m.donor))
    return decentrain::detail::concat("a view whose donor ", m.donor, " is not a member at the target");
  for (const auto j : m.ranks)
    if (!current.contains(j) && !checks::contains(m.behind, j))
      return decentrain::detail::concat("a view that admits peer ", j, " without its taking the state");
  return std::nullopt;
}

// A view that admits joiner `me`, sent it by `sender` (ranks below `capacity`): a joiner knows
// no view to hold it against, only that the view is well formed, that the sender is one of its
// members and that it takes this joiner in behind the target.
inline std::optional<std::string> invalid_admission(const message& m, int sender, int me, int capacity) {
  if (m.step < 0 || m.phase < 0 || m.phase > last_phase) return decentrain::detail::concat("a view at step ", m.step, " phase ", int{m.phase});
  for (const auto& [what, list] : {std::pair{"members", &m.ranks}, std::pair{"removed", &m.departed}, std::pair{"behind", &m.behind},
                                   std::pair{"barred", &m.convicted}})
    if (auto why = checks::ranks(what, *list, capacity)) return why;
  if (!checks::contains(m.ranks, sender)) return decentrain::detail::concat("a view sent by peer ", sender, ", not one of its members");
  if (!checks::contains(m.behind, me)) return std::string("a view that admits this joiner without its taking the state");
  for (const auto j : m.convicted)
    if (checks::contains(m.ranks, j)) return decentrain::detail::concat("a view that bars its own member ", j);
  for (const auto j : m.behind)
    if (!checks::contains(m.ranks, j)) return decentrain::detail::concat("a view with peer ", j, " behind but not a member");
  if (!checks::contains(m.ranks, m.donor) || checks::contains(m.behind, m.donor))
    return decentrain::detail::concat("a view whose donor ", m.donor, " is not a member at the target");
  return std::nullopt;
}

// The ranks a message may name on `ep`: below its capacity (tcp: the joiners' ranks too).
template <class E>
int capacity_of(const E& ep) {
  if constexpr (requires { ep.capacity(); }) return ep.capacity();
  else return ep.world();
}

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

}  // namespace decentrain::fault::detail
