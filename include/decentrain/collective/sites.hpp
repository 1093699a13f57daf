// Which site each peer is at. Peers of one site (a datacenter, a machine) share a fast network;
// sites reach each other over the WAN. Each peer knows its own site's name (`--site NAME`), and
// the peers agree on everyone's by one all-gather, so that every peer builds the same map and
// the same groups from it (collective/two_level_all_reduce.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"

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
    for (int s = 0; s < sites(); ++s) {
      out += (s ? ", " : "") + name(s) + ":";
      for (int r : members(s)) out += " " + std::to_string(r);
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

}  // namespace decentrain::collective
