// What a transport offers a peer: its rank among `world` peers, ordered point-to-point byte
// messages matched by (source, tag), and traffic counters. Collectives and policies are written
// against this concept only; `any_endpoint` erases the type so a trainer can take any of them.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/tag.hpp"

namespace decentrain::transport {

// An allocator whose value-initialisation leaves bytes as they are: a received message's buffer
// is sized and then overwritten by the socket, and zero-filling it first cost about a tenth of a
// TCP all-reduce (bench/allreduce). Everything else behaves as std::allocator.
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
// wall time for real transports, simulated compute plus link time for in_process.
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
  double wait_seconds = 0.0;
  double clock_seconds = 0.0;
};

// A message and the peer that sent it (recv_any).
struct received {
  int source = -1;
  bytes data;
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

// Owns any endpoint behind one type. Endpoints are moved in; copies share the same endpoint.
class any_endpoint {
 public:
  any_endpoint() = default;

  template <class E>
    requires(!std::same_as<std::remove_cvref_t<E>, any_endpoint>)
  any_endpoint(E&& e)  // NOLINT: implicit on purpose, so any endpoint can be passed where one is expected
      : self_(make(std::forward<E>(e))) {}

  bool valid() const { return self_ != nullptr; }
  int rank() const { return get().rank(); }
  int world() const { return get().world(); }
  void send(int peer, tag_type tag, std::span<const std::byte> data) { get().send(peer, tag, data); }
  bytes recv(int peer, tag_type tag) { return get().recv(peer, tag); }
  received recv_any(std::span<const int> sources, tag_type tag) { return get().recv_any(sources, tag); }
  std::optional<bytes> try_recv(int peer, tag_type tag) { return get().try_recv(peer, tag); }
  void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                tag_type tag, const landed_fn& landed) {
    get().exchange(to, outs, from, ins, tag, landed);
  }
  traffic_stats stats() const { return get().stats(); }
  void computed(double seconds) { get().computed(seconds); }
  void expect(int source, tag_type tag, std::uint64_t size) { get().expect(source, tag, size); }
  void allow(tag_type tag, std::uint64_t size) { get().allow(tag, size); }
  std::optional<link_estimate> slowest_link() const { return get().slowest_link(); }
  std::optional<any_endpoint> lane() {
    auto l = get().lane();
    if (!l) return std::nullopt;
    any_endpoint out;
    out.self_ = std::move(l);
    return out;
  }
  void rejoin(const any_endpoint& lane) { get().rejoin(lane.get()); }
  std::chrono::steady_clock::time_point now() const { return get().now(); }
  void pause(std::chrono::milliseconds d) { get().pause(d); }
  std::optional<double> step_seconds() const { return get().step_seconds(); }

  // The membership members (transport/membership.hpp); they throw for a transport without them.
  bool has_membership() const { return get().has_membership(); }
  bytes recv_within(int peer, tag_type tag, std::chrono::milliseconds timeout) { return get().recv_within(peer, tag, timeout); }
  void discard_before(int peer, tag_type tag) { get().discard_before(peer, tag); }
  void set_epoch(std::uint64_t epoch) { get().set_epoch(epoch); }
  std::optional<alarm> alarmed() const { return get().alarmed(); }
  void forget(int peer) { get().forget(peer); }
  void bar(int peer, const std::string& reason) { get().bar(peer, reason); }
  void leave(const std::string& reason) { get().leave(reason); }
  // Joining (joining_endpoint); a transport without it has no late joiners.
  bool takes_joiners() const { return get().takes_joiners(); }
  bool joined_late() const { return get().joined_late(); }
  std::vector<int> connected() const { return get().connected(); }
  int capacity() const { return get().capacity(); }
  void rediscover() { get().rediscover(); }
  // The members of the view installed (a transport that restricts joiners takes it; others ignore it).
  void set_members(const std::vector<int>& members) { get().set_members(members); }

