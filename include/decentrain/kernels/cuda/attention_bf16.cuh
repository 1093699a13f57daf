// Causal attention for bf16 activations on tensor cores (FlashAttention-2's algorithm, written
// with WMMA 16x16x16 bf16 products and f32 accumulation). The f32 kernels of attention.cuh run
// on CUDA cores and cost most of a GPT-2 step at T = 1024; these are what bf16 mixed precision
// uses when the head width is 16, 32, 64 or 128 (attention_bf16_supported).
//
// Blocks of 4 warps own 64 rows (queries, or keys for dK/dV); each warp owns 16 of them and
// walks 64-row tiles of the other side staged in shared memory. WMMA fragments have no
// documented element layout, so products are stored to a per-warp f32 scratch tile where the
// softmax runs with two lanes per row (lane / 2 is the row, lane % 2 the half of its columns).
// Probabilities go back to bf16 before the products with V, dO, Q and K, as in FlashAttention.
// The backward recomputes P from the saved logsumexp in two kernels, dQ and dK/dV, so no
// gradient element is written by two blocks: no atomics, and results repeat exactly.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
namespace fa {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DECENTRAIN_FA_HAS_WMMA_BF16 1
#endif

using bf = __nv_bfloat16;
inline constexpr int rows = 64;      // rows a block owns, and rows per staged tile
inline constexpr int warps = 4;      // 16 rows each
inline constexpr int threads = 32 * warps;

// Shared-memory strides. bf16 rows are padded by 8 elements (16 bytes: rows stay 16-byte
// aligned for vector stores, and 16 rows stay 32-byte aligned for WMMA) to spread banks.
template <int D>
struct layout {
  static constexpr int ld = D + 8;                    // a staged (64, D) bf16 tile
  static constexpr int ldp = rows + 8;                // a warp's (16, 64) bf16 tile of P or dS
  static constexpr int lds = (D + 4 > rows + 4) ? D + 4 : rows + 4;  // a warp's f32 scratch (16, 64 or D)
  static constexpr std::size_t tile_bytes = sizeof(bf) * rows * ld;
  static constexpr std::size_t scratch_bytes = sizeof(float) * 16 * lds;  // per warp
  static constexpr std::size_t p_bytes = sizeof(bf) * 16 * ldp;           // per warp
};

// Rows [r0, r0 + 64) of one head (rows C apart, D wide) into a padded tile, 16 bytes a load;
// rows at or past Tn are zero.
template <int D>
__device__ void load_rows(bf* tile, const bf* src, std::int64_t r0, std::int64_t Tn, std::int64_t C) {
  constexpr int vecs = D / 8;
  for (int idx = threadIdx.x; idx < rows * vecs; idx += threads) {
    const int r = idx / vecs, c = (idx % vecs) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r0 + r < Tn) value = *reinterpret_cast<const uint4*>(src + (r0 + r) * C + c);
    *reinterpret_cast<uint4*>(tile + r * layout<D>::ld + c) = value;
  }
}

#ifdef DECENTRAIN_FA_HAS_WMMA_BF16
namespace wmma = nvcuda::wmma;
using acc_frag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
using a_frag = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major>;
using bt_frag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::col_major>;  // B^T read from B's rows
using b_frag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::row_major>;

