// Causal attention for bf16 activations on tensor cores: FlashAttention-2's algorithm written
// with mma.sync m16n8k16 bf16 products (f32 accumulation), ldmatrix fragment loads and cp.async
// double buffering. The f32 kernels of attention.cuh run on CUDA cores and cost most of a GPT-2
// step at T = 1024; these are what bf16 mixed precision uses when the head width is 16, 32, 64
// or 128 (attention_bf16_supported).
//
// Blocks of 4 warps own 64 rows (queries, or keys for dK/dV); each warp owns 16 of them and
// walks 64-row tiles of the other side, staged in shared memory one tile ahead of use. The
// accumulator layout of m16n8k16 is its A operand's layout, so scores become probabilities in
// registers and feed the next product directly, without a trip through shared memory.
// Probabilities go to bf16 before the products with V, dO, Q and K, as in FlashAttention.
// The backward recomputes P from the saved logsumexp in two kernels, dQ and dK/dV, so no
// gradient element is written by two blocks: no atomics, and results repeat exactly.
//
// Rows of q, k, v (and of dq, dk, dv) are `ld` elements apart, so the three can be column
// blocks of one fused (B, T, 3C) projection; out and dout are (B, T, C).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cuda/common.cuh"

namespace decentrain::kernels {

namespace cuda_detail {
namespace fa {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DECENTRAIN_FA_HAS_MMA_BF16 1
#endif

using bf = __nv_bfloat16;
inline constexpr int rows = 64;      // rows a block owns, and rows per staged tile
inline constexpr int warps = 4;      // 16 rows each
inline constexpr int threads = 32 * warps;
inline constexpr float log2e = 1.4426950408889634f;

// A staged (64, D) bf16 tile; rows padded by 8 elements (16 bytes), so the 8 row addresses of
// one ldmatrix fall in 8 different 16-byte bank groups.
template <int D>
struct tile {
  static constexpr int ld = D + 8;
  static constexpr int elems = rows * ld;
  static constexpr std::size_t bytes = sizeof(bf) * elems;
};

// Where one head's rows start: row t of head h in batch b is at base + t * ld.
struct head_rows {
  std::int64_t b, h;
  template <int D>
  __device__ std::int64_t base(std::int64_t Tn, std::int64_t ld) const {
    return b * Tn * ld + h * D;
  }
};

#ifdef DECENTRAIN_FA_HAS_MMA_BF16
__device__ inline unsigned smem_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared without passing through registers; `valid` false writes zeros.
__device__ inline void copy_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ inline void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// Rows [r0, r0 + 64) of one head (rows `ld` apart, D wide) into a padded tile; rows at or past
// Tn are zero.
template <int D>
__device__ void load_tile_async(bf* dst, const bf* src, std::int64_t r0, std::int64_t Tn, std::int64_t ld) {
  constexpr int vecs = D / 8;
  for (int idx = threadIdx.x; idx < rows * vecs; idx += threads) {
    const int r = idx / vecs, c = (idx % vecs) * 8;
    const bool valid = r0 + r < Tn;
    copy_async16(dst + r * tile<D>::ld + c, valid ? src + (r0 + r) * ld + c : src, valid);
  }
}

__device__ inline void ldmatrix_x4(unsigned (&r)[4], const bf* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const bf* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// c (16x8, f32) += a (16x16, bf16, row major) x b (16x8, bf16, column major).
__device__ inline void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 g + q holds accumulator elements
// (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1) of each 16x8 tile.

// The A fragment of rows [r0, r0+16) and columns [c0, c0+16) of a staged tile.
template <int D>
__device__ void load_a(unsigned (&a)[4], const bf* t, int r0, int c0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, t + (r0 + lane % 16) * tile<D>::ld + c0 + (lane / 16) * 8);
}

// B fragments of two 8-wide column tiles [n0, n0+16) over k in [k0, k0+16), from a tile that
// stores B transposed (row n holds B[., n]: K or V rows for Q K^T or dO V^T). b[0], b[1]
// belong to columns n0..n0+7, b[2], b[3] to n0+8..n0+15.
template <int D>
__device__ void load_b_from_rows(unsigned (&b)[4], const bf* t, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, t + (n0 + lane % 8 + (lane / 16) * 8) * tile<D>::ld + k0 + ((lane / 8) % 2) * 8);
}

// The same fragments from a tile that stores B as it is (row k holds B[k, .]: V, dO, Q or K
// as the right operand of P V, P^T dO, dS^T Q or dS K).
template <int D>
__device__ void load_b_from_columns(unsigned (&b)[4], const bf* t, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, t + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * tile<D>::ld + n0 + (lane / 16) * 8);
}

// s (16 x 64) = A (16 x D, rows r0.. of tile `a`) x B^T (B: the 64 rows of tile `b`).
template <int D>
__device__ void product_abt(float (&s)[rows / 8][4], const bf* a, int r0, const bf* b) {
#pragma unroll
  for (int n = 0; n < rows / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned fa[4];
    load_a<D>(fa, a, r0, kk * 16);
#pragma unroll
    for (int n = 0; n < rows / 16; ++n) {
      unsigned fb[4];
      load_b_from_rows<D>(fb, b, n * 16, kk * 16);
      mma(s[2 * n], fa, fb[0], fb[1]);
      mma(s[2 * n + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 x D) += P (16 x 64, accumulator layout, rounded to bf16) x B (the tile's 64 x D).
template <int D>
__device__ void accumulate_pb(float (&acc)[D / 8][4], const float (&p)[rows / 8][4], const bf* b) {
#pragma unroll
  for (int kk = 0; kk < rows / 16; ++kk) {
    const unsigned fa[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      unsigned fb[4];
      load_b_from_columns<D>(fb, b, n * 16, kk * 16);
      mma(acc[2 * n], fa, fb[0], fb[1]);
      mma(acc[2 * n + 1], fa, fb[2], fb[3]);
    }
  }
}

// Writes a warp's (16 x D) accumulator times `scale` as bf16 rows r0.. of dst (rows `ld`
// apart); rows at or past Tn are left alone.
template <int D>
__device__ void store_rows(bf* dst, const float (&acc)[D / 8][4], std::int64_t r0, std::int64_t Tn, std::int64_t ld,
                           float scale) {
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t r = r0 + g + 8 * half;
    if (r >= Tn) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<__nv_bfloat162*>(dst + r * ld + n * 8 + 2 * q) =
          __floats2bfloat162_rn(acc[n][2 * half] * scale, acc[n][2 * half + 1] * scale);
  }
}
#endif

// Query tiles in reverse order: the last tiles see the most keys and start first.
__device__ inline std::int64_t reversed_tile() { return static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x); }

template <int D>
__global__ void __launch_bounds__(threads) forward_kernel(bf* out, float* lse, const bf* q, const bf* k, const bf* v,
                                                          std::int64_t Tn, std::int64_t H, std::int64_t ld,
                                                          float scale) {
#ifdef DECENTRAIN_FA_HAS_MMA_BF16
  using L = tile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* ks = qs + L::elems;      // two buffers
  bf* vs = ks + 2 * L::elems;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, lq = lane % 4;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const head_rows hr{bh / H, bh % H};
  const std::int64_t in = hr.base<D>(Tn, ld), o_base = hr.base<D>(Tn, C);
  const std::int64_t q0 = reversed_tile() * rows;
  const int w0 = static_cast<int>(q0) + warp * 16;  // positions in 32 bits: the mask is per score (grid checks T)
  const int tiles = static_cast<int>(q0 / rows) + 1;  // key tiles up to the diagonal
  load_tile_async<D>(qs, q + in, q0, Tn, ld);
  load_tile_async<D>(ks, k + in, 0, Tn, ld);
  load_tile_async<D>(vs, v + in, 0, Tn, ld);
  commit_copies();
  const float scale2 = scale * log2e;  // scores in base 2: exp2 is one instruction
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, l summed per lane
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      load_tile_async<D>(ks + ((j + 1) % 2) * L::elems, k + in, (j + 1) * rows, Tn, ld);
      load_tile_async<D>(vs + ((j + 1) % 2) * L::elems, v + in, (j + 1) * rows, Tn, ld);
      commit_copies();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    const int s0 = j * rows;
    if (s0 <= w0 + 15) {  // some key of the tile is visible to the warp's rows
      float s[rows / 8][4];
      product_abt<D>(s, qs, warp * 16, ks + (j % 2) * L::elems);
      const bool diagonal = s0 + rows - 1 > w0;
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int n = 0; n < rows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = s0 + n * 8 + 2 * lq + (e & 1), row = w0 + g + 8 * (e / 2);
          const float x = diagonal && col > row ? -INFINITY : s[n][e] * scale2;
          s[n][e] = x;
          mx[e / 2] = fmaxf(mx[e / 2], x);
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      // Key 0 is visible to every row, so m is finite from the first tile on; the guard keeps
      // a row that sees nothing yet at probability 0 rather than NaN all the same.
      float shift[2], correction[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        shift[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
        correction[r] = exp2f(m[r] - shift[r]);
        m[r] = mx[r];
        l[r] *= correction[r];
      }
#pragma unroll
      for (int n = 0; n < rows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(s[n][e] - shift[e / 2]);
          s[n][e] = p;
          l[e / 2] += p;
        }
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] *= correction[e / 2];
      accumulate_pb<D>(o, s, vs + (j % 2) * L::elems);
    }
    __syncthreads();  // every warp is done with buffer j % 2 before tile j + 2 lands in it
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] /= l[e / 2];
  store_rows<D>(out + o_base, o, w0, Tn, C, 1.0f);
  if (lq == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t t = w0 + g + 8 * r;
      if (t < Tn) lse[bh * Tn + t] = (m[r] + log2f(l[r])) / log2e;  // natural log, as the f32 kernels keep it
    }
#endif
}

// delta[bh, t] = sum_d dO[t, d] O[t, d] in f32, a warp per row (dout and out are (B, T, C)).
template <int D>
__global__ void delta_kernel(float* delta, const bf* dout, const bf* out, std::int64_t Tn, std::int64_t H) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(warps) + warp;
  if (t >= Tn) return;
  const std::int64_t row = head_rows{bh / H, bh % H}.base<D>(Tn, C) + t * C;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(dout[row + d]) * __bfloat162float(out[row + d]);
  acc = warp_reduce(acc, sum_op{});
  if (lane == 0) delta[bh * Tn + t] = acc;
}

// dQ = scale * dS K, a block per 64 queries walking key tiles up to the diagonal.
template <int D>
__global__ void __launch_bounds__(threads) dq_kernel(bf* dq, const bf* dout, const float* lse, const float* delta,
                                                     const bf* q, const bf* k, const bf* v, std::int64_t Tn,
                                                     std::int64_t H, std::int64_t ld, float scale) {
#ifdef DECENTRAIN_FA_HAS_MMA_BF16
  using L = tile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* dos = qs + L::elems;
  bf* ks = dos + L::elems;     // two buffers
  bf* vs = ks + 2 * L::elems;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, lq = lane % 4;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const head_rows hr{bh / H, bh % H};
  const std::int64_t in = hr.base<D>(Tn, ld), o_base = hr.base<D>(Tn, C);
  const std::int64_t q0 = reversed_tile() * rows;
  const int w0 = static_cast<int>(q0) + warp * 16, tn = static_cast<int>(Tn);
  const int tiles = static_cast<int>(q0 / rows) + 1;
  load_tile_async<D>(qs, q + in, q0, Tn, ld);
  load_tile_async<D>(dos, dout + o_base, q0, Tn, C);
  load_tile_async<D>(ks, k + in, 0, Tn, ld);
  load_tile_async<D>(vs, v + in, 0, Tn, ld);
  commit_copies();
  const float scale2 = scale * log2e;
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t t = w0 + g + 8 * r;
    row_lse[r] = t < Tn ? lse[bh * Tn + t] * log2e : 0.0f;
    row_delta[r] = t < Tn ? delta[bh * Tn + t] : 0.0f;
  }
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      load_tile_async<D>(ks + ((j + 1) % 2) * L::elems, k + in, (j + 1) * rows, Tn, ld);
      load_tile_async<D>(vs + ((j + 1) % 2) * L::elems, v + in, (j + 1) * rows, Tn, ld);
      commit_copies();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    const int s0 = j * rows;
    if (s0 <= w0 + 15) {
      float s[rows / 8][4], dp[rows / 8][4];
      product_abt<D>(s, qs, warp * 16, ks + (j % 2) * L::elems);
      product_abt<D>(dp, dos, warp * 16, vs + (j % 2) * L::elems);
#pragma unroll
      for (int n = 0; n < rows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = s0 + n * 8 + 2 * lq + (e & 1), row = w0 + g + 8 * (e / 2);
          const float p = col <= row && row < tn ? exp2f(s[n][e] * scale2 - row_lse[e / 2]) : 0.0f;
          s[n][e] = p * (dp[n][e] - row_delta[e / 2]);  // dS
        }
      accumulate_pb<D>(acc, s, ks + (j % 2) * L::elems);
    }
    __syncthreads();
  }
  store_rows<D>(dq + in, acc, w0, Tn, ld, scale);
#endif
}

