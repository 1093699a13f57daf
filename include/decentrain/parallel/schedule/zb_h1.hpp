// ZB-H1, zero bubble at 1F1B's memory (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the
// backward split in two, the input half (what the stage before waits for) run as 1F1B runs its
// backward, the weight half put off into the time the stage would otherwise wait. With equal
// costs the bubble falls from 1F1B's (S - 1) / (M + S - 1) to (S - 1) / (3M + S - 1).
//
// Stage s runs S - 1 - s forwards ahead (one fewer than 1F1B: its input halves come back sooner),
// then a forward and an input half in turn, then the input halves left; after each input half
// from the (s + 1)-th on, the weight half of the oldest micro-batch that owes one; the weight
// halves left at the end. So stage s holds at most S - s micro-batches between forward and input
// half, as in 1F1B, and at most S between forward and weight half on every stage, 1F1B's most
// (its first stage's). (The paper's handcrafted schedule, as torch.distributed.pipelining's
// ScheduleInterleavedZeroBubble writes it for one chunk.)
#pragma once

#include <algorithm>

#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

inline program zb_h1(int peers, int micro_batches) {
  check_shape("zb-h1", peers, micro_batches);
  auto p = one_stage_per_peer(peers, micro_batches);
  const int S = peers, M = micro_batches;
  for (int s = 0; s < S; ++s) {
    auto& list = p.actions[static_cast<std::size_t>(s)];
    const int ahead = std::min(S - 1 - s, M);
    int forward = 0, input = 0, weight = 0;
    for (; forward < ahead; ++forward) list.push_back({op::forward, forward, s});
    while (input < M) {
      if (forward < M) list.push_back({op::forward, forward++, s});
      list.push_back({op::backward_input, input++, s});
      if (input > s) list.push_back({op::backward_weight, weight++, s});
    }
    while (weight < M) list.push_back({op::backward_weight, weight++, s});
  }
  return p;
}

}  // namespace decentrain::parallel::schedule
