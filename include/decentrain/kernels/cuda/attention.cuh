// Causal multi-head attention on the GPU, flash-attention style: no (T, T) matrix ever reaches
// global memory. q, k, v are (B, T, C) with head h in columns [h*D, (h+1)*D), as on the CPU.
//
// Forward: one warp per query row; the block's warps share 32-key tiles of K and V in shared
// memory, and each lane scores one key of the tile against the warp's query. An online softmax
// (running max m and sum l) rescales the accumulated output as tiles arrive. The forward keeps
// only logsumexp per row (B, H, T) for the backward.
// Backward (as FlashAttention-2): delta = rowsum(dO * O); then one kernel per output gradient,
// each recomputing P = exp(scale q.k - lse) tile by tile: dQ with a warp per query row over key
// tiles, dK and dV with a warp per key row over query tiles. No atomics: every gradient element
// is written by one lane, so results repeat exactly.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cmath>
#include <cstdint>
#include <vector>

#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/cuda/softmax.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
inline constexpr int attention_warps = 8;  // rows (queries or keys) per block
inline constexpr int attention_tile = 32;  // keys or queries per shared-memory tile (one per lane)

// The lane's dot product of a row in shared memory (broadcast to the warp) with row `lane` of
// a padded tile.
template <class T>
__device__ T row_dot(const T* row, const T* tile, int lane, std::int64_t D) {
  const T* other = tile + lane * (D + 1);
  T acc = 0;
  for (std::int64_t d = 0; d < D; ++d) acc += row[d] * other[d];
  return acc;
}

// Loads rows [r0, r0 + 32) of a head (rows C apart) into a padded (32, D+1) tile; rows past Tn
// are zero.
template <class T>
__device__ void load_tile(T* tile, const T* src, std::int64_t r0, std::int64_t Tn, std::int64_t C, std::int64_t D) {
  for (std::int64_t idx = threadIdx.x; idx < attention_tile * D; idx += blockDim.x) {
    const std::int64_t r = idx / D, d = idx % D;
    tile[r * (D + 1) + d] = r0 + r < Tn ? src[(r0 + r) * C + d] : T(0);
  }
}

template <class T, int MaxD>
__global__ void attention_forward_kernel(T* out, T* lse, const T* q, const T* k, const T* v, std::int64_t Tn,
                                         std::int64_t C, std::int64_t H, T scale) {
  constexpr int per_lane = MaxD / 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const std::int64_t D = C / H;
  T* ks = reinterpret_cast<T*>(smem_raw);  // (32, D+1)
  T* vs = ks + attention_tile * (D + 1);   // (32, D+1)
  T* qs = vs + attention_tile * (D + 1);   // (warps, D)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const std::int64_t base = b * Tn * C + h * D;
  const std::int64_t q0 = blockIdx.x * static_cast<std::int64_t>(attention_warps);
  const std::int64_t t = q0 + warp;
  const std::int64_t last = min64(q0 + attention_warps, Tn) - 1;
  T* qrow = qs + warp * D;
  if (t < Tn)
    for (std::int64_t d = lane; d < D; d += 32) qrow[d] = q[base + t * C + d];
  T o[per_lane];
  for (int i = 0; i < per_lane; ++i) o[i] = T(0);
  T m = lowest<T>(), l = T(0);
  for (std::int64_t s0 = 0; s0 <= last; s0 += attention_tile) {
    __syncthreads();  // the previous tile is consumed (and qrow is written)
    load_tile(ks, k + base, s0, Tn, C, D);
    load_tile(vs, v + base, s0, Tn, C, D);
    __syncthreads();
    if (t < Tn && s0 <= t) {  // uniform over the warp
      const std::int64_t s = s0 + lane;
      const bool visible = s <= t;
      const T score = visible ? row_dot(qrow, ks, lane, D) * scale : lowest<T>();
      const T tile_max = warp_reduce(score, max_op{});
      const T m_new = m > tile_max ? m : tile_max;  // finite: key s0 is visible
      const T p = visible ? device_exp(score - m_new) : T(0);
      const T correction = device_exp(m - m_new);
      l = l * correction + warp_reduce(p, sum_op{});
      for (int i = 0; i < per_lane; ++i) o[i] *= correction;
      const int count = static_cast<int>(min64(attention_tile, t - s0 + 1));
      for (int j = 0; j < count; ++j) {
        const T pj = __shfl_sync(0xffffffffu, p, j);
        for (int i = 0; i < per_lane; ++i) {
          const std::int64_t d = lane + 32 * i;
          if (d < D) o[i] += pj * vs[j * (D + 1) + d];
        }
      }
      m = m_new;
    }
  }
  if (t < Tn) {
    const T inv = T(1) / l;
    for (int i = 0; i < per_lane; ++i) {
      const std::int64_t d = lane + 32 * i;
      if (d < D) out[base + t * C + d] = o[i] * inv;
    }
    if (lane == 0) lse[bh * Tn + t] = m + device_log(l);
  }
}

