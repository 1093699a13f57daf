// All-reduce time on simulated links (transport::in_process), where time is what the bytes
// would take on the links rather than what this machine takes: the message sizes chosen for the
// links (collective::options raised to 8x the slowest link's bandwidth x latency) against fixed
// sizes (one 1 MiB chunk per ring step, recursive doubling below 512 KiB), and the wire time
// alone as the floor. With --balanced, the partitioned all-reduce on `heterogeneous` links
// instead: equal shares against shares balanced by each peer's connection (DeDLOC), and the ring.
// With --sites, two sites of k peers (a LAN inside each, `wan` between): the flat ring with the
// sites in rank order and dealt at random, against the two-level all-reduce, the bytes that
// cross between the sites counted on every link.
// With --ring-order, links that differ per pair (regions, sites dealt at random,
// heterogeneous): the ring in rank order against the ring laid along the measured links
// (collective/ring_order.hpp), and what measuring costs.
// With --algorithms, the ring, recursive doubling and recursive halving then doubling, each named,
// on 4, 6 and 8 peers of `lan`, `wan` and `heterogeneous` links.
// Usage: bench_allreduce_simulated [--world 4] [--balanced | --sites | --ring-order | --algorithms] [--json PATH]
#include <decentrain/collective/balanced_all_reduce.hpp>
#include <decentrain/collective/communicator.hpp>
#include <decentrain/collective/ring_order.hpp>
#include <decentrain/collective/two_level_all_reduce.hpp>
#include <decentrain/core/rng.hpp>
#include <decentrain/transport/in_process.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "output_file.hpp"

namespace dt = decentrain;

namespace {

// Simulated seconds of one sum of `bytes` of f32 on these links (the slowest peer's clock), by
// reduce(communicator, values) on every peer, or -1 when it is wrong (every peer checks the exact
// sum); after(network) reads the network once the peers are done.
template <class Reduce>
double simulate_with(const dt::transport::link_matrix& links, std::size_t bytes, dt::collective::options opts, Reduce&& reduce,
                     const std::function<void(const dt::transport::in_process&)>& after = {}) {
  const int world = links.world();
  dt::transport::in_process net(links, {1, std::chrono::milliseconds(600000)});
  std::vector<double> clock(static_cast<std::size_t>(world));
  std::vector<int> right(static_cast<std::size_t>(world));
  net.run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator comm(ep, opts);
    std::vector<float> v(bytes / sizeof(float), static_cast<float>(ep.rank() + 1));
    reduce(comm, std::span<float>(v));
    const float expect = static_cast<float>(world * (world + 1) / 2);
    right[static_cast<std::size_t>(ep.rank())] = std::all_of(v.begin(), v.end(), [&](float x) { return x == expect; });
    clock[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
  });
  if (after) after(net);
  if (!std::all_of(right.begin(), right.end(), [](int ok) { return ok != 0; })) return -1;
  return *std::max_element(clock.begin(), clock.end());
}

// The ring or recursive doubling as `opts` choose, or with `shares` the partitioned all-reduce
// by them.
double simulate(const dt::transport::link_matrix& links, std::size_t bytes, dt::collective::options opts,
                const std::vector<double>& shares = {}) {
  return simulate_with(links, bytes, opts, [&](auto& comm, std::span<float> v) {
    if (shares.empty()) comm.all_reduce(v);
    else dt::collective::balanced_all_reduce(comm, v, std::span<const double>(shares));
  });
}

