// bench/allreduce: bandwidth of the library's ring all-reduce over TCP on loopback, side by side
// in one run with OpenMPI's MPI_Allreduce and torch.distributed's gloo backend.
//
//   bench_allreduce [--world 4] [--min-bytes 1024] [--max-bytes 268435456] [--chunk-bytes B]
//                   [--only decentrain,decentrain-keyed,decentrain-tls,decentrain-relayed,mpi-tcp,mpi-shm,gloo]
//                   [--rounds 1] [--json PATH]
//
// decentrain-keyed is the same all-reduce with a run key (transport/auth.hpp): every frame
// tagged by its sender and checked by its receiver, the cost of authenticated peers.
// decentrain-tls is the same with TLS (transport/tls.hpp; certificates from scripts/tls_certs):
// every frame encrypted as well, the cost of confidentiality.
// decentrain-relayed is the plain all-reduce with the upper half of the ranks accepting no
// connections (tcp/relay.hpp): in the ring, the hop between two of them goes through a relay
// (the lowest rank that listens), the cost of a peer behind a NAT.
//
// With --rounds R every implementation runs R times, interleaved (all of them, then all of them
// again), and a size's time is the median of its R times: this machine has slow spells of a
// minute or more that would otherwise land on whichever implementation ran then.
// Each implementation runs as `world` processes on this machine, sums float32 buffers of each
// size in place (a first call is checked against the exact sum), then times a fixed number of
// calls between barriers; a size's time is the slowest rank's mean. Bandwidths follow
// nccl-tests: algbw = bytes / time, busbw = algbw * 2 (N - 1) / N.
// MPI runs twice: restricted to its TCP transport (the like-for-like comparison: the same
// loopback sockets) and with its shared-memory transport (what mpirun picks on one machine).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/transport/mpi.hpp"
#include "decentrain/transport/tcp.hpp"
#include "output_file.hpp"
#include "processes.hpp"

namespace dt = decentrain;
namespace fs = std::filesystem;

namespace {

struct row {
  std::size_t bytes = 0;
  std::int64_t iters = 0;
  double seconds = 0;
};

// Enough calls to move about 512 MiB per size, within [5, 500]. allreduce_gloo.py does the same.
std::int64_t iterations(std::size_t bytes) {
  return std::clamp<std::int64_t>(static_cast<std::int64_t>((std::size_t{512} << 20) / bytes), 5, 500);
}

// The timing loop every C++ worker shares; `all_reduce` sums a float buffer in place across the
// world, `slowest` returns the maximum of a double across the world.
template <class AllReduce, class Slowest>
std::vector<row> measure(const std::vector<std::size_t>& sizes, int rank, int world, AllReduce&& all_reduce, Slowest&& slowest) {
  std::vector<row> rows;
  for (const auto bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> check(n, static_cast<float>(rank + 1));
    all_reduce(check);
    const float expected = static_cast<float>(world * (world + 1) / 2);
    dt::detail::check(std::all_of(check.begin(), check.end(), [&](float v) { return v == expected; }),
                      "all-reduce of ", bytes, " bytes gave a wrong sum on rank ", rank);
    std::vector<float> buf(n, 0.0f);  // zeros stay zeros: no overflow, no denormals
    const auto iters = iterations(bytes);
    for (std::int64_t i = 0; i < std::max<std::int64_t>(1, iters / 10); ++i) all_reduce(buf);
    (void)slowest(0.0);  // a barrier
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) all_reduce(buf);
    const double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(iters);
    rows.push_back({bytes, iters, slowest(mean)});
  }
  return rows;
}

void write_rows(const std::string& path, const std::vector<row>& rows) {
  std::ofstream out(path);
  for (const auto& r : rows) out << r.bytes << ',' << r.iters << ',' << r.seconds << '\n';
  dt::detail::check(static_cast<bool>(out), "cannot write ", path);
}

