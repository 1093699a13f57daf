// Causal multi-head scaled-dot-product attention on the CPU: q, k, v are (B, T, C) with
// C = H * D, head h reading columns [h*D, (h+1)*D). Every product is a GEMM on strided views
// (a head's rows are C apart, which the leading dimension expresses), so no head is ever copied
// out; work is split over (batch, head) pairs, each GEMM then single-threaded. The forward keeps
// the probabilities (B, H, T, T), zero above the diagonal, for the backward.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/kernels/cpu/gemm.hpp"

namespace decentrain::kernels {

// What the forward keeps for the backward: the probabilities.
inline std::vector<std::int64_t> attention_saved_sizes(cpu, std::int64_t B, std::int64_t H, std::int64_t Tn) {
  return {B, H, Tn, Tn};
}

template <class T>
void attention_forward(cpu, T* out, T* probs, const T* q, const T* k, const T* v, std::int64_t B,
                       std::int64_t Tn, std::int64_t C, std::int64_t H) {
  const std::int64_t D = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  DECENTRAIN_OMP(parallel for schedule(dynamic) if (B * H > 1 && B * H * Tn * Tn * D >= (1 << 16)))
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const std::int64_t base = b * Tn * C + h * D;
    T* p = probs + bh * Tn * Tn;
    // scores = scale * q_h k_h^T; only the lower triangle is used below.
    gemm(cpu{}, false, true, Tn, Tn, D, scale, q + base, C, k + base, C, T(0), p, Tn);
    for (std::int64_t t = 0; t < Tn; ++t) {
      T* row = p + t * Tn;
      T mx = row[0];
      for (std::int64_t s = 1; s <= t; ++s) mx = row[s] > mx ? row[s] : mx;
      T sum = 0;
      for (std::int64_t s = 0; s <= t; ++s) sum += (row[s] = std::exp(row[s] - mx));
      const T inv = T(1) / sum;
      for (std::int64_t s = 0; s <= t; ++s) row[s] *= inv;
      for (std::int64_t s = t + 1; s < Tn; ++s) row[s] = T(0);
    }
    gemm(cpu{}, false, false, Tn, D, Tn, T(1), p, Tn, v + base, C, T(0), out + base, C);  // out_h = P v_h
  }
}

// dq, dk, dv are accumulated into (+=). Each (batch, head) pair writes only its own columns.
// The forward's output is not needed here (the GPU kernels use it).
template <class T>
void attention_backward(cpu, T* dq, T* dk, T* dv, const T* dout, const T* /*out*/, const T* probs, const T* q,
                        const T* k, const T* v, std::int64_t B, std::int64_t Tn, std::int64_t C,
                        std::int64_t H) {
  const std::int64_t D = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  DECENTRAIN_OMP(parallel for schedule(dynamic) if (B * H > 1 && B * H * Tn * Tn * D >= (1 << 16)))
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const std::int64_t base = b * Tn * C + h * D;
    const T* p = probs + bh * Tn * Tn;
    std::vector<T> ds(static_cast<std::size_t>(Tn * Tn));
    gemm(cpu{}, false, true, Tn, Tn, D, T(1), dout + base, C, v + base, C, T(0), ds.data(), Tn);  // dP = dO v^T
    gemm(cpu{}, true, false, Tn, D, Tn, T(1), p, Tn, dout + base, C, T(1), dv + base, C);         // dv += P^T dO
    for (std::int64_t t = 0; t < Tn; ++t) {  // dS = P * (dP - sum(P * dP)) * scale
      const T* pr = p + t * Tn;
      T* d = ds.data() + t * Tn;
      T dot = 0;
      for (std::int64_t s = 0; s <= t; ++s) dot += pr[s] * d[s];
      for (std::int64_t s = 0; s <= t; ++s) d[s] = pr[s] * (d[s] - dot) * scale;
      for (std::int64_t s = t + 1; s < Tn; ++s) d[s] = T(0);
    }
    gemm(cpu{}, false, false, Tn, D, Tn, T(1), ds.data(), Tn, k + base, C, T(1), dq + base, C);  // dq += dS k
    gemm(cpu{}, true, false, Tn, D, Tn, T(1), ds.data(), Tn, q + base, C, T(1), dk + base, C);   // dk += dS^T q
  }
}

}  // namespace decentrain::kernels
