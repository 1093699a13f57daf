// Matrix multiply on the CPU: C = alpha * op(A) * op(B) + beta * C, row-major with leading
// dimensions, as BLAS. Goes to CBLAS when the build has one; otherwise to a portable packed
// GEMM (BLIS-style blocking, GCC/Clang vector extensions) that is also always available for
// testing against CBLAS.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/detail/error.hpp"

#if DECENTRAIN_HAS_CBLAS
#include <cblas.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace decentrain::kernels {

enum class gemm_backend { automatic, portable, cblas };

// The instruction sets the portable GEMM has micro-kernels for, widest first.
enum class gemm_isa { avx512, avx2, baseline };

inline constexpr bool has_cblas = DECENTRAIN_HAS_CBLAS != 0;

namespace detail::gemm {

// GCC/Clang vector extensions: one source, compiled to whatever SIMD the enclosing function
// is built for. A micro-tile is MR rows by two vectors of columns (2*MR accumulators).
template <class T, int VectorBytes>
struct vector_of;
// `memory` loads and stores any address (element-aligned, may alias the scalars), directly:
// a memcpy into a local vector leaves a stack round trip per load in the dispatched builds.
template <int VectorBytes>
struct vector_of<float, VectorBytes> {
  typedef float type __attribute__((vector_size(VectorBytes)));
  typedef float memory __attribute__((vector_size(VectorBytes), aligned(4), may_alias));
};
template <int VectorBytes>
struct vector_of<double, VectorBytes> {
  typedef double type __attribute__((vector_size(VectorBytes)));
  typedef double memory __attribute__((vector_size(VectorBytes), aligned(8), may_alias));
};

template <class T, int VectorBytes, int TileRows>
struct blocking {
  using vec = typename vector_of<T, VectorBytes>::type;
  using vec_memory = typename vector_of<T, VectorBytes>::memory;
  static constexpr int lanes = VectorBytes / static_cast<int>(sizeof(T));
  static constexpr int mr = TileRows;
  static constexpr int nr = 2 * lanes;
  // kc*nr of packed B stays in L1 while A slivers stream from L2; mc*kc of A fits L2.
  static constexpr std::int64_t kc = 256;
  static constexpr std::int64_t mc = mr * 24;
  static constexpr std::int64_t nc = 2048;
};

// AVX-512 keeps 24 of its 32 registers as accumulators (12x2), AVX2 12 of 16 (6x2); the
// baseline is SSE2-sized.
using isa = gemm_isa;
template <isa I> struct isa_shape;
template <> struct isa_shape<isa::avx512> { static constexpr int vector_bytes = 64, tile_rows = 12; };
template <> struct isa_shape<isa::avx2> { static constexpr int vector_bytes = 32, tile_rows = 6; };
template <> struct isa_shape<isa::baseline> { static constexpr int vector_bytes = 16, tile_rows = 6; };

struct aligned_deleter {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t{64}); }
};
template <class T>
std::unique_ptr<T[], aligned_deleter> aligned_buffer(std::int64_t n) {
  return std::unique_ptr<T[], aligned_deleter>(
      static_cast<T*>(::operator new(static_cast<std::size_t>(n) * sizeof(T), std::align_val_t{64})));
}

// Packs rows [0, m) x cols [0, k) of A (element (i,p) at a[i*rs + p*cs]) into mr-row slivers,
// each stored k-major, zero-padding the last sliver.
template <class B, class T>
void pack_a(T* dst, const T* a, std::int64_t rs, std::int64_t cs, std::int64_t m, std::int64_t k) {
  constexpr int mr = B::mr;
  for (std::int64_t i0 = 0; i0 < m; i0 += mr) {
    const std::int64_t rows = std::min<std::int64_t>(mr, m - i0);
    for (std::int64_t p = 0; p < k; ++p) {
      for (std::int64_t i = 0; i < rows; ++i) dst[i] = a[(i0 + i) * rs + p * cs];
      for (std::int64_t i = rows; i < mr; ++i) dst[i] = T(0);
      dst += mr;
    }
  }
}

// Packs rows [0, k) x cols [0, n) of B into nr-column slivers, each stored k-major.
template <class B, class T>
void pack_b(T* dst, const T* b, std::int64_t rs, std::int64_t cs, std::int64_t k, std::int64_t n) {
  constexpr int nr = B::nr;
  for (std::int64_t j0 = 0; j0 < n; j0 += nr) {
    const std::int64_t cols = std::min<std::int64_t>(nr, n - j0);
    for (std::int64_t p = 0; p < k; ++p) {
      const T* row = b + p * rs + j0 * cs;
      if (cs == 1 && cols == nr) {
        std::memcpy(dst, row, sizeof(T) * nr);
      } else {
        for (std::int64_t j = 0; j < cols; ++j) dst[j] = row[j * cs];
        for (std::int64_t j = cols; j < nr; ++j) dst[j] = T(0);
      }
      dst += nr;
    }
  }
}

