// The membership protocol's messages (reports, views, markers, joiners' hellos), how they are
// encoded, and how one is awaited from a given peer.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/fault/membership/view.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault::detail {

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