// delta[bh, t] = sum_d dO[t, d] * O[t, d], one warp per row.
template <class T>
__global__ void attention_delta_kernel(T* delta, const T* dout, const T* out, std::int64_t Tn, std::int64_t C,
                                       std::int64_t H) {
  const std::int64_t D = C / H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(attention_warps) + warp;
  if (t >= Tn) return;
  const std::int64_t row = b * Tn * C + h * D + t * C;
  T acc = 0;
  for (std::int64_t d = lane; d < D; d += 32) acc += dout[row + d] * out[row + d];
  acc = warp_reduce(acc, sum_op{});
  if (lane == 0) delta[bh * Tn + t] = acc;
}

// dq += scale * sum_s dS[t, s] k[s], a warp per query row t.
template <class T, int MaxD>
__global__ void attention_dq_kernel(T* dq, const T* dout, const T* lse, const T* delta, const T* q, const T* k,
                                    const T* v, std::int64_t Tn, std::int64_t C, std::int64_t H, T scale) {
  constexpr int per_lane = MaxD / 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const std::int64_t D = C / H;
  T* ks = reinterpret_cast<T*>(smem_raw);   // (32, D+1)
  T* vs = ks + attention_tile * (D + 1);    // (32, D+1)
  T* qs = vs + attention_tile * (D + 1);    // (warps, D)
  T* dos = qs + attention_warps * D;        // (warps, D)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const std::int64_t base = b * Tn * C + h * D;
  const std::int64_t q0 = blockIdx.x * static_cast<std::int64_t>(attention_warps);
  const std::int64_t t = q0 + warp;
  const std::int64_t last = min64(q0 + attention_warps, Tn) - 1;
  T* qrow = qs + warp * D;
  T* dorow = dos + warp * D;
  if (t < Tn)
    for (std::int64_t d = lane; d < D; d += 32) {
      qrow[d] = q[base + t * C + d];
      dorow[d] = dout[base + t * C + d];
    }
  const T row_lse = t < Tn ? lse[bh * Tn + t] : T(0);
  const T row_delta = t < Tn ? delta[bh * Tn + t] : T(0);
  T acc[per_lane];
  for (int i = 0; i < per_lane; ++i) acc[i] = T(0);
  for (std::int64_t s0 = 0; s0 <= last; s0 += attention_tile) {
    __syncthreads();
    load_tile(ks, k + base, s0, Tn, C, D);
    load_tile(vs, v + base, s0, Tn, C, D);
    __syncthreads();
    if (t < Tn && s0 <= t) {
      const std::int64_t s = s0 + lane;
      T ds = T(0);
      if (s <= t) {
        const T p = device_exp(row_dot(qrow, ks, lane, D) * scale - row_lse);
        ds = p * (row_dot(dorow, vs, lane, D) - row_delta);
      }
      const int count = static_cast<int>(min64(attention_tile, t - s0 + 1));
      for (int j = 0; j < count; ++j) {
        const T dsj = __shfl_sync(0xffffffffu, ds, j);
        for (int i = 0; i < per_lane; ++i) {
          const std::int64_t d = lane + 32 * i;
          if (d < D) acc[i] += dsj * ks[j * (D + 1) + d];
        }
      }
    }
  }
  if (t < Tn)
    for (int i = 0; i < per_lane; ++i) {
      const std::int64_t d = lane + 32 * i;
      if (d < D) dq[base + t * C + d] += acc[i] * scale;
    }
}

