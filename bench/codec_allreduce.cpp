// bench/codec_allreduce: does a codec pay for itself? Time of one all-reduce (the mean) of a
// GPT-2-124M-sized pseudo-gradient among 4 peers through each codec, against identity (f32):
//   loopback  4 processes over TCP on 127.0.0.1, wall clock (the slowest peer), one thread each;
//   wan, lan  4 in-process peers on the simulated presets: link time plus the codecs' encode and
//             decode CPU time, which collective::encoded_all_reduce charges to the endpoint (one thread
//             each), so a codec pays for its work as on a real machine.
// A round's time is the slowest peer's; a codec's time is the median of --rounds rounds.
//
//   bench_codec_allreduce [--values 124439808] [--world 4] [--links loopback,wan,lan]
//                         [--codecs identity;bf16;fp16;int8;int4;fp4;sign] [--rounds 3] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "decentrain/collective/any_codec.hpp"
#include "decentrain/collective/encoded_all_reduce.hpp"
#include "decentrain/compress/compress.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/transport/in_process.hpp"
#include "args.hpp"
#include "output_file.hpp"
#include "processes.hpp"

namespace dt = decentrain;
namespace fs = std::filesystem;

namespace {

// Each peer's own pseudo-gradient-like values, ~N(0, 1e-3).
std::vector<float> values_of(int rank, std::size_t n) {
  std::vector<float> v(n);
  dt::rng g(static_cast<std::uint64_t>(rank) + 1, "codec-allreduce");
  for (auto& x : v) x = static_cast<float>(1e-3 * g.normal());
  return v;
}

std::vector<std::string> split(const std::string& list, char sep) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, sep);) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void single_thread() {
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
}

// Simulated seconds of one all-reduce through `spec` on the preset `link` (the slowest peer's clock).
double simulated(const std::string& link, int world, std::size_t n, const std::string& spec) {
  dt::transport::in_process net(dt::transport::links::preset(link, world), {1, std::chrono::minutes(30)});
  std::vector<double> clock(static_cast<std::size_t>(world));
  net.run([&](dt::transport::in_process::endpoint& ep) {
    single_thread();
    dt::transport::any_endpoint any(ep);  // the codec is chosen at run time: any_codec's communicator
    dt::collective::communicator comm(any);
    auto codec = dt::collective::parse_codec(spec);
    auto v = values_of(ep.rank(), n);
    const double t0 = any.stats().clock_seconds;
    dt::collective::encoded_all_reduce(codec, comm, std::span<float>(v), true);
    clock[static_cast<std::size_t>(ep.rank())] = any.stats().clock_seconds - t0;
  });
  return *std::max_element(clock.begin(), clock.end());
}