// out (16, 64) = A (16, D) x B^T, B a staged (64, D) tile: scores S = Q K^T, or dP = dO V^T.
template <int D>
__device__ void product_abt(float* out, const bf* a, const bf* b) {
  constexpr int ld = layout<D>::ld;
  acc_frag acc[rows / 16];
  for (auto& f : acc) wmma::fill_fragment(f, 0.0f);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    a_frag fa;
    wmma::load_matrix_sync(fa, a + kk * 16, ld);
#pragma unroll
    for (int n = 0; n < rows / 16; ++n) {
      bt_frag fb;
      wmma::load_matrix_sync(fb, b + n * 16 * ld + kk * 16, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < rows / 16; ++n) wmma::store_matrix_sync(out + n * 16, acc[n], layout<D>::lds, wmma::mem_row_major);
}

// acc (16, D) += P (16, 64, a warp's bf16 tile) x B, B a staged (64, D) tile.
template <int D>
__device__ void accumulate_pb(acc_frag (&acc)[D / 16], const bf* p, const bf* b) {
#pragma unroll
  for (int kk = 0; kk < rows / 16; ++kk) {
    a_frag fa;
    wmma::load_matrix_sync(fa, p + kk * 16, layout<D>::ldp);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      b_frag fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * layout<D>::ld + n * 16, layout<D>::ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's (16, D) accumulator times `scale` as bf16 rows of dst (rows C apart), rows
// at or past Tn left alone. Goes through the warp's scratch tile.
template <int D>
__device__ void store_rows(bf* dst, acc_frag (&acc)[D / 16], float* scratch, std::int64_t r0, std::int64_t Tn,
                           std::int64_t C, float scale) {
  __syncwarp();
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::store_matrix_sync(scratch + n * 16, acc[n], layout<D>::lds, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < 16 * D / 2; idx += 32) {
    const int r = idx / (D / 2), c = (idx % (D / 2)) * 2;
    if (r0 + r >= Tn) continue;
    const float* s = scratch + r * layout<D>::lds + c;
    *reinterpret_cast<__nv_bfloat162*>(dst + (r0 + r) * C + c) = __floats2bfloat162_rn(s[0] * scale, s[1] * scale);
  }
}
#endif

template <int D>
__global__ void __launch_bounds__(threads) forward_kernel(bf* out, float* lse, const bf* q, const bf* k, const bf* v,
                                                          std::int64_t Tn, std::int64_t C, std::int64_t H, float scale) {
#ifdef DECENTRAIN_FA_HAS_WMMA_BF16
  using L = layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* ks = qs + rows * L::ld;
  bf* vs = ks + rows * L::ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* sc = reinterpret_cast<float*>(vs + rows * L::ld) + warp * 16 * L::lds;
  bf* ps = reinterpret_cast<bf*>(reinterpret_cast<float*>(vs + rows * L::ld) + warps * 16 * L::lds) + warp * 16 * L::ldp;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H, base = b * Tn * C + h * D;
  const std::int64_t q0 = blockIdx.x * static_cast<std::int64_t>(rows), w0 = q0 + warp * 16, t = w0 + r;
  const std::int64_t last = min64(q0 + rows, Tn) - 1;
  load_rows<D>(qs, q + base, q0, Tn, C);
  constexpr int cols = D / 2;  // output columns per lane
  float o[cols];
#pragma unroll
  for (int i = 0; i < cols; ++i) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t s0 = 0; s0 <= last; s0 += rows) {
    __syncthreads();  // the previous tiles are consumed (and Q is staged)
    load_rows<D>(ks, k + base, s0, Tn, C);
    load_rows<D>(vs, v + base, s0, Tn, C);
    __syncthreads();
    if (s0 > w0 + 15) continue;  // no key of this tile is visible to the warp's rows
    product_abt<D>(sc, qs + warp * 16 * L::ld, ks);
    __syncwarp();
    float x[rows / 2], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < rows / 2; ++j) {
      const int col = half * (rows / 2) + j;
      x[j] = s0 + col <= t ? sc[r * L::lds + col] * scale : -INFINITY;
      mx = fmaxf(mx, x[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    // A row that sees no key yet keeps m = -inf; its probabilities are 0, not NaN.
    const float shift = m_new == -INFINITY ? 0.0f : m_new;
    const float correction = __expf(m - shift);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < rows / 2; ++j) {
      const float p = __expf(x[j] - shift);
      sum += p;
      ps[r * L::ldp + half * (rows / 2) + j] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * correction + sum;
    m = m_new;
    __syncwarp();
    acc_frag pv[D / 16];
    for (auto& f : pv) wmma::fill_fragment(f, 0.0f);
    accumulate_pb<D>(pv, ps, vs);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) wmma::store_matrix_sync(sc + n * 16, pv[n], L::lds, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < cols; ++i) o[i] = o[i] * correction + sc[r * L::lds + half * cols + i];
    __syncwarp();  // the scratch is read before the next tile's scores overwrite it
  }
  if (t < Tn) {
    const float inv = 1.0f / l;
    bf* dst = out + base + t * C + half * cols;
#pragma unroll
    for (int i = 0; i < cols; i += 2)
      *reinterpret_cast<__nv_bfloat162*>(dst + i) = __floats2bfloat162_rn(o[i] * inv, o[i + 1] * inv);
    if (half == 0) lse[bh * Tn + t] = m + logf(l);
  }
#endif
}

// delta[bh, t] = sum_d dO[t, d] O[t, d] in f32, a warp per row.
template <int D>
__global__ void delta_kernel(float* delta, const bf* dout, const bf* out, std::int64_t Tn, std::int64_t C,
                             std::int64_t H) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(warps) + warp;
  if (t >= Tn) return;
  const std::int64_t row = b * Tn * C + h * D + t * C;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(dout[row + d]) * __bfloat162float(out[row + d]);
  acc = warp_reduce(acc, sum_op{});
  if (lane == 0) delta[bh * Tn + t] = acc;
}

// dQ = scale * dS K, a block per 64 queries walking key tiles up to the diagonal.
template <int D>
__global__ void __launch_bounds__(threads) dq_kernel(bf* dq, const bf* dout, const float* lse, const float* delta,
                                                     const bf* q, const bf* k, const bf* v, std::int64_t Tn,
                                                     std::int64_t C, std::int64_t H, float scale) {
#ifdef DECENTRAIN_FA_HAS_WMMA_BF16
  using L = layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* dos = qs + rows * L::ld;
  bf* ks = dos + rows * L::ld;
  bf* vs = ks + rows * L::ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* scratch = reinterpret_cast<float*>(vs + rows * L::ld);
  float* sc = scratch + warp * 2 * 16 * L::lds;  // scores
  float* dp = sc + 16 * L::lds;                  // dO V^T
  bf* ds = reinterpret_cast<bf*>(scratch + warps * 2 * 16 * L::lds) + warp * 16 * L::ldp;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H, base = b * Tn * C + h * D;
  const std::int64_t q0 = blockIdx.x * static_cast<std::int64_t>(rows), w0 = q0 + warp * 16, t = w0 + r;
  const std::int64_t last = min64(q0 + rows, Tn) - 1;
  load_rows<D>(qs, q + base, q0, Tn, C);
  load_rows<D>(dos, dout + base, q0, Tn, C);
  const float row_lse = t < Tn ? lse[bh * Tn + t] : 0.0f, row_delta = t < Tn ? delta[bh * Tn + t] : 0.0f;
  acc_frag acc[D / 16];
  for (auto& f : acc) wmma::fill_fragment(f, 0.0f);
  for (std::int64_t s0 = 0; s0 <= last; s0 += rows) {
    __syncthreads();
    load_rows<D>(ks, k + base, s0, Tn, C);
    load_rows<D>(vs, v + base, s0, Tn, C);
    __syncthreads();
    if (s0 > w0 + 15) continue;
    product_abt<D>(sc, qs + warp * 16 * L::ld, ks);
    product_abt<D>(dp, dos + warp * 16 * L::ld, vs);
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < rows / 2; ++j) {
      const int col = half * (rows / 2) + j;
      float g = 0.0f;
      if (s0 + col <= t && t < Tn) {
        const float p = __expf(sc[r * L::lds + col] * scale - row_lse);
        g = p * (dp[r * L::lds + col] - row_delta);
      }
      ds[r * L::ldp + col] = __float2bfloat16_rn(g);
    }
    __syncwarp();
    accumulate_pb<D>(acc, ds, ks);
  }
  store_rows<D>(dq + base, acc, sc, w0, Tn, C, scale);
#endif
}

// dV = P^T dO and dK = scale * dS^T Q, a block per 64 keys walking query tiles from the diagonal.
template <int D>
__global__ void __launch_bounds__(threads) dkv_kernel(bf* dk, bf* dv, const bf* dout, const float* lse,
                                                      const float* delta, const bf* q, const bf* k, const bf* v,
                                                      std::int64_t Tn, std::int64_t C, std::int64_t H, float scale) {
#ifdef DECENTRAIN_FA_HAS_WMMA_BF16
  using L = layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* ks = reinterpret_cast<bf*>(smem);
  bf* vs = ks + rows * L::ld;
  bf* qs = vs + rows * L::ld;
  bf* dos = qs + rows * L::ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  float* scratch = reinterpret_cast<float*>(dos + rows * L::ld);
  float* sc = scratch + warp * 2 * 16 * L::lds;  // S^T: this warp's keys against the tile's queries
  float* dp = sc + 16 * L::lds;                  // dP^T = V dO^T
  bf* pt = reinterpret_cast<bf*>(scratch + warps * 2 * 16 * L::lds) + warp * 2 * 16 * L::ldp;
  bf* dst = pt + 16 * L::ldp;
  float* lse_tile = reinterpret_cast<float*>(reinterpret_cast<bf*>(scratch + warps * 2 * 16 * L::lds) +
                                             warps * 2 * 16 * L::ldp);
  float* delta_tile = lse_tile + rows;
  const std::int64_t bh = blockIdx.y, b = bh / H, h = bh % H, base = b * Tn * C + h * D;
  const std::int64_t k0 = blockIdx.x * static_cast<std::int64_t>(rows), w0 = k0 + warp * 16, s = w0 + r;
  load_rows<D>(ks, k + base, k0, Tn, C);
  load_rows<D>(vs, v + base, k0, Tn, C);
  acc_frag dk_acc[D / 16], dv_acc[D / 16];
  for (auto& f : dk_acc) wmma::fill_fragment(f, 0.0f);
  for (auto& f : dv_acc) wmma::fill_fragment(f, 0.0f);
  for (std::int64_t t0 = k0; t0 < Tn; t0 += rows) {  // queries before k0 see none of these keys
    __syncthreads();
    load_rows<D>(qs, q + base, t0, Tn, C);
    load_rows<D>(dos, dout + base, t0, Tn, C);
    for (int i = threadIdx.x; i < rows; i += threads) {
      lse_tile[i] = t0 + i < Tn ? lse[bh * Tn + t0 + i] : 0.0f;
      delta_tile[i] = t0 + i < Tn ? delta[bh * Tn + t0 + i] : 0.0f;
    }
    __syncthreads();
    product_abt<D>(sc, ks + warp * 16 * L::ld, qs);
    product_abt<D>(dp, vs + warp * 16 * L::ld, dos);
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < rows / 2; ++j) {
      const int col = half * (rows / 2) + j;
      const std::int64_t tq = t0 + col;
      float p = 0.0f, g = 0.0f;
      if (tq >= s && tq < Tn) {
        p = __expf(sc[r * L::lds + col] * scale - lse_tile[col]);
        g = p * (dp[r * L::lds + col] - delta_tile[col]);
      }
      pt[r * L::ldp + col] = __float2bfloat16_rn(p);
      dst[r * L::ldp + col] = __float2bfloat16_rn(g);
    }
    __syncwarp();
    accumulate_pb<D>(dv_acc, pt, dos);
    accumulate_pb<D>(dk_acc, dst, qs);
  }
  store_rows<D>(dv + base, dv_acc, sc, w0, Tn, C, 1.0f);
  store_rows<D>(dk + base, dk_acc, sc, w0, Tn, C, scale);
#endif
}

