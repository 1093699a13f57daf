// When a SWARM peer should serve another stage: Petals' rule (bigscience-workshop/petals,
// block_selection.py) with the hysteresis its users asked for. A stage's throughput is the sum of
// its peers' speeds over the stage's cost (seconds a sample takes a peer of speed 1); the
// pipeline runs at its slowest stage's. A peer moves only when that bottleneck, now over what it
// would be after the move, is under `gain`; never back to a stage it left within `cooldown`
// checks (Petals issue 389: peers "rebalancing" onto the same blocks back and forth); and only
// once the same move was the best in `confirm` checks in a row (PR 493's confirmation), each
// check judging a peer by the moving average of the speeds the checks saw, so that noise in the
// measured speeds moves nobody. Petals' gain is 0.75 (a move must make the pipeline a third
// faster); a gain that coarse leaves a pipeline short of its best assignment once a few peers are
// lost, since no single move of those left gains that much. With the averaging and the
// confirmation holding noise off, 0.97 here (bench/swarm measures both sides). A move is one
// peer's, or a swap of two peers of different speeds between their stages (which balances
// stages no single move can); a move that leaves a stage without peers leaves a pipeline of
// throughput 0, so none does, and any move that serves a stage without peers passes. Of the
// moves that pass, the one that leaves the fastest pipeline goes (ties: the lowest peer, single
// moves before swaps, then the lowest stage; moves whose pipelines are within `tie` of each
// other's are ties, so noise in the speeds does not flip the choice between moves that gain the
// same, two fast peers each able to trade with either of two slow ones, and reset the
// confirmation every check), one per check. Every peer computes the same move
// from the same figures (agreed as a view is), so a move needs no leader.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::parallel::pools {

struct rebalance_settings {
  double gain = 0.97;  // move when bottleneck now / bottleneck after < gain (Petals: 0.75)
  int confirm = 3;     // the same best move in this many checks in a row
  int cooldown = 20;   // checks before a peer may go back to a stage it left
  double smoothing = 0.2;  // a peer's speed is the moving average (bias-corrected) of what the checks saw
  double tie = 0.02;       // pipelines within this share of each other's throughput: a tie (see above)

  void validate() const {
    decentrain::detail::check(gain > 0 && gain < 1, "swarm rebalance: gain must be in (0, 1), got ", gain);
    decentrain::detail::check(confirm >= 1, "swarm rebalance: confirm must be >= 1, got ", confirm);
    decentrain::detail::check(cooldown >= 0, "swarm rebalance: cooldown must be >= 0, got ", cooldown);
    decentrain::detail::check(smoothing > 0 && smoothing <= 1, "swarm rebalance: smoothing must be in (0, 1], got ", smoothing);
    decentrain::detail::check(tie >= 0 && tie < 1, "swarm rebalance: tie must be in [0, 1), got ", tie);
  }
};

// A peer as the check sees it: the stage it serves and its speed (samples a second at a stage of
// cost 1: its measured throughput times its stage's cost).
struct pool_peer {
  int peer = 0;
  int stage = 0;
  double speed = 0;
};

// `peer` goes from stage `from` to `to`; with a `partner` (>= 0), that peer goes the other way
// at the same time (a swap: where no single move balances the stages, two peers of different
// speeds trading places may).
struct stage_move {
  int peer = 0, from = 0, to = 0;
  int partner = -1;
  double before = 0, after = 0;        // the slowest stage's throughput, samples a second (of those with peers)
  int empty_before = 0, empty_after = 0;  // stages without peers
  friend bool operator==(const stage_move& a, const stage_move& b) {
    return a.peer == b.peer && a.from == b.from && a.to == b.to && a.partner == b.partner;
  }
};

// Each stage's throughput, and the slowest's.
inline std::vector<double> stage_throughputs(const std::vector<pool_peer>& peers, const std::vector<double>& cost) {
  std::vector<double> t(cost.size(), 0.0);
  for (const auto& p : peers) t[static_cast<std::size_t>(p.stage)] += p.speed / cost[static_cast<std::size_t>(p.stage)];
  return t;
}
inline double bottleneck(const std::vector<pool_peer>& peers, const std::vector<double>& cost) {
  const auto t = stage_throughputs(peers, cost);
  return t.empty() ? 0.0 : *std::min_element(t.begin(), t.end());
}

// The stage a joiner serves: the slowest (ties: the lowest), where its speed adds most to the
// pipeline's.
inline int stage_for_joiner(const std::vector<pool_peer>& peers, const std::vector<double>& cost) {
  decentrain::detail::check(!cost.empty(), "swarm rebalance: no stages");
  const auto t = stage_throughputs(peers, cost);
  return static_cast<int>(std::min_element(t.begin(), t.end()) - t.begin());
}