// C[0:rows, 0:cols] += alpha * (packed A sliver) * (packed B sliver). Always inlined into the
// per-ISA entry points below, so it compiles under each one's instruction set.
template <class B, class T>
[[gnu::always_inline]] inline void micro_kernel(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha,
                  std::int64_t rows, std::int64_t cols) {
  using vec = typename B::vec;
  using mem = typename B::vec_memory;
  constexpr int mr = B::mr, lanes = B::lanes, nr = B::nr;
  vec acc[mr][2];
  for (int i = 0; i < mr; ++i) acc[i][0] = acc[i][1] = vec{};
  for (std::int64_t p = 0; p < k; ++p) {
    const vec b0 = *reinterpret_cast<const mem*>(b + p * nr);
    const vec b1 = *reinterpret_cast<const mem*>(b + p * nr + lanes);
    const T* ap = a + p * mr;
    for (int i = 0; i < mr; ++i) {
      const T ai = ap[i];
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  if (rows == mr && cols == nr) {
    for (int i = 0; i < mr; ++i) {
      T* ci = c + i * ldc;
      *reinterpret_cast<mem*>(ci) += alpha * acc[i][0];
      *reinterpret_cast<mem*>(ci + lanes) += alpha * acc[i][1];
    }
  } else {
    alignas(64) T tile[mr][nr];
    std::memcpy(tile, acc, sizeof tile);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) c[i * ldc + j] += alpha * tile[i][j];
  }
}

// One thread's share: C block of m x n, all of K, with its own packing buffers. Packing and
// loops are memory-bound and compile for the baseline; only `Kernel::run` is ISA-specific.
template <class Kernel, class T>
void gemm_block(std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t a_rs, std::int64_t a_cs, const T* b, std::int64_t b_rs,
                std::int64_t b_cs, T beta, T* c, std::int64_t ldc) {
  using B = typename Kernel::template blocking_for<T>;
  if (beta != T(1)) {
    for (std::int64_t i = 0; i < m; ++i) {
      T* row = c + i * ldc;
      if (beta == T(0)) std::fill_n(row, n, T(0));
      else for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
  if (k == 0 || alpha == T(0)) return;
  // K is cut into equal panels of at most kc, so no short ragged panel wastes a pass over C.
  const std::int64_t k_panels = (k + B::kc - 1) / B::kc;
  const std::int64_t kc = ((k + k_panels - 1) / k_panels + 7) / 8 * 8;
  const std::int64_t nc = std::min<std::int64_t>(B::nc, (n + B::nr - 1) / B::nr * B::nr);
  const std::int64_t mc = std::min<std::int64_t>(B::mc, (m + B::mr - 1) / B::mr * B::mr);
  auto packed_b = aligned_buffer<T>(kc * nc);
  auto packed_a = aligned_buffer<T>(mc * kc);
  for (std::int64_t jc = 0; jc < n; jc += nc) {
    const std::int64_t nb = std::min(nc, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += kc) {
      const std::int64_t kb = std::min(kc, k - pc);
      pack_b<B>(packed_b.get(), b + pc * b_rs + jc * b_cs, b_rs, b_cs, kb, nb);
      for (std::int64_t ic = 0; ic < m; ic += mc) {
        const std::int64_t mb = std::min(mc, m - ic);
        pack_a<B>(packed_a.get(), a + ic * a_rs + pc * a_cs, a_rs, a_cs, mb, kb);
        for (std::int64_t jr = 0; jr < nb; jr += B::nr) {
          for (std::int64_t ir = 0; ir < mb; ir += B::mr) {
            Kernel::run(kb, packed_a.get() + ir * kb, packed_b.get() + jr * kb,
                         c + (ic + ir) * ldc + jc + jr, ldc, alpha,
                         std::min<std::int64_t>(B::mr, mb - ir), std::min<std::int64_t>(B::nr, nb - jr));
          }
        }
      }
    }
  }
}

// One micro-kernel per instruction set, each a small function of its own (as in BLIS), so
// its 2*MR accumulators get the register allocator's full attention.
template <isa I>
struct kernel_for {
  template <class T>
  using blocking_for = blocking<T, isa_shape<I>::vector_bytes, isa_shape<I>::tile_rows>;
  template <class T>
  [[gnu::noinline]] static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc,
                                    T alpha, std::int64_t rows, std::int64_t cols) {
    micro_kernel<blocking_for<T>>(k, a, b, c, ldc, alpha, rows, cols);
  }
};

// x86-64 with GCC or Clang: the AVX2 and AVX-512 kernels are compiled whatever the -march, and
// chosen at run time, so a default build still uses the machine's full vector width. nvcc's
// host pass and other targets use only what the compiler flags enable.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define DECENTRAIN_GEMM_DISPATCH 1
template <>
struct kernel_for<isa::avx512> {
  template <class T>
  using blocking_for = blocking<T, 64, 12>;
  template <class T>
  [[gnu::noinline, gnu::target("avx512f,avx512vl,avx512dq,avx2,fma")]] static void run(
      std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, std::int64_t rows,
      std::int64_t cols) {
    micro_kernel<blocking_for<T>>(k, a, b, c, ldc, alpha, rows, cols);
  }
};
template <>
struct kernel_for<isa::avx2> {
  template <class T>
  using blocking_for = blocking<T, 32, 6>;
  template <class T>
  [[gnu::noinline, gnu::target("avx2,fma")]] static void run(std::int64_t k, const T* a, const T* b,
                                                             T* c, std::int64_t ldc, T alpha,
                                                             std::int64_t rows, std::int64_t cols) {
    micro_kernel<blocking_for<T>>(k, a, b, c, ldc, alpha, rows, cols);
  }
};
inline isa best_isa() {
  static const isa best =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
              __builtin_cpu_supports("avx512dq")
          ? isa::avx512
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? isa::avx2
                                                                         : isa::baseline;
  return best;
}
#else
#define DECENTRAIN_GEMM_DISPATCH 0
inline isa best_isa() {
#if defined(__AVX512F__)
  return isa::avx512;
#elif defined(__AVX2__)
  return isa::avx2;
#else
  return isa::baseline;
#endif
}
#endif

template <class T, class... Args>
void gemm_block_dispatch(isa which, Args... args) {
  switch (which) {
    case isa::avx512: return gemm_block<kernel_for<isa::avx512>, T>(args...);
    case isa::avx2: return gemm_block<kernel_for<isa::avx2>, T>(args...);
    case isa::baseline: break;
  }
  gemm_block<kernel_for<isa::baseline>, T>(args...);
}

}  // namespace detail::gemm

// The widest instruction set this machine (and build) runs the portable GEMM with.
inline gemm_isa best_gemm_isa() { return detail::gemm::best_isa(); }

// The portable GEMM. Threads (OpenMP) split C into strips along its longer side, each strip a
// whole number of micro-tiles, so threads never share output and need no synchronisation.
// `which` picks the micro-kernel (tests use it to cover every one the machine can run).
template <class T>
void portable_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                   T* c, std::int64_t ldc, gemm_isa which = best_gemm_isa()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm is for float and double");
  decentrain::detail::check(static_cast<int>(which) >= static_cast<int>(best_gemm_isa()),
                            "portable_gemm: this machine or build cannot run the requested instruction set");
  // Threads own whole micro-tiles: strips are multiples of the widest tile (12 rows, 32 floats).
  constexpr std::int64_t tile_m = 12, tile_n = 64 / sizeof(T) * 2;
  const std::int64_t a_rs = trans_a ? 1 : lda, a_cs = trans_a ? lda : 1;
  const std::int64_t b_rs = trans_b ? 1 : ldb, b_cs = trans_b ? ldb : 1;
  int threads = 1;
#if defined(_OPENMP)
  // Below about a million multiply-adds, starting threads costs more than it saves.
  if (m * n * k >= (std::int64_t{1} << 20) && !omp_in_parallel()) threads = omp_get_max_threads();
#endif
  const bool split_rows = m >= n;
  const std::int64_t unit = split_rows ? tile_m : tile_n;
  const std::int64_t extent = split_rows ? m : n;
  const std::int64_t units = (extent + unit - 1) / unit;
  threads = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, units)));
  DECENTRAIN_OMP(parallel for num_threads(threads) schedule(static, 1))
  for (int t = 0; t < threads; ++t) {
    const std::int64_t first = units * t / threads * unit;
    const std::int64_t last = std::min(extent, units * (t + 1) / threads * unit);
    if (first >= last) continue;
    if (split_rows) {
      detail::gemm::gemm_block_dispatch<T>(which, last - first, n, k, alpha, a + first * a_rs, a_rs,
                                           a_cs, b, b_rs, b_cs, beta, c + first * ldc, ldc);
    } else {
      detail::gemm::gemm_block_dispatch<T>(which, m, last - first, k, alpha, a, a_rs, a_cs,
                                           b + first * b_cs, b_rs, b_cs, beta, c + first, ldc);
    }
  }
}