template <int D>
constexpr std::size_t forward_smem() {
  using L = layout<D>;
  return 3 * L::tile_bytes + warps * (L::scratch_bytes + L::p_bytes);
}
template <int D>
constexpr std::size_t dq_smem() {
  using L = layout<D>;
  return 4 * L::tile_bytes + warps * (2 * L::scratch_bytes + L::p_bytes);
}
template <int D>
constexpr std::size_t dkv_smem() {
  using L = layout<D>;
  return 4 * L::tile_bytes + warps * (2 * L::scratch_bytes + 2 * L::p_bytes) + 2 * rows * sizeof(float);
}

template <class Launch>
void with_width(std::int64_t D, Launch&& launch) {
  switch (D) {
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    default: decentrain::detail::fail("cuda bf16 attention: head width ", D, " is not 16, 32, 64 or 128");
  }
}

template <class Kernel>
void set_smem(Kernel kernel, std::size_t bytes) {
  cuda_rt::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                 "cudaFuncSetAttribute (bf16 attention shared memory)");
}

inline dim3 grid(std::int64_t B, std::int64_t H, std::int64_t Tn) {
  decentrain::detail::check(B * H < 65536, "cuda causal_attention: B * n_head = ", B * H, " is above 65535");
  return dim3(static_cast<unsigned>((Tn + rows - 1) / rows), static_cast<unsigned>(B * H));
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
}  // namespace fa
}  // namespace cuda_detail

