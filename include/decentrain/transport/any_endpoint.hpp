// any_endpoint: one type for every transport's endpoint (moved in; copies share it), so a
// trainer and its communicators take any of them; the elastic-group members
// (transport/membership.hpp) throw for a transport without them.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/membership.hpp"

namespace decentrain::transport {

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
  double compute_speed() const { return get().compute_speed(); }

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
    virtual double compute_speed() const = 0;
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
    double compute_speed() const override { return transport::compute_speed(e); }
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
