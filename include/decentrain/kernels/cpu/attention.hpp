// Causal multi-head scaled-dot-product attention on the CPU (as llm.c): q, k, v are (B, T, C)
// with C = H * D, head h reading columns [h*D, (h+1)*D). The forward keeps the attention
// probabilities (B, H, T, T), lower triangle only, which the backward reuses.
#pragma once

#include <cmath>
#include <cstdint>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"

namespace decentrain::kernels {

template <class T>
void attention_forward(cpu, T* out, T* probs, const T* q, const T* k, const T* v, std::int64_t B,
                       std::int64_t Tn, std::int64_t C, std::int64_t H) {
  const std::int64_t D = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  DECENTRAIN_OMP(parallel for collapse(2) if (B * H * Tn * Tn * D >= (1 << 16)))
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t t = 0; t < Tn; ++t) {
        const T* qt = q + (b * Tn + t) * C + h * D;
        T* p = probs + ((b * H + h) * Tn + t) * Tn;
        T mx = -INFINITY;
        for (std::int64_t s = 0; s <= t; ++s) {
          const T* ks = k + (b * Tn + s) * C + h * D;
          T dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qt[d] * ks[d];
          dot *= scale;
          p[s] = dot;
          mx = dot > mx ? dot : mx;
        }
        T sum = 0;
        for (std::int64_t s = 0; s <= t; ++s) {
          p[s] = std::exp(p[s] - mx);
          sum += p[s];
        }
        const T inv = T(1) / sum;
        for (std::int64_t s = 0; s <= t; ++s) p[s] *= inv;
        for (std::int64_t s = t + 1; s < Tn; ++s) p[s] = T(0);
        T* o = out + (b * Tn + t) * C + h * D;
        for (std::int64_t d = 0; d < D; ++d) o[d] = T(0);
        for (std::int64_t s = 0; s <= t; ++s) {
          const T* vs = v + (b * Tn + s) * C + h * D;
          for (std::int64_t d = 0; d < D; ++d) o[d] += p[s] * vs[d];
        }
      }
    }
  }
}

// dq, dk, dv are accumulated into (+=). Work is split by (batch, head): each pair touches only
// its own columns of dq/dk/dv, so threads never write the same element.
template <class T>
void attention_backward(cpu, T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q,
                        const T* k, const T* v, std::int64_t B, std::int64_t Tn, std::int64_t C,
                        std::int64_t H) {
  const std::int64_t D = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  DECENTRAIN_OMP(parallel for collapse(2) if (B * H * Tn * Tn * D >= (1 << 16)))
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t t = 0; t < Tn; ++t) {
        const T* p = probs + ((b * H + h) * Tn + t) * Tn;
        const T* g = dout + (b * Tn + t) * C + h * D;
        // dp[s] = dout . v[s];  dv[s] += p[s] * dout;  dscore = p * (dp - sum p*dp)
        T weighted = 0;
        for (std::int64_t s = 0; s <= t; ++s) {
          const T* vs = v + (b * Tn + s) * C + h * D;
          T* dvs = dv + (b * Tn + s) * C + h * D;
          T dp = 0;
          for (std::int64_t d = 0; d < D; ++d) {
            dp += g[d] * vs[d];
            dvs[d] += p[s] * g[d];
          }
          weighted += p[s] * dp;
        }
        const T* qt = q + (b * Tn + t) * C + h * D;
        T* dqt = dq + (b * Tn + t) * C + h * D;
        for (std::int64_t s = 0; s <= t; ++s) {
          const T* vs = v + (b * Tn + s) * C + h * D;
          T dp = 0;
          for (std::int64_t d = 0; d < D; ++d) dp += g[d] * vs[d];
          const T dscore = p[s] * (dp - weighted) * scale;
          const T* ks = k + (b * Tn + s) * C + h * D;
          T* dks = dk + (b * Tn + s) * C + h * D;
          for (std::int64_t d = 0; d < D; ++d) {
            dqt[d] += dscore * ks[d];
            dks[d] += dscore * qt[d];
          }
        }
      }
    }
  }
}

}  // namespace decentrain::kernels