// Whether the tensor-core path takes these tensors: head width 16, 32, 64 or 128, rows that
// keep 16-byte vector loads aligned, and a GPU with bf16 tensor cores (compute capability 8+).
inline bool attention_bf16_supported(cuda, std::int64_t C, std::int64_t H, std::initializer_list<const void*> ptrs) {
  if (H <= 0 || C % H != 0) return false;
  const std::int64_t D = C / H;
  if (D != 16 && D != 32 && D != 64 && D != 128) return false;
  for (const void* p : ptrs)
    if (!cuda_detail::fa::aligned16(p)) return false;
  static const int major = [] {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return 0;
    return value;
  }();
  return major >= 8;
}

// out (B, T, C) bf16 and lse (B, H, T) f32 from bf16 q, k, v.
inline void attention_forward_bf16(cuda, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                   std::int64_t B, std::int64_t Tn, std::int64_t C, std::int64_t H) {
  namespace fa = cuda_detail::fa;
  if (B * Tn * C == 0) return;
  const std::int64_t D = C / H;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const auto as = [](auto* p) { return reinterpret_cast<fa::bf*>(p); };
  const auto cas = [](const auto* p) { return reinterpret_cast<const fa::bf*>(p); };
  fa::with_width(D, [&](auto width) {
    constexpr int W = decltype(width)::value;
    const auto kernel = fa::forward_kernel<W>;
    fa::set_smem(kernel, fa::forward_smem<W>());
    kernel<<<fa::grid(B, H, Tn), fa::threads, fa::forward_smem<W>(), cuda_rt::current_stream()>>>(
        as(out), lse, cas(q), cas(k), cas(v), Tn, C, H, scale);
    cuda_rt::check_launch("bf16 attention forward");
  });
}

