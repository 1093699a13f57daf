// Gossip graphs: whom each replica sends to and receives from in round t (ranks of ctx.replicas,
// n of them). Every graph here is doubly stochastic under equal weights (each replica is received
// by as many peers as it receives from), so a round of comm::gossip_round keeps the replicas'
// mean, and each round's lists are consistent (j sends to i exactly when i receives from j):
//   ring                  both ring neighbours, every round (Lian et al. 2017's setting);
//   torus                 the four neighbours on an r x c grid that wraps (r the largest divisor
//                         of n up to sqrt(n); a prime n is a ring);
//   exponential           every peer 2^k ahead and behind for 2^k < n, every round (the static
//                         exponential graph: ceil(log2 n) neighbours each way);
//   one_peer_exponential  one peer a round, 2^k ahead with k = t mod ceil(log2 n), weight 1/2
//                         (Assran et al. 2019, arXiv 1811.10792; Ying et al. 2021, arXiv
//                         2110.13363): for n a power of two, log2 n rounds give every replica
//                         the exact mean;
//   random                a random pairing each round (one replica left out when n is odd),
//                         the same on every replica (drawn from the seed and the round).
// topology::named picks one of them at run time by its name (the CLI's --topology).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/core/rng.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::comm {

namespace topology {

namespace detail {
// `ranks` less `rank` itself and repeats, in their first order.
inline std::vector<int> distinct_others(const std::vector<int>& ranks, int rank) {
  std::vector<int> out;
  for (const int j : ranks)
    if (j != rank && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
  return out;
}
}  // namespace detail

// Both neighbours on a ring (one for two replicas, none alone).
struct ring {
  static constexpr const char* name = "ring";
  std::vector<int> receives_from(int rank, int n, std::int64_t) const { return neighbours(rank, n); }
  std::vector<int> sends_to(int rank, int n, std::int64_t) const { return neighbours(rank, n); }

 private:
  static std::vector<int> neighbours(int rank, int n) {
    if (n < 2) return {};
    return detail::distinct_others({(rank + n - 1) % n, (rank + 1) % n}, rank);
  }
};

// Up, down, left and right on an r x c grid that wraps at its edges.
struct torus {
  static constexpr const char* name = "torus";
  std::vector<int> receives_from(int rank, int n, std::int64_t) const { return neighbours(rank, n); }
  std::vector<int> sends_to(int rank, int n, std::int64_t) const { return neighbours(rank, n); }
  // The grid's rows: the largest divisor of n that is at most sqrt(n).
  static int rows(int n) {
    int r = 1;
    for (int d = 1; d * d <= n; ++d)
      if (n % d == 0) r = d;
    return r;
  }

 private:
  static std::vector<int> neighbours(int rank, int n) {
    if (n < 2) return {};
    const int r = rows(n), c = n / r, row = rank / c, col = rank % c;
    const auto at = [c](int y, int x) { return y * c + x; };
    return detail::distinct_others({at((row + r - 1) % r, col), at((row + 1) % r, col), at(row, (col + c - 1) % c),
                                    at(row, (col + 1) % c)},
                                   rank);
  }
};

// Every peer 2^k ahead (sends) and behind (receives) for 2^k < n, every round.
struct exponential {
  static constexpr const char* name = "exponential";
  std::vector<int> receives_from(int rank, int n, std::int64_t) const { return hops(rank, n, -1); }
  std::vector<int> sends_to(int rank, int n, std::int64_t) const { return hops(rank, n, +1); }

 private:
  static std::vector<int> hops(int rank, int n, int direction) {
    std::vector<int> out;
    for (int hop = 1; hop < n; hop *= 2) out.push_back(((rank + direction * hop) % n + n) % n);
    return out;
  }
};

// One peer a round, 2^k ahead (it receives from the one 2^k behind), k cycling through
// 0 .. ceil(log2 n) - 1.
struct one_peer_exponential {
  static constexpr const char* name = "one-peer-exponential";
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

// A random pairing of the replicas each round: a shuffle of 0 .. n-1 drawn from the seed and the
// round, each pair of places 2m, 2m+1 averaging together (the last left out when n is odd).
struct random {
  static constexpr const char* name = "random";
  std::uint64_t seed = 0;
  std::vector<int> receives_from(int rank, int n, std::int64_t round) const { return partner(rank, n, round); }
  std::vector<int> sends_to(int rank, int n, std::int64_t round) const { return partner(rank, n, round); }

