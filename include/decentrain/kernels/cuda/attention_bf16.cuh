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
inline constexpr int warps = 4;
inline constexpr int threads = 32 * warps;
inline constexpr float log2e = 1.4426950408889634f;

// How a kernel is cut. A warp owns MT m-tiles of 16 rows (queries, or keys for dK/dV), at
// rows 16 (warp + 4 i) of its block, so a block owns 64 MT rows and, under the causal mask,
// every warp has about the same work. N rows of the other side are staged per step. Two
// m-tiles a warp use each fragment of the staged tile twice and give each warp two
// independent chains of products; their accumulators bound how large N can be.
template <int MT, int N>
struct cut {
  static_assert(MT == 1 || MT == 2, "one or two m-tiles a warp");
  static_assert(N == 32 || N == 64, "32 or 64 staged rows");
  static constexpr int m_tiles = MT, staged = N, block_rows = 16 * warps * MT;
};
// The cuts the library launches, per head width (bench/gpu_train_step times the others).
template <int D>
struct default_cuts {
  using forward = cut<D <= 64 ? 2 : 1, 64>;
  using dq = cut<D <= 64 ? 2 : 1, D <= 64 ? 32 : 64>;
  using dkv = cut<D <= 64 ? 2 : 1, D <= 64 ? 32 : 64>;
};

// A staged (R, D) bf16 tile; rows padded by 8 elements (16 bytes), so the 8 row addresses of
// one ldmatrix fall in 8 different 16-byte bank groups.
template <int R, int D>
struct tile {
  static constexpr int ld = D + 8;
  static constexpr int elems = R * ld;
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

// Rows [r0, r0 + R) of one head (rows `ld` apart, D wide) into a padded tile; rows at or past
// Tn are zero.
template <int R, int D>
__device__ void load_tile_async(bf* dst, const bf* src, std::int64_t r0, std::int64_t Tn, std::int64_t ld) {
  constexpr int vecs = D / 8;
  for (int idx = threadIdx.x; idx < R * vecs; idx += threads) {
    const int r = idx / vecs, c = (idx % vecs) * 8;
    const bool valid = r0 + r < Tn;
    copy_async16(dst + r * tile<R, D>::ld + c, valid ? src + (r0 + r) * ld + c : src, valid);
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

// The A fragment of rows [r0, r0+16) and columns [c0, c0+16) of a staged tile D wide.
template <int D>
__device__ void load_a(unsigned (&a)[4], const bf* t, int r0, int c0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, t + (r0 + lane % 16) * (D + 8) + c0 + (lane / 16) * 8);
}

// B fragments of two 8-wide column tiles [n0, n0+16) over k in [k0, k0+16), from a tile that
// stores B transposed (row n holds B[., n]: K or V rows for Q K^T or dO V^T). b[0], b[1]
// belong to columns n0..n0+7, b[2], b[3] to n0+8..n0+15.
template <int D>
__device__ void load_b_from_rows(unsigned (&b)[4], const bf* t, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, t + (n0 + lane % 8 + (lane / 16) * 8) * (D + 8) + k0 + ((lane / 8) % 2) * 8);
}

// The same fragments from a tile that stores B as it is (row k holds B[k, .]: V, dO, Q or K
// as the right operand of P V, P^T dO, dS^T Q or dS K).
template <int D>
__device__ void load_b_from_columns(unsigned (&b)[4], const bf* t, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, t + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * (D + 8) + n0 + (lane / 16) * 8);
}

// A warp's m-tiles: where each starts in the block (rows 16 (warp + 4 i)) and which of them
// the step at hand touches (the same for every lane, so no branch diverges).
template <int MT>
struct m_tiles {
  int row[MT];
  bool live[MT];
  __device__ explicit m_tiles(int warp) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      row[i] = 16 * (warp + warps * i);
      live[i] = true;
    }
  }
  __device__ bool any() const {
    bool a = false;
#pragma unroll
    for (int i = 0; i < MT; ++i) a = a || live[i];
    return a;
  }
};

