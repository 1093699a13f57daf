// bench/gemm: GFLOP/s of the library's matmul on the GEMM shapes of GPT training, side by side
// in one run with OpenBLAS cblas_sgemm and the portable fallback, all on the same threads.
// Prints a table and writes one JSON row per shape and implementation.
//
//   gemm [--threads N] [--reps R] [--json PATH]
#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "output_file.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dt = decentrain;

namespace {

struct gemm_shape {
  const char* role;
  std::int64_t m, k, n;
  bool ta, tb;
};

// Median seconds of each function over `reps` rounds. Within a round the functions run one
// after another, so a slow spell of a shared machine hits all of them alike; three warm-up
// rounds first bring caches and the allocator to their steady state.
std::vector<double> time_interleaved(int reps, const std::vector<std::function<void()>>& fs) {
  for (int w = 0; w < 3; ++w)
    for (const auto& f : fs) f();
  std::vector<std::vector<double>> t(fs.size());
  for (int i = 0; i < reps; ++i) {
    for (std::size_t j = 0; j < fs.size(); ++j) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[j]();
      t[j].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::vector<double> medians;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) try {
  int threads = 2, reps = 5;
  std::string json_path = "gemm.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--json") json_path = argv[i + 1];
    else { std::fprintf(stderr, "unknown option %s\n", flag.c_str()); return 2; }
  }
  bench::output_file json(json_path);  // opened first: a bad path fails before the minutes of measuring
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
#if DECENTRAIN_HAS_CBLAS
  openblas_set_num_threads(threads);
#else
  std::fprintf(stderr, "this build has no CBLAS: nothing to compare with\n");
  return 1;
#endif

  // M x K x N for a layer computing (M, K) x (K, N), and its two backward products.
  const std::vector<gemm_shape> shapes = {
      {"fc fwd   (T*B=2048, C=384)", 2048, 384, 1536, false, false},
      {"fc dX    (T*B=2048, C=384)", 2048, 1536, 384, false, true},
      {"fc dW    (T*B=2048, C=384)", 384, 2048, 1536, true, false},
      {"proj fwd (T*B=2048, C=384)", 2048, 1536, 384, false, false},
      {"proj dX  (T*B=2048, C=384)", 2048, 384, 1536, false, true},
      {"proj dW  (T*B=2048, C=384)", 1536, 2048, 384, true, false},
      {"fc fwd   (T*B=8192, C=768)", 8192, 768, 3072, false, false},
      {"fc dX    (T*B=8192, C=768)", 8192, 3072, 768, false, true},
      {"fc dW    (T*B=8192, C=768)", 768, 8192, 3072, true, false},
  };

  std::printf("GEMM GFLOP/s, f32, %d threads, median of %d interleaved rounds, on %s\n", threads, reps, cpu_model().c_str());
  std::printf("%-28s %-20s %8s %8s %8s %8s %7s %7s %7s\n", "shape", "MxKxN (op)", "library",
              "lib+alloc", "OpenBLAS", "portable", "lib/OB", "alloc/OB", "port/OB");
  json << "[\n";
  dt::rng gen(1, "bench-gemm");
  bool first_row = true;
  for (const auto& s : shapes) {
    const auto a = dt::uniform(s.ta ? dt::shape{s.k, s.m} : dt::shape{s.m, s.k}, gen, -1, 1);
    const auto b = dt::uniform(s.tb ? dt::shape{s.n, s.k} : dt::shape{s.k, s.n}, gen, -1, 1);
    auto c = dt::zeros(dt::shape{s.m, s.n});
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* pc = c.data<float>();
    const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;

    // The library two ways: into a caller's buffer (the same conditions as the OpenBLAS call)
    // and allocating a fresh result each call (what a graph op pays).
    const auto times = time_interleaved(reps, {
        [&] { dt::math::matmul_into(a, b, c, s.ta, s.tb); },
        [&] { auto fresh = dt::math::matmul(a, b, s.ta, s.tb); },
        [&] {
#if DECENTRAIN_HAS_CBLAS
          cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                      static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.f, pa,
                      static_cast<blasint>(lda), pb, static_cast<blasint>(ldb), 0.f, pc, static_cast<blasint>(s.n));
#endif
        },
        [&] { dt::kernels::portable_gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.f, pa, lda, pb, ldb, 0.f, pc, s.n); },
    });
    const double t_lib = times[0], t_alloc = times[1], t_blas = times[2], t_port = times[3];
    const double g_alloc = flops / t_alloc / 1e9;
    const double g_lib = flops / t_lib / 1e9, g_blas = flops / t_blas / 1e9, g_port = flops / t_port / 1e9;
    char dims[64];
    std::snprintf(dims, sizeof dims, "%lldx%lldx%lld (%s%s)", static_cast<long long>(s.m), static_cast<long long>(s.k),
                  static_cast<long long>(s.n), s.ta ? "T" : "N", s.tb ? "T" : "N");
    std::printf("%-28s %-20s %8.1f %8.1f %8.1f %8.1f %6.2fx %7.2fx %6.2fx\n", s.role, dims, g_lib,
                g_alloc, g_blas, g_port, g_lib / g_blas, g_alloc / g_blas, g_port / g_blas);
    json << (first_row ? "" : ",\n") << "  {\"shape\": \"" << dims << "\", \"role\": \"" << s.role
         << "\", \"threads\": " << threads << ", \"library_gflops\": " << g_lib
         << ", \"library_alloc_gflops\": " << g_alloc << ", \"openblas_gflops\": " << g_blas << ", \"portable_gflops\": " << g_port
         << ", \"library_vs_openblas\": " << g_lib / g_blas << ", \"portable_vs_openblas\": " << g_port / g_blas << "}";
    first_row = false;
  }
  json << "\n]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm: %s\n", e.what());
  return 1;
}