 private:
  struct base {
    virtual ~base() = default;
    virtual int rank() const = 0;
    virtual int world() const = 0;
    virtual void send(int, tag_type, std::span<const std::byte>) = 0;
    virtual bytes recv(int, tag_type) = 0;
    virtual received recv_any(std::span<const int>, tag_type) = 0;
    virtual std::optional<bytes> try_recv(int, tag_type) = 0;
    virtual void exchange(int, std::span<const std::span<const std::byte>>, int, std::span<const std::span<std::byte>>, tag_type,
                          const landed_fn&) = 0;
    virtual traffic_stats stats() const = 0;
    virtual void computed(double) = 0;
    virtual void expect(int, tag_type, std::uint64_t) = 0;
    virtual void allow(tag_type, std::uint64_t) = 0;
    virtual std::optional<link_estimate> slowest_link() const = 0;
    virtual std::shared_ptr<base> lane() = 0;
    virtual void rejoin(const base& lane) = 0;
    virtual std::chrono::steady_clock::time_point now() const = 0;
    virtual void pause(std::chrono::milliseconds) = 0;
    virtual std::optional<double> step_seconds() const = 0;
    virtual bool has_membership() const = 0;
    virtual bytes recv_within(int, tag_type, std::chrono::milliseconds) = 0;
    virtual void discard_before(int, tag_type) = 0;
    virtual void set_epoch(std::uint64_t) = 0;
    virtual std::optional<alarm> alarmed() const = 0;
    virtual void forget(int) = 0;
    virtual void bar(int, const std::string&) = 0;
    virtual void leave(const std::string&) = 0;
    virtual bool takes_joiners() const = 0;
    virtual bool joined_late() const = 0;
    virtual std::vector<int> connected() const = 0;
    virtual int capacity() const = 0;
    virtual void rediscover() = 0;
    virtual void set_members(const std::vector<int>&) = 0;
  };
  template <class E>
  struct model final : base {
    explicit model(E inner) : e(std::move(inner)) {}
    int rank() const override { return static_cast<int>(e.rank()); }
    int world() const override { return static_cast<int>(e.world()); }
    void send(int p, tag_type t, std::span<const std::byte> d) override { e.send(p, t, d); }
    bytes recv(int p, tag_type t) override { return e.recv(p, t); }
    received recv_any(std::span<const int> sources, tag_type t) override { return e.recv_any(sources, t); }
    std::optional<bytes> try_recv(int p, tag_type t) override { return e.try_recv(p, t); }
    void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                  tag_type t, const landed_fn& landed) override {
      transport::exchange(e, to, outs, from, ins, t, landed);
    }
    traffic_stats stats() const override { return e.stats(); }
    void computed(double s) override { e.computed(s); }
    void expect(int source, tag_type t, std::uint64_t size) override { transport::expect(e, source, t, size); }
    void allow(tag_type t, std::uint64_t size) override { transport::allow(e, t, size); }
    std::optional<link_estimate> slowest_link() const override { return transport::slowest_link(e); }
    std::shared_ptr<base> lane() override {
      auto l = transport::open_lane(e);
      if (!l) return nullptr;
      return std::make_shared<model<E>>(std::move(*l));
    }
    void rejoin(const base& lane) override { transport::rejoin_lane(e, static_cast<const model<E>&>(lane).e); }
    std::chrono::steady_clock::time_point now() const override { return transport::now(e); }
    void pause(std::chrono::milliseconds d) override { transport::pause(e, d); }
    std::optional<double> step_seconds() const override { return transport::step_seconds(e); }
    bool has_membership() const override { return membership_endpoint<E>; }
    bytes recv_within(int p, tag_type t, std::chrono::milliseconds timeout) override {
      if constexpr (membership_endpoint<E>) return e.recv_within(p, t, timeout);
      else no_membership();
    }
    void discard_before(int p, tag_type t) override {
      if constexpr (membership_endpoint<E>) e.discard_before(p, t);
      else no_membership();
    }
    void set_epoch(std::uint64_t epoch) override {
      if constexpr (membership_endpoint<E>) e.set_epoch(epoch);
      else no_membership();
    }
    std::optional<alarm> alarmed() const override {
      if constexpr (membership_endpoint<E>) return e.alarmed();
      else return std::nullopt;
    }
    void forget(int p) override {
      if constexpr (membership_endpoint<E>) e.forget(p);
      else no_membership();
    }
    void bar(int p, const std::string& reason) override {
      if constexpr (membership_endpoint<E>) e.bar(p, reason);
      else no_membership();
    }
    void leave(const std::string& reason) override {
      if constexpr (membership_endpoint<E>) e.leave(reason);
      else no_membership();
    }
    bool takes_joiners() const override { return transport::takes_joiners(e); }
    bool joined_late() const override {
      if constexpr (joining_endpoint<E>) return e.joined_late();
      else return false;
    }
    std::vector<int> connected() const override {
      if constexpr (joining_endpoint<E>) return e.connected();
      else return {};
    }
    int capacity() const override {
      if constexpr (joining_endpoint<E>) return e.capacity();
      else return world();
    }
    void rediscover() override {
      if constexpr (joining_endpoint<E>) e.rediscover();
    }
    void set_members(const std::vector<int>& members) override {
      if constexpr (requires { e.set_members(members); }) e.set_members(members);
    }
    [[noreturn]] static void no_membership() {
      decentrain::detail::fail("transport: this transport has no membership protocol support (recv_within, alarms, "
                               "forget); elastic groups need tcp or in_process");
    }
    E e;
  };

  template <class E>
  static std::shared_ptr<base> make(E&& e) {
    using T = std::remove_cvref_t<E>;
    static_assert(detail::check_endpoint<T>());
    return std::make_shared<model<T>>(std::forward<E>(e));
  }

  base& get() const {
    decentrain::detail::check(self_ != nullptr, "any_endpoint: used before an endpoint was given to it");
    return *self_;
  }

  std::shared_ptr<base> self_;
};

static_assert(endpoint<any_endpoint>);

}  // namespace decentrain::transport