// dv += sum_t P[t, s] dO[t] and dk += scale * sum_t dS[t, s] q[t], a warp per key row s.
template <class T, int MaxD>
__global__ void attention_dkv_kernel(T* dk, T* dv, const T* dout, const T* lse, const T* delta, const T* q,
                                     const T* k, const T* v, std::int64_t Tn, std::int64_t C, std::int64_t H,
                                     T scale) {
  constexpr int per_lane = MaxD / 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const std::int64_t D = C / H;
  T* qt = reinterpret_cast<T*>(smem_raw);    // (32, D+1) queries
  T* dos = qt + attention_tile * (D + 1);    // (32, D+1) output gradients
  T* krows = dos + attention_tile * (D + 1); // (warps, D)
  T* vrows = krows + attention_warps * D;    // (warps, D)
  T* lse_tile = vrows + attention_warps * D; // (32)
  T* delta_tile = lse_tile + attention_tile; // (32)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const std::int64_t base = b * Tn * C + h * D;
  const std::int64_t k0 = blockIdx.x * static_cast<std::int64_t>(attention_warps);
  const std::int64_t s = k0 + warp;
  T* krow = krows + warp * D;
  T* vrow = vrows + warp * D;
  if (s < Tn)
    for (std::int64_t d = lane; d < D; d += 32) {
      krow[d] = k[base + s * C + d];
      vrow[d] = v[base + s * C + d];
    }
  T dk_acc[per_lane], dv_acc[per_lane];
  for (int i = 0; i < per_lane; ++i) dk_acc[i] = dv_acc[i] = T(0);
  // Queries before the block's first key see none of its keys.
  for (std::int64_t t0 = k0 / attention_tile * attention_tile; t0 < Tn; t0 += attention_tile) {
    __syncthreads();
    load_tile(qt, q + base, t0, Tn, C, D);
    load_tile(dos, dout + base, t0, Tn, C, D);
    for (int r = threadIdx.x; r < attention_tile; r += blockDim.x) {
      lse_tile[r] = t0 + r < Tn ? lse[bh * Tn + t0 + r] : T(0);
      delta_tile[r] = t0 + r < Tn ? delta[bh * Tn + t0 + r] : T(0);
    }
    __syncthreads();
    if (s < Tn && t0 + attention_tile > s) {  // uniform over the warp: some query in the tile sees s
      const std::int64_t t = t0 + lane;
      T p = T(0), ds = T(0);
      if (t >= s && t < Tn) {
        p = device_exp(row_dot(krow, qt, lane, D) * scale - lse_tile[lane]);
        ds = p * (row_dot(vrow, dos, lane, D) - delta_tile[lane]);
      }
      for (int j = 0; j < attention_tile; ++j) {
        const T pj = __shfl_sync(0xffffffffu, p, j);
        const T dsj = __shfl_sync(0xffffffffu, ds, j);
        for (int i = 0; i < per_lane; ++i) {
          const std::int64_t d = lane + 32 * i;
          if (d < D) {
            dv_acc[i] += pj * dos[j * (D + 1) + d];
            dk_acc[i] += dsj * qt[j * (D + 1) + d];
          }
        }
      }
    }
  }
  if (s < Tn)
    for (int i = 0; i < per_lane; ++i) {
      const std::int64_t d = lane + 32 * i;
      if (d < D) {
        dk[base + s * C + d] += dk_acc[i] * scale;
        dv[base + s * C + d] += dv_acc[i];
      }
    }
}

// Launches kernel<T, MaxD> with the smallest MaxD (64, 128 or 256) that holds D, raising the
// shared-memory limit when the tiles need more than the default 48 KiB.
template <class T, class Launch>
void with_head_width(std::int64_t D, Launch&& launch) {
  decentrain::detail::check(D >= 1 && D <= 256, "cuda causal_attention: head width ", D,
                            " is not supported (1 to 256)");
  if (D <= 64) launch(std::integral_constant<int, 64>{});
  else if (D <= 128) launch(std::integral_constant<int, 128>{});
  else launch(std::integral_constant<int, 256>{});
}

template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    cuda_rt::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                   "cudaFuncSetAttribute (attention shared memory)");
}

