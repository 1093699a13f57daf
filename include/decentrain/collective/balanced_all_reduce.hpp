// Averaging balanced by bandwidth (DeDLOC, Diskin et al. 2021; hivemind's load_balance_peers):
// the shares of a partitioned all-reduce (communicator::partitioned_all_reduce) sized so that
// the slowest peer's time is as small as it can be. A peer that reduces a share w of the buffer
// moves (1 + (n - 2) w) of it each way, so its time is (1 + (n - 2) w) / b for a connection of
// b bytes/s; in a ring every peer moves 2 (n - 1) / n of it, paced by the slowest connection.
// hivemind solves this as a linear program; its optimum is a water level, found here by
// bisection: every peer gets the share that brings its time up to one level, the level where
// the shares add up to 1, and a peer too slow to reach it reduces nothing. So does a peer that
// accepts no connections (client mode): it sends its values and receives the result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::collective {

// What a peer can carry: the slower of its connection's two directions, in bytes/s, and
// whether it reduces a share (false: client mode).
struct peer_capacity {
  double bytes_per_s = 0.0;
  bool aggregates = true;
};

// The seconds per byte of buffer that a peer with `capacity` spends on a share `share` among
// `world` peers: the model the shares are balanced by (latency left out).
inline double partitioned_seconds_per_byte(double share, const peer_capacity& capacity, int world) {
  return (1.0 + std::max(0, world - 2) * share) / capacity.bytes_per_s;
}

// The slowest peer's time for a buffer of `bytes` split by `shares`, by the same model.
inline double partitioned_seconds(std::span<const double> shares, std::span<const peer_capacity> peers, double bytes) {
  decentrain::detail::check(shares.size() == peers.size(), "partitioned_seconds: ", shares.size(), " shares for ", peers.size(),
                            " peers");
  double slowest = 0.0;
  for (std::size_t i = 0; i < peers.size(); ++i)
    slowest = std::max(slowest, bytes * partitioned_seconds_per_byte(shares[i], peers[i], static_cast<int>(peers.size())));
  return slowest;
}

// Shares (adding up to 1) that minimise the slowest peer's time. Deterministic: peers that
// compute them from the same capacities get the same bits.
inline std::vector<double> balanced_shares(std::span<const peer_capacity> peers) {
  const auto n = peers.size();
  decentrain::detail::check(n >= 1, "balanced_shares: needs at least one peer");
  double floor_level = 0.0, ceiling_level = INFINITY;  // seconds per byte
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    const double b = peers[i].bytes_per_s;
    decentrain::detail::check(b > 0 && std::isfinite(b), "balanced_shares: peer ", i, "'s bandwidth must be a number > 0, got ", b);
    floor_level = std::max(floor_level, 1.0 / b);  // sending its values and receiving the result
    if (peers[i].aggregates) {
      any = true;
      ceiling_level = std::min(ceiling_level, partitioned_seconds_per_byte(1.0, peers[i], static_cast<int>(n)));
    }
  }
  decentrain::detail::check(any, "balanced_shares: no peer aggregates (every one is in client mode)");
  std::vector<double> shares(n, 0.0);
  // Two peers move the whole buffer each way whatever their shares: shares by bandwidth then.
  if (n <= 2) {
    double total = 0.0;
    for (std::size_t i = 0; i < n; ++i) total += peers[i].aggregates ? peers[i].bytes_per_s : 0.0;
    for (std::size_t i = 0; i < n; ++i) shares[i] = peers[i].aggregates ? peers[i].bytes_per_s / total : 0.0;
    return shares;
  }
  // The largest share that keeps peer i within `level`.
  auto fill = [&](double level) {
    double total = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      shares[i] = peers[i].aggregates
                      ? std::clamp((level * peers[i].bytes_per_s - 1.0) / static_cast<double>(n - 2), 0.0, 1.0)
                      : 0.0;
      total += shares[i];
    }
    return total;
  };
  double low = floor_level, high = std::max(floor_level, ceiling_level);
  if (fill(low) < 1.0)
    for (int i = 0; i < 200 && high - low > 1e-15 * high; ++i) {
      const double mid = 0.5 * (low + high);
      (fill(mid) < 1.0 ? low : high) = mid;
    }
  else
    high = low;
  const double total = fill(high);  // >= 1: scaling down keeps every peer within the level
  for (auto& s : shares) s /= total;
  return shares;
}

