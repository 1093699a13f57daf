// Gossip (decentralized SGD, D-PSGD: Lian et al. 2017, arXiv 1705.09056): no all-reduce and no
// peer that hears from everyone. Every `inner_steps` steps each replica averages its parameters
// with the few neighbours its Topology names for that round, after its own optimizer step (the
// adapt-then-combine order). Replicas hold different parameters between rounds; they drift
// towards their mean at a rate set by the topology's spectral gap, and every round moves
// `degree` models per peer whatever the group's size (an all-reduce moves about two).
//
// A topology says whom each replica sends to and receives from in round t (ranks of
// ctx.replicas). Both here are doubly stochastic (every replica is received by as many peers as
// it receives from, all with equal weight), so a round keeps the replicas' mean:
//   topology::ring         both ring neighbours every round, weights 1/3 (Lian et al.'s setting);
//   topology::exponential  one peer a round, 2^k ahead with k = t mod ceil(log2 n), weight 1/2
//                          (the one-peer exponential graph: Assran et al. 2019, arXiv
//                          1811.10792; Ying et al. 2021, arXiv 2110.13363). For n a power of two,
//                          log2 n rounds give every replica the exact mean.
// Under fault::elastic the topology is laid over the current view's members, so the ring closes
// over a dead peer. Optimizer state stays local; the policy has no state of its own to save (the
// round follows from the step), so a resumed run continues bit for bit. The trainer's
// validation loss is then the replicas' mean, each on its own rows.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

namespace topology {

// Both neighbours on a ring (one for two replicas, none alone).
struct ring {
  static constexpr const char* name = "ring";
  std::vector<int> receives_from(int rank, int n, std::int64_t) const { return neighbours(rank, n); }
  std::vector<int> sends_to(int rank, int n, std::int64_t) const { return neighbours(rank, n); }

 private:
  static std::vector<int> neighbours(int rank, int n) {
    std::vector<int> out;
    for (int j : {(rank + n - 1) % n, (rank + 1) % n})
      if (j != rank && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    return out;
  }
};

// One peer a round, 2^k ahead (it receives from the one 2^k behind), k cycling through
// 0 .. ceil(log2 n) - 1.
struct exponential {
  static constexpr const char* name = "exponential";
  std::vector<int> receives_from(int rank, int n, std::int64_t round) const {
    if (n < 2) return {};
    return {static_cast<int>((rank + n - hop(n, round)) % n)};
  }
  std::vector<int> sends_to(int rank, int n, std::int64_t round) const {
    if (n < 2) return {};
    return {static_cast<int>((rank + hop(n, round)) % n)};
  }

 private:
  static int hop(int n, std::int64_t round) {
    const int levels = std::bit_width(static_cast<unsigned>(n - 1));  // ceil(log2 n)
    return 1 << static_cast<int>(round % levels);
  }
};

}  // namespace topology

// One static_assert per member, so a topology that lacks one is told which.
template <class T>
constexpr bool check_topology() {
  static_assert(requires { { T::name } -> std::convertible_to<const char*>; },
                "gossip topology: needs `static constexpr const char* name`");
  static_assert(requires(const T& t, int rank, int n, std::int64_t round) {
    { t.receives_from(rank, n, round) } -> std::same_as<std::vector<int>>;
  }, "gossip topology: needs `std::vector<int> receives_from(int rank, int n, std::int64_t round) const`");
  static_assert(requires(const T& t, int rank, int n, std::int64_t round) {
    { t.sends_to(rank, n, round) } -> std::same_as<std::vector<int>>;
  }, "gossip topology: needs `std::vector<int> sends_to(int rank, int n, std::int64_t round) const`");
  return true;
}

// One gossip round on `values` (this replica's, replaced by the average of its own and those it
// receives from): sends first, then receives, so every replica may call it at once whatever the
// topology. The neighbour lists must be consistent (j sends to i in round t exactly when i
// receives from j); a peer named twice or out of range is refused, naming the topology.
template <class Topology, class Comm>
void gossip_round(const Topology& topo, Comm& replicas, std::int64_t round, std::span<float> values,
                  std::vector<float>& scratch, std::vector<double>& sum) {
  const int me = replicas.rank(), n = replicas.world();
  const auto to = topo.sends_to(me, n, round), from = topo.receives_from(me, n, round);
  for (const auto* list : {&to, &from})
    for (std::size_t i = 0; i < list->size(); ++i) {
      const int j = (*list)[i];
      decentrain::detail::check(j >= 0 && j < n && j != me &&
                                    std::find(list->begin(), list->begin() + static_cast<std::ptrdiff_t>(i), j) ==
                                        list->begin() + static_cast<std::ptrdiff_t>(i),
                                "gossip: topology '", Topology::name, "' names peer ", j, " for replica ", me, " of ", n,
                                " in round ", round, " (out of range, itself, or twice)");
    }
  // Every replica sends before it receives: each says first what it will take, so a transport
  // that bounds what it queues from a peer takes these whole (transport::expect).
  for (int j : from) replicas.expect_from(j, values.size_bytes());
  for (int j : to) replicas.send_to(j, std::span<const float>(values));
  if (from.empty()) return;
  // In double, in the order of `from`, so a round's result does not depend on message timing.
  sum.assign(values.begin(), values.end());
  scratch.resize(values.size());
  for (int j : from) {
    replicas.recv_from(j, std::span<float>(scratch));
    for (std::size_t i = 0; i < values.size(); ++i) sum[i] += scratch[i];
  }
  const double w = 1.0 / static_cast<double>(from.size() + 1);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(sum[i] * w);
}

template <class Topology = topology::exponential>
struct gossip {
  static_assert(check_topology<Topology>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "gossip";

  std::int64_t inner_steps = 1;  // steps between gossip rounds (D-PSGD: 1)
  Topology topology{};

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "gossip: inner_steps must be >= 1, got ", inner_steps);
    // Every replica must gossip alike: a different topology or period would pair sends with
    // receives that never come.
    if (!ctx.joined)
      decentrain::detail::check(ctx.replicas.all_same(decentrain::detail::fnv1a(describe())),
                                "gossip: the peers gossip differently (this one: ", describe(),
                                "); every peer must use the same topology and inner_steps");
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (!ends_round(ctx, inner_steps)) return;
    gather_values(ctx.parameters, buffer_);
    gossip_round(topology, ctx.replicas, ctx.step / inner_steps, std::span<float>(buffer_), scratch_, sum_);
    scatter_values(ctx.parameters, buffer_);
  }
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  void save(io::checkpoint&) const {}
  void load(const io::checkpoint&) {}

  std::string describe() const {
    return std::string(name) + ":" + Topology::name + ",inner_steps=" + std::to_string(inner_steps);
  }

 private:
  std::vector<float> buffer_, scratch_;
  std::vector<double> sum_;
};

}  // namespace decentrain::comm
