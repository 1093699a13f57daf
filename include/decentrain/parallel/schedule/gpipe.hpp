// GPipe (Huang et al. 2019): every micro-batch forward through the stages, then every one
// backward. Bubble (S - 1) / (M + S - 1); each stage holds all M micro-batches' activations.
#pragma once

#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

inline program gpipe(int peers, int micro_batches) {
  check_shape("gpipe", peers, micro_batches);
  auto p = one_stage_per_peer(peers, micro_batches);
  for (int s = 0; s < peers; ++s) {
    auto& list = p.actions[static_cast<std::size_t>(s)];
    for (int m = 0; m < micro_batches; ++m) list.push_back({op::forward, m, s});
    for (int m = 0; m < micro_batches; ++m) list.push_back({op::backward, m, s});
  }
  return p;
}

}  // namespace decentrain::parallel::schedule