// The partitioned all-reduce on `heterogeneous` links of 4, 8 and 16 peers (five draws each):
// shares balanced by what each peer states of its connection (the slower of its two
// directions, as a speed test would give it), against equal shares and the ring.
int balanced_table(const std::string& json) {
  bench::output_file out(json);
  out << "[\n";
  bool first = true;
  const std::size_t bytes = 16'000'000;
  std::printf("all-reduce (sum, float32) of 16 MB on heterogeneous links: simulated seconds (the slowest peer)\n");
  std::printf("%6s %5s %9s %10s %10s %10s %14s %13s %14s\n", "world", "seed", "ring", "equal", "balanced", "bal/equal",
              "bal/ring", "model ratio", "slowest Mbit/s");
  for (int world : {4, 8, 16}) {
    double sum_ratio = 0, sum_ring = 0;
    const int seeds = 5;
    for (int seed = 0; seed < seeds; ++seed) {
      const auto links = dt::transport::links::heterogeneous(world, static_cast<std::uint64_t>(seed));
      std::vector<dt::collective::peer_capacity> peers;
      double slowest = INFINITY;
      for (int r = 0; r < world; ++r) {
        const auto a = links.access(r);
        peers.push_back({std::min(a.uplink_bytes_per_s, a.downlink_bytes_per_s), true});
        slowest = std::min(slowest, peers.back().bytes_per_s);
      }
      const auto balanced = dt::collective::balanced_shares(peers), equal = dt::collective::equal_shares(world);
      const double ring = simulate(links, bytes, {}), e = simulate(links, bytes, {}, equal), b = simulate(links, bytes, {}, balanced);
      if (ring < 0 || e < 0 || b < 0) {
        std::fprintf(stderr, "bench_allreduce_simulated: wrong sum (world %d, seed %d)\n", world, seed);
        return 1;
      }
      const double model = dt::collective::partitioned_seconds(balanced, peers, bytes) / dt::collective::partitioned_seconds(equal, peers, bytes);
      std::printf("%6d %5d %9.2f %10.2f %10.2f %9.2fx %13.2fx %12.2fx %14.1f\n", world, seed, ring, e, b, b / e, b / ring, model,
                  slowest * 8 / 1e6);
      out << (first ? "" : ",\n") << "  {\"world\": " << world << ", \"seed\": " << seed << ", \"bytes\": " << bytes
          << ", \"ring_s\": " << ring << ", \"equal_s\": " << e << ", \"balanced_s\": " << b << ", \"model_ratio\": " << model
          << ", \"slowest_bytes_per_s\": " << slowest << "}";
      first = false;
      sum_ratio += b / e;
      sum_ring += b / ring;
    }
    std::printf("%6d %5s %9s %10s %10s %9.2fx %13.2fx   (mean of %d draws)\n", world, "mean", "", "", "", sum_ratio / seeds,
                sum_ring / seeds, seeds);
  }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return 0;
}

// One all-reduce of `bytes` of f32 by peers at sites (site_of[r]) on these links, flat (the
// ring, as automatic picks it for this size) or two-level: the slowest peer's simulated seconds
// (-1 when a sum is wrong), the payload bytes sent between sites in all, and the busiest link
// between sites.
struct site_run {
  double seconds = -1, across_bytes = 0, busiest_bytes = 0;
};
site_run simulate_sites(const std::vector<int>& site_of, std::size_t bytes, bool two_level) {
  const int world = static_cast<int>(site_of.size());
  const auto links = dt::transport::links::by_site(dt::transport::links::wan(world), dt::transport::links::lan(world), site_of);
  std::vector<std::string> names;
  for (int s : site_of) names.push_back("site-" + std::to_string(s));
  const auto map = dt::collective::site_map::from_names(names);
  site_run out;
  out.seconds = simulate_with(
      links, bytes, {},
      [&](auto& comm, std::span<float> v) {
        if (two_level) dt::collective::two_level(comm, map).all_reduce(v);
        else comm.all_reduce(v);
      },
      [&](const dt::transport::in_process& net) {
        for (int s = 0; s < world; ++s)
          for (int d = 0; d < world; ++d)
            if (site_of[static_cast<std::size_t>(s)] != site_of[static_cast<std::size_t>(d)]) {
              const auto b = static_cast<double>(net.bytes_sent(s, d));
              out.across_bytes += b;
              out.busiest_bytes = std::max(out.busiest_bytes, b);
            }
      });
  return out;
}

