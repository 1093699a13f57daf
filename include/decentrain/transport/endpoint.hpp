// What a transport offers a peer: its rank among `world` peers, ordered point-to-point byte
// messages matched by (source, tag), and traffic counters. Collectives and policies are written
// against this concept only; `any_endpoint` (transport/any_endpoint.hpp) erases the type so a
// trainer can take any of them, and transport/membership.hpp says what an elastic group needs
// beyond it.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/tag.hpp"

namespace decentrain::transport {

// An allocator whose value-initialisation leaves bytes as they are: a received message's buffer
// is sized and then overwritten by the socket, so zero-filling it first would be one more pass
// over every byte received. Everything else behaves as std::allocator.
template <class T>
struct uninitialized_allocator : std::allocator<T> {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  uninitialized_allocator() = default;
  template <class U>
  uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;  // default-, not value-initialised
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A message payload. `bytes(n)` and `resize(n)` do not zero the new bytes.
using bytes = std::vector<std::byte, uninitialized_allocator<std::byte>>;

// Counters every endpoint keeps. `wait_seconds` is time a recv spent waiting for its message
// (simulated time on simulated links); `clock_seconds` is the endpoint's notion of elapsed time:
// wall time for real transports (tcp: from when its group formed), simulated compute plus link
// time for in_process.
struct traffic_stats {
  std::uint64_t bytes_sent = 0;      // the messages' payloads
  std::uint64_t bytes_received = 0;
  // What the transport sent beside the payloads: frame headers and padding, and its control
  // frames (handshakes, heartbeats, goodbyes). tcp counts its own; TLS's record overhead and
  // TCP/IP headers are below it, and in_process (simulated messages) and mpi (whose envelopes it
  // cannot see) count 0.
  std::uint64_t framing_bytes_sent = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t malformed_frames = 0;   // dropped, connection closed (tcp)
  std::uint64_t rejected_frames = 0;    // failed the run key's authentication; connection closed (tcp)
  std::uint64_t retransmissions = 0;    // simulated drops that cost a retransmission (in_process)
  // Data bodies read straight into memory a receiver posted (tcp's exchange; whatever the frame
  // turned out to be), so a test can tell that path from the mailbox's. The others count 0.
  std::uint64_t bodies_into_posted = 0;
  // Messages sent and received in pieces over several connections at once (tcp_options::streams);
  // the others count 0.
  std::uint64_t striped_sent = 0, striped_received = 0;
  // tcp's further streams lost to an error or a reset, or closed by their peer (the pair goes on
  // over the others), the pieces sent again over the others, and pieces that came again after
  // they landed (sent again while their landed frame was on its way) and were dropped; the
  // others count 0.
  std::uint64_t streams_lost = 0, pieces_resent = 0, pieces_twice = 0;
  // tcp's further streams this peer dialed and its peer took: a pair's first ones, those dialed
  // again for one lost, and those a measured link asked for (tcp_options::streams_from_link).
  std::uint64_t streams_opened = 0;
  double wait_seconds = 0.0;
  double clock_seconds = 0.0;
};

// A message and the peer that sent it (recv_any), and when it arrived on the receiver's clock
// (stats().clock_seconds) where the transport knows it: a simulated network's arrival, which may
// lie before the receive when the receiver was busy; NaN elsewhere (the receive's own time).
struct received {
  int source = -1;
  bytes data;
  double arrival_s = std::numeric_limits<double>::quiet_NaN();
};

// Messages between one (source, destination) pair arrive in the order they were sent; `recv`
// blocks until the message with that source and tag arrives, and throws decentrain::error when
// it cannot (timeout, peer gone). `recv_any` takes the next message with that tag from whichever
// of a set of peers has one first (each one's own still in order) and says who sent it: a
// router that hands work to several peers takes their answers as they come (SWARM), a gossip
// step the first neighbour ready; it throws as recv does, naming the first of the set that can
// send nothing more while nothing is queued from the others (the caller leaves it out and asks
// again). `try_recv` takes the next message from a peer if it has arrived, else returns none
// at once (it throws as recv does when the peer is gone). `computed` tells the endpoint how long
// the caller computed, which a simulated network adds to its clock and a real one ignores.
template <class E>
concept endpoint = requires(E& e, const E& ce, int peer, std::span<const int> sources, tag_type tag,
                            std::span<const std::byte> data, double seconds) {
  { ce.rank() } -> std::convertible_to<int>;
  { ce.world() } -> std::convertible_to<int>;
  e.send(peer, tag, data);
  { e.recv(peer, tag) } -> std::same_as<bytes>;
  { e.recv_any(sources, tag) } -> std::same_as<received>;
  { e.try_recv(peer, tag) } -> std::same_as<std::optional<bytes>>;
  { ce.stats() } -> std::convertible_to<traffic_stats>;
  e.computed(seconds);
};

// The slowest link of a network, the same figure on every peer: its largest latency and its
// smallest bandwidth. A transport that knows its links (in_process) offers slowest_link() so the
// collectives can size their steps to the links (see collective::options); real networks do not
// know theirs in advance, and every peer must reach the same sizes, so they offer nothing.
struct link_estimate {
  double latency_s = 0.0;
  double bytes_per_s = 0.0;
  // Bytes a link holds in flight: what a sender must have on its way to keep it busy.
  double bandwidth_delay_bytes() const { return latency_s * bytes_per_s; }
};

template <endpoint E>
std::optional<link_estimate> slowest_link(const E& e) {
  if constexpr (requires { { e.slowest_link() } -> std::convertible_to<std::optional<link_estimate>>; })
    return e.slowest_link();
  else
    return std::nullopt;
}

// The time protocols with deadlines read (membership agreements, admission, joiner pacing), and
// how they wait without a message: the steady clock and a sleep on real networks; a simulated
// network that runs its peers in turns on simulated time (in_process's deterministic mode)
// offers now() and pause() of its own, so that a run is the same from its seed.
template <class E>
std::chrono::steady_clock::time_point now(const E& e) {
  if constexpr (requires { { e.now() } -> std::same_as<std::chrono::steady_clock::time_point>; })
    return e.now();
  else
    return std::chrono::steady_clock::now();
}
template <class E>
void pause(E& e, std::chrono::milliseconds d) {
  if constexpr (requires { e.pause(d); })
    e.pause(d);
  else
    std::this_thread::sleep_for(d);
}

// The compute time of one training step as a simulated network models it (deterministic
// in_process), which the trainer then reports in place of what it measured (and codecs do not
// charge theirs); none: measure it.
template <class E>
std::optional<double> step_seconds(const E& e) {
  if constexpr (requires { { e.step_seconds() } -> std::same_as<std::optional<double>>; })
    return e.step_seconds();
  else
    return std::nullopt;
}

// How fast this peer computes relative to the machine it runs on, as a simulated network models
// it (in_process::options::speeds): computed(s) charges s / speed. 1 for a real one.
template <class E>
double compute_speed(const E& e) {
  if constexpr (requires { { e.compute_speed() } -> std::convertible_to<double>; })
    return e.compute_speed();
  else
    return 1.0;
}

// A lane is a second endpoint of the same peer, for a collective that runs on a background
// thread while the caller goes on (collective::communicator's non-blocking calls). The lane and
// the endpoint are used from two threads at once, always with different tags. A transport whose
// endpoints are safe for that returns a copy (tcp); one with per-thread state returns an endpoint
// of its own and folds it back in rejoin() when the collective is waited for (in_process: the
// clock and the counters); one that cannot (mpi below MPI_THREAD_MULTIPLE) offers none, and
// the collective then runs on the caller's thread when it is started.
template <endpoint E>
std::optional<E> open_lane(E& e) {
  if constexpr (requires { { e.lane() } -> std::same_as<std::optional<E>>; })
    return e.lane();
  else
    return std::nullopt;
}
template <endpoint E>
void rejoin_lane(E& e, const E& lane) {
  if constexpr (requires { e.rejoin(lane); }) e.rejoin(lane);
}
// Whether a finished lane's end is behind `e`'s clock: where rejoining moves the clock (simulated
// links), rejoining now would not wait. Elsewhere always.
template <endpoint E>
bool lane_landed(const E& e, const E& lane) {
  if constexpr (requires(E& m) { m.rejoin(lane); }) return lane.stats().clock_seconds <= e.stats().clock_seconds;
  else return true;
}

// A receiver that knows what its next messages from `source` on `tag` will be says so before it
// sends its own part of a step (a ring or gossip step sends before it receives): a transport
// that bounds what it queues from each peer (tcp: tcp_options::max_queued_bytes) then takes
// those `size` bytes beyond the bound, so peers that all send before they receive never wait on one
// another. Others queue without bound and ignore it.
template <endpoint E>
void expect(E& e, int source, tag_type tag, std::uint64_t size) {
  if constexpr (requires { e.expect(source, tag, size); }) e.expect(source, tag, size);
}

// The same, standing: up to `size` bytes from each peer on `tag`, whenever they come (a message
// written before its receiver can know of it: fault/handoff.hpp's).
template <endpoint E>
void allow(E& e, tag_type tag, std::uint64_t size) {
  if constexpr (requires { e.allow(tag, size); }) e.allow(tag, size);
}

// Called as each message of an exchange lands, in order: (its index, its size).
using landed_fn = std::function<void(std::size_t index, std::size_t size)>;

// Sends each of `outs` to `to` (nothing when `to` < 0), then receives the next ins.size()
// messages from `from` with `tag`, the i-th into ins[i] (written only when the sizes match), and
// calls landed(i, size) as each arrives, in order. Many messages in one exchange cost one
// network latency, not one each: the collectives send a whole ring step's chunks this way. A
// transport that can post `ins` before it sends, so that messages land there without a buffer
// and a copy of their own (tcp), offers this as a member; the others send, recv and copy.
template <endpoint E>
void exchange(E& e, int to, std::span<const std::span<const std::byte>> outs, int from,
              std::span<const std::span<std::byte>> ins, tag_type tag, const landed_fn& landed) {
  if constexpr (requires { e.exchange(to, outs, from, ins, tag, landed); }) {
    e.exchange(to, outs, from, ins, tag, landed);
  } else {
    if (to >= 0)
      for (const auto& out : outs) e.send(to, tag, out);
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const bytes message = e.recv(from, tag);
      if (message.size() == ins[i].size() && !message.empty()) std::memcpy(ins[i].data(), message.data(), message.size());
      landed(i, message.size());
    }
  }
}

// One message each way; returns the size of the one received.
template <endpoint E>
std::size_t exchange(E& e, int to, std::span<const std::byte> out, int from, std::span<std::byte> in, tag_type tag) {
  std::size_t got = 0;
  const std::span<const std::byte> outs[1] = {out};
  const std::span<std::byte> ins[1] = {in};
  exchange(e, to, outs, from, ins, tag, [&](std::size_t, std::size_t size) { got = size; });
  return got;
}

namespace detail {
template <class E>
constexpr bool check_endpoint() {
  static_assert(requires(const E& e) { { e.rank() } -> std::convertible_to<int>; },
                "a transport endpoint needs `int rank() const`");
  static_assert(requires(const E& e) { { e.world() } -> std::convertible_to<int>; },
                "a transport endpoint needs `int world() const`");
  static_assert(requires(E& e, int p, tag_type t, std::span<const std::byte> d) { e.send(p, t, d); },
                "a transport endpoint needs `void send(int peer, tag_type tag, std::span<const std::byte> data)`");
  static_assert(requires(E& e, int p, tag_type t) { { e.recv(p, t) } -> std::same_as<bytes>; },
                "a transport endpoint needs `transport::bytes recv(int peer, tag_type tag)`");
  static_assert(requires(E& e, std::span<const int> s, tag_type t) { { e.recv_any(s, t) } -> std::same_as<received>; },
                "a transport endpoint needs `transport::received recv_any(std::span<const int> sources, tag_type tag)`");
  static_assert(requires(E& e, int p, tag_type t) { { e.try_recv(p, t) } -> std::same_as<std::optional<bytes>>; },
                "a transport endpoint needs `std::optional<transport::bytes> try_recv(int peer, tag_type tag)`");
  static_assert(requires(const E& e) { { e.stats() } -> std::convertible_to<traffic_stats>; },
                "a transport endpoint needs `traffic_stats stats() const`");
  static_assert(requires(E& e, double s) { e.computed(s); },
                "a transport endpoint needs `void computed(double seconds)` (a no-op for real networks)");
  return true;
}
}  // namespace detail

}  // namespace decentrain::transport
