// What a trainer reports: after every step, at every evaluation, and at the end of fit.
#pragma once

#include <cstdint>
#include <vector>

namespace decentrain::train {

struct step_metrics {
  int rank = 0;
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
  double utilisation() const { return clock_s > 0 ? compute_s / clock_s : 0.0; }
};

struct eval_point {
  int rank = 0;
  std::int64_t step = 0;
  double val_loss = 0;
  std::uint64_t bytes_sent = 0;         // everything this peer's transport sent so far
  double clock_s = 0;
  std::uint64_t policy_bytes_sent = 0;  // of which the communication policy's
};

struct fit_result {
  double final_val_loss = 0;
  step_metrics last;
  std::vector<eval_point> evals;
  bool stopped = false;  // ended early by trainer::stop_when (no final evaluation then)
};

}  // namespace decentrain::train
