// A pipeline schedule as data: for each peer of the pipeline, the actions it runs in order (as
// torch.distributed.pipelining's schedules are lists of actions). Generators write such
// programs (gpipe.hpp, one_f_one_b.hpp, zb_h1.hpp), check.hpp checks one, simulate.hpp times
// one from given costs; the executor that runs one on a model's stages takes the same data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::parallel::schedule {

// backward: a micro-batch's whole backward on a stage, input and weight gradients at once;
// backward_input and backward_weight: its two halves, which zero-bubble schedules run apart
// (the input gradient is what the previous stage waits for; the weight gradient fills bubbles).
enum class op : std::uint8_t { forward, backward, backward_input, backward_weight };

inline const char* name_of(op o) {
  switch (o) {
    case op::forward: return "F";
    case op::backward: return "B";
    case op::backward_input: return "I";
    case op::backward_weight: return "W";
  }
  return "?";
}

// One action: `what` for micro-batch `micro` on stage `stage` (a stage is a part of the model;
// a peer may hold several: the chunks of interleaved schedules).
struct action {
  op what = op::forward;
  int micro = 0;
  int stage = 0;
  friend bool operator==(const action&, const action&) = default;
};

inline std::string to_string(const action& a) {
  return decentrain::detail::concat(name_of(a.what), a.micro, "@", a.stage);
}

// A schedule for one step: `micro_batches` micro-batches through the stages, stage 0 first in
// the model; `peer_of[s]` holds stage s; `actions[p]` is what peer p runs, in order.
struct program {
  int micro_batches = 0;
  std::vector<int> peer_of;
  std::vector<std::vector<action>> actions;

  int peers() const { return static_cast<int>(actions.size()); }
  int stages() const { return static_cast<int>(peer_of.size()); }
};

// The settings every generator checks: at least one peer and one micro-batch.
inline void check_shape(const char* schedule, int peers, int micro_batches) {
  decentrain::detail::check(peers >= 1, "schedule ", schedule, ": needs at least one peer (stage), got ", peers);
  decentrain::detail::check(micro_batches >= 1, "schedule ", schedule, ": needs at least one micro-batch, got ", micro_batches);
}

// One stage per peer, stage p on peer p.
inline program one_stage_per_peer(int peers, int micro_batches) {
  program p;
  p.micro_batches = micro_batches;
  for (int s = 0; s < peers; ++s) p.peer_of.push_back(s);
  p.actions.resize(static_cast<std::size_t>(peers));
  return p;
}

}  // namespace decentrain::parallel::schedule
