// Cross-entropy with logits, fused with the softmax. Rows whose target equals ignore_index
// count for nothing; the loss is the mean over the others (NaN when there are none, as in
// PyTorch). The forward keeps each row's logsumexp (N values), so the backward computes the
// softmax in one pass over the logits instead of keeping an (N, V) probability tensor alive.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"
#include "decentrain/kernels/cpu/softmax.hpp"

namespace decentrain::kernels {

// Returns the summed loss over the rows whose target is not ignore_index (the caller counts
// them while validating the targets, which must lie in [0, V) or equal ignore_index), and
// writes each counted row's logsumexp to row_lse (N entries; ignored rows' are unspecified).
template <class T>
double cross_entropy_forward(cpu, const T* logits, const std::int32_t* targets, std::int64_t N,
                             std::int64_t V, std::int32_t ignore_index, T* row_lse) {
  double total = 0.0;
  DECENTRAIN_OMP(parallel for reduction(+ : total) if (N * V >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets[i] == ignore_index) continue;
    const T* row = logits + i * V;
    const auto [mx, sum] = detail::row_softmax_stats(row, V);
    row_lse[i] = mx + std::log(sum);
    total += static_cast<double>(row_lse[i] - row[targets[i]]);
  }
  return total;
}

// dlogits = dloss_per_row * (softmax(logits) - onehot(target)) for counted rows, 0 for ignored
// ones (written, not accumulated); row_lse from the forward.
template <class T>
void cross_entropy_backward(cpu, T* dlogits, const T* logits, const T* row_lse, const std::int32_t* targets,
                            std::int64_t N, std::int64_t V, std::int32_t ignore_index, T dloss_per_row) {
  DECENTRAIN_OMP(parallel for if (N * V >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < N; ++i) {
    T* d = dlogits + i * V;
    if (targets[i] == ignore_index) {
      std::fill(d, d + V, T(0));
      continue;
    }
    const T* row = logits + i * V;
    const T lse = row_lse[i];
    for (std::int64_t c = 0; c < V; ++c) d[c] = dloss_per_row * std::exp(row[c] - lse);
    d[targets[i]] -= dloss_per_row;
  }
}

}  // namespace decentrain::kernels
