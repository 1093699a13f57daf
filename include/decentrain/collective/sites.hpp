// Which site each peer is at. Peers of one site (a datacenter, a machine) share a fast network;
// sites reach each other over the WAN. Each peer knows its own site's name (`--site NAME`), and
// the peers agree on everyone's by one all-gather, so that every peer builds the same map and
// the same groups from it (collective/two_level_all_reduce.hpp). Or the peers measure the round
// trips between them and group those that are near (sites_by_latency).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::collective {

class site_map {
 public:
  static constexpr std::size_t max_name_bytes = 63;

  // From each rank's site name, in rank order; sites are numbered in the order their first
  // rank appears. A name is 1 to 63 bytes.
  static site_map from_names(std::span<const std::string> per_rank) {
    decentrain::detail::check(!per_rank.empty(), "sites: no peers named");
    site_map m;
    for (std::size_t r = 0; r < per_rank.size(); ++r) {
      const auto& name = per_rank[r];
      decentrain::detail::check(!name.empty() && name.size() <= max_name_bytes, "sites: peer ", r, "'s site name must be 1 to ",
                                max_name_bytes, " bytes, got ", name.size());
      const auto at = std::find(m.names_.begin(), m.names_.end(), name);
      m.site_of_.push_back(static_cast<int>(at - m.names_.begin()));
      if (at == m.names_.end()) m.names_.push_back(name);
    }
    return m;
  }

  int world() const { return static_cast<int>(site_of_.size()); }
  int sites() const { return static_cast<int>(names_.size()); }
  int site_of(int rank) const { return site_of_.at(static_cast<std::size_t>(rank)); }
  const std::string& name(int site) const { return names_.at(static_cast<std::size_t>(site)); }
  // The ranks of `site`, ascending.
  std::vector<int> members(int site) const {
    std::vector<int> out;
    for (int r = 0; r < world(); ++r)
      if (site_of(r) == site) out.push_back(r);
    return out;
  }
  // `rank`'s place among its site's members.
  int position(int rank) const {
    int p = 0;
    for (int r = 0; r < rank; ++r) p += site_of(r) == site_of(rank) ? 1 : 0;
    return p;
  }
  // The fewest members a site has.
  int smallest() const {
    int least = world();
    for (int s = 0; s < sites(); ++s) least = std::min(least, static_cast<int>(members(s).size()));
    return least;
  }
  // "a: 0 1, b: 2 3": for messages and summaries.
  std::string describe() const {
    std::string out;
    // (appended piece by piece: g++ 12 at -O2 and above warns, wrongly, of overlapping copies
    // in `const char* + std::string` here, and -Werror makes that an error)
    for (int s = 0; s < sites(); ++s) {
      if (s) out += ", ";
      out += name(s);
      out += ':';
      for (int r : members(s)) {
        out += ' ';
        out += std::to_string(r);
      }
    }
    return out;
  }
  bool operator==(const site_map&) const = default;

 private:
  std::vector<int> site_of_;
  std::vector<std::string> names_;
};

// The peers of `comm` each say their own site's name; every peer returns the same map. Every
// peer calls it (a policy with sites agrees that it has them in its settings' check first).
// Fails on every peer, naming them, when some peers name no site (an empty name).
template <class Comm>
site_map agree_on_sites(Comm& comm, const std::string& mine) {
  decentrain::detail::check(mine.size() <= site_map::max_name_bytes, "sites: this peer's site name is ", mine.size(),
                            " bytes, at most ", site_map::max_name_bytes, " are allowed");
  char text[site_map::max_name_bytes + 1] = {};
  std::memcpy(text, mine.data(), mine.size());
  const auto all = comm.all_gather(std::span<const char>(text, sizeof text));
  std::vector<std::string> names;
  std::string unnamed;
  for (int r = 0; r < comm.world(); ++r) {
    const char* at = all.data() + static_cast<std::size_t>(r) * sizeof text;
    names.emplace_back(at, strnlen(at, sizeof text - 1));
    if (names.back().empty()) unnamed += (unnamed.empty() ? "" : ", ") + std::to_string(r);
  }
  decentrain::detail::check(unnamed.empty(), "sites: peers ", unnamed, " name no site (this peer: '", mine,
                            "'): every peer of a collective by sites needs one");
  return site_map::from_names(names);
}