template <int MT, int N>
__device__ void zero(float (&x)[MT][N / 8][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[i][n][e] = 0.0f;
}

// s[i] (16 x N) = A_i (16 x D: rows mt.row[i].. of tile `a`) x B^T (B: the N rows of tile
// `b`), for the live m-tiles; each B fragment is loaded once for all of them.
template <int D, int N, int MT>
__device__ void product_abt(float (&s)[MT][N / 8][4], const bf* a, const m_tiles<MT>& mt, const bf* b) {
  zero<MT, N>(s);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned fa[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
      if (mt.live[i]) load_a<D>(fa[i], a, mt.row[i], kk * 16);
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      unsigned fb[4];
      load_b_from_rows<D>(fb, b, n * 16, kk * 16);
#pragma unroll
      for (int i = 0; i < MT; ++i)
        if (mt.live[i]) {
          mma(s[i][2 * n], fa[i], fb[0], fb[1]);
          mma(s[i][2 * n + 1], fa[i], fb[2], fb[3]);
        }
    }
  }
}

// acc[i] (16 x D) += P_i (16 x N, accumulator layout, rounded to bf16) x B (the tile's N x D),
// for the live m-tiles.
template <int D, int N, int MT>
__device__ void accumulate_pb(float (&acc)[MT][D / 8][4], const float (&p)[MT][N / 8][4], const m_tiles<MT>& mt,
                              const bf* b) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    unsigned fa[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      fa[i][0] = pack_bf16(p[i][2 * kk][0], p[i][2 * kk][1]);
      fa[i][1] = pack_bf16(p[i][2 * kk][2], p[i][2 * kk][3]);
      fa[i][2] = pack_bf16(p[i][2 * kk + 1][0], p[i][2 * kk + 1][1]);
      fa[i][3] = pack_bf16(p[i][2 * kk + 1][2], p[i][2 * kk + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      unsigned fb[4];
      load_b_from_columns<D>(fb, b, n * 16, kk * 16);
#pragma unroll
      for (int i = 0; i < MT; ++i)
        if (mt.live[i]) {
          mma(acc[i][2 * n], fa[i], fb[0], fb[1]);
          mma(acc[i][2 * n + 1], fa[i], fb[2], fb[3]);
        }
    }
  }
}

// Writes a warp's m-tiles (16 x D accumulators) times `scale` as bf16 rows r0 + mt.row[i]..
// of dst (rows `ld` apart); rows at or past Tn are left alone.
template <int D, int MT>
__device__ void store_rows(bf* dst, const float (&acc)[MT][D / 8][4], const m_tiles<MT>& mt, std::int64_t r0,
                           std::int64_t Tn, std::int64_t ld, float scale) {
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t r = r0 + mt.row[i] + g + 8 * half;
      if (r >= Tn) continue;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(dst + r * ld + n * 8 + 2 * q) =
            __floats2bfloat162_rn(acc[i][n][2 * half] * scale, acc[i][n][2 * half + 1] * scale);
    }
}
#endif

// Row blocks in reverse order: the last see the most keys and start first.
__device__ inline std::int64_t reversed_block() { return static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x); }