// dV = P^T dO and dK = scale * dS^T Q, a block per 64 keys walking query tiles from the diagonal.
template <int D>
__global__ void __launch_bounds__(threads) dkv_kernel(bf* dk, bf* dv, const bf* dout, const float* lse,
                                                      const float* delta, const bf* q, const bf* k, const bf* v,
                                                      std::int64_t Tn, std::int64_t H, std::int64_t ld, float scale) {
#ifdef DECENTRAIN_FA_HAS_MMA_BF16
  using L = tile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* ks = reinterpret_cast<bf*>(smem);
  bf* vs = ks + L::elems;
  bf* qs = vs + L::elems;       // two buffers
  bf* dos = qs + 2 * L::elems;  // two buffers
  float* lse_tile = reinterpret_cast<float*>(dos + 2 * L::elems);  // two buffers of 64, base 2
  float* delta_tile = lse_tile + 2 * rows;                         // two buffers of 64
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, lq = lane % 4;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const head_rows hr{bh / H, bh % H};
  const std::int64_t in = hr.base<D>(Tn, ld), o_base = hr.base<D>(Tn, C);
  const std::int64_t k0 = blockIdx.x * static_cast<std::int64_t>(rows);
  const int w0 = static_cast<int>(k0) + warp * 16, tn = static_cast<int>(Tn);
  const int tiles = static_cast<int>((Tn - k0 + rows - 1) / rows);  // queries before k0 see none of these keys
  const auto stage = [&](int j) {  // query tile j into buffer j % 2
    const std::int64_t t0 = k0 + static_cast<std::int64_t>(j) * rows;
    load_tile_async<D>(qs + (j % 2) * L::elems, q + in, t0, Tn, ld);
    load_tile_async<D>(dos + (j % 2) * L::elems, dout + o_base, t0, Tn, C);
    for (int i = threadIdx.x; i < rows; i += threads) {
      lse_tile[(j % 2) * rows + i] = t0 + i < Tn ? lse[bh * Tn + t0 + i] * log2e : 0.0f;
      delta_tile[(j % 2) * rows + i] = t0 + i < Tn ? delta[bh * Tn + t0 + i] : 0.0f;
    }
  };
  load_tile_async<D>(ks, k + in, k0, Tn, ld);
  load_tile_async<D>(vs, v + in, k0, Tn, ld);
  stage(0);
  commit_copies();
  const float scale2 = scale * log2e;
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      stage(j + 1);
      commit_copies();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    const int t0 = static_cast<int>(k0) + j * rows;
    const bf* qt = qs + (j % 2) * L::elems;
    const bf* dot = dos + (j % 2) * L::elems;
    const float* lt = lse_tile + (j % 2) * rows;
    const float* dt = delta_tile + (j % 2) * rows;
    float st[rows / 8][4], dpt[rows / 8][4];  // S^T and dP^T: this warp's keys against the tile's queries
    product_abt<D>(st, ks, warp * 16, qt);
    product_abt<D>(dpt, vs, warp * 16, dot);
#pragma unroll
    for (int n = 0; n < rows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * lq + (e & 1);
        const int query = t0 + c, key = w0 + g + 8 * (e / 2);
        const float p = query >= key && query < tn ? exp2f(st[n][e] * scale2 - lt[c]) : 0.0f;
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - dt[c]);  // dS^T
      }
    accumulate_pb<D>(dv_acc, st, dot);
    accumulate_pb<D>(dk_acc, dpt, qt);
    __syncthreads();
  }
  store_rows<D>(dv + in, dv_acc, w0, Tn, ld, 1.0f);
  store_rows<D>(dk + in, dk_acc, w0, Tn, ld, scale);