 private:
  std::vector<int> partner(int rank, int n, std::int64_t round) const {
    if (n < 2) return {};
    std::vector<int> order(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
    rng gen(seed ^ (static_cast<std::uint64_t>(round) * 0x9e3779b97f4a7c15ull), "gossip.random");
    for (std::size_t i = order.size(); i-- > 1;) std::swap(order[i], order[gen.below(i + 1)]);
    const auto at = static_cast<std::size_t>(std::find(order.begin(), order.end(), rank) - order.begin());
    const std::size_t other = at ^ 1u;
    if (other >= order.size()) return {};
    return {order[other]};
  }
};

// One of the graphs above, chosen by its name at run time.
struct named {
  static constexpr const char* name = "named";
  static constexpr const char* names = "ring, torus, exponential, one-peer-exponential or random";
  std::string which = one_peer_exponential::name;
  std::uint64_t seed = 0;  // random's

  // Throws naming the graphs there are; `exponential` is the static graph (the one-peer graph,
  // which an earlier `exponential` meant, is `one-peer-exponential`).
  static named parse(std::string_view text) {
    named t;
    t.which = std::string(text);
    t.validate();
    return t;
  }
  void validate() const {
    const bool known = which == ring::name || which == torus::name || which == exponential::name ||
                       which == one_peer_exponential::name || which == random::name;
    decentrain::detail::check(known, "gossip: unknown topology '", which, "' (expected ", names, ")");
  }
  std::string describe() const { return which == random::name ? which + "(seed=" + std::to_string(seed) + ")" : which; }

  std::vector<int> receives_from(int rank, int n, std::int64_t round) const {
    return visit([&](const auto& t) { return t.receives_from(rank, n, round); });
  }
  std::vector<int> sends_to(int rank, int n, std::int64_t round) const {
    return visit([&](const auto& t) { return t.sends_to(rank, n, round); });
  }

 private:
  template <class F>
  std::vector<int> visit(F&& f) const {
    if (which == ring::name) return f(ring{});
    if (which == torus::name) return f(torus{});
    if (which == exponential::name) return f(exponential{});
    if (which == one_peer_exponential::name) return f(one_peer_exponential{});
    if (which == random::name) return f(random{seed});
    validate();
    return {};
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

// What a topology is called in messages and agreements: its describe() where it has one (a
// choice made at run time), else its name.
template <class T>
std::string topology_name(const T& t) {
  if constexpr (requires { { t.describe() } -> std::convertible_to<std::string>; }) return t.describe();
  else return T::name;
}

// The peers `topo` names for replica `me` of `n` in `round` (one of its lists), checked: each in
// range, not `me`, none twice; else an error naming the policy (`who`), the graph and the peer.
template <class T>
std::vector<int> checked_neighbours(std::vector<int> list, const T& topo, int me, int n, std::int64_t round, const char* who) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    const int j = list[i];
    decentrain::detail::check(j >= 0 && j < n && j != me && std::count(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(i), j) == 0,
                              who, ": topology '", topology_name(topo), "' names peer ", j, " for replica ", me, " of ", n,
                              " in round ", round, " (out of range, itself, or twice)");
  }
  return list;
}

// A policy that keeps something per neighbour (CHOCO's public copies, AD-PSGD's open requests)
// needs every replica's neighbours the same every round; CHOCO also needs each one a neighbour
// of its neighbours (`undirected`). Else an error naming the policy (`who`), the graph and what
// it needs (`needs`).
template <class T>
void check_fixed(const T& topo, int n, const char* who, const char* needs, bool undirected) {
  for (int r = 0; r < n; ++r) {
    const auto to = topo.sends_to(r, n, 0), from = topo.receives_from(r, n, 0);
    for (std::int64_t t = 1; t < 16; ++t)
      decentrain::detail::check(topo.sends_to(r, n, t) == to && topo.receives_from(r, n, t) == from, who, ": topology '",
                                topology_name(topo), "' changes its neighbours with the round; ", needs, ", so it needs a fixed graph");
    decentrain::detail::check(!undirected || std::is_permutation(to.begin(), to.end(), from.begin(), from.end()), who,
                              ": topology '", topology_name(topo), "' has replica ", r, " send to other peers than it receives from; ",
                              needs, ", so it needs an undirected graph");
  }
}

}  // namespace decentrain::comm