template <int D, class Cut>
__global__ void __launch_bounds__(threads) forward_kernel(bf* out, float* lse, const bf* q, const bf* k, const bf* v,
                                                          std::int64_t Tn, std::int64_t H, std::int64_t ld,
                                                          float scale) {
#ifdef DECENTRAIN_FA_HAS_MMA_BF16
  constexpr int MT = Cut::m_tiles, N = Cut::staged, BR = Cut::block_rows;
  using QT = tile<BR, D>;
  using KT = tile<N, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* ks = qs + QT::elems;      // two buffers
  bf* vs = ks + 2 * KT::elems;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, lq = lane % 4;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const head_rows hr{bh / H, bh % H};
  const std::int64_t in = hr.base<D>(Tn, ld), o_base = hr.base<D>(Tn, C);
  const std::int64_t q0 = reversed_block() * BR;
  const int last_key = static_cast<int>((q0 + BR < Tn ? q0 + BR : Tn) - 1);
  const int tiles = last_key / N + 1;  // key tiles up to the diagonal
  m_tiles<MT> mt(warp);
  load_tile_async<BR, D>(qs, q + in, q0, Tn, ld);
  load_tile_async<N, D>(ks, k + in, 0, Tn, ld);
  load_tile_async<N, D>(vs, v + in, 0, Tn, ld);
  commit_copies();
  const float scale2 = scale * log2e;  // scores in base 2: exp2 is one instruction
  float o[MT][D / 8][4];
  zero<MT, D>(o);
  float m[MT][2], l[MT][2];  // rows g and g + 8 of each m-tile, l summed per lane
#pragma unroll
  for (int i = 0; i < MT; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      load_tile_async<N, D>(ks + ((j + 1) % 2) * KT::elems, k + in, (j + 1) * N, Tn, ld);
      load_tile_async<N, D>(vs + ((j + 1) % 2) * KT::elems, v + in, (j + 1) * N, Tn, ld);
      commit_copies();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    const int s0 = j * N;
#pragma unroll
    for (int i = 0; i < MT; ++i) mt.live[i] = s0 <= static_cast<int>(q0) + mt.row[i] + 15;  // some key is visible
    if (mt.any()) {
      float s[MT][N / 8][4];
      product_abt<D, N, MT>(s, qs, mt, ks + (j % 2) * KT::elems);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (!mt.live[i]) continue;
        const int w0 = static_cast<int>(q0) + mt.row[i];
        const bool diagonal = s0 + N - 1 > w0;
        float mx[2] = {m[i][0], m[i][1]};
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = s0 + n * 8 + 2 * lq + (e & 1), row = w0 + g + 8 * (e / 2);
            const float x = diagonal && col > row ? -INFINITY : s[i][n][e] * scale2;
            s[i][n][e] = x;
            mx[e / 2] = fmaxf(mx[e / 2], x);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        // Key 0 is visible to every row, so m is finite from the first tile on; the guard
        // keeps a row that sees nothing yet at probability 0 rather than NaN all the same.
        float shift[2], correction[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          shift[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
          correction[r] = exp2f(m[i][r] - shift[r]);
          m[i][r] = mx[r];
          l[i][r] *= correction[r];
        }
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = exp2f(s[i][n][e] - shift[e / 2]);
            s[i][n][e] = p;
            l[i][e / 2] += p;
          }
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][n][e] *= correction[e / 2];
      }
      accumulate_pb<D, N, MT>(o, s, mt, vs + (j % 2) * KT::elems);
    }
    __syncthreads();  // every warp is done with buffer j % 2 before tile j + 2 lands in it
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 1);
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 2);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][n][e] /= l[i][e / 2];
    mt.live[i] = true;
  }
  store_rows<D, MT>(out + o_base, o, mt, q0, Tn, C, 1.0f);
  if (lq == 0)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::int64_t t = q0 + mt.row[i] + g + 8 * r;
        if (t < Tn) lse[bh * Tn + t] = (m[i][r] + log2f(l[i][r])) / log2e;  // natural log, as the f32 kernels keep it
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

