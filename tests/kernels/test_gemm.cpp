// GEMM: the portable kernel against a plain triple loop in long double, on odd sizes, every
// transpose, alpha/beta and padded leading dimensions; and against CBLAS where both exist.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <vector>

namespace dt = decentrain;
namespace k = decentrain::kernels;

namespace {
template <class T>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed) {
  dt::rng gen(seed, "gemm-test");
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(gen.uniform(-1.0, 1.0));
  return v;
}

template <class T>
void reference_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t kk, T alpha,
                    const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                    std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      long double s = 0;
      for (std::int64_t p = 0; p < kk; ++p)
        s += static_cast<long double>(ta ? a[p * lda + i] : a[i * lda + p]) *
             static_cast<long double>(tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = static_cast<T>(alpha * s + (beta == T(0) ? 0.0L : beta * static_cast<long double>(c[i * ldc + j])));
    }
}

struct gemm_case {
  std::int64_t m, n, k;
};

// Tolerance: |error| <= eps * k * max|a||b| bound, here eps(T) * 4 * sqrt(k) scaled (inputs in [-1, 1]).
template <class T>
void check_against_reference(k::gemm_backend backend, k::gemm_isa isa = k::best_gemm_isa()) {
  const double eps = std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16;
  const std::vector<gemm_case> cases = {{1, 1, 1},   {7, 5, 3},    {13, 33, 17}, {64, 64, 64},
                                        {97, 131, 259}, {300, 37, 600}, {5, 700, 9}, {33, 1, 40}};
  for (auto [m, n, kk] : cases) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] : {std::pair<T, T>{1, 0}, std::pair<T, T>{T(-0.5), T(1.5)}}) {
          // Leading dimensions padded by 3 so the kernel must honour them.
          const std::int64_t lda = (ta ? m : kk) + 3, ldb = (tb ? kk : n) + 3, ldc = n + 3;
          const auto a = random_vector<T>(static_cast<std::size_t>((ta ? kk : m) * lda), 1);
          const auto b = random_vector<T>(static_cast<std::size_t>((tb ? n : kk) * ldb), 2);
          auto c = random_vector<T>(static_cast<std::size_t>(m * ldc), 3);
          auto expected = c;
          reference_gemm(ta, tb, m, n, kk, alpha, a.data(), lda, b.data(), ldb, beta, expected.data(), ldc);
          if (backend == k::gemm_backend::portable)
            k::portable_gemm(ta, tb, m, n, kk, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, isa);
          else
            k::gemm(dt::cpu{}, ta, tb, m, n, kk, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, backend);
          const double tol = eps * 8 * (std::sqrt(static_cast<double>(kk)) + 1) * 4;
          double worst = 0;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < ldc; ++j) {
              const auto idx = static_cast<std::size_t>(i * ldc + j);
              // Padding columns beyond n must be untouched.
              worst = std::max(worst, std::abs(static_cast<double>(c[idx]) - static_cast<double>(expected[idx])));
            }
          INFO("m=" << m << " n=" << n << " k=" << kk << " ta=" << ta << " tb=" << tb << " alpha=" << alpha);
          CHECK(worst <= tol);
        }
      }
    }
  }
}

// Every micro-kernel this machine can run, not only the one the dispatcher picks.
std::vector<k::gemm_isa> runnable_isas() {
  std::vector<k::gemm_isa> out;
  for (auto isa : {k::gemm_isa::avx512, k::gemm_isa::avx2, k::gemm_isa::baseline})
    if (static_cast<int>(isa) >= static_cast<int>(k::best_gemm_isa())) out.push_back(isa);
  return out;
}
}  // namespace

TEST_CASE("portable gemm matches a long-double reference (float)", "[gemm]") {
  for (auto isa : runnable_isas()) {
    INFO("isa " << static_cast<int>(isa));
    check_against_reference<float>(k::gemm_backend::portable, isa);
  }
}
TEST_CASE("portable gemm matches a long-double reference (double)", "[gemm]") {
  for (auto isa : runnable_isas()) {
    INFO("isa " << static_cast<int>(isa));
    check_against_reference<double>(k::gemm_backend::portable, isa);
  }
}

TEST_CASE("the dispatcher uses this machine's widest instruction set", "[gemm]") {
#if defined(__x86_64__) && defined(__GNUC__)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  CHECK((k::best_gemm_isa() == k::gemm_isa::avx512) == avx512);
#endif
  CHECK(runnable_isas().back() == k::gemm_isa::baseline);
}

TEST_CASE("the default gemm path matches the reference", "[gemm]") {
  check_against_reference<float>(k::gemm_backend::automatic);
  check_against_reference<double>(k::gemm_backend::automatic);
}

// Only built with a CBLAS: without one there is nothing to compare against.
#if DECENTRAIN_HAS_CBLAS
TEST_CASE("portable gemm agrees with CBLAS on GPT-sized shapes", "[gemm][cblas]") {
  const std::int64_t m = 256, n = 384, kk = 192;
  const auto a = random_vector<float>(static_cast<std::size_t>(m * kk), 4);
  const auto b = random_vector<float>(static_cast<std::size_t>(kk * n), 5);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> c1(static_cast<std::size_t>(m * n)), c2(c1.size());
      const std::int64_t lda = ta ? m : kk, ldb = tb ? kk : n;
      k::gemm(dt::cpu{}, ta, tb, m, n, kk, 1.f, a.data(), lda, b.data(), ldb, 0.f, c1.data(), n, k::gemm_backend::portable);
      k::gemm(dt::cpu{}, ta, tb, m, n, kk, 1.f, a.data(), lda, b.data(), ldb, 0.f, c2.data(), n, k::gemm_backend::cblas);
      double worst = 0;
      for (std::size_t i = 0; i < c1.size(); ++i) worst = std::max(worst, std::abs(double(c1[i]) - double(c2[i])));
      INFO("ta=" << ta << " tb=" << tb);
      CHECK(worst < 2e-5);  // two f32 summation orders over k=192 values in [-1, 1]
    }
  }
}
#endif

TEST_CASE("gemm with k = 0 scales C by beta", "[gemm]") {
  std::vector<float> c{1, 2, 3, 4};
  k::gemm<float>(dt::cpu{}, false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  CHECK(c == std::vector<float>{0.5f, 1.f, 1.5f, 2.f});
}
