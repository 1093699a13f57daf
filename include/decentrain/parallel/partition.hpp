// Where to cut a model into pipeline stages from what its parts cost (torchtitan's and
// DeepSpeed's partitioners do the same from measured or counted costs): contiguous runs of
// blocks, each stage at least one, so that the slowest stage, which sets the pipeline's pace,
// is as fast as any cut can make it. The end stages carry extra work beside their blocks (the
// embeddings on the first, the final norm, the head and the loss on the last), which an even
// cut ignores. The result goes into parallel::pipeline::blocks (nn::part::blocks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::parallel {

struct model_costs {
  std::vector<double> blocks;  // each block's cost (a micro-batch's forward and backward, say)
  double first_extra = 0;      // beside its blocks, on the first stage
  double last_extra = 0;       // beside its blocks, on the last stage
};

// Each stage's cost under a cut (blocks per stage).
inline std::vector<double> stage_costs(const model_costs& c, const std::vector<std::int64_t>& cut) {
  std::vector<double> out;
  std::size_t next = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    double sum = s == 0 ? c.first_extra : 0.0;
    if (s + 1 == cut.size()) sum += c.last_extra;
    for (std::int64_t b = 0; b < cut[s]; ++b) sum += c.blocks.at(next++);
    out.push_back(sum);
  }
  return out;
}

// Blocks per stage minimising the slowest stage's cost (dynamic programming over the cut points,
// S x n^2 steps); among equal cuts, the first found. Throws when the stages cannot each hold a block.
inline std::vector<std::int64_t> partition(const model_costs& c, int stages) {
  const auto n = static_cast<int>(c.blocks.size());
  decentrain::detail::check(stages >= 1 && stages <= n, "partition: ", stages, " stages for ", n,
                            " blocks (each stage needs at least one)");
  for (const double b : c.blocks) decentrain::detail::check(b >= 0, "partition: a block's cost must be >= 0, got ", b);
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + c.blocks[static_cast<std::size_t>(i)];
  const auto run = [&](int from, int to, int s) {  // blocks [from, to) as stage s
    double cost = prefix[static_cast<std::size_t>(to)] - prefix[static_cast<std::size_t>(from)];
    if (s == 0) cost += c.first_extra;
    if (s == stages - 1) cost += c.last_extra;
    return cost;
  };
  constexpr double none = std::numeric_limits<double>::infinity();
  // best[s][i]: the slowest of stages 0..s when they hold the first i blocks; from[s][i]: where stage s starts.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages), std::vector<double>(static_cast<std::size_t>(n) + 1, none));
  std::vector<std::vector<int>> from(static_cast<std::size_t>(stages), std::vector<int>(static_cast<std::size_t>(n) + 1, -1));
  for (int i = 1; i <= n; ++i) best[0][static_cast<std::size_t>(i)] = run(0, i, 0);
  for (int s = 1; s < stages; ++s)
    for (int i = s + 1; i <= n; ++i)
      for (int j = s; j < i; ++j) {
        const double slowest = std::max(best[static_cast<std::size_t>(s) - 1][static_cast<std::size_t>(j)], run(j, i, s));
        if (slowest < best[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)]) {
          best[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] = slowest;
          from[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)] = j;
        }
      }
  std::vector<std::int64_t> cut(static_cast<std::size_t>(stages));
  for (int s = stages - 1, end = n; s >= 0; --s) {
    const int begin = s == 0 ? 0 : from[static_cast<std::size_t>(s)][static_cast<std::size_t>(end)];
    cut[static_cast<std::size_t>(s)] = end - begin;
    end = begin;
  }
  return cut;
}

}  // namespace decentrain::parallel
