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

inline constexpr bool has_cblas = DECENTRAIN_HAS_CBLAS != 0;

namespace detail::gemm {

// Register blocking follows the widest vector the compiler may use: a micro-tile is MR rows
// by two vectors of columns, which keeps 2*MR accumulators in registers.
#if defined(__AVX512F__)
inline constexpr int vector_bytes = 64;
inline constexpr int tile_rows = 12;  // 24 of the 32 zmm registers hold accumulators
#elif defined(__AVX__)
inline constexpr int vector_bytes = 32;
inline constexpr int tile_rows = 6;  // 12 of the 16 ymm registers
#else
inline constexpr int vector_bytes = 16;
inline constexpr int tile_rows = 6;
#endif

// GCC/Clang vector extensions: portable source that compiles to whatever SIMD is enabled.
template <class T>
struct vector_of;
template <>
struct vector_of<float> {
  typedef float type __attribute__((vector_size(vector_bytes)));
};
template <>
struct vector_of<double> {
  typedef double type __attribute__((vector_size(vector_bytes)));
};

template <class T>
struct blocking {
  using vec = typename vector_of<T>::type;
  static constexpr int lanes = vector_bytes / static_cast<int>(sizeof(T));
  static constexpr int mr = tile_rows;
  static constexpr int nr = 2 * lanes;
  // kc*nr*sizeof(T) of packed B stays in L1 while A slivers stream from L2; mc*kc of A in L2.
  static constexpr std::int64_t kc = 256;
  static constexpr std::int64_t mc = mr * 24;
  static constexpr std::int64_t nc = 2048;
};

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
template <class T>
void pack_a(T* dst, const T* a, std::int64_t rs, std::int64_t cs, std::int64_t m, std::int64_t k) {
  constexpr int mr = blocking<T>::mr;
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
template <class T>
void pack_b(T* dst, const T* b, std::int64_t rs, std::int64_t cs, std::int64_t k, std::int64_t n) {
  constexpr int nr = blocking<T>::nr;
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

// C[0:rows, 0:cols] += alpha * (packed A sliver) * (packed B sliver).
template <class T>
void micro_kernel(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha,
                  std::int64_t rows, std::int64_t cols) {
  using B = blocking<T>;
  using vec = typename B::vec;
  constexpr int mr = B::mr, lanes = B::lanes, nr = B::nr;
  vec acc[mr][2];
  for (int i = 0; i < mr; ++i) acc[i][0] = acc[i][1] = vec{};
  for (std::int64_t p = 0; p < k; ++p) {
    vec b0, b1;
    std::memcpy(&b0, b + p * nr, sizeof(vec));
    std::memcpy(&b1, b + p * nr + lanes, sizeof(vec));
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
      vec c0, c1;
      std::memcpy(&c0, ci, sizeof(vec));
      std::memcpy(&c1, ci + lanes, sizeof(vec));
      c0 += alpha * acc[i][0];
      c1 += alpha * acc[i][1];
      std::memcpy(ci, &c0, sizeof(vec));
      std::memcpy(ci + lanes, &c1, sizeof(vec));
    }
  } else {
    alignas(64) T tile[mr][nr];
    std::memcpy(tile, acc, sizeof tile);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) c[i * ldc + j] += alpha * tile[i][j];
  }
}

// One thread's share: C block of m x n, all of K, with its own packing buffers.
template <class T>
void gemm_block(std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t a_rs, std::int64_t a_cs, const T* b, std::int64_t b_rs,
                std::int64_t b_cs, T beta, T* c, std::int64_t ldc) {
  using B = blocking<T>;
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
      pack_b(packed_b.get(), b + pc * b_rs + jc * b_cs, b_rs, b_cs, kb, nb);
      for (std::int64_t ic = 0; ic < m; ic += mc) {
        const std::int64_t mb = std::min(mc, m - ic);
        pack_a(packed_a.get(), a + ic * a_rs + pc * a_cs, a_rs, a_cs, mb, kb);
        for (std::int64_t jr = 0; jr < nb; jr += B::nr) {
          for (std::int64_t ir = 0; ir < mb; ir += B::mr) {
            micro_kernel(kb, packed_a.get() + ir * kb, packed_b.get() + jr * kb,
                         c + (ic + ir) * ldc + jc + jr, ldc, alpha,
                         std::min<std::int64_t>(B::mr, mb - ir), std::min<std::int64_t>(B::nr, nb - jr));
          }
        }
      }
    }
  }
}

}  // namespace detail::gemm

// The portable GEMM. Threads (OpenMP) split C into strips along its longer side, each strip a
// whole number of micro-tiles, so threads never share output and need no synchronisation.
template <class T>
void portable_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                   T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm is for float and double");
  using B = detail::gemm::blocking<T>;
  const std::int64_t a_rs = trans_a ? 1 : lda, a_cs = trans_a ? lda : 1;
  const std::int64_t b_rs = trans_b ? 1 : ldb, b_cs = trans_b ? ldb : 1;
  int threads = 1;
#if defined(_OPENMP)
  // Below about a million multiply-adds, starting threads costs more than it saves.
  if (m * n * k >= (std::int64_t{1} << 20) && !omp_in_parallel()) threads = omp_get_max_threads();
#endif
  const bool split_rows = m >= n;
  const std::int64_t unit = split_rows ? B::mr : B::nr;
  const std::int64_t extent = split_rows ? m : n;
  const std::int64_t units = (extent + unit - 1) / unit;
  threads = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, units)));
  DECENTRAIN_OMP(parallel for num_threads(threads) schedule(static, 1))
  for (int t = 0; t < threads; ++t) {
    const std::int64_t first = units * t / threads * unit;
    const std::int64_t last = std::min(extent, units * (t + 1) / threads * unit);
    if (first >= last) continue;
    if (split_rows) {
      detail::gemm::gemm_block(last - first, n, k, alpha, a + first * a_rs, a_rs, a_cs, b, b_rs,
                               b_cs, beta, c + first * ldc, ldc);
    } else {
      detail::gemm::gemm_block(m, last - first, k, alpha, a, a_rs, a_cs, b + first * b_cs, b_rs,
                               b_cs, beta, c + first, ldc);
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