#if DECENTRAIN_HAS_ASIO
// One loopback process: every codec, `rounds` times; rank 0 writes "codec,seconds" lines.
int tcp_worker(int rank, int world, const std::string& address_file, std::size_t n, const std::vector<std::string>& codecs,
               int rounds, const std::string& out) {
  single_thread();
  dt::transport::any_endpoint peer(std::move(*bench::loopback_peer(rank, world, address_file)));
  dt::collective::communicator comm(peer);
  const auto mine = values_of(rank, n);
  std::vector<float> v;
  std::ofstream file;
  if (rank == 0) file.open(out);
  for (const auto& spec : codecs) {
    auto codec = dt::collective::parse_codec(spec);
    for (int r = 0; r <= rounds; ++r) {  // round 0 warms up (buffers, connections' windows)
      v = mine;
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      dt::collective::encoded_all_reduce(codec, comm, std::span<float>(v), true);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      comm.all_reduce(std::span<double>(&s, 1), dt::collective::reduce_op::max);
      if (rank == 0 && r > 0) file << spec << ',' << s << '\n';
    }
  }
  comm.barrier();  // nobody closes its sockets while another still reads
  dt::detail::check(rank != 0 || static_cast<bool>(file), "cannot write ", out);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_codec_allreduce [--values N] [--world 4] [--links loopback,wan,lan] [--codecs a;b] "
                      "[--rounds 3] [--json PATH]");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const auto n = static_cast<std::size_t>(std::stoull(value("values", "124439808")));  // GPT-2 124M's parameters
  const int world = std::stoi(value("world", "4"));
  const int rounds = std::stoi(value("rounds", "3"));
  const auto codecs = split(value("codecs", "identity;bf16;fp16;int8;int4;fp4;sign"), ';');
  for (const auto& c : codecs) (void)dt::collective::parse_codec(c);  // a bad spec fails now
  dt::detail::check(world >= 2 && rounds >= 1 && n >= static_cast<std::size_t>(world), "--world >= 2, --rounds >= 1, --values >= world");

  const std::string worker = value("worker", "");
  if (!worker.empty()) {
#if DECENTRAIN_HAS_ASIO
    return tcp_worker(std::stoi(value("rank", "0")), world, value("address-file", ""), n, codecs, rounds, value("out", ""));
#else
    dt::detail::fail("built without asio: no tcp worker");
#endif
  }
  const auto links = split(value("links", "loopback,wan,lan"), ',');
  const std::string json_path = value("json", "codec_allreduce.json");
  cli.finish();
  bench::output_file json(json_path);

  std::map<std::string, std::map<std::string, double>> seconds;  // link -> codec -> median
  for (const auto& link : links) {
    std::map<std::string, std::vector<double>> times;
    if (link == "loopback") {
      char dir_template[] = "/tmp/decentrain-codec-allreduce-XXXXXX";
      dt::detail::check(::mkdtemp(dir_template) != nullptr, "cannot make a temporary directory");
      const std::string dir = dir_template, file = dir + "/times.csv", self = fs::canonical("/proc/self/exe").string();
      std::string list;
      for (const auto& c : codecs) list += (list.empty() ? "" : ";") + c;
      std::vector<std::vector<std::string>> cmds;
      for (int r = 0; r < world; ++r)
        cmds.push_back({self, "--worker", "tcp", "--rank", std::to_string(r), "--world", std::to_string(world), "--values",
                        std::to_string(n), "--codecs", list, "--rounds", std::to_string(rounds), "--address-file",
                        dir + "/address", "--out", file});
      std::fprintf(stderr, "loopback: %d processes ...\n", world);
      bench::run_all(cmds, std::chrono::seconds(1800), "loopback");
      std::ifstream in(file);
      for (std::string line; std::getline(in, line);) {
        const auto comma = line.rfind(',');
        times[line.substr(0, comma)].push_back(std::stod(line.substr(comma + 1)));
      }
      fs::remove_all(dir);
    } else {
      for (const auto& spec : codecs)
        for (int r = 0; r < rounds; ++r) {
          std::fprintf(stderr, "%s: %s, round %d ...\n", link.c_str(), spec.c_str(), r + 1);
          times[spec].push_back(simulated(link, world, n, spec));
        }
    }
    for (const auto& spec : codecs) {
      dt::detail::check(times[spec].size() == static_cast<std::size_t>(rounds), link, ": ", spec, " has ", times[spec].size(),
                        " times of ", rounds);
      seconds[link][spec] = median(times[spec]);
    }
  }

  std::printf("all-reduce (mean) of %zu f32 values (%.0f MB) among %d peers: seconds per round (median of %d), "
              "and identity's time over the codec's\n", n, 4.0 * static_cast<double>(n) / 1e6, world, rounds);
  std::printf("%-12s", "codec");
  for (const auto& link : links) std::printf(" %12s %9s", (link + " s").c_str(), "speedup");
  std::printf("\n");
  json << "[\n";
  bool first = true;
  for (const auto& spec : codecs) {
    std::printf("%-12s", spec.c_str());
    for (const auto& link : links) {
      const double s = seconds[link][spec], speedup = seconds[link]["identity"] > 0 ? seconds[link]["identity"] / s : 0;
      std::printf(" %12.3f %8.2fx", s, speedup);
      json << (first ? "" : ",\n") << "  {\"codec\": \"" << spec << "\", \"link\": \"" << link << "\", \"values\": " << n
           << ", \"world\": " << world << ", \"seconds\": " << s << ", \"speedup_vs_identity\": " << speedup << "}";
      first = false;
    }
    std::printf("\n");
  }
  json << "\n]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_codec_allreduce: %s\n", e.what());
  return 1;
}