// Two sites of 2, 4 and 8 peers: the flat ring with the sites in rank order (the ring leaves each
// site once) and dealt to the ranks at random (three draws), against the two-level all-reduce.
int sites_table(const std::string& json) {
  bench::output_file out(json);
  out << "[\n";
  bool first = true;
  const std::size_t bytes = 16'000'000;
  std::printf("all-reduce (sum, float32) of 16 MB by two sites: lan inside, wan between (100 ms, 100 Mbit/s a pair)\n");
  std::printf("%9s %-30s %11s %12s %16s %17s\n", "per site", "collective", "simulated s", "MB across", "busiest link MB",
              "across / 2-level");
  for (int k : {2, 4, 8}) {
    std::vector<int> ordered;
    for (int r = 0; r < 2 * k; ++r) ordered.push_back(r < k ? 0 : 1);
    std::vector<std::pair<std::string, std::vector<int>>> layouts = {{"in rank order", ordered}};
    for (int draw = 0; draw < 3; ++draw) {
      auto dealt = ordered;
      dt::rng gen(static_cast<std::uint64_t>(draw) + 1, "sites");
      for (std::size_t i = dealt.size() - 1; i > 0; --i) std::swap(dealt[i], dealt[gen.next_u64() % (i + 1)]);
      layouts.push_back({"dealt at random " + std::to_string(draw + 1), dealt});
    }
    const auto two = simulate_sites(ordered, bytes, true);
    for (const auto& [layout, site_of] : layouts)
      for (const bool two_level : {false, true}) {
        if (two_level && layout != "in rank order") continue;
        const auto r = two_level ? two : simulate_sites(site_of, bytes, false);
        if (r.seconds < 0) {
          std::fprintf(stderr, "bench_allreduce_simulated: wrong sum (%d a site, %s)\n", k, layout.c_str());
          return 1;
        }
        const std::string name = two_level ? "two-level" : "flat ring, " + layout;
        std::printf("%9d %-30s %11.3f %12.2f %16.2f %16.2fx\n", k, name.c_str(), r.seconds, r.across_bytes / 1e6,
                    r.busiest_bytes / 1e6, r.across_bytes / two.across_bytes);
        out << (first ? "" : ",\n") << "  {\"per_site\": " << k << ", \"collective\": \"" << name << "\", \"bytes\": " << bytes
            << ", \"seconds\": " << r.seconds << ", \"across_bytes\": " << r.across_bytes
            << ", \"busiest_across_bytes\": " << r.busiest_bytes << "}";
        first = false;
      }
  }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return 0;
}