#if DECENTRAIN_HAS_CBLAS
template <class T>
void cblas_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                T* c, std::int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto i = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
}
#endif

// The GEMM every op uses. Leading dimensions are checked so a bad call fails with a message,
// not a wild read.
template <class T>
void gemm(cpu, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc, gemm_backend backend = gemm_backend::automatic) {
  decentrain::detail::check(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m=", m, " n=", n, " k=", k);
  decentrain::detail::check(lda >= std::max<std::int64_t>(1, trans_a ? m : k) &&
                                ldb >= std::max<std::int64_t>(1, trans_b ? k : n) &&
                                ldc >= std::max<std::int64_t>(1, n),
                            "gemm: leading dimension too small (lda=", lda, ", ldb=", ldb,
                            ", ldc=", ldc, " for m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  if (backend == gemm_backend::cblas && !has_cblas)
    decentrain::detail::fail("gemm: the CBLAS backend was requested but this build has no CBLAS "
                             "(configure with a CBLAS such as libopenblas-dev installed)");
#if DECENTRAIN_HAS_CBLAS
  if (backend != gemm_backend::portable) {
    // BLAS rejects k == 0 with some leading dimensions; the portable path handles it uniformly.
    if (k > 0) return cblas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
#endif
  portable_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace decentrain::kernels
