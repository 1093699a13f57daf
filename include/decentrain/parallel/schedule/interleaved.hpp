// Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): the model cut into v x S stages, peer p
// holding v of them (its chunks: stages p, p + S, ..., p + (v - 1) S). Each peer goes through its
// chunks S micro-batches at a time, chunk after chunk, forwards in chunk order and backwards in
// the reverse; it runs (S - p - 1) x 2 + (v - 1) x S forwards ahead, then one forward and one
// backward in turn, then the backwards left. The pipeline fills v times as fast: with a unit per
// chunk's action the bubble is (S - 1) / (vM + S - 1) against 1F1B's (S - 1) / (M + S - 1), for
// more transfers and more activations held (up to (S - p - 1) x 2 + (v - 1) x S + 1 micro-batch
// chunks). As Megatron's, it needs M to be a multiple of S.
#pragma once

#include <algorithm>

#include "decentrain/detail/error.hpp"
#include "decentrain/parallel/schedule/action.hpp"

namespace decentrain::parallel::schedule {

inline program interleaved(int peers, int micro_batches, int chunks) {
  check_shape("interleaved", peers, micro_batches);
  decentrain::detail::check(chunks >= 1, "schedule interleaved: needs at least one chunk per peer, got ", chunks);
  decentrain::detail::check(micro_batches % peers == 0, "schedule interleaved: micro-batches (", micro_batches,
                            ") must be a multiple of the peers (", peers, ")");
  const int S = peers, M = micro_batches, v = chunks;
  program p;
  p.micro_batches = M;
  for (int s = 0; s < S * v; ++s) p.peer_of.push_back(s % S);
  p.actions.resize(static_cast<std::size_t>(S));
  const int total = M * v;  // a peer's forwards (and backwards): every micro-batch through every chunk
  // The k-th forward or backward of peer `peer`: its chunk, the micro-batch, the model's stage.
  const auto nth = [&](int peer, int k, op what) {
    const int in_group = k % (S * v);
    int chunk = in_group / S;
    if (what != op::forward) chunk = v - 1 - chunk;
    const int micro = (k / (S * v)) * S + k % S;
    return action{what, micro, chunk * S + peer};
  };
  for (int peer = 0; peer < S; ++peer) {
    auto& list = p.actions[static_cast<std::size_t>(peer)];
    const int ahead = v == 1 ? std::min(S - peer - 1, total) : std::min((S - peer - 1) * 2 + (v - 1) * S, total);
    int forward = 0, backward = 0;
    for (; forward < ahead; ++forward) list.push_back(nth(peer, forward, op::forward));
    while (forward < total) {
      list.push_back(nth(peer, forward++, op::forward));
      list.push_back(nth(peer, backward++, op::backward));
    }
    while (backward < total) list.push_back(nth(peer, backward++, op::backward));
  }
  return p;
}

}  // namespace decentrain::parallel::schedule