// The round trip between every pair of `comm`'s peers, in seconds on the endpoints' clocks
// (simulated time on simulated links), row-major n x n, the same on every peer. Each peer sends
// a ping to every other at once and answers every ping the moment it takes it, in the order
// they come, until it has every answer: a pair's figure is the smaller of the two peers'
// measures, so that a peer that reached the probe late (whose answers went out late) does not
// make the pair look far. `probe` numbers the call (the same on every peer; a tag of its own).
template <class Comm>
std::vector<double> measure_round_trips(Comm& comm, std::uint32_t probe = 0) {
  auto& ep = comm.endpoint();
  const int n = comm.world(), me = comm.rank();
  std::vector<double> mine(static_cast<std::size_t>(n), 0.0);
  if (n > 1) {
    const transport::tag_type tag = (transport::tag_type{0x70696e67u} << 32) | probe;  // "ping"
    std::vector<int> others;
    for (int q = 0; q < n; ++q)
      if (q != me) others.push_back(q);
    const auto clock = [&] { return ep.stats().clock_seconds; };
    const std::byte ping[1] = {std::byte{0}}, pong[1] = {std::byte{1}};
    const double start = clock();
    for (const int q : others) ep.send(q, tag, std::span<const std::byte>(ping));
    std::vector<int> answered(static_cast<std::size_t>(n), 0), asked(static_cast<std::size_t>(n), 0);
    for (std::size_t pending = 2 * others.size(); pending > 0; --pending) {
      const auto m = ep.recv_any(std::span<const int>(others), tag);
      const auto q = static_cast<std::size_t>(m.source);
      decentrain::detail::check(m.data.size() == 1 && (m.data[0] == std::byte{0} || m.data[0] == std::byte{1}), "sites: peer ",
                                m.source, " sent a ", m.data.size(), "-byte message where a ping or its answer (1 byte) belongs");
      auto& seen = m.data[0] == std::byte{0} ? asked[q] : answered[q];
      decentrain::detail::check(seen == 0, "sites: peer ", m.source, " sent a second ", m.data[0] == std::byte{0} ? "ping" : "answer");
      seen = 1;
      if (m.data[0] == std::byte{0}) {
        ep.send(m.source, tag, std::span<const std::byte>(pong));
      } else {
        const double at = std::isfinite(m.arrival_s) ? m.arrival_s : clock();
        mine[q] = std::max(0.0, at - start);
      }
    }
  }
  const auto all = comm.all_gather(std::span<const double>(mine));
  std::vector<double> out(all.size());
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const auto ab = static_cast<std::size_t>(a * n + b), ba = static_cast<std::size_t>(b * n + a);
      out[ab] = a == b ? 0.0 : std::min(all[ab], all[ba]);
    }
  return out;
}

// Sites from the round trips of n peers (row-major, symmetric): the pairs' figures sorted, the
// largest factor between two neighbours splits near from far where it is at least `gap`, and
// peers joined by near pairs share a site, named "near-R" by its lowest rank R. No such jump
// (peers about equally far from each other): one site. The same figures give the same map.
inline site_map sites_from_round_trips(std::span<const double> rtt, int n, double gap = 4.0) {
  decentrain::detail::check(n >= 1 && rtt.size() == static_cast<std::size_t>(n) * static_cast<std::size_t>(n), "sites: ", rtt.size(),
                            " round trips for ", n, " peers (n x n)");
  decentrain::detail::check(gap > 1 && std::isfinite(gap), "sites: the gap must be a factor > 1, got ", gap);
  const auto at = [&](int a, int b) { return rtt[static_cast<std::size_t>(a * n + b)]; };
  std::vector<double> pairs;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      decentrain::detail::check(std::isfinite(at(a, b)) && at(a, b) >= 0, "sites: the round trip of peers ", a, " and ", b,
                                " is not a time (", at(a, b), ")");
      pairs.push_back(std::max(at(a, b), 1e-6));  // (a microsecond at least: ideal links measure 0)
    }
  std::sort(pairs.begin(), pairs.end());
  double threshold = -1, widest = gap;
  for (std::size_t i = 0; i + 1 < pairs.size(); ++i)
    if (pairs[i + 1] / pairs[i] >= widest) {
      widest = pairs[i + 1] / pairs[i];
      threshold = std::sqrt(pairs[i] * pairs[i + 1]);
    }
  std::vector<int> root(static_cast<std::size_t>(n));
  std::iota(root.begin(), root.end(), 0);
  const auto find = [&](int x) {
    while (root[static_cast<std::size_t>(x)] != x) x = root[static_cast<std::size_t>(x)] = root[static_cast<std::size_t>(root[static_cast<std::size_t>(x)])];
    return x;
  };
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (threshold < 0 || std::max(at(a, b), 1e-6) <= threshold) {
        const int ra = find(a), rb = find(b);
        root[static_cast<std::size_t>(std::max(ra, rb))] = std::min(ra, rb);  // (the lowest rank stays the root)
      }
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("near-" + std::to_string(find(r)));
  return site_map::from_names(names);
}

// The sites of `comm`'s peers from their measured round trips (measure_round_trips, then
// sites_from_round_trips): every peer returns the same map.
template <class Comm>
site_map sites_by_latency(Comm& comm, double gap = 4.0, std::uint32_t probe = 0) {
  return sites_from_round_trips(measure_round_trips(comm, probe), comm.world(), gap);
}

}  // namespace decentrain::collective