// dQ = scale * dS K, a block per 64 MT queries walking key tiles up to the diagonal.
template <int D, class Cut>
__global__ void __launch_bounds__(threads) dq_kernel(bf* dq, const bf* dout, const float* lse, const float* delta,
                                                     const bf* q, const bf* k, const bf* v, std::int64_t Tn,
                                                     std::int64_t H, std::int64_t ld, float scale) {
#ifdef DECENTRAIN_FA_HAS_MMA_BF16
  constexpr int MT = Cut::m_tiles, N = Cut::staged, BR = Cut::block_rows;
  using QT = tile<BR, D>;
  using KT = tile<N, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* dos = qs + QT::elems;
  bf* ks = dos + QT::elems;     // two buffers
  bf* vs = ks + 2 * KT::elems;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, lq = lane % 4;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const head_rows hr{bh / H, bh % H};
  const std::int64_t in = hr.base<D>(Tn, ld), o_base = hr.base<D>(Tn, C);
  const std::int64_t q0 = reversed_block() * BR;
  const int last_key = static_cast<int>((q0 + BR < Tn ? q0 + BR : Tn) - 1);
  const int tiles = last_key / N + 1;
  m_tiles<MT> mt(warp);
  load_tile_async<BR, D>(qs, q + in, q0, Tn, ld);
  load_tile_async<BR, D>(dos, dout + o_base, q0, Tn, C);
  load_tile_async<N, D>(ks, k + in, 0, Tn, ld);
  load_tile_async<N, D>(vs, v + in, 0, Tn, ld);
  commit_copies();
  const float scale2 = scale * log2e;
  float row_lse[MT][2], row_delta[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t t = q0 + mt.row[i] + g + 8 * r;
      row_lse[i][r] = t < Tn ? lse[bh * Tn + t] * log2e : 0.0f;
      row_delta[i][r] = t < Tn ? delta[bh * Tn + t] : 0.0f;
    }
  float acc[MT][D / 8][4];
  zero<MT, D>(acc);
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      load_tile_async<N, D>(ks + ((j + 1) % 2) * KT::elems, k + in, (j + 1) * N, Tn, ld);
      load_tile_async<N, D>(vs + ((j + 1) % 2) * KT::elems, v + in, (j + 1) * N, Tn, ld);
      commit_copies();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    const int s0 = j * N;
#pragma unroll
    for (int i = 0; i < MT; ++i) mt.live[i] = s0 <= static_cast<int>(q0) + mt.row[i] + 15;
    if (mt.any()) {
      float s[MT][N / 8][4], dp[MT][N / 8][4];
      product_abt<D, N, MT>(s, qs, mt, ks + (j % 2) * KT::elems);
      product_abt<D, N, MT>(dp, dos, mt, vs + (j % 2) * KT::elems);
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = s0 + n * 8 + 2 * lq + (e & 1), row = static_cast<int>(q0) + mt.row[i] + g + 8 * (e / 2);
            const float p = col <= row && row < Tn ? exp2f(s[i][n][e] * scale2 - row_lse[i][e / 2]) : 0.0f;
            s[i][n][e] = p * (dp[i][n][e] - row_delta[i][e / 2]);  // dS
          }
      accumulate_pb<D, N, MT>(acc, s, mt, ks + (j % 2) * KT::elems);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) mt.live[i] = true;
  store_rows<D, MT>(dq + in, acc, mt, q0, Tn, ld, scale);
#endif
}