std::vector<row> read_rows(const std::string& path) {
  std::ifstream in(path);
  dt::detail::check(static_cast<bool>(in), "no results in ", path);
  std::vector<row> rows;
  std::string line;
  while (std::getline(in, line)) {
    row r;
    char comma = 0;
    std::istringstream fields(line);
    fields >> r.bytes >> comma >> r.iters >> comma >> r.seconds;
    dt::detail::check(!fields.fail(), "bad result line '", line, "' in ", path);
    rows.push_back(r);
  }
  return rows;
}

std::vector<std::size_t> parse_sizes(const std::string& list) {
  std::vector<std::size_t> sizes;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) sizes.push_back(std::stoull(item));
  return sizes;
}

// ---- workers ----

#if DECENTRAIN_HAS_ASIO
int tcp_worker(int rank, int world, const std::string& address_file, const std::vector<std::size_t>& sizes,
               std::size_t chunk_bytes, const std::string& out, const std::string& protection, const std::string& cert_dir) {
  auto peer = bench::loopback_peer(rank, world, address_file, [&](dt::transport::tcp_options& o) {
    if (protection == "keyed") o.key = "a benchmark's run key, 32 bytes.";
    if (protection == "relayed" && rank >= world / 2 && rank > 0) {
      o.listen.clear();
      o.punch_within = std::chrono::milliseconds(0);  // (relays, not a punched hole)
    }
    if (protection == "tls") {
      const auto stem = cert_dir + "/rank-" + std::to_string(rank);
      o.tls = {stem + ".pem", stem + ".key", cert_dir + "/ca.pem", true};
    }
  });
  dt::collective::options copts;
  if (chunk_bytes) copts.chunk_bytes = chunk_bytes;
  dt::collective::communicator comm(*peer, copts);
  const auto rows = measure(
      sizes, rank, world, [&](std::vector<float>& b) { comm.all_reduce(std::span<float>(b)); },
      [&](double v) {
        comm.all_reduce(std::span<double>(&v, 1), dt::collective::reduce_op::max);
        return v;
      });
  if (rank == 0) write_rows(out, rows);
  comm.barrier();  // nobody closes its sockets while another still reads
  return 0;
}
#endif