class rebalancer {
 public:
  explicit rebalancer(rebalance_settings s = {}) : settings_(s) { settings_.validate(); }

  // One check on the group's figures: the move to make now, if one passed.
  std::optional<stage_move> check(const std::vector<pool_peer>& peers, const std::vector<double>& cost) {
    for (const auto& p : peers)
      decentrain::detail::check(p.stage >= 0 && p.stage < static_cast<int>(cost.size()) && p.speed >= 0 && std::isfinite(p.speed),
                                "swarm rebalance: peer ", p.peer, " has stage ", p.stage, " of ", cost.size(), " and speed ", p.speed);
    for (const double c : cost) decentrain::detail::check(c > 0 && std::isfinite(c), "swarm rebalance: a stage's cost must be > 0, got ", c);
    ++checks_;
    // Each peer's speed averaged over the checks (a peer gone is forgotten).
    std::map<int, std::pair<double, int>> kept;
    auto smoothed = peers;
    for (auto& p : smoothed) {
      auto [average, count] = speeds_.count(p.peer) ? speeds_[p.peer] : std::pair<double, int>{0.0, 0};
      average = (1 - settings_.smoothing) * average + settings_.smoothing * p.speed;
      ++count;
      kept[p.peer] = {average, count};
      p.speed = average / (1 - std::pow(1 - settings_.smoothing, count));
    }
    speeds_ = std::move(kept);
    const auto best = best_move(smoothed, cost);
    // A move that serves one more stage without peers passes (such a stage stops the pipeline).
    if (!best || !(best->empty_after < best->empty_before ||
                   (best->empty_after == best->empty_before && best->before < settings_.gain * best->after))) {
      streak_ = 0;
      return std::nullopt;
    }
    streak_ = last_ && *last_ == *best ? streak_ + 1 : 1;
    last_ = best;
    if (streak_ < settings_.confirm) return std::nullopt;
    streak_ = 0;
    last_.reset();
    left_[best->peer] = {best->from, checks_};
    if (best->partner >= 0) left_[best->partner] = {best->to, checks_};
    ++moves_;
    return best;
  }
  std::uint64_t moves() const { return moves_; }
  std::uint64_t checks() const { return checks_; }

  // What the checks remember (speeds' averages, the move being confirmed, the stages peers left),
  // exactly: a group that resumes from its checkpoints makes the same moves at the same checks.
  // (parallel::swarm starts the checks afresh on every member when the group changes: a joiner
  // has none of it.)
  void save(io::checkpoint& c, const std::string& prefix) const {
    char buf[160];
    std::string text;
    for (const auto& [peer, v] : speeds_) {
      std::snprintf(buf, sizeof buf, "s %d %a %d;", peer, v.first, v.second);
      text += buf;
    }
    for (const auto& [peer, v] : left_) {
      std::snprintf(buf, sizeof buf, "l %d %d %llu;", peer, v.first, static_cast<unsigned long long>(v.second));
      text += buf;
    }
    if (last_) {
      std::snprintf(buf, sizeof buf, "m %d %d %d %d;", last_->peer, last_->from, last_->to, last_->partner);
      text += buf;
    }
    c.text[prefix + "rebalance"] = text;
    c.counters[prefix + "rebalance.checks"] = static_cast<std::int64_t>(checks_);
    c.counters[prefix + "rebalance.moves"] = static_cast<std::int64_t>(moves_);
    c.counters[prefix + "rebalance.streak"] = streak_;
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    using decentrain::detail::check;
    const auto it = c.text.find(prefix + "rebalance");
    check(it != c.text.end(), "swarm rebalance: the checkpoint has no '", prefix, "rebalance'");
    const auto counter = [&](const char* key) {
      const auto k = c.counters.find(prefix + key);
      check(k != c.counters.end() && k->second >= 0, "swarm rebalance: the checkpoint has no '", prefix, key, "'");
      return k->second;
    };
    std::map<int, std::pair<double, int>> speeds;
    std::map<int, std::pair<int, std::uint64_t>> left;
    std::optional<stage_move> last;
    std::istringstream in(it->second);
    for (std::string item; std::getline(in, item, ';');) {
      if (item.empty()) continue;
      std::istringstream fields(item);
      std::string kind;
      fields >> kind;
      int peer = 0;
      if (kind == "s") {
        std::string average;
        int count = 0;
        fields >> peer >> average >> count;
        char* end = nullptr;
        const double a = std::strtod(average.c_str(), &end);
        check(!fields.fail() && end && *end == '\0' && std::isfinite(a) && a >= 0 && count >= 1,
              "swarm rebalance: the checkpoint's entry '", item, "' is malformed");
        speeds[peer] = {a, count};
      } else if (kind == "l") {
        int stage = 0;
        unsigned long long at = 0;
        fields >> peer >> stage >> at;
        check(!fields.fail() && stage >= 0, "swarm rebalance: the checkpoint's entry '", item, "' is malformed");
        left[peer] = {stage, at};
      } else if (kind == "m") {
        stage_move m;
        fields >> m.peer >> m.from >> m.to >> m.partner;
        check(!fields.fail(), "swarm rebalance: the checkpoint's entry '", item, "' is malformed");
        last = m;
      } else {
        check(false, "swarm rebalance: the checkpoint's entry '", item, "' is malformed");
      }
    }
    checks_ = static_cast<std::uint64_t>(counter("rebalance.checks"));
    moves_ = static_cast<std::uint64_t>(counter("rebalance.moves"));
    streak_ = static_cast<int>(counter("rebalance.streak"));
    speeds_ = std::move(speeds);
    left_ = std::move(left);
    last_ = last;
  }