// One ring all-reduce of `bytes` on these links, its ring in rank order or measured first
// (collective::order_ring; probe_bytes 0: the round trips alone): the seconds the measuring took
// and the all-reduce's (the slowest peer's clock after both), -1 when a sum is wrong.
struct ordered_run {
  double measure_s = 0, seconds = -1, across_bytes = 0;
  std::vector<int> order;
};
ordered_run simulate_ordered(const dt::transport::link_matrix& links, std::size_t bytes, bool measured, std::size_t probe_bytes,
                             const std::vector<int>& site_of = {}) {
  const int world = links.world();
  std::vector<double> measured_at(static_cast<std::size_t>(world)), started(static_cast<std::size_t>(world));
  ordered_run out;
  const double end = simulate_with(
      links, bytes, {},
      [&](auto& comm, std::span<float> v) {
        const auto r = static_cast<std::size_t>(comm.rank());
        if (measured) {
          const auto pick = dt::collective::order_ring(comm, static_cast<double>(bytes) / world, probe_bytes);
          if (r == 0) out.order = pick.order;
        }
        measured_at[r] = comm.endpoint().stats().clock_seconds;
        comm.barrier();
        started[r] = comm.endpoint().stats().clock_seconds;
        comm.all_reduce(v, dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
      },
      [&](const dt::transport::in_process& net) {
        for (int s = 0; s < world && !site_of.empty(); ++s)
          for (int d = 0; d < world; ++d)
            if (site_of[static_cast<std::size_t>(s)] != site_of[static_cast<std::size_t>(d)])
              out.across_bytes += static_cast<double>(net.bytes_sent(s, d));
      });
  if (end < 0) return out;
  out.measure_s = *std::max_element(measured_at.begin(), measured_at.end());
  out.seconds = end - *std::min_element(started.begin(), started.end());
  return out;
}

// Peers whose links differ per pair: three regions dealt to the ranks in turn (5 ms inside,
// 40, 75 and 110 ms between, 100 Mbit/s), two sites of 8 dealt at random (lan inside, wan
// between), and heterogeneous links (each peer its own latency and bandwidth): a ring
// all-reduce in rank order against the ring laid along the measured links.
int ring_order_table(const std::string& json) {
  bench::output_file out(json);
  out << "[\n";
  bool first = true;
  std::printf("ring all-reduce (sum, float32): rank order against the order measured (simulated seconds, the slowest peer)\n");
  std::printf("%-26s %7s %9s %-22s %10s %12s %10s %11s\n", "links", "peers", "size", "order", "measure s", "all-reduce s",
              "vs rank", "MB across");
  struct scenario {
    std::string name;
    dt::transport::link_matrix links;
    std::vector<int> site_of;
  };
  std::vector<scenario> scenarios;
  for (const int n : {8, 16}) {
    const double between[3][3] = {{0.005, 0.04, 0.075}, {0.04, 0.005, 0.11}, {0.075, 0.11, 0.005}};
    dt::transport::link_matrix m(n, dt::transport::simulated_link{}, dt::transport::access_link{12.5e6, 12.5e6});
    std::vector<int> site_of;
    for (int a = 0; a < n; ++a) {
      site_of.push_back(a % 3);
      for (int b = 0; b < n; ++b) m.at(a, b) = dt::transport::simulated_link{between[a % 3][b % 3], 12.5e6, 0.002, 0.0, 0.3};
    }
    scenarios.push_back({"three regions, in turn", m, site_of});
  }
  {
    std::vector<int> dealt;
    for (int r = 0; r < 16; ++r) dealt.push_back(r < 8 ? 0 : 1);
    dt::rng gen(1, "sites");
    for (std::size_t i = dealt.size() - 1; i > 0; --i) std::swap(dealt[i], dealt[gen.next_u64() % (i + 1)]);
    scenarios.push_back({"two sites, dealt at random", dt::transport::links::by_site(dt::transport::links::wan(16), dt::transport::links::lan(16), dealt), dealt});
  }
  for (const std::uint64_t seed : {0, 1, 2})
    scenarios.push_back({"heterogeneous, seed " + std::to_string(seed), dt::transport::links::heterogeneous(8, seed), {}});
  for (const auto& sc : scenarios)
    for (const std::size_t bytes : {std::size_t{65536}, std::size_t{16'000'000}}) {
      const auto rank = simulate_ordered(sc.links, bytes, false, 0, sc.site_of);
      const auto latency = simulate_ordered(sc.links, bytes, true, 0, sc.site_of);
      const auto bandwidth = simulate_ordered(sc.links, bytes, true, 64 << 10, sc.site_of);
      for (const auto* r : {&rank, &latency, &bandwidth}) {
        if (r->seconds < 0) {
          std::fprintf(stderr, "bench_allreduce_simulated: wrong sum (%s)\n", sc.name.c_str());
          return 1;
        }
        const std::string kind = r == &rank ? "rank" : r == &latency ? "round trips" : "round trips + 64 KB";
        std::printf("%-26s %7d %8.0fK %-22s %10.3f %12.3f %9.2fx %11.2f\n", sc.name.c_str(), sc.links.world(), bytes / 1024.0,
                    kind.c_str(), r->measure_s, r->seconds, r->seconds / rank.seconds, r->across_bytes / 1e6);
        out << (first ? "" : ",\n") << "  {\"links\": \"" << sc.name << "\", \"world\": " << sc.links.world() << ", \"bytes\": " << bytes
            << ", \"order\": \"" << kind << "\", \"measure_s\": " << r->measure_s << ", \"seconds\": " << r->seconds
            << ", \"across_bytes\": " << r->across_bytes << ", \"ring\": \"" << dt::collective::describe_order(r->order) << "\"}";
        first = false;
      }
    }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return 0;
}

// The three algorithms side by side on 4 and 8 peers (and 6, where halving folds two peers in):
// the ring, recursive doubling and recursive halving then doubling, each named (`automatic`
// picks recursive doubling under 512 KiB raised to the links, the ring from there), the message
// sizes raised to the links as automatic's are. Each the mean of 5 calls after a first one.
int algorithms_table(const std::string& json) {
  bench::output_file out(json);
  out << "[\n";
  bool first = true;
  using dt::collective::algorithm;
  std::printf("all-reduce (sum, float32) by each algorithm: simulated seconds (the slowest peer)\n");
  std::printf("%-14s %6s %9s %10s %12s %12s %12s %12s\n", "link", "peers", "size", "ring", "rec. doubl.", "halv.+doubl.",
              "h+d / ring", "h+d / best");
  for (const std::string link : {"lan", "wan", "heterogeneous"})
    for (const int world : {4, 6, 8})
      for (const std::size_t bytes : {std::size_t{65536}, std::size_t{1'000'000}, std::size_t{4'000'000}, std::size_t{16'000'000}}) {
        const auto links = dt::transport::links::preset(link, world);
        double seconds[3];
        const algorithm algos[3] = {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling};
        for (int a = 0; a < 3; ++a) {
          // (timed from a barrier after a first all-reduce: a communicator's first ring, or
          // halving and doubling, agrees on its sizes, once; then the mean of `calls`, the
          // links' jitter and losses drawn anew in each)
          const int calls = 5;
          std::vector<double> started(static_cast<std::size_t>(world));
          const double end = simulate_with(links, bytes, {}, [&](auto& comm, std::span<float> v) {
            std::vector<float> copy(v.begin(), v.end());
            comm.all_reduce(std::span<float>(copy), dt::collective::reduce_op::sum, algos[a]);
            comm.barrier();
            started[static_cast<std::size_t>(comm.rank())] = comm.endpoint().stats().clock_seconds;
            for (int call = 1; call < calls; ++call) {
              copy.assign(v.begin(), v.end());
              comm.all_reduce(std::span<float>(copy), dt::collective::reduce_op::sum, algos[a]);
            }
            comm.all_reduce(v, dt::collective::reduce_op::sum, algos[a]);  // (the one checked)
          });
          seconds[a] = end < 0 ? -1 : (end - *std::min_element(started.begin(), started.end())) / calls;
          if (seconds[a] < 0) {
            std::fprintf(stderr, "bench_allreduce_simulated: wrong sum (%s, %d peers, %zu bytes)\n", link.c_str(), world, bytes);
            return 1;
          }
        }
        const double best = std::min(seconds[0], seconds[1]);
        std::printf("%-14s %6d %8.0fK %10.3f %12.3f %12.3f %11.2fx %11.2fx\n", link.c_str(), world, bytes / 1000.0, seconds[0], seconds[1],
                    seconds[2], seconds[2] / seconds[0], seconds[2] / best);
        out << (first ? "" : ",\n") << "  {\"link\": \"" << link << "\", \"world\": " << world << ", \"bytes\": " << bytes
            << ", \"ring_s\": " << seconds[0] << ", \"recursive_doubling_s\": " << seconds[1]
            << ", \"halving_doubling_s\": " << seconds[2] << "}";
        first = false;
      }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int world = 4;
  bool balanced = false, sites = false, ring = false, algorithms = false;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--world" && i + 1 < argc) {
      world = std::stoi(argv[++i]);
    } else if (a == "--balanced") {
      balanced = true;
    } else if (a == "--sites") {
      sites = true;
    } else if (a == "--ring-order") {
      ring = true;
    } else if (a == "--algorithms") {
      algorithms = true;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_allreduce_simulated [--world 4] [--balanced | --sites | --ring-order | --algorithms] [--json PATH]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (balanced + sites + ring + algorithms > 1) {
    std::fprintf(stderr, "bench_allreduce_simulated: --balanced, --sites, --ring-order and --algorithms are different tables; give one\n");
    return 2;
  }
  if (balanced) return balanced_table(json.empty() ? "bench/results/allreduce_balanced.json" : json);
  if (sites) return sites_table(json.empty() ? "bench/results/allreduce_sites.json" : json);
  if (ring) return ring_order_table(json.empty() ? "bench/results/allreduce_ring_order.json" : json);
  if (algorithms) return algorithms_table(json.empty() ? "bench/results/allreduce_algorithms.json" : json);
  if (json.empty()) json = "bench/results/allreduce_simulated.json";
  if (world < 2) {
    std::fprintf(stderr, "bench_allreduce_simulated: --world must be >= 2\n");
    return 2;
  }
  dt::collective::options fixed;
  fixed.in_flight_multiple = 0;  // the sizes as given, whatever the links
  bench::output_file out(json);
  out << "[\n";
  bool first = true;
  std::printf("all-reduce (sum, float32) of %d peers on simulated links: simulated seconds\n", world);
  std::printf("%-14s %10s %12s %12s %8s %12s\n", "link", "size", "fixed sizes", "to links", "speedup", "wire only");
  for (const std::string link : {"lan", "wan", "heterogeneous"}) {
    // The ring's bytes on the slowest link: what no algorithm that sends them can beat.
    const auto slowest = *dt::transport::in_process(dt::transport::links::preset(link, world)).at(0).slowest_link();
    for (std::size_t mb : {1, 4, 16, 100}) {
      const std::size_t bytes = mb * 1000 * 1000;
      const auto links = dt::transport::links::preset(link, world);
      const double a = simulate(links, bytes, fixed), b = simulate(links, bytes, {});
      const double wire = 2.0 * (world - 1) / world * static_cast<double>(bytes) / slowest.bytes_per_s;
      if (a < 0 || b < 0) {
        std::fprintf(stderr, "bench_allreduce_simulated: wrong sum (%s, %zu MB)\n", link.c_str(), mb);
        return 1;
      }
      std::printf("%-14s %7zu MB %12.3f %12.3f %7.2fx %12.3f\n", link.c_str(), mb, a, b, a / b, wire);
      out << (first ? "" : ",\n") << "  {\"link\": \"" << link << "\", \"world\": " << world << ", \"bytes\": " << bytes
          << ", \"fixed_s\": " << a << ", \"to_links_s\": " << b << ", \"wire_s\": " << wire << "}";
      first = false;
    }
  }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return 0;
}
