// Pipeline schedules on the simulator (parallel/schedule/simulate.hpp), each action one unit (a
// forward, a backward's input half, its weight half): the bubble each schedule leaves against the
// closed form of its paper, the activations stage 0 holds at most, and ZB-H1's step against
// 1F1B's. Usage: bench_pipeline [--json PATH]
#include <decentrain/parallel/schedule/schedule.hpp>

#include <cstdio>
#include <string>

#include "output_file.hpp"

namespace ps = decentrain::parallel::schedule;

int main(int argc, char** argv) try {
  std::string json = "bench/results/pipeline.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_pipeline [--json PATH]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  bench::output_file out(json);
  out << "[\n";
  bool first = true, all_equal = true;
  std::printf("%-6s %3s %4s %10s %12s %6s %13s %10s\n", "sched", "S", "M", "bubble", "closed form", "equal", "stage-0 stash",
              "vs 1F1B");
  for (int S : {2, 4, 8})
    for (int M : {S, 2 * S, 4 * S, 8 * S}) {
      const auto base = ps::simulate(ps::one_f_one_b(S, M)).makespan;
      struct row {
        const char* name;
        ps::program p;
        int num, den;
      };
      for (const auto& r : {row{"gpipe", ps::gpipe(S, M), S - 1, M + S - 1}, row{"1f1b", ps::one_f_one_b(S, M), S - 1, M + S - 1},
                            row{"zb-h1", ps::zb_h1(S, M), S - 1, 3 * M + S - 1}}) {
        const auto t = ps::simulate(r.p);
        const double closed = static_cast<double>(r.num) / r.den;
        const bool equal = t.idle() * r.den == r.num * t.makespan * static_cast<std::int64_t>(t.busy.size());
        all_equal = all_equal && equal;
        const double speedup = static_cast<double>(base) / static_cast<double>(t.makespan);
        std::printf("%-6s %3d %4d %10.4f %12.4f %6s %13d %9.3fx\n", r.name, S, M, t.bubble(), closed, equal ? "yes" : "NO",
                    t.peak_stash[0], speedup);
        out << (first ? "" : ",\n") << "  {\"schedule\": \"" << r.name << "\", \"stages\": " << S << ", \"micro_batches\": " << M
            << ", \"bubble\": " << t.bubble() << ", \"closed_form\": " << closed << ", \"equal\": " << (equal ? "true" : "false")
            << ", \"stage0_peak_stash\": " << t.peak_stash[0] << ", \"makespan\": " << t.makespan << ", \"speedup_vs_1f1b\": " << speedup
            << "}";
        first = false;
      }
    }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return all_equal ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
  return 2;
}
