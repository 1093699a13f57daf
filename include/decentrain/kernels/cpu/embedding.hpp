// Embedding lookup: rows of a (V, C) table gathered by integer ids, and the scatter-add that
// is its gradient. Ids must be validated by the caller.
#pragma once

#include <cstdint>
#include <cstring>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"

namespace decentrain::kernels {

template <class T>
void embedding_forward(cpu, T* out, const std::int32_t* ids, const T* table, std::int64_t N,
                       std::int64_t C) {
  DECENTRAIN_OMP(parallel for if (N * C >= detail::parallel_threshold))
  for (std::int64_t i = 0; i < N; ++i)
    std::memcpy(out + i * C, table + static_cast<std::int64_t>(ids[i]) * C, sizeof(T) * C);
}

// dtable[ids[i]] += dout[i]. Repeated ids make rows collide, so threads split the columns.
template <class T>
void embedding_backward(cpu, T* dtable, const std::int32_t* ids, const T* dout, std::int64_t N,
                        std::int64_t C) {
  DECENTRAIN_OMP(parallel for if (N * C >= detail::parallel_threshold))
  for (std::int64_t c0 = 0; c0 < C; c0 += 64) {
    const std::int64_t c1 = c0 + 64 < C ? c0 + 64 : C;
    for (std::int64_t i = 0; i < N; ++i) {
      T* row = dtable + static_cast<std::int64_t>(ids[i]) * C;
      const T* g = dout + i * C;
      for (std::int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  }
}

}  // namespace decentrain::kernels
