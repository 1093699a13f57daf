// Where every peer of the group listens, as this peer knows it, and whether the group it belongs
// to is formed or this peer joined it running; what a caller asking for the directory is told.
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"

namespace decentrain::transport::tcp_detail {

struct directory {
  // rank -> "host:port", this peer's own included; "" for a peer that accepts no connections
  // (it dials every peer itself)
  std::map<int, std::string> addresses;
  std::set<int> joining;                 // ranks a seed said are joiners not admitted yet
  std::size_t turn = 0;                  // which known address rediscover() asks first (training thread)
  bool formed = false;  // the mesh of this peer's group is complete (it may be running)
  bool late = false;    // this peer joined a running group
  std::string refusal;  // why this peer cannot join at all (its rank is taken, a wrong key)

  // The answer to a directory request: before the group is formed, every address known; after,
  // only this peer and the peers it is connected to (those a joiner must reach).
  // `joiner(r)`: whether connected peer r is a joiner not admitted yet.
  template <class Connected, class Joiner>
  wire::directory answer(int self, Connected&& connected, Joiner&& joiner) const {
    wire::directory d;
    d.formed = formed;
    for (const auto& [r, a] : addresses)
      if (!formed || r == self || connected(r)) {
        d.entries.emplace_back(r, a);
        if (r != self && joiner(r)) d.joining.push_back(r);
      }
    return d;
  }

  // A seed's answer, at peer `self` (of `capacity` ranks, listening at `advertised`): the
  // addresses are learned, and a running group makes this peer a joiner, or refuses it when its
  // rank is taken there by another process. `outside`: this peer has no connection yet.
  void learn(const wire::directory& d, int self, int capacity, const std::string& advertised, bool outside) {
    if (d.formed && (outside || late)) {
      for (const auto& [r, a] : d.entries)
        if (r == self && (outside || a != advertised))
          refusal = decentrain::detail::concat("tcp: rank ", self, " is taken in the running group (by the peer ",
                                               a.empty() ? std::string("that accepts no connections") : "at " + a,
                                               "); a peer that joins needs a rank of its own");
      late = refusal.empty();
    }
    for (const auto& [r, a] : d.entries)
      if (r >= 0 && r < capacity && r != self) {
        if (!a.empty() || !addresses.count(r)) addresses[r] = a;  // (an empty address never hides one known)
        if (std::find(d.joining.begin(), d.joining.end(), r) != d.joining.end()) joining.insert(r);
        else joining.erase(r);
      }
  }
};

}  // namespace decentrain::transport::tcp_detail
