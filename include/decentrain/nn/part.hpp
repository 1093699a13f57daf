// A part of a model cut along its depth into pipeline stages: the part peer `stage` of `stages`
// holds, and how many of the model's blocks each stage holds. With `chunks` v > 1 the model is
// cut into v x stages stages and the peer holds v of them (its chunks), in one of two layouts:
// looped, stage, stage + stages, ... (interleaved 1F1B), or v, chunk c going down the peers when
// c is even and back up when it is odd, so that with two chunks peer p holds model stages p and
// 2 x stages - 1 - p (ZB-V: the first peer holds both the first and the last model stage). A
// model that can be cut takes one in its constructor (nn::gpt: embeddings with model stage 0,
// the final layer norm and the head with the last) and holds only that part's parameters.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::nn {

enum class chunk_layout : std::uint8_t { looped, v };

struct part {
  int stage = 0;
  int stages = 1;
  // Blocks per model stage (v x stages of them), stage 0 first; empty: as even as they go, the
  // earlier stages taking one more where the blocks do not divide (a cost partitioner fills it
  // otherwise).
  std::vector<std::int64_t> blocks;
  int chunks = 1;
  chunk_layout layout = chunk_layout::looped;

  bool whole() const { return stages == 1 && chunks == 1; }
  int model_stages() const { return stages * chunks; }
  // The peer that holds model stage `s` (of model_stages()).
  int peer_of(int s) const {
    const int chunk = s / stages, i = s % stages;
    return layout == chunk_layout::v && chunk % 2 == 1 ? stages - 1 - i : i;
  }
  // Whether model stage `s` is one of this part's.
  bool holds(int s) const { return s >= 0 && s < model_stages() && peer_of(s) == stage; }
  // Whether it holds the model's first stage (the embeddings) and its last (the head).
  bool first() const { return holds(0); }
  bool last() const { return holds(model_stages() - 1); }
  // Which of this part's chunks model stage `s` is (its chunks in model order).
  int chunk_of(int s) const {
    decentrain::detail::check(holds(s), "model part: stage ", s, " is not held by peer ", stage, " of ", stages);
    int chunk = 0;
    for (int t = 0; t < s; ++t) chunk += holds(t) ? 1 : 0;
    return chunk;
  }

  // The blocks [begin, end) of model stage `s` of a model with `n_blocks`; throws naming the
  // setting that does not fit it.
  std::pair<std::int64_t, std::int64_t> block_range(std::int64_t n_blocks, int s) const {
    const auto counts = blocks_per_stage(n_blocks);
    decentrain::detail::check(s >= 0 && s < model_stages(), "model part: stage ", s, " is outside [0, ", model_stages(), ")");
    const auto begin = std::accumulate(counts.begin(), counts.begin() + s, std::int64_t{0});
    return {begin, begin + counts[static_cast<std::size_t>(s)]};
  }

  std::vector<std::int64_t> blocks_per_stage(std::int64_t n_blocks) const {
    using decentrain::detail::check;
    check(stages >= 1, "model part: stages must be >= 1, got ", stages);
    check(chunks >= 1, "model part: chunks must be >= 1, got ", chunks);
    check(stage >= 0 && stage < stages, "model part: stage ", stage, " is outside [0, ", stages, ")");
    const int n = model_stages();
    check(n <= n_blocks, "model part: ", n, " stages", chunks > 1 ? " (stages x chunks)" : "", " cut a model of ", n_blocks,
          " blocks (layers); each stage needs at least one, so stages", chunks > 1 ? " x chunks" : "", " must be <= ", n_blocks);
    if (blocks.empty()) {
      std::vector<std::int64_t> even(static_cast<std::size_t>(n), n_blocks / n);
      for (std::int64_t s = 0; s < n_blocks % n; ++s) ++even[static_cast<std::size_t>(s)];
      return even;
    }
    check(blocks.size() == static_cast<std::size_t>(n), "model part: blocks per stage lists ", blocks.size(),
          " stages, the model is cut into ", n);
    for (std::size_t s = 0; s < blocks.size(); ++s)
      check(blocks[s] >= 1, "model part: stage ", s, " is given ", blocks[s], " blocks; each stage needs at least one");
    const auto total = std::accumulate(blocks.begin(), blocks.end(), std::int64_t{0});
    check(total == n_blocks, "model part: blocks per stage add up to ", total, ", the model has ", n_blocks);
    return blocks;
  }
};

}  // namespace decentrain::nn
