// 1F1B, PipeDream-Flush (Narayanan et al. 2021): stage s runs S - s - 1 forwards ahead, then one
// forward and one backward in turn, then the backwards left. GPipe's bubble, (S - 1) / (M + S - 1),
// but stage s holds at most min(S - s, M) micro-batches' activations instead of M.
#pragma once

#include <algorithm>

#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

inline program one_f_one_b(int peers, int micro_batches) {
  check_shape("1f1b", peers, micro_batches);
  auto p = one_stage_per_peer(peers, micro_batches);
  for (int s = 0; s < peers; ++s) {
    auto& list = p.actions[static_cast<std::size_t>(s)];
    const int ahead = std::min(peers - s - 1, micro_batches);
    int forward = 0, backward = 0;
    for (; forward < ahead; ++forward) list.push_back({op::forward, forward, s});
    while (forward < micro_batches) {
      list.push_back({op::forward, forward++, s});
      list.push_back({op::backward, backward++, s});
    }
    while (backward < micro_batches) list.push_back({op::backward, backward++, s});
  }
  return p;
}

}  // namespace decentrain::parallel::schedule
