// ZB-H1, zero bubble at 1F1B's memory (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the
// backward split in two, the input half (what the stage before waits for) as early as it can
// run, the weight half put off into the time the stage would otherwise wait. Stage s keeps at
// most min(S - s, M) micro-batches' activations, as in 1F1B, and with equal costs the bubble
// falls from 1F1B's (S - 1) / (M + S - 1) to (S - 1) / (3M + S - 1).
//
// Written by running the stages in unit time steps, each taking at every step the first of: the
// input half of its oldest micro-batch whose output gradient has come; a forward, while it holds
// fewer than S - s micro-batches' activations; a weight half it owes. (The paper's heuristic
// scheduler, with the memory of 1F1B as its limit.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

inline program zb_h1(int peers, int micro_batches) {
  check_shape("zb-h1", peers, micro_batches);
  auto p = one_stage_per_peer(peers, micro_batches);
  const auto S = static_cast<std::size_t>(peers);
  const auto M = static_cast<std::size_t>(micro_batches);
  constexpr std::int64_t never = -1;
  // When each micro-batch's forward and input half ended on each stage (never: not yet).
  std::vector<std::vector<std::int64_t>> forward_end(S, std::vector<std::int64_t>(M, never));
  std::vector<std::vector<std::int64_t>> input_end(S, std::vector<std::int64_t>(M, never));
  std::vector<std::size_t> forwards(S, 0), inputs(S, 0), weights(S, 0);  // how many of each each stage ran
  const auto by = [](std::int64_t end, std::int64_t t) { return end != never && end <= t; };
  std::size_t left = 3 * S * M;
  const std::int64_t limit = 4 * static_cast<std::int64_t>(3 * M + S);  // a step count no such schedule reaches
  for (std::int64_t t = 0; left > 0; ++t) {
    decentrain::detail::check(t < limit, "schedule zb-h1: no progress by step ", t, " (a bug in the generator)");
    for (std::size_t s = 0; s < S; ++s) {
      auto& list = p.actions[s];
      const int stage = static_cast<int>(s);
      const std::size_t i = inputs[s], f = forwards[s];
      if (i < f && by(forward_end[s][i], t) && (s + 1 == S || by(input_end[s + 1][i], t))) {
        list.push_back({op::backward_input, static_cast<int>(i), stage});
        input_end[s][i] = t + 1;
        ++inputs[s];
      } else if (f < M && (s == 0 || by(forward_end[s - 1][f], t)) && f - i < S - s) {
        list.push_back({op::forward, static_cast<int>(f), stage});
        forward_end[s][f] = t + 1;
        ++forwards[s];
      } else if (weights[s] < i && by(input_end[s][weights[s]], t)) {
        list.push_back({op::backward_weight, static_cast<int>(weights[s]), stage});
        ++weights[s];
      } else {
        continue;
      }
      --left;
    }
  }
  return p;
}

}  // namespace decentrain::parallel::schedule
