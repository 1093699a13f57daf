// ZB-V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 6): the model cut into 2S
// stages, peer p holding stages p and 2S - 1 - p (a V: down the peers and back up, so the first
// peer holds both ends of the model and the turn at the last peer needs no transfer), each
// backward split into its input and weight halves as in ZB-H1. A chunk's actions cost half a
// stage's; with equal costs a step takes 6M + S - 1 chunk actions once M >= 3S/2, the least any
// schedule can (the last peer waits S - 1 for its first forward and then has 6M to run), and
// 4M + 4S - 2 below that. Every peer holds at most 2S chunks' activations (forward run, weight
// half not yet), S stages' worth: 1F1B's most.
//
// Peer p: 2(S - p) - 1 forwards of its first chunk; p times a forward of each chunk; S - p times
// the second chunk's forward and both its halves; then, while forwards are left, the first
// chunk's forward and both halves and the second's forward and both halves; then p times both
// chunks' input halves, S - p times the first chunk's input half and an owed weight half, and
// the weight halves left, the second chunk's first. (The paper's handcrafted schedule, as
// torch.distributed.pipelining's ScheduleZBVZeroBubble writes it; written for max(M, 2S - 1)
// micro-batches, those past M dropped.)
#pragma once

#include <algorithm>

#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

inline program zb_v(int peers, int micro_batches) {
  check_shape("zb-v", peers, micro_batches);
  const int S = peers, M = micro_batches, n = std::max(M, 2 * S - 1);
  program p;
  p.micro_batches = M;
  for (int s = 0; s < 2 * S; ++s) p.peer_of.push_back(s < S ? s : 2 * S - 1 - s);
  p.actions.resize(static_cast<std::size_t>(S));
  for (int peer = 0; peer < S; ++peer) {
    auto& list = p.actions[static_cast<std::size_t>(peer)];
    const int first = peer, second = 2 * S - 1 - peer;  // its model stages
    int f0 = 0, f1 = 0, i0 = 0, i1 = 0;  // forwards and input halves run, per chunk
    const auto add = [&](op what, int micro, int stage) {
      if (micro < M) list.push_back({what, micro, stage});
    };
    const auto both_halves = [&](int& input, int stage) {
      add(op::backward_input, input, stage);
      add(op::backward_weight, input++, stage);
    };
    for (int k = 0; k < 2 * (S - peer) - 1; ++k) add(op::forward, f0++, first);
    for (int k = 0; k < peer; ++k) {
      add(op::forward, f1++, second);
      add(op::forward, f0++, first);
    }
    for (int k = 0; k < S - peer; ++k) {
      add(op::forward, f1++, second);
      both_halves(i1, second);
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(op::forward, f0++, first);
      both_halves(i0, first);
      add(op::forward, f1++, second);
      both_halves(i1, second);
    }
    int w0 = i0, w1 = i1;  // weight halves run
    for (int k = 0; k < peer; ++k) {
      add(op::backward_input, i0++, first);
      add(op::backward_input, i1++, second);
    }
    for (int k = 0; k < S - peer; ++k) {
      add(op::backward_input, i0++, first);
      add(op::backward_weight, w0++, first);
    }
    while (w1 < i1) add(op::backward_weight, w1++, second);
    while (w0 < i0) add(op::backward_weight, w0++, first);
  }
  return p;
}

}  // namespace decentrain::parallel::schedule