inline dim3 attention_grid(std::int64_t B, std::int64_t H, std::int64_t Tn) {
  decentrain::detail::check(B * H < 65536, "cuda causal_attention: B * n_head = ", B * H, " is above 65535");
  return dim3(static_cast<unsigned>((Tn + attention_warps - 1) / attention_warps), static_cast<unsigned>(B * H));
}
}  // namespace cuda_detail

// What the forward keeps for the backward: logsumexp per (batch, head, row).
inline std::vector<std::int64_t> attention_saved_sizes(cuda, std::int64_t B, std::int64_t H, std::int64_t Tn) {
  return {B, H, Tn};
}

template <class T>
void attention_forward(cuda, T* out, T* saved, const T* q, const T* k, const T* v, std::int64_t B, std::int64_t Tn,
                       std::int64_t C, std::int64_t H) {
  if (B * Tn * C == 0) return;
  const std::int64_t D = C / H;
  const T scale = T(1) / static_cast<T>(std::sqrt(static_cast<double>(D)));
  cuda_detail::with_head_width<T>(D, [&](auto max_d) {
    constexpr int MaxD = decltype(max_d)::value;
    const auto kernel = cuda_detail::attention_forward_kernel<T, MaxD>;
    const std::size_t smem = sizeof(T) * static_cast<std::size_t>(2 * cuda_detail::attention_tile * (D + 1) +
                                                                   cuda_detail::attention_warps * D);
    cuda_detail::allow_shared_memory(kernel, smem);
    kernel<<<cuda_detail::attention_grid(B, H, Tn), 32 * cuda_detail::attention_warps, smem,
             cuda_rt::current_stream()>>>(out, saved, q, k, v, Tn, C, H, scale);
    cuda_rt::check_launch("attention_forward_kernel");
  });
}

// dq, dk, dv are accumulated into (+=). `out` is the forward's output, `saved` its logsumexp.
template <class T>
void attention_backward(cuda, T* dq, T* dk, T* dv, const T* dout, const T* out, const T* saved, const T* q,
                        const T* k, const T* v, std::int64_t B, std::int64_t Tn, std::int64_t C, std::int64_t H) {
  if (B * Tn * C == 0) return;
  const std::int64_t D = C / H;
  const T scale = T(1) / static_cast<T>(std::sqrt(static_cast<double>(D)));
  const auto stream = cuda_rt::current_stream();
  const auto grid = cuda_detail::attention_grid(B, H, Tn);
  constexpr int threads = 32 * cuda_detail::attention_warps;
  cuda_detail::scratch<T> delta(B * H * Tn);
  cuda_detail::attention_delta_kernel<<<grid, threads, 0, stream>>>(delta.get(), dout, out, Tn, C, H);
  cuda_rt::check_launch("attention_delta_kernel");
  cuda_detail::with_head_width<T>(D, [&](auto max_d) {
    constexpr int MaxD = decltype(max_d)::value;
    const std::size_t tiles = static_cast<std::size_t>(2 * cuda_detail::attention_tile * (D + 1));
    const std::size_t rows = static_cast<std::size_t>(2 * cuda_detail::attention_warps * D);
    const auto dq_kernel = cuda_detail::attention_dq_kernel<T, MaxD>;
    const std::size_t dq_smem = sizeof(T) * (tiles + rows);
    cuda_detail::allow_shared_memory(dq_kernel, dq_smem);
    dq_kernel<<<grid, threads, dq_smem, stream>>>(dq, dout, saved, delta.get(), q, k, v, Tn, C, H, scale);
    cuda_rt::check_launch("attention_dq_kernel");
    const auto dkv_kernel = cuda_detail::attention_dkv_kernel<T, MaxD>;
    const std::size_t dkv_smem = sizeof(T) * (tiles + rows + 2 * cuda_detail::attention_tile);
    cuda_detail::allow_shared_memory(dkv_kernel, dkv_smem);
    dkv_kernel<<<grid, threads, dkv_smem, stream>>>(dk, dv, dout, saved, delta.get(), q, k, v, Tn, C, H, scale);
    cuda_rt::check_launch("attention_dkv_kernel");
  });
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