// dV = P^T dO and dK = scale * dS^T Q, a block per 64 MT keys walking query tiles from the
// diagonal.
template <int D, class Cut>
__global__ void __launch_bounds__(threads) dkv_kernel(bf* dk, bf* dv, const bf* dout, const float* lse,
                                                      const float* delta, const bf* q, const bf* k, const bf* v,
                                                      std::int64_t Tn, std::int64_t H, std::int64_t ld, float scale) {
#ifdef DECENTRAIN_FA_HAS_MMA_BF16
  constexpr int MT = Cut::m_tiles, N = Cut::staged, BR = Cut::block_rows;
  using KT = tile<BR, D>;
  using QT = tile<N, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf* ks = reinterpret_cast<bf*>(smem);
  bf* vs = ks + KT::elems;
  bf* qs = vs + KT::elems;       // two buffers
  bf* dos = qs + 2 * QT::elems;  // two buffers
  float* lse_tile = reinterpret_cast<float*>(dos + 2 * QT::elems);  // two buffers of N, base 2
  float* delta_tile = lse_tile + 2 * N;                              // two buffers of N
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, lq = lane % 4;
  const std::int64_t bh = blockIdx.y, C = H * D;
  const head_rows hr{bh / H, bh % H};
  const std::int64_t in = hr.base<D>(Tn, ld), o_base = hr.base<D>(Tn, C);
  const std::int64_t k0 = blockIdx.x * static_cast<std::int64_t>(BR);
  const int tiles = static_cast<int>((Tn - k0 + N - 1) / N);  // queries before k0 see none of these keys
  m_tiles<MT> mt(warp);
  const auto stage = [&](int j) {  // query tile j into buffer j % 2
    const std::int64_t t0 = k0 + static_cast<std::int64_t>(j) * N;
    load_tile_async<N, D>(qs + (j % 2) * QT::elems, q + in, t0, Tn, ld);
    load_tile_async<N, D>(dos + (j % 2) * QT::elems, dout + o_base, t0, Tn, C);
    for (int i = threadIdx.x; i < N; i += threads) {
      lse_tile[(j % 2) * N + i] = t0 + i < Tn ? lse[bh * Tn + t0 + i] * log2e : 0.0f;
      delta_tile[(j % 2) * N + i] = t0 + i < Tn ? delta[bh * Tn + t0 + i] : 0.0f;
    }
  };
  load_tile_async<BR, D>(ks, k + in, k0, Tn, ld);
  load_tile_async<BR, D>(vs, v + in, k0, Tn, ld);
  stage(0);
  commit_copies();
  const float scale2 = scale * log2e;
  float dk_acc[MT][D / 8][4], dv_acc[MT][D / 8][4];
  zero<MT, D>(dk_acc);
  zero<MT, D>(dv_acc);
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      stage(j + 1);
      commit_copies();
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    const int t0 = static_cast<int>(k0) + j * N;
#pragma unroll
    for (int i = 0; i < MT; ++i) mt.live[i] = t0 + N - 1 >= static_cast<int>(k0) + mt.row[i];  // some query sees a key
    if (mt.any()) {
      const bf* qt = qs + (j % 2) * QT::elems;
      const bf* dot = dos + (j % 2) * QT::elems;
      const float* lt = lse_tile + (j % 2) * N;
      const float* dt = delta_tile + (j % 2) * N;
      float st[MT][N / 8][4], dpt[MT][N / 8][4];  // S^T and dP^T: this warp's keys against the tile's queries
      product_abt<D, N, MT>(st, ks, mt, qt);
      product_abt<D, N, MT>(dpt, vs, mt, dot);
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = n * 8 + 2 * lq + (e & 1);
            const int query = t0 + c, key = static_cast<int>(k0) + mt.row[i] + g + 8 * (e / 2);
            const float p = query >= key && query < Tn ? exp2f(st[i][n][e] * scale2 - lt[c]) : 0.0f;
            st[i][n][e] = p;
            dpt[i][n][e] = p * (dpt[i][n][e] - dt[c]);  // dS^T
          }
      accumulate_pb<D, N, MT>(dv_acc, st, mt, dot);
      accumulate_pb<D, N, MT>(dk_acc, dpt, mt, qt);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) mt.live[i] = true;
  store_rows<D, MT>(dv + in, dv_acc, mt, k0, Tn, ld, 1.0f);
  store_rows<D, MT>(dk + in, dk_acc, mt, k0, Tn, ld, scale);
#endif
}