// Equal shares: what a partitioned all-reduce does without balancing.
inline std::vector<double> equal_shares(int world) {
  decentrain::detail::check(world >= 1, "equal_shares: world must be >= 1, got ", world);
  return std::vector<double>(static_cast<std::size_t>(world), 1.0 / world);
}

// Shares of `values` as whole counts adding up to it: each share's floor, then one more to the
// largest remainders (the lower rank first on a tie). A share of 0 gets 0.
inline std::vector<std::size_t> counts_for(std::span<const double> shares, std::size_t values) {
  decentrain::detail::check(!shares.empty(), "counts_for: needs at least one share");
  double total = 0.0;
  for (std::size_t i = 0; i < shares.size(); ++i) {
    decentrain::detail::check(shares[i] >= 0 && std::isfinite(shares[i]), "counts_for: share ", i, " must be >= 0, got ", shares[i]);
    total += shares[i];
  }
  decentrain::detail::check(total > 0, "counts_for: the shares add up to 0");
  std::vector<std::size_t> counts(shares.size());
  std::vector<double> remainder(shares.size());
  std::size_t given = 0;
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const double exact = shares[i] / total * static_cast<double>(values);
    counts[i] = std::min(values - given, static_cast<std::size_t>(std::floor(exact)));
    remainder[i] = shares[i] > 0 ? exact - static_cast<double>(counts[i]) : -1.0;
    given += counts[i];
  }
  std::vector<std::size_t> order(shares.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  for (std::size_t k = 0; given < values; k = (k + 1) % order.size())
    if (shares[order[k]] > 0) {
      ++counts[order[k]];
      ++given;
    }
  return counts;
}

// Every peer states its own capacity; all get the same balanced shares (one all-gather of two
// numbers a peer). A stated bandwidth sizes only that peer's share: one that overstates it slows
// the all-reduce down. (Like the ring, a partitioned all-reduce trusts each peer with what it
// reduces; robust_all_reduce.hpp is for peers that lie.)
template <class Communicator>
std::vector<double> agree_on_shares(Communicator& comm, peer_capacity mine) {
  decentrain::detail::check(mine.bytes_per_s > 0 && std::isfinite(mine.bytes_per_s),
                            "agree_on_shares: this peer's bandwidth must be a number > 0, got ", mine.bytes_per_s);
  const double stated[2] = {mine.bytes_per_s, mine.aggregates ? 1.0 : 0.0};
  const auto all = comm.all_gather(std::span<const double>(stated));
  std::vector<peer_capacity> peers(static_cast<std::size_t>(comm.world()));
  for (std::size_t i = 0; i < peers.size(); ++i) {
    const double b = all[2 * i];
    if (!(b > 0 && std::isfinite(b)))
      transport::fail_peer(static_cast<int>(i), "agree_on_shares", "agree_on_shares: peer ", i, " states a bandwidth of ", b,
                           " bytes/s (must be a number > 0)");
    peers[i] = {b, all[2 * i + 1] != 0.0};
  }
  decentrain::detail::check(std::any_of(peers.begin(), peers.end(), [](const peer_capacity& p) { return p.aggregates; }),
                            "agree_on_shares: no peer aggregates (every one is in client mode)");
  return balanced_shares(peers);
}

// A partitioned all-reduce by these shares (from agree_on_shares: the same on every peer).
template <class Communicator, class T>
void balanced_all_reduce(Communicator& comm, std::span<T> data, std::span<const double> shares, reduce_op op = reduce_op::sum) {
  decentrain::detail::check(shares.size() == static_cast<std::size_t>(comm.world()), "balanced_all_reduce: ", shares.size(),
                            " shares for ", comm.world(), " peers");
  const auto counts = counts_for(shares, data.size());
  comm.partitioned_all_reduce(data, std::span<const std::size_t>(counts), op);
}

}  // namespace decentrain::collective