#endif
}

template <int D>
constexpr std::size_t forward_smem() {
  return 5 * tile<D>::bytes;
}
template <int D>
constexpr std::size_t dq_smem() {
  return 6 * tile<D>::bytes;
}
template <int D>
constexpr std::size_t dkv_smem() {
  return 6 * tile<D>::bytes + 4 * rows * sizeof(float);
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
  decentrain::detail::check(Tn < (std::int64_t{1} << 30), "cuda causal_attention: T = ", Tn, " is 2^30 or more");
  return dim3(static_cast<unsigned>((Tn + rows - 1) / rows), static_cast<unsigned>(B * H));
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
}  // namespace fa
}  // namespace cuda_detail

// Whether the tensor-core path takes these tensors: head width 16, 32, 64 or 128, rows `ld`
// elements apart and pointers that keep 16-byte copies aligned, and a GPU with bf16 tensor
// cores (compute capability 8+).
inline bool attention_bf16_supported(cuda, std::int64_t C, std::int64_t H, std::int64_t ld,
                                     std::initializer_list<const void*> ptrs) {
  if (H <= 0 || C % H != 0 || ld < C || ld % 8 != 0) return false;
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

// out (B, T, C) bf16 and lse (B, H, T) f32 from bf16 q, k, v whose rows are `ld` apart.
inline void attention_forward_bf16(cuda, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                   std::int64_t B, std::int64_t Tn, std::int64_t C, std::int64_t H, std::int64_t ld) {
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
        as(out), lse, cas(q), cas(k), cas(v), Tn, H, ld, scale);
    cuda_rt::check_launch("bf16 attention forward");
  });
}

