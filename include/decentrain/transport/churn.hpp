// A churn schedule for simulated peers: which rank is killed or started (again, or for the first
// time: a joiner) at which simulated time. A deterministic in_process network applies it between
// its peers' turns (transport/turns.hpp), so a kill lands wherever the victim stands at that
// time, in a step or mid-collective, and the same schedule and seed give the same run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "decentrain/core/rng.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::transport {

struct churn_event {
  enum class kind : std::uint8_t { kill, start };
  double at_s = 0.0;  // simulated time
  kind what = kind::kill;
  int rank = -1;
  bool operator==(const churn_event&) const = default;
};
using churn_schedule = std::vector<churn_event>;

inline std::string describe(const churn_event& e) {
  return std::string(e.what == churn_event::kind::kill ? "kill" : "start") + " peer " + std::to_string(e.rank) + " at " +
         std::to_string(e.at_s) + " s";
}

// A seeded random churn: every `every_min_s`..`every_max_s` seconds one running peer, drawn at
// random, is killed, and starts again `down_min_s`..`down_max_s` seconds later (as a new process
// that joins the running group); `joiners` new ranks (from `peers` on) join once each, at random
// times in the first half. Kills never leave fewer than `min_alive` peers running (as the
// schedule counts them: a peer that fails for another reason is not known here).
struct random_churn {
  int peers = 4;
  int joiners = 0;
  double seconds = 3600.0;
  double every_min_s = 60.0, every_max_s = 180.0;
  double down_min_s = 10.0, down_max_s = 60.0;
  int min_alive = 2;

  void validate() const {
    using decentrain::detail::check;
    check(peers >= 1 && joiners >= 0, "random_churn: needs peers >= 1 and joiners >= 0, got ", peers, " and ", joiners);
    check(seconds > 0, "random_churn: seconds must be > 0, got ", seconds);
    check(every_min_s > 0 && every_max_s >= every_min_s, "random_churn: needs 0 < every_min_s <= every_max_s, got ",
          every_min_s, " and ", every_max_s);
    check(down_min_s >= 0 && down_max_s >= down_min_s, "random_churn: needs 0 <= down_min_s <= down_max_s, got ", down_min_s,
          " and ", down_max_s);
    check(min_alive >= 1, "random_churn: min_alive must be >= 1, got ", min_alive);
  }

  churn_schedule make(std::uint64_t seed) const {
    validate();
    rng gen(seed, "churn");
    churn_schedule out;
    const auto uniform = [&](double lo, double hi) { return gen.uniform(lo, hi); };
    for (int j = 0; j < joiners; ++j) out.push_back({uniform(0.0, seconds / 2), churn_event::kind::start, peers + j});
    std::sort(out.begin(), out.end(), [](const churn_event& a, const churn_event& b) { return a.at_s < b.at_s; });
    // Walk the kills in time order, knowing who runs: the initial peers, the joiners once their
    // start has passed, and the killed ones once their restart has.
    std::vector<churn_event> restarts, pending;
    std::set<int> running;
    for (int r = 0; r < peers; ++r) running.insert(r);
    std::size_t joined = 0;
    for (double t = uniform(every_min_s, every_max_s); t < seconds; t += uniform(every_min_s, every_max_s)) {
      for (; joined < out.size() && out[joined].at_s <= t; ++joined) running.insert(out[joined].rank);
      std::erase_if(pending, [&](const churn_event& e) {
        if (e.at_s > t) return false;
        running.insert(e.rank);
        return true;
      });
      if (static_cast<int>(running.size()) <= min_alive) continue;
      auto victim = running.begin();
      std::advance(victim, static_cast<std::ptrdiff_t>(gen.next_u64() % running.size()));
      const int r = *victim;
      running.erase(victim);
      out.push_back({t, churn_event::kind::kill, r});
      const double back = t + uniform(down_min_s, down_max_s);
      if (back < seconds) {
        restarts.push_back({back, churn_event::kind::start, r});
        pending.push_back(restarts.back());
      }
    }
    out.insert(out.end(), restarts.begin(), restarts.end());
    std::stable_sort(out.begin(), out.end(), [](const churn_event& a, const churn_event& b) { return a.at_s < b.at_s; });
    return out;
  }
};

}  // namespace decentrain::transport
