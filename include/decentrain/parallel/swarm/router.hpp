// Where SWARM sends a micro-batch next: among the peers of the next stage, each gets a share of
// the micro-batches proportional to its measured throughput (samples per second, its link
// included: a measurement is the round trip of a micro-batch sent to it), in an interleaved
// order (smooth weighted round-robin: every peer's weight is added to its credit, the peer with
// the most credit goes next and pays the weights' sum; with weights that hold still, every peer's
// count is within one of its share over any window, and no peer gets a burst).
// The estimate is SWARM's (yandex-research/swarm, balancer.py): an exponential moving average
// of seconds per sample, alpha 0.1, bias-corrected (a peer's first measurement is its estimate,
// not a tenth of it). Unlike it, a change of speed is followed at once: `confirm` measurements in
// a row that are each over `change_ratio` times the estimate (or under 1 / that) restart the
// average from them, so a peer that became 4x slower loses its share after two micro-batches
// rather than over the ~30 it takes an average with alpha 0.1 to forget, while noise of +-20%
// (a ratio of 1.5 at most) never restarts it. A peer not measured yet is assumed as fast as the
// mean of those that are, so a joiner gets work and is measured.
// The state (estimates, credits) is in the checkpoint: a deterministic run resumes bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "decentrain/detail/error.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::parallel::pools {

struct router_settings {
  double alpha = 0.1;         // the weight of a new measurement in the average
  double change_ratio = 2.0;  // a measurement this many times off the estimate (either way) counts toward a restart
  int confirm = 2;            // that many in a row, the same way, restart the average from them

  void validate() const {
    decentrain::detail::check(alpha > 0 && alpha <= 1, "swarm router: alpha must be in (0, 1], got ", alpha);
    decentrain::detail::check(change_ratio > 1 && std::isfinite(change_ratio), "swarm router: change_ratio must be > 1, got ",
                              change_ratio);
    decentrain::detail::check(confirm >= 1, "swarm router: confirm must be >= 1, got ", confirm);
  }
};

class router {
 public:
  explicit router(router_settings s = {}) : settings_(s) { settings_.validate(); }

  // The peers that may take micro-batches (one removed and added again starts unmeasured).
  void add(int peer) { peers_.try_emplace(peer); }
  void remove(int peer) { peers_.erase(peer); }
  bool contains(int peer) const { return peers_.count(peer) != 0; }
  std::size_t size() const { return peers_.size(); }

  // The next peer, skipping `excluded` (those that failed this micro-batch or passed its
  // deadline); none when every peer is excluded.
  std::optional<int> next(const std::set<int>& excluded = {}) {
    double total = 0;
    entry* best = nullptr;
    int chosen = -1;
    const double fallback = mean_throughput();
    for (auto& [peer, e] : peers_) {
      if (excluded.count(peer)) continue;
      const double w = throughput_of(e, fallback);
      e.credit += w;
      total += w;
      if (!best || e.credit > best->credit) best = &e, chosen = peer;
    }
    if (!best) return std::nullopt;
    best->credit -= total;
    return chosen;
  }

  // One micro-batch of `samples` went to `peer` and came back `seconds` later.
  void measured(int peer, double seconds, double samples = 1) {
    decentrain::detail::check(seconds > 0 && std::isfinite(seconds) && samples > 0 && std::isfinite(samples),
                              "swarm router: a measurement needs seconds > 0 and samples > 0, got ", seconds, " s for ",
                              samples, " samples");
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;  // left since it was sent
    entry& e = it->second;
    const double x = seconds / samples;
    decentrain::detail::check(x > 0 && std::isfinite(x), "swarm router: ", seconds, " s for ", samples,
                              " samples is no time a sample can take");
    if (e.count > 0) {
      const double estimate = seconds_per_sample(e), ratio = x / estimate;
      const int way = ratio > settings_.change_ratio ? 1 : ratio < 1 / settings_.change_ratio ? -1 : 0;
      if (way != 0 && way == e.way) {
        e.run_sum += x;
        ++e.run;
      } else {
        e.way = way;
        e.run = way != 0 ? 1 : 0;
        e.run_sum = way != 0 ? x : 0;
      }
      if (e.run >= settings_.confirm) {  // the peer changed: start again from what it does now
        e.average = 0;
        e.count = 0;
        e.way = 0;
        take(e, e.run_sum / e.run);
        e.run = 0;
        e.run_sum = 0;
        ++restarts_;
        return;
      }
    }
    take(e, x);
  }