template <int D, class Cut>
constexpr std::size_t forward_smem() {
  return tile<Cut::block_rows, D>::bytes + 4 * tile<Cut::staged, D>::bytes;
}
template <int D, class Cut>
constexpr std::size_t dq_smem() {
  return 2 * tile<Cut::block_rows, D>::bytes + 4 * tile<Cut::staged, D>::bytes;
}
template <int D, class Cut>
constexpr std::size_t dkv_smem() {
  return 2 * tile<Cut::block_rows, D>::bytes + 4 * tile<Cut::staged, D>::bytes + 4 * Cut::staged * sizeof(float);
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

inline dim3 grid(std::int64_t B, std::int64_t H, std::int64_t Tn, int block_rows) {
  decentrain::detail::check(B * H < 65536, "cuda causal_attention: B * n_head = ", B * H, " is above 65535");
  decentrain::detail::check(Tn < (std::int64_t{1} << 30), "cuda causal_attention: T = ", Tn, " is above 2^30");
  return dim3(static_cast<unsigned>((Tn + block_rows - 1) / block_rows), static_cast<unsigned>(B * H));
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline float scale_of(std::int64_t D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

// The forward with a chosen cut (the library's is default_cuts<D>::forward).
template <int D, class Cut>
void forward(bf* out, float* lse, const bf* q, const bf* k, const bf* v, std::int64_t B, std::int64_t Tn,
             std::int64_t H, std::int64_t ld) {
  const auto kernel = forward_kernel<D, Cut>;
  set_smem(kernel, forward_smem<D, Cut>());
  kernel<<<grid(B, H, Tn, Cut::block_rows), threads, forward_smem<D, Cut>(), cuda_rt::current_stream()>>>(
      out, lse, q, k, v, Tn, H, ld, scale_of(D));
  cuda_rt::check_launch("bf16 attention forward");
}

// The backward with chosen cuts; `delta` holds B H Tn floats of scratch.
template <int D, class DqCut, class DkvCut>
void backward(bf* dq, bf* dk, bf* dv, const bf* dout, const bf* out, const float* lse, float* delta, const bf* q,
              const bf* k, const bf* v, std::int64_t B, std::int64_t Tn, std::int64_t H, std::int64_t ld) {
  const auto stream = cuda_rt::current_stream();
  const dim3 rows_grid(static_cast<unsigned>((Tn + warps - 1) / warps), static_cast<unsigned>(B * H));
  delta_kernel<D><<<rows_grid, threads, 0, stream>>>(delta, dout, out, Tn, H);
  cuda_rt::check_launch("bf16 attention delta");
  const auto dq_k = dq_kernel<D, DqCut>;
  set_smem(dq_k, dq_smem<D, DqCut>());
  dq_k<<<grid(B, H, Tn, DqCut::block_rows), threads, dq_smem<D, DqCut>(), stream>>>(dq, dout, lse, delta, q, k, v, Tn,
                                                                                  H, ld, scale_of(D));
  cuda_rt::check_launch("bf16 attention dq");
  const auto dkv_k = dkv_kernel<D, DkvCut>;
  set_smem(dkv_k, dkv_smem<D, DkvCut>());
  dkv_k<<<grid(B, H, Tn, DkvCut::block_rows), threads, dkv_smem<D, DkvCut>(), stream>>>(
      dk, dv, dout, lse, delta, q, k, v, Tn, H, ld, scale_of(D));
  cuda_rt::check_launch("bf16 attention dk, dv");
}
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
  fa::with_width(C / H, [&](auto width) {
    constexpr int W = decltype(width)::value;
    fa::forward<W, typename fa::default_cuts<W>::forward>(reinterpret_cast<fa::bf*>(out), lse,
                                                          reinterpret_cast<const fa::bf*>(q),
                                                          reinterpret_cast<const fa::bf*>(k),
                                                          reinterpret_cast<const fa::bf*>(v), B, Tn, H, ld);
  });
}

// dq, dk, dv (rows `ld` apart, like q, k, v) are written, not accumulated; dout and out are
// (B, T, C).
inline void attention_backward_bf16(cuda, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                                    const float* lse, const bf16* q, const bf16* k, const bf16* v, std::int64_t B,
                                    std::int64_t Tn, std::int64_t C, std::int64_t H, std::int64_t ld) {
  namespace fa = cuda_detail::fa;
  if (B * Tn * C == 0) return;
  const auto as = [](auto* p) { return reinterpret_cast<fa::bf*>(p); };
  const auto cas = [](const auto* p) { return reinterpret_cast<const fa::bf*>(p); };
  cuda_detail::scratch<float> delta(B * H * Tn);
  fa::with_width(C / H, [&](auto width) {
    constexpr int W = decltype(width)::value;
    using cuts = fa::default_cuts<W>;
    fa::backward<W, typename cuts::dq, typename cuts::dkv>(as(dq), as(dk), as(dv), cas(dout), cas(out), lse, delta.get(),
                                                           cas(q), cas(k), cas(v), B, Tn, H, ld);
  });
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
