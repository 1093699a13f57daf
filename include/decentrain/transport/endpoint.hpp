// What a transport offers a peer: its rank among `world` peers, ordered point-to-point byte
// messages matched by (source, tag), and traffic counters. Collectives and policies are written
// against this concept only; `any_endpoint` erases the type so a trainer can take any of them.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::transport {

using tag_type = std::uint64_t;

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
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t malformed_frames = 0;   // dropped, connection closed (tcp)
  std::uint64_t retransmissions = 0;    // simulated drops that cost a retransmission (in_process)
  double wait_seconds = 0.0;
  double clock_seconds = 0.0;
};

// Messages between one (source, destination) pair arrive in the order they were sent; `recv`
// blocks until the message with that source and tag arrives, and throws decentrain::error when
// it cannot (timeout, peer gone). `computed` tells the endpoint how long the caller computed,
// which a simulated network adds to its clock and a real one ignores.
template <class E>
concept endpoint = requires(E& e, const E& ce, int peer, tag_type tag, std::span<const std::byte> data, double seconds) {
  { ce.rank() } -> std::convertible_to<int>;
  { ce.world() } -> std::convertible_to<int>;
  e.send(peer, tag, data);
  { e.recv(peer, tag) } -> std::same_as<bytes>;
  { ce.stats() } -> std::convertible_to<traffic_stats>;
  e.computed(seconds);
};

// Sends `out` to `to` (nothing when `to` < 0), then receives the next message from `from` with
// `tag` into `in` and returns that message's size; `in` is written only when the sizes match.
// A transport that can post `in` before it sends, so that the message lands there without a
// buffer and a copy of its own (tcp), offers this as a member; the others send, recv and copy.
template <endpoint E>
std::size_t exchange(E& e, int to, std::span<const std::byte> out, int from, std::span<std::byte> in, tag_type tag) {
  if constexpr (requires { { e.exchange(to, out, from, in, tag) } -> std::convertible_to<std::size_t>; }) {
    return e.exchange(to, out, from, in, tag);
  } else {
    if (to >= 0) e.send(to, tag, out);
    const bytes message = e.recv(from, tag);
    if (message.size() == in.size() && !in.empty()) std::memcpy(in.data(), message.data(), in.size());
    return message.size();
  }
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
  std::size_t exchange(int to, std::span<const std::byte> out, int from, std::span<std::byte> in, tag_type tag) {
    return get().exchange(to, out, from, in, tag);
  }
  traffic_stats stats() const { return get().stats(); }
  void computed(double seconds) { get().computed(seconds); }

 private:
  struct base {
    virtual ~base() = default;
    virtual int rank() const = 0;
    virtual int world() const = 0;
    virtual void send(int, tag_type, std::span<const std::byte>) = 0;
    virtual bytes recv(int, tag_type) = 0;
    virtual std::size_t exchange(int, std::span<const std::byte>, int, std::span<std::byte>, tag_type) = 0;
    virtual traffic_stats stats() const = 0;
    virtual void computed(double) = 0;
  };
  template <class E>
  struct model final : base {
    explicit model(E e) : e(std::move(e)) {}
    int rank() const override { return static_cast<int>(e.rank()); }
    int world() const override { return static_cast<int>(e.world()); }
    void send(int p, tag_type t, std::span<const std::byte> d) override { e.send(p, t, d); }
    bytes recv(int p, tag_type t) override { return e.recv(p, t); }
    std::size_t exchange(int to, std::span<const std::byte> out, int from, std::span<std::byte> in, tag_type t) override {
      return transport::exchange(e, to, out, from, in, t);
    }
    traffic_stats stats() const override { return e.stats(); }
    void computed(double s) override { e.computed(s); }
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