  // Samples per second the router expects of `peer` (the mean of the measured ones until it is
  // measured; 1 when none is).
  double throughput(int peer) const {
    const auto it = peers_.find(peer);
    decentrain::detail::check(it != peers_.end(), "swarm router: peer ", peer, " is not among its peers");
    return throughput_of(it->second, mean_throughput());
  }
  // How long `samples` should take `peer`, by the estimate (none before its first measurement).
  std::optional<double> expected_seconds(int peer, double samples = 1) const {
    const auto it = peers_.find(peer);
    if (it == peers_.end() || it->second.count == 0) return std::nullopt;
    return samples * seconds_per_sample(it->second);
  }
  // How often a peer's average was restarted by a change of speed.
  std::uint64_t restarts() const { return restarts_; }

  // Exact (hexadecimal floats): a deterministic run resumes with the same picks.
  void save(io::checkpoint& c, const std::string& prefix) const {
    std::string text;
    char buf[160];
    for (const auto& [peer, e] : peers_) {
      std::snprintf(buf, sizeof buf, "%d %a %lld %a %d %d %a;", peer, e.average, static_cast<long long>(e.count), e.credit, e.way,
                    e.run, e.run_sum);
      text += buf;
    }
    c.text[prefix + "router"] = text;
    c.counters[prefix + "router.restarts"] = static_cast<std::int64_t>(restarts_);
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    const auto it = c.text.find(prefix + "router");
    decentrain::detail::check(it != c.text.end(), "swarm router: the checkpoint has no '", prefix, "router'");
    std::map<int, entry> loaded;
    std::istringstream in(it->second);
    for (std::string item; std::getline(in, item, ';');) {
      if (item.empty()) continue;
      std::istringstream fields(item);
      std::string average, credit, run_sum;
      int peer = 0;
      long long count = 0;
      entry e;
      fields >> peer >> average >> count >> credit >> e.way >> e.run >> run_sum;
      decentrain::detail::check(!fields.fail(), "swarm router: the checkpoint's entry '", item, "' is malformed");
      const auto number = [&](const std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        decentrain::detail::check(end && end != text.c_str() && *end == '\0' && std::isfinite(v), "swarm router: the checkpoint's entry '",
                                  item, "' is malformed");
        return v;
      };
      e.average = number(average);
      e.count = count;
      e.credit = number(credit);
      e.run_sum = number(run_sum);
      decentrain::detail::check(count >= 0 && (count == 0 ? e.average == 0 : e.average > 0) && e.way >= -1 && e.way <= 1 &&
                                    e.run >= 0 && e.run_sum >= 0,
                                "swarm router: the checkpoint's entry '", item, "' is out of range");
      loaded[peer] = e;
    }
    peers_ = std::move(loaded);
    const auto r = c.counters.find(prefix + "router.restarts");
    restarts_ = r == c.counters.end() ? 0 : static_cast<std::uint64_t>(r->second);
  }

 private:
  struct entry {
    double average = 0;      // the moving average of seconds per sample, before bias correction
    std::int64_t count = 0;  // measurements in it
    double credit = 0;       // smooth weighted round-robin
    int way = 0, run = 0;    // measurements in a row off the estimate, and which way (+1 slower, -1 faster)
    double run_sum = 0;      // their seconds per sample, summed
  };

  void take(entry& e, double x) {  // one measurement into the average
    e.average = (1 - settings_.alpha) * e.average + settings_.alpha * x;
    ++e.count;
  }
  double seconds_per_sample(const entry& e) const {
    return e.average / (1 - std::pow(1 - settings_.alpha, static_cast<double>(e.count)));
  }
  double throughput_of(const entry& e, double fallback) const { return e.count > 0 ? 1 / seconds_per_sample(e) : fallback; }
  double mean_throughput() const {
    double sum = 0;
    int n = 0;
    for (const auto& [peer, e] : peers_)
      if (e.count > 0) sum += 1 / seconds_per_sample(e), ++n;
    return n > 0 ? sum / n : 1.0;
  }

  router_settings settings_;
  std::map<int, entry> peers_;
  std::uint64_t restarts_ = 0;
};

}  // namespace decentrain::parallel::pools
