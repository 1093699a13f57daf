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

// Writes each row's loss (0 for rows whose target is ignore_index) to row_loss and each
// counted row's logsumexp to row_lse (ignored rows' are unspecified). Targets must lie in
// [0, V) or equal ignore_index (the op checks them).
template <class T>
void cross_entropy_rows(cpu, const T* logits, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                        std::int32_t ignore_index, T* row_lse, double* row_loss) {
  DECENTRAIN_OMP(parallel for if (N * V >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets[i] == ignore_index) {
      row_loss[i] = 0.0;
      continue;
    }
    const T* row = logits + i * V;
    const auto [mx, sum] = detail::row_softmax_stats(row, V);
    row_lse[i] = mx + std::log(sum);
    row_loss[i] = static_cast<double>(row_lse[i] - row[targets[i]]);
  }
}

// Returns the summed loss over the rows whose target is not ignore_index, added in row order
// (the same sum for any thread count), and writes row_lse as cross_entropy_rows.
template <class T>
double cross_entropy_forward(cpu, const T* logits, const std::int32_t* targets, std::int64_t N,
                             std::int64_t V, std::int32_t ignore_index, T* row_lse) {
  std::vector<double> row_loss(static_cast<std::size_t>(N));
  cross_entropy_rows(cpu{}, logits, targets, N, V, ignore_index, row_lse, row_loss.data());
  double total = 0.0;
  for (double l : row_loss) total += l;
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
