// A sub-group of peers as an endpoint of its own: ranks 0..k-1 of the group are the listed world
// ranks, and every tag gets the group's channel in its high 32 bits, so the group's collectives
// never pair with the world's or another group's (stage replicas, Moshpit groups). Communicators
// over it work unchanged; communicator::group makes one.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/membership.hpp"

namespace decentrain::collective {

// The channel of a group: the same on every member, whatever the order it was listed in.
inline std::uint32_t group_channel(std::uint32_t parent, std::span<const int> sorted_ranks) {
  std::uint64_t h = decentrain::detail::splitmix64(0x67726f7570ull ^ parent);  // "group"
  for (int r : sorted_ranks) h = decentrain::detail::splitmix64(h ^ static_cast<std::uint64_t>(r));
  // never 0 (the world's channel) nor the membership protocol's
  return transport::usable_channel(static_cast<std::uint32_t>(h >> 32) | 1u);
}

template <transport::endpoint Endpoint>
class group_view {
  // The world, or the ranks peers that join it may take (an elastic group's view lists them).
  static int ranks_below(const Endpoint& e) {
    if constexpr (requires { e.capacity(); }) return e.capacity();
    else return e.world();
  }

 public:
  // `parent` must outlive the view unless the view owns it (a lane).
  group_view(std::shared_ptr<Endpoint> parent, std::vector<int> members, std::uint32_t channel)
      : parent_(std::move(parent)), members_(std::move(members)), channel_(channel) {
    decentrain::detail::check(!members_.empty(), "group: needs at least one member");
    for (std::size_t i = 0; i < members_.size(); ++i) {
      decentrain::detail::check(members_[i] >= 0 && members_[i] < ranks_below(*parent_), "group: rank ", members_[i],
                                " is outside a world of ", ranks_below(*parent_));
      if (members_[i] == parent_->rank()) rank_ = static_cast<int>(i);
    }
    decentrain::detail::check(rank_ >= 0, "group: peer ", parent_->rank(), " is not one of the group's members");
  }

  int rank() const { return rank_; }
  int world() const { return static_cast<int>(members_.size()); }
  int world_rank(int member) const { return members_[static_cast<std::size_t>(member)]; }
  void send(int peer, transport::tag_type tag, std::span<const std::byte> data) {
    parent_->send(at(peer), mapped(tag), data);
  }
  transport::bytes recv(int peer, transport::tag_type tag) { return parent_->recv(at(peer), mapped(tag)); }
  // (sources and the sender as members of the group)
  transport::received recv_any(std::span<const int> sources, transport::tag_type tag) {
    std::vector<int> ranks;
    ranks.reserve(sources.size());
    for (const int s : sources) ranks.push_back(at(s));
    auto m = parent_->recv_any(ranks, mapped(tag));
    m.source = static_cast<int>(std::find(members_.begin(), members_.end(), m.source) - members_.begin());
    return m;
  }
  std::optional<transport::bytes> try_recv(int peer, transport::tag_type tag) { return parent_->try_recv(at(peer), mapped(tag)); }
  void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                transport::tag_type tag, const transport::landed_fn& landed) {
    transport::exchange(*parent_, to < 0 ? to : at(to), outs, at(from), ins, mapped(tag), landed);
  }
  void expect(int source, transport::tag_type tag, std::uint64_t size) { transport::expect(*parent_, at(source), mapped(tag), size); }
  void allow(transport::tag_type tag, std::uint64_t size) { transport::allow(*parent_, mapped(tag), size); }
  transport::traffic_stats stats() const { return parent_->stats(); }
  void computed(double seconds) { parent_->computed(seconds); }
  // The parent's clock and wait: a protocol with a deadline on a group (DiLoCo's round deadline
  // on the view's replicas) keeps a simulated network's time, not the steady clock's.
  std::chrono::steady_clock::time_point now() const { return transport::now(*parent_); }
  void pause(std::chrono::milliseconds d) { transport::pause(*parent_, d); }
  std::optional<transport::link_estimate> slowest_link() const { return transport::slowest_link(*parent_); }
  std::optional<double> step_seconds() const { return transport::step_seconds(*parent_); }
  std::optional<group_view> lane() {
    auto l = transport::open_lane(*parent_);
    if (!l) return std::nullopt;
    return group_view(std::make_shared<Endpoint>(std::move(*l)), members_, channel_);
  }
  void rejoin(const group_view& lane) { transport::rejoin_lane(*parent_, *lane.parent_); }

 private:
  int at(int member) const {
    decentrain::detail::check(member >= 0 && member < world(), "group: member ", member, " is outside a group of ", world());
    return members_[static_cast<std::size_t>(member)];
  }
  transport::tag_type mapped(transport::tag_type tag) const { return tag ^ (static_cast<transport::tag_type>(channel_) << 32); }

  std::shared_ptr<Endpoint> parent_;
  std::vector<int> members_;
  std::uint32_t channel_;
  int rank_ = -1;
};

}  // namespace decentrain::collective