#if DECENTRAIN_HAS_MPI
int mpi_worker(int argc, char** argv, const std::vector<std::size_t>& sizes, const std::string& out) {
  dt::transport::mpi_environment env(&argc, &argv, MPI_THREAD_FUNNELED);  // as measured in RESULTS: no background lanes needed
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto rows = measure(
      sizes, rank, world,
      [&](std::vector<float>& b) {
        MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(b.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      },
      [&](double v) {
        MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return v;
      });
  if (rank == 0) write_rows(out, rows);
  MPI_Barrier(MPI_COMM_WORLD);
  return 0;
}
#endif

// ---- the driver ----

std::string join_sizes(const std::vector<std::size_t>& sizes) {
  std::string s;
  for (auto b : sizes) s += (s.empty() ? "" : ",") + std::to_string(b);
  return s;
}

std::string human(std::size_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  return buf;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> args(argv + 1, argv + argc);
  const char* usage =
      "usage: bench_allreduce [--world 4] [--min-bytes 1024] [--max-bytes 268435456] [--chunk-bytes B]\n"
      "                       [--only decentrain,decentrain-keyed,decentrain-tls,decentrain-relayed,mpi-tcp,mpi-shm,gloo]\n"
      "                       [--rounds 1] [--json PATH]";
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    std::printf("%s\n", usage);
    return 0;
  }
  // Flags come in pairs; one nobody knows is an error before minutes of measuring (MPI's own
  // arguments only reach the workers, which mpirun starts with flags of their own).
  const std::vector<std::string> known = {"--world", "--out", "--chunk-bytes", "--worker", "--sizes", "--rank",
                                          "--address-file", "--min-bytes", "--max-bytes", "--only", "--rounds", "--json"};
  const bool worker_run = std::find(args.begin(), args.end(), "--worker") != args.end();
  for (std::size_t i = 0; i < args.size() && !worker_run; i += 2) {
    dt::detail::check(std::find(known.begin(), known.end(), args[i]) != known.end(), "unknown option '", args[i], "'\n", usage);
    dt::detail::check(i + 1 < args.size(), args[i], " needs a value\n", usage);
  }
  auto value = [&](const std::string& flag, const std::string& fallback) {
    auto it = std::find(args.begin(), args.end(), flag);
    if (it == args.end()) return fallback;
    dt::detail::check(it + 1 != args.end(), flag, " needs a value");
    return *(it + 1);
  };
  const std::string self = fs::canonical("/proc/self/exe").string();
  const int world = std::stoi(value("--world", "4"));
  const std::string out = value("--out", "");
  const auto chunk_bytes = static_cast<std::size_t>(std::stoull(value("--chunk-bytes", "0")));

  const std::string worker = value("--worker", "");
  if (!worker.empty()) {
    const auto sizes = parse_sizes(value("--sizes", ""));
#if DECENTRAIN_HAS_ASIO
    if (worker == "tcp" || worker == "tcp-keyed" || worker == "tcp-tls" || worker == "tcp-relayed")
      return tcp_worker(std::stoi(value("--rank", "0")), world, value("--address-file", ""), sizes, chunk_bytes, out,
                        worker.substr(3 + (worker.size() > 3)), value("--cert-dir", ""));
#endif
#if DECENTRAIN_HAS_MPI
    if (worker == "mpi") return mpi_worker(argc, argv, sizes, out);
#endif
    dt::detail::fail("this build has no '", worker, "' worker");
  }

  std::vector<std::size_t> sizes;
  const auto lo = std::stoull(value("--min-bytes", "1024")), hi = std::stoull(value("--max-bytes", "268435456"));
  dt::detail::check(lo >= sizeof(float) * static_cast<std::size_t>(world) && lo <= hi, "--min-bytes must be at least 4 x world and <= --max-bytes");
  for (auto b = lo; b <= hi; b *= 4) sizes.push_back(b);
  std::vector<std::string> impls;
  {
    std::stringstream in(value("--only", "decentrain,decentrain-keyed,decentrain-tls,decentrain-relayed,mpi-tcp,mpi-shm,gloo"));
    for (std::string item; std::getline(in, item, ',');) impls.push_back(item);
    for (const auto& impl : impls)
      dt::detail::check(impl == "decentrain" || impl == "decentrain-keyed" || impl == "decentrain-tls" || impl == "decentrain-relayed" ||
                            impl == "mpi-tcp" || impl == "mpi-shm" || impl == "gloo",
                        "unknown implementation '", impl,
                        "' in --only (decentrain, decentrain-keyed, decentrain-tls, decentrain-relayed, mpi-tcp, mpi-shm, gloo)");
  }
  const int rounds = std::stoi(value("--rounds", "1"));
  dt::detail::check(rounds >= 1, "--rounds must be at least 1");
  const std::string json_path = value("--json", "allreduce.json");
  bench::output_file json(json_path);  // opened first: a bad path fails before the minutes of measuring

  char dir_template[] = "/tmp/decentrain-allreduce-XXXXXX";
  dt::detail::check(::mkdtemp(dir_template) != nullptr, "cannot make a temporary directory");
  const std::string dir = dir_template;
  const std::string size_list = join_sizes(sizes), w = std::to_string(world);
  const std::vector<std::string> mpirun = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", w};

  std::map<std::string, std::vector<std::vector<row>>> by_round;  // implementation -> round -> sizes
  std::map<std::string, std::string> skipped;
  for (int round = 0; round < rounds; ++round)
  for (const auto& impl : impls) {
    if (skipped.count(impl)) continue;
    const std::string file = dir + "/" + impl + ".csv";
    std::fprintf(stderr, "round %d of %d: running %s ...\n", round + 1, rounds, impl.c_str());
    fs::remove(file);
    fs::remove(dir + "/address");  // the workers of a new run must not join the last run's rank 0
    try {
      if (impl.starts_with("decentrain")) {
        if (impl == "decentrain-tls" && !fs::exists(dir + "/certs/rank-" + std::to_string(world - 1) + ".pem"))
          bench::run_all({{"/bin/bash", DECENTRAIN_SOURCE_DIR "/scripts/tls_certs", dir + "/certs", w, "--days", "2"}},
                         std::chrono::seconds(60), "scripts/tls_certs");
        std::vector<std::vector<std::string>> cmds;
        for (int r = 0; r < world; ++r)
          cmds.push_back({self, "--worker", "tcp" + impl.substr(10), "--rank", std::to_string(r), "--world", w, "--sizes", size_list,
                          "--address-file", dir + "/address", "--chunk-bytes", std::to_string(chunk_bytes), "--out", file,
                          "--cert-dir", dir + "/certs"});
        bench::run_all(cmds, std::chrono::seconds(900), impl);
      } else if (impl == "mpi-tcp" || impl == "mpi-shm") {
        if (!DECENTRAIN_HAS_MPI) throw dt::error("built without MPI");
        auto cmd = mpirun;
        for (const char* a : {"--mca", "btl", impl == "mpi-tcp" ? "self,tcp" : "self,vader"}) cmd.emplace_back(a);
        if (impl == "mpi-tcp")
          for (const char* a : {"--mca", "btl_tcp_if_include", "lo"}) cmd.emplace_back(a);
        for (const auto& a : {self, std::string("--worker"), std::string("mpi"), std::string("--sizes"), size_list, std::string("--out"), file})
          cmd.push_back(a);
        bench::run_all({cmd}, std::chrono::seconds(900), impl);
      } else if (impl == "gloo") {
        bench::run_all({{"/usr/bin/python3", DECENTRAIN_SOURCE_DIR "/bench/allreduce_gloo.py", "--world", w, "--sizes", size_list, "--out", file}},
                std::chrono::seconds(900), impl);
      }
      by_round[impl].push_back(read_rows(file));
      dt::detail::check(by_round[impl].back().size() == sizes.size(), impl, " reported ", by_round[impl].back().size(), " sizes of ",
                        sizes.size());
    } catch (const std::exception& e) {
      skipped[impl] = e.what();
      by_round.erase(impl);
      std::fprintf(stderr, "%s: not measured: %s\n", impl.c_str(), e.what());
    }
  }
  fs::remove_all(dir);
  std::map<std::string, std::vector<row>> results;  // the median round of each size
  for (const auto& [impl, runs] : by_round)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<row> of_size;
      for (const auto& run : runs) of_size.push_back(run[i]);
      std::sort(of_size.begin(), of_size.end(), [](const row& a, const row& b) { return a.seconds < b.seconds; });
      row median = of_size[of_size.size() / 2];
      if (of_size.size() % 2 == 0) median.seconds = (median.seconds + of_size[of_size.size() / 2 - 1].seconds) / 2;
      results[impl].push_back(median);
    }

  const double bus = 2.0 * (world - 1) / world;
  auto busbw = [&](const std::string& impl, std::size_t i) {
    auto it = results.find(impl);
    return it == results.end() || i >= it->second.size() ? 0.0 : static_cast<double>(it->second[i].bytes) / it->second[i].seconds * bus / 1e9;
  };
  std::printf("all-reduce (sum, float32, in place), %d processes on this machine; bus bandwidth GB/s "
              "(nccl-tests: algbw x 2(N-1)/N)%s\n", world, rounds > 1 ? (", median of " + std::to_string(rounds) + " rounds").c_str() : "");
  std::printf("%9s %12s %11s %11s %11s %11s %11s %11s %11s %9s %9s %9s %9s %9s\n", "size", "ours us", "ours", "ours+key", "ours+TLS",
              "ours relay", "MPI tcp", "MPI shm", "gloo", "key/ours", "TLS/ours", "rel/ours", "ours/MPI", "ours/gloo");
  auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
  // What was not measured prints as "-", never as a zero bandwidth or ratio.
  auto cell = [](double v, int width, const char* suffix, int digits = 3) {
    char buf[32];
    if (v > 0) std::snprintf(buf, sizeof buf, "%*.*f%s", width - static_cast<int>(std::strlen(suffix)), digits, v, suffix);
    else std::snprintf(buf, sizeof buf, "%*s", width, "-");
    return std::string(buf);
  };
  auto num = [](double v) {  // null: not measured
    std::ostringstream text;
    if (v > 0) text << v; else text << "null";
    return text.str();
  };
  json << "[\n";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double ours = busbw("decentrain", i), keyed = busbw("decentrain-keyed", i), tls = busbw("decentrain-tls", i),
                 relayed = busbw("decentrain-relayed", i), mt = busbw("mpi-tcp", i), ms = busbw("mpi-shm", i), gl = busbw("gloo", i);
    const double us = results.count("decentrain") ? results["decentrain"][i].seconds * 1e6 : 0.0;
    std::printf("%9s %12s %11s %11s %11s %11s %11s %11s %11s %9s %9s %9s %9s %9s\n", human(sizes[i]).c_str(),
                cell(us, 12, "", 1).c_str(), cell(ours, 11, "").c_str(), cell(keyed, 11, "").c_str(), cell(tls, 11, "").c_str(),
                cell(relayed, 11, "").c_str(), cell(mt, 11, "").c_str(), cell(ms, 11, "").c_str(), cell(gl, 11, "").c_str(),
                cell(ratio(keyed, ours), 9, "x").c_str(), cell(ratio(tls, ours), 9, "x").c_str(), cell(ratio(relayed, ours), 9, "x").c_str(),
                cell(ratio(ours, mt), 9, "x").c_str(), cell(ratio(ours, gl), 9, "x").c_str());
    json << (i ? ",\n" : "") << "  {\"bytes\": " << sizes[i] << ", \"world\": " << world << ", \"rounds\": " << rounds
         << ", \"ours_us\": " << num(us) << ", \"ours_busbw_gbs\": " << num(ours) << ", \"ours_keyed_busbw_gbs\": " << num(keyed)
         << ", \"keyed_over_ours\": " << num(ratio(keyed, ours)) << ", \"ours_tls_busbw_gbs\": " << num(tls)
         << ", \"tls_over_ours\": " << num(ratio(tls, ours)) << ", \"ours_relayed_busbw_gbs\": " << num(relayed)
         << ", \"relayed_over_ours\": " << num(ratio(relayed, ours)) << ", \"mpi_tcp_busbw_gbs\": " << num(mt)
         << ", \"mpi_shm_busbw_gbs\": " << num(ms) << ", \"gloo_busbw_gbs\": " << num(gl) << ", \"ours_over_mpi_tcp\": "
         << num(ratio(ours, mt)) << ", \"ours_over_gloo\": " << num(ratio(ours, gl)) << "}";
  }
  json << "\n]\n";
  json.close();
  if (rounds > 1) {  // the spread behind each median
    std::printf("\nbusbw GB/s of each round:\n");
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%9s", human(sizes[i]).c_str());
      for (const auto& [impl, runs] : by_round) {
        std::printf("  %s", impl.c_str());
        for (const auto& run : runs) std::printf(" %.3f", static_cast<double>(run[i].bytes) / run[i].seconds * bus / 1e9);
      }
      std::printf("\n");
    }
  }
  for (const auto& [impl, why] : skipped) std::printf("%s: not measured (%s)\n", impl.c_str(), why.c_str());
  std::printf("rows written to %s\n", json_path.c_str());
  return skipped.empty() ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
  return 1;
}
