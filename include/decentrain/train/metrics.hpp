// What a trainer reports: after every step, at every evaluation, and at the end of fit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace decentrain::train {

struct step_metrics {
  int rank = 0;  // the peer's world rank (its endpoint's): the same after its group's view changes
  std::int64_t step = 0;  // steps done so far
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;  // by this peer's transport, cumulative
  double network_wait_s = 0;  // cumulative time blocked on the network (simulated for in_process)
  double clock_s = 0;         // the transport's clock: simulated time for in_process, wall otherwise
  double wall_s = 0;          // since fit() began
  double unix_time = 0;       // seconds since the epoch, when the step ended
  // Of bytes_sent, what the communication policy's own collectives sent (evaluation excluded).
  std::uint64_t policy_bytes_sent = 0;
  std::int64_t redos = 0;     // steps (parts) the fault policy had redone, cumulative
  // Seconds this peer spent computing steps (forward, backward, optimizer), cumulative; over
  // clock_s it is the compute utilisation: the share of the time the processor was not left
  // waiting on the network.
  double compute_s = 0;
  // The most bytes per second this peer's transport sent over any span of at least a second of
  // its clock so far (see send_rate).
  double peak_send_rate = 0;
  // What the transport sent beside bytes_sent: frame headers, padding, control frames
  // (transport::traffic_stats; 0 where the transport adds none it can count), cumulative.
  std::uint64_t framing_bytes_sent = 0;
  // Tokens this peer trained on in this fit, cumulative: a policy sized to speed takes several
  // inner steps a step, so steps x batch does not count them.
  std::int64_t tokens = 0;
  double utilisation() const { return clock_s > 0 ? compute_s / clock_s : 0.0; }
  double mean_send_rate() const { return clock_s > 0 ? static_cast<double>(bytes_sent) / clock_s : 0.0; }
};

// A peer's peak send rate, fed its (clock, bytes sent) after each step in order: the largest rate
// over the shortest run of steps that spans at least `window_s` of clock. A step alone would not
// do: an exchange in the background sends in bursts that land between steps.
class send_rate {
 public:
  explicit send_rate(double window_s = 1.0) : window_s_(window_s) {}
  void add(double clock_s, std::uint64_t bytes_sent) {
    seen_.emplace_back(clock_s, bytes_sent);
    while (seen_.size() > 2 && seen_.back().first - seen_[1].first >= window_s_) seen_.pop_front();
    const auto& [t0, b0] = seen_.front();
    const auto& [t1, b1] = seen_.back();
    if (t1 - t0 >= window_s_ && t1 > t0) peak_ = std::max(peak_, static_cast<double>(b1 - b0) / (t1 - t0));
  }
  double peak() const { return peak_; }  // bytes per second; 0 before a window has passed

 private:
  double window_s_;
  std::deque<std::pair<double, std::uint64_t>> seen_;
  double peak_ = 0;
};

struct eval_point {
  int rank = 0;  // the peer's world rank, as step_metrics::rank
  std::int64_t step = 0;
  double val_loss = 0;
  std::uint64_t bytes_sent = 0;         // everything this peer's transport sent so far
  double clock_s = 0;
  std::uint64_t policy_bytes_sent = 0;  // of which the communication policy's
  // Under a policy whose replicas hold different parameters between its exchanges (gossip:
  // CommPolicy::replicas_differ), the mean over the replicas of the L2 distance of each one's
  // parameters from their mean; -1 where not measured (the replicas are equal by construction).
  double consensus_distance = -1;
};

struct fit_result {
  double final_val_loss = 0;
  step_metrics last;
  std::vector<eval_point> evals;
  bool stopped = false;  // ended early by trainer::stop_when (no final evaluation then)
};

}  // namespace decentrain::train
