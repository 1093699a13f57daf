// What a parallelism policy is: a struct of settings that opts in with
// `using policy_concept = parallel::policy_tag;` and owns the step. It says where a peer sits
//   placement place(int rank, int world) const      its pipeline stage and the world ranks that
//                                                   hold the same parameters (its replicas)
// and runs, for the trainer,
//   step_result forward_backward(Ctx&)               one step's forward and backward (micro-
//                                                   batches, stages, sends inside), gradients
//                                                   left in the parameters
//   double evaluate(Ctx&, std::int64_t batch)        the validation loss of one batch, no gradients
// `Ctx` is a train::peer_context; train/concepts.hpp checks each member.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "decentrain/detail/meta.hpp"
#include "decentrain/nn/part.hpp"

namespace decentrain::parallel {

struct policy_tag {};

template <class P>
concept declares_parallel_policy = decentrain::detail::opts_into<P, policy_tag>;

// Where a peer sits. The communication policy averages among `replicas` only: the world's ranks
// (ascending, this peer included) that hold the same parameters. Data parallelism: everyone.
// With several stages (or chunks), the trainer builds only this stage's part of the model
// (nn::part: `blocks` per model stage, empty for an even cut) and `pipeline` lists the world ranks that hold stage 0, 1,
// ... of this peer's copy of the model (this peer at index `stage`); empty where there is no fixed
// copy (SWARM: each stage's pool takes micro-batches from any peer of the stage before).
struct placement {
  int stage = 0;
  int stages = 1;
  int copy = 0;  // which copy of the pipeline (its rows of each step), of world / stages
  std::vector<int> replicas;
  std::vector<int> pipeline;
  std::vector<std::int64_t> blocks;
  int chunks = 1;  // model stages per peer (interleaved schedules: the model is cut into stages x chunks)
  nn::chunk_layout layout = nn::chunk_layout::looped;  // which of the model's stages are this peer's chunks

  // The part of the model this peer builds and runs.
  nn::part part() const { return nn::part{stage, stages, blocks, chunks, layout}; }
};

// The placement of plain data parallelism: one stage, every peer a replica.
inline placement everyone(int world) {
  placement p;
  for (int r = 0; r < world; ++r) p.replicas.push_back(r);
  return p;
}

// What one step computed on this peer.
struct step_result {
  double loss = std::numeric_limits<double>::quiet_NaN();  // this step's training loss (NaN where unknown)
  std::int64_t rows = 0;    // sequences this peer processed
  std::int64_t tokens = 0;  // tokens this peer processed (for tokens/s)
  double weight = 1.0;      // this peer's weight when contributions are averaged (its rows, say)
};

}  // namespace decentrain::parallel
