// What a transport offers an elastic group (fault::elastic) beyond the endpoint concept: tags
// reserved for the membership protocol, an alarm that wakes every peer blocked in a collective
// when one of them saw a peer fail, receives with a deadline, and a way to drop what a peer sent
// before a marker (the previous view's messages) or to forget a peer for good. tcp and in_process
// offer all of it; a transport that does not (mpi: the MPI runtime aborts the job on a dead rank
// unless it has ULFM) gets an error naming what is missing when an elastic group starts.
//
// The alarm is what turns "one peer saw the failure" into "every survivor stops within a bounded
// time": without it a survivor whose own neighbours are alive would wait for a message that its
// neighbour, busy re-forming, never sends, until the receive timeout.
#pragma once

#include <array>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"
#include "decentrain/transport/tag.hpp"

namespace decentrain::transport {

// A channel (the high 32 bits of a tag) that no communicator hands out (collective::group_channel
// and the lanes' channels skip it).
inline constexpr std::uint32_t membership_channel = 0xffffffffu;
inline constexpr tag_type membership_tag(std::uint32_t n) { return (tag_type{membership_channel} << 32) | n; }
// Messages to this tag are not queued: they raise the receiver's alarm (see alarm below).
inline constexpr tag_type alarm_tag = membership_tag(1);
inline constexpr bool is_membership_tag(tag_type t) { return (t >> 32) == membership_channel; }
inline constexpr std::uint32_t usable_channel(std::uint32_t c) { return c == membership_channel ? c ^ 2u : c; }

// What an alarm says: in view `epoch`, `reporter` saw peer `failed` fail.
struct alarm {
  std::uint64_t epoch = 0;
  int reporter = -1;
  int failed = -1;
};

// What an alarm says, for errors: a failure, or (failed < 0) a view change for another reason
// (a peer joins).
inline failure_cause cause_of(const alarm& a) { return a.failed < 0 ? failure_cause::joining : failure_cause::reported; }
inline std::string describe(const alarm& a) {
  if (a.failed < 0)
    return "peer " + std::to_string(a.reporter) + " started a view change (view " + std::to_string(a.epoch) + ")";
  return "peer " + std::to_string(a.reporter) + " reports that peer " + std::to_string(a.failed) + " failed (view " +
         std::to_string(a.epoch) + ")";
}

namespace wire {
inline constexpr std::size_t alarm_bytes = 16;
inline std::array<std::byte, alarm_bytes> encode_alarm(std::uint64_t epoch, int failed) {
  std::array<std::byte, alarm_bytes> out{};
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((epoch >> (8 * i)) & 0xff);
  const auto f = static_cast<std::uint32_t>(failed);
  for (int i = 0; i < 4; ++i) out[static_cast<std::size_t>(8 + i)] = static_cast<std::byte>((f >> (8 * i)) & 0xff);
  return out;
}
// Nothing when the body is not an alarm (wrong size): a malformed alarm is dropped, not obeyed.
inline std::optional<alarm> decode_alarm(std::span<const std::byte> body, int reporter) {
  if (body.size() != alarm_bytes) return std::nullopt;
  alarm a;
  for (int i = 0; i < 8; ++i) a.epoch |= static_cast<std::uint64_t>(body[static_cast<std::size_t>(i)]) << (8 * i);
  std::uint32_t f = 0;
  for (int i = 0; i < 4; ++i) f |= static_cast<std::uint32_t>(body[static_cast<std::size_t>(8 + i)]) << (8 * i);
  a.failed = static_cast<int>(f);
  a.reporter = reporter;
  return a;
}
}  // namespace wire

// Whether an endpoint type takes part in elastic groups (transport/membership.hpp).
template <class E>
concept membership_endpoint = endpoint<E> && requires(E& e, const E& ce, int peer, tag_type tag, std::chrono::milliseconds t,
                                                      std::uint64_t epoch, const std::string& reason) {
  // recv with its own deadline (the membership protocol's, not the transport's receive timeout)
  { e.recv_within(peer, tag, t) } -> std::same_as<bytes>;
  // drop the non-membership messages `peer` sent before the last message taken from it on `tag`
  e.discard_before(peer, tag);
  // alarms of views older than `epoch` are stale: clear the current one if it is, ignore later ones
  e.set_epoch(epoch);
  { ce.alarmed() } -> std::same_as<std::optional<alarm>>;
  // close `peer` for good: waits on it fail, what it queued is dropped, sends to it fail
  e.forget(peer);
  // forget `peer` and never take it back, also as a joiner; it is told `reason` (the group excluded it)
  e.bar(peer, reason);
  // this peer leaves: every other peer's waits on it fail at once, as departed, saying `reason`
  e.leave(reason);
};

// Whether an elastic group on this endpoint type takes in peers that join once it runs (tcp).
template <class E>
concept joining_endpoint = membership_endpoint<E> && requires(E& e, const E& ce) {
  { ce.joined_late() } -> std::same_as<bool>;             // this peer joined a running group
  { ce.connected() } -> std::same_as<std::vector<int>>;   // every connected peer
  { ce.capacity() } -> std::same_as<int>;                  // ranks are below this (world() and joiners)
  e.rediscover();  // a joiner: connect to the group's peers it is not connected to yet (later joiners)
};

// Whether this run of a joining endpoint can see joiners at all: an endpoint type that takes them
// only in some runs (in_process: a deterministic run's churn) says so with takes_joiners(), and
// the group then spends nothing per round on looking for them.
template <class E>
bool takes_joiners(const E& e) {
  if constexpr (!joining_endpoint<E>) return false;
  else if constexpr (requires { { e.takes_joiners() } -> std::same_as<bool>; }) return e.takes_joiners();
  else return true;
}

}  // namespace decentrain::transport
