// What the status page shows of a running training (decentrain-gpt train --status-port): each
// peer's latest step figures, its loss curve (thinned to a bounded number of points however long
// the run), its evaluations and the group's members, as one JSON document.
#pragma once

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cli {

class run_status {
 public:
  // `config` is the metrics' config line (a JSON object) and `total_steps` the run's length.
  run_status(std::string config, std::int64_t total_steps) : config_(std::move(config)), total_steps_(total_steps) {}

  // Hooks one peer's trainer (called before its fit; peers of one process share this object).
  template <class Trainer>
  void attach(Trainer& t) {
    t.on_step([this, &t](const decentrain::train::step_metrics& m) {
      std::lock_guard lock(mutex_);
      peer& p = peers_[m.rank];
      p.last = m;
      p.seen = true;
      add_point(p, m.step, m.loss);
      if constexpr (requires { t.members(); }) members_ = t.members();
    });
    t.on_eval([this](const decentrain::train::eval_point& e) {
      std::lock_guard lock(mutex_);
      auto& evals = peers_[e.rank].evals;
      if (evals.size() < max_points) evals.emplace_back(e.step, e.val_loss);
    });
  }

  // The other peers' pages (a TCP or MPI group: each process serves its own peer's figures and
  // links the others'), as (rank, address).
  void set_group(std::vector<std::pair<int, std::string>> pages) {
    std::lock_guard lock(mutex_);
    group_ = std::move(pages);
  }

  std::string json() const {
    std::lock_guard lock(mutex_);
    std::string out = "{\"config\": " + (config_.empty() ? std::string("{}") : config_) +
                      ", \"total_steps\": " + std::to_string(total_steps_) + ", \"members\": [";
    for (std::size_t i = 0; i < members_.size(); ++i) out += (i ? ", " : "") + std::to_string(members_[i]);
    out += "], \"group\": [";
    for (std::size_t i = 0; i < group_.size(); ++i)
      out += std::string(i ? ", " : "") + "{\"rank\": " + std::to_string(group_[i].first) + ", \"page\": " +
             decentrain::io::json_quote(group_[i].second) + "}";
    out += "], \"peers\": [";
    bool first = true;
    for (const auto& [rank, p] : peers_) {
      if (!p.seen) continue;
      const auto& m = p.last;
      out += std::string(first ? "" : ", ") + "{\"rank\": " + std::to_string(rank) + ", \"step\": " + std::to_string(m.step) +
             ", \"loss\": " + number(m.loss) + ", \"tokens_per_s\": " + number(m.tokens_per_s) +
             ", \"bytes_sent\": " + std::to_string(m.bytes_sent) + ", \"bytes_received\": " + std::to_string(m.bytes_received) +
             ", \"network_wait_s\": " + number(m.network_wait_s) + ", \"clock_s\": " + number(m.clock_s) +
             ", \"utilisation\": " + number(m.utilisation()) + ", \"curve\": [";
      for (std::size_t i = 0; i < p.curve.size(); ++i)
        out += (i ? ", [" : "[") + std::to_string(p.curve[i].first) + ", " + number(p.curve[i].second) + "]";
      out += "], \"evals\": [";
      for (std::size_t i = 0; i < p.evals.size(); ++i)
        out += (i ? ", [" : "[") + std::to_string(p.evals[i].first) + ", " + number(p.evals[i].second) + "]";
      out += "]}";
      first = false;
    }
    return out + "]}";
  }

 private:
  // Points kept per curve: past this, every other point goes and only every (doubled) stride-th
  // step is added, so a run of millions of steps costs the page what one of thousands does.
  static constexpr std::size_t max_points = 2000;
  struct peer {
    decentrain::train::step_metrics last;
    bool seen = false;
    std::vector<std::pair<std::int64_t, double>> curve, evals;
    std::int64_t stride = 1;
  };

  static void add_point(peer& p, std::int64_t step, double loss) {
    if (step % p.stride != 0) return;
    p.curve.emplace_back(step, loss);
    if (p.curve.size() < max_points) return;
    std::vector<std::pair<std::int64_t, double>> kept;
    p.stride *= 2;
    for (const auto& point : p.curve)
      if (point.first % p.stride == 0) kept.push_back(point);
    p.curve = std::move(kept);
  }
  static std::string number(double v) {  // JSON has no NaN or infinity
    if (!std::isfinite(v)) return "null";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
  }

  mutable std::mutex mutex_;
  std::string config_;
  std::int64_t total_steps_;
  std::map<int, peer> peers_;
  std::vector<int> members_;
  std::vector<std::pair<int, std::string>> group_;
};

// The peers that start a TCP or MPI run together swap their status pages' addresses: one
// all-gather of 128 bytes each on a channel of its own, before training (a peer without a page,
// or whose address does not fit, sends an empty one; what is not a plain http:// address is
// dropped). Every such peer calls it, page or not.
template <class Endpoint>
std::vector<std::pair<int, std::string>> swap_status_pages(Endpoint& ep, const std::string& mine) {
  constexpr std::size_t width = 128;
  char own[width] = {};
  if (mine.size() < width) std::copy(mine.begin(), mine.end(), own);
  decentrain::collective::communicator<Endpoint> c(ep, {}, 0x53544154u);  // "STAT"
  const auto all = c.all_gather(std::span<const char>(own, width));
  std::vector<std::pair<int, std::string>> pages;
  for (int r = 0; r < c.world(); ++r) {
    const char* at = all.data() + static_cast<std::size_t>(r) * width;
    const std::string page(at, strnlen(at, width));
    // Another peer's text goes into this page's links: only a plain http:// address is taken.
    const bool plain = page.rfind("http://", 0) == 0 && std::all_of(page.begin(), page.end(), [](char ch) {
      return ch > ' ' && ch < 127 && ch != '"' && ch != '\'' && ch != '<' && ch != '>' && ch != '\\';
    });
    if (r != ep.rank() && plain) pages.emplace_back(r, page);
  }
  return pages;
}

}  // namespace cli