// dq, dk, dv (B, T, C) bf16 are written (not accumulated).
inline void attention_backward_bf16(cuda, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                                    const float* lse, const bf16* q, const bf16* k, const bf16* v, std::int64_t B,
                                    std::int64_t Tn, std::int64_t C, std::int64_t H) {
  namespace fa = cuda_detail::fa;
  if (B * Tn * C == 0) return;
  const std::int64_t D = C / H;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const auto as = [](auto* p) { return reinterpret_cast<fa::bf*>(p); };
  const auto cas = [](const auto* p) { return reinterpret_cast<const fa::bf*>(p); };
  const auto stream = cuda_rt::current_stream();
  cuda_detail::scratch<float> delta(B * H * Tn);
  fa::with_width(D, [&](auto width) {
    constexpr int W = decltype(width)::value;
    const dim3 rows_grid(static_cast<unsigned>((Tn + fa::warps - 1) / fa::warps), static_cast<unsigned>(B * H));
    fa::delta_kernel<W><<<rows_grid, fa::threads, 0, stream>>>(delta.get(), cas(dout), cas(out), Tn, C, H);
    cuda_rt::check_launch("bf16 attention delta");
    const auto dq_kernel = fa::dq_kernel<W>;
    fa::set_smem(dq_kernel, fa::dq_smem<W>());
    dq_kernel<<<fa::grid(B, H, Tn), fa::threads, fa::dq_smem<W>(), stream>>>(
        as(dq), cas(dout), lse, delta.get(), cas(q), cas(k), cas(v), Tn, C, H, scale);
    cuda_rt::check_launch("bf16 attention dq");
    const auto dkv_kernel = fa::dkv_kernel<W>;
    fa::set_smem(dkv_kernel, fa::dkv_smem<W>());
    dkv_kernel<<<fa::grid(B, H, Tn), fa::threads, fa::dkv_smem<W>(), stream>>>(
        as(dk), as(dv), cas(dout), lse, delta.get(), cas(q), cas(k), cas(v), Tn, C, H, scale);
    cuda_rt::check_launch("bf16 attention dk, dv");
  });
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