// dq, dk, dv (rows `ld` apart, like q, k, v) are written, not accumulated; dout and out are
// (B, T, C).
inline void attention_backward_bf16(cuda, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                                    const float* lse, const bf16* q, const bf16* k, const bf16* v, std::int64_t B,
                                    std::int64_t Tn, std::int64_t C, std::int64_t H, std::int64_t ld) {
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
    fa::delta_kernel<W><<<rows_grid, fa::threads, 0, stream>>>(delta.get(), cas(dout), cas(out), Tn, H);
    cuda_rt::check_launch("bf16 attention delta");
    const auto dq_kernel = fa::dq_kernel<W>;
    fa::set_smem(dq_kernel, fa::dq_smem<W>());
    dq_kernel<<<fa::grid(B, H, Tn), fa::threads, fa::dq_smem<W>(), stream>>>(
        as(dq), cas(dout), lse, delta.get(), cas(q), cas(k), cas(v), Tn, H, ld, scale);
    cuda_rt::check_launch("bf16 attention dq");
    const auto dkv_kernel = fa::dkv_kernel<W>;
    fa::set_smem(dkv_kernel, fa::dkv_smem<W>());
    dkv_kernel<<<fa::grid(B, H, Tn), fa::threads, fa::dkv_smem<W>(), stream>>>(
        as(dk), as(dv), cas(dout), lse, delta.get(), cas(q), cas(k), cas(v), Tn, H, ld, scale);
    cuda_rt::check_launch("bf16 attention dk, dv");
  });
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
