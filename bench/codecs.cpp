// bench/codecs: encode and decode throughput of every codec against memcpy of the same buffer,
// and what each saves on the wire, for f32 buffers of 1 to 100 MB. Throughput is GB/s of f32
// input (decode: of the f32 values produced), the median of the repetitions; threads as OpenMP
// gives them (OMP_NUM_THREADS).
//
//   bench_codecs [--sizes-mb 1,10,100] [--reps 5] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "decentrain/compress/compress.hpp"
#include "decentrain/core/rng.hpp"
#include "output_file.hpp"

namespace dt = decentrain;
namespace cz = dt::compress;

namespace {

double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  f();  // warm: pages mapped, caches as in steady use
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct row {
  std::string codec;
  double mb = 0, encode_gbs = 0, decode_gbs = 0, memcpy_gbs = 0, ratio = 0;
};

template <class Codec>
row measure(const std::string& label, Codec codec, const std::vector<float>& x, int reps, double memcpy_gbs) {
  const double bytes = 4.0 * static_cast<double>(x.size());
  std::vector<std::byte> payload(codec.max_encoded_bytes(x.size()));
  std::size_t size = 0;
  const double enc = median_seconds(reps, [&] { size = codec.encode(std::span<const float>(x), payload); });
  // Decode adds into a sum, as the collectives do: timed alone, into the sum of the calls before
  // (until 2026-11-25 the timing also zeroed the buffer first, a write pass of its own).
  std::vector<float> out(x.size(), 0.0f);
  const double dec = median_seconds(reps, [&] { codec.decode_add(std::span<const std::byte>(payload.data(), size), std::span<float>(out)); });
  return {label, bytes / 1e6, bytes / enc / 1e9, bytes / dec / 1e9, memcpy_gbs, bytes / static_cast<double>(size)};
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<double> sizes_mb = {1, 10, 100};
  int reps = 5;
  std::string json = "bench/results/codecs.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    dt::detail::check(i + 1 < argc, "bench_codecs: ", a, " needs a value");
    const std::string v = argv[++i];
    if (a == "--sizes-mb") {
      sizes_mb.clear();
      std::stringstream in(v);
      for (std::string part; std::getline(in, part, ',');) sizes_mb.push_back(std::stod(part));
    } else if (a == "--reps") {
      reps = std::stoi(v);
    } else if (a == "--json") {
      json = v;
    } else {
      dt::detail::fail("bench_codecs: unknown option ", a, " (--sizes-mb, --reps, --json)");
    }
  }
  int threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  std::printf("codec throughput, %d OpenMP thread(s), median of %d; GB/s of f32 values; memcpy single call on the same buffer\n",
              threads, reps);
  std::printf("%-16s %8s %10s %10s %10s %8s %8s\n", "codec", "MB", "encode", "decode", "memcpy", "enc/mcp", "ratio");
  std::vector<row> rows;
  for (double mb : sizes_mb) {
    const auto n = static_cast<std::size_t>(mb * 1e6 / 4);
    std::vector<float> x(n);
    dt::rng g(1, "bench-codecs");
    for (auto& v : x) v = static_cast<float>(g.normal());
    std::vector<float> copy(n);
    const double mc = median_seconds(reps, [&] { std::memcpy(copy.data(), x.data(), n * 4); });
    const double memcpy_gbs = 4.0 * static_cast<double>(n) / mc / 1e9;
    cz::top_k topk;
    topk.fraction = 0.01;
    cz::top_k topk_int2 = topk;
    topk_int2.value_bits = 2;
    cz::int8_blockwise stochastic;
    stochastic.mode = cz::rounding::stochastic;
    for (const auto& r : {measure("fp16", cz::fp16{}, x, reps, memcpy_gbs), measure("bf16", cz::bf16{}, x, reps, memcpy_gbs),
                          measure("int8", cz::int8_blockwise{}, x, reps, memcpy_gbs),
                          measure("int8-stochastic", stochastic, x, reps, memcpy_gbs),
                          measure("int4", cz::int4_blockwise{}, x, reps, memcpy_gbs), measure("fp4", cz::fp4{}, x, reps, memcpy_gbs),
                          measure("sign", cz::sign{}, x, reps, memcpy_gbs), measure("topk-1%", topk, x, reps, memcpy_gbs),
                          measure("topk-1%-int2", topk_int2, x, reps, memcpy_gbs)}) {
      std::printf("%-16s %8.0f %10.2f %10.2f %10.2f %8.2f %8.1f\n", r.codec.c_str(), r.mb, r.encode_gbs, r.decode_gbs,
                  r.memcpy_gbs, r.encode_gbs / r.memcpy_gbs, r.ratio);
      rows.push_back(r);
    }
  }
  bench::output_file out(json);
  out << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? ",\n" : "") << "  {\"codec\": \"" << r.codec << "\", \"mb\": " << r.mb << ", \"threads\": " << threads
        << ", \"encode_gbs\": " << r.encode_gbs << ", \"decode_gbs\": " << r.decode_gbs << ", \"memcpy_gbs\": " << r.memcpy_gbs
        << ", \"ratio\": " << r.ratio << "}";
  }
  out << "\n]\n";
  std::printf("rows written to %s\n", json.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_codecs: %s\n", e.what());
  return 1;
}