 private:
  struct score_of {
    int empty = 0;         // stages without peers
    double slowest = 0;    // the slowest of the others' throughputs
  };
  // Fewer stages without peers first, then the faster pipeline by more than the tie.
  bool better(const score_of& a, const score_of& b) const {
    return a.empty != b.empty ? a.empty < b.empty : a.slowest > b.slowest * (1 + settings_.tie);
  }
  static score_of score(const std::vector<double>& t, const std::vector<int>& count) {
    score_of s{0, std::numeric_limits<double>::infinity()};
    for (std::size_t k = 0; k < t.size(); ++k) {
      if (count[k] == 0) ++s.empty;
      else s.slowest = std::min(s.slowest, t[k]);
    }
    if (!std::isfinite(s.slowest)) s.slowest = 0;
    return s;
  }

  std::optional<stage_move> best_move(const std::vector<pool_peer>& peers, const std::vector<double>& cost) const {
    const auto t = stage_throughputs(peers, cost);
    std::vector<int> count(cost.size(), 0);
    for (const auto& p : peers) ++count[static_cast<std::size_t>(p.stage)];
    const auto now = score(t, count);
    auto by_peer = peers;  // ties go the same way whatever order the figures came in
    std::sort(by_peer.begin(), by_peer.end(), [](const pool_peer& x, const pool_peer& y) { return x.peer < y.peer; });
    std::optional<stage_move> best;
    score_of best_score;
    const auto consider = [&](const stage_move& m, const std::vector<double>& after, const std::vector<int>& counts) {
      const auto sc = score(after, counts);
      if (best && !better(sc, best_score)) return;
      best = m;
      best->before = now.slowest;
      best->after = sc.slowest;
      best->empty_before = now.empty;
      best->empty_after = sc.empty;
      best_score = sc;
    };
    for (const auto& p : by_peer) {
      const auto a = static_cast<std::size_t>(p.stage);
      for (std::size_t b = 0; b < cost.size(); ++b) {
        if (b == a || blocked(p.peer, static_cast<int>(b))) continue;
        auto after = t;
        auto counts = count;
        after[a] -= p.speed / cost[a];
        after[b] += p.speed / cost[b];
        --counts[a];
        ++counts[b];
        consider(stage_move{p.peer, p.stage, static_cast<int>(b)}, after, counts);
      }
      for (const auto& q : by_peer) {  // swaps with a slower peer of another stage
        const auto b = static_cast<std::size_t>(q.stage);
        if (b == a || q.speed >= p.speed || blocked(p.peer, q.stage) || blocked(q.peer, p.stage)) continue;
        auto after = t;
        after[a] += (q.speed - p.speed) / cost[a];
        after[b] += (p.speed - q.speed) / cost[b];
        consider(stage_move{p.peer, p.stage, q.stage, q.peer}, after, count);
      }
    }
    return best;
  }
  bool blocked(int peer, int stage) const {
    const auto it = left_.find(peer);
    return it != left_.end() && it->second.first == stage && checks_ - it->second.second < static_cast<std::uint64_t>(settings_.cooldown);
  }

  rebalance_settings settings_;
  std::map<int, std::pair<int, std::uint64_t>> left_;  // peer -> (the stage it left, the check it left at)
  std::map<int, std::pair<double, int>> speeds_;       // peer -> (its speed's moving average, checks in it)
  std::optional<stage_move> last_;
  int streak_ = 0;
  std::uint64_t checks_ = 0, moves_ = 0;
};

}  // namespace decentrain::parallel::pools
