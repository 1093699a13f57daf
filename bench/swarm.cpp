// bench/swarm: SWARM's routing of micro-batches among the peers of a stage, against the
// reference balancer of yandex-research/swarm (an exponential moving average of seconds per
// sample, alpha 0.1, bias-corrected, no restart), side by side on the same simulated peers.
// 16 peers in 4 stages of 4, speeds spread 1x-4x (transport::speeds::spread), each micro-batch's
// round trip off by up to +-20% (uniform). Per stage, a router sends micro-batches to its peers:
//   shares       the largest relative distance of a peer's share of 1000 micro-batches from its
//                speed's share (goal: <= 3%)
//   4x slower    the fastest peer of each stage becomes 4x slower: the same distance over the
//                1000 micro-batches after the first 50 following the change (goal: <= 3%)
//   4x faster    the slowest becomes 4x faster: likewise
//   restarts     estimates restarted as a change of speed over 10000 micro-batches of noise alone
// Then rebalancing (parallel/swarm/rebalance.hpp) on the same 16 peers, stages of equal cost,
// each check seeing every speed off by up to +-20%: peers start on stage rank mod 4; a quarter
// of them is lost (chosen at random), the others rebalance for 200 checks; 4 joiners come
// (speeds 1x-4x, each on the slowest stage) and the group rebalances for 200 more. After each,
// the pipeline's throughput (its slowest stage's) as a share of the best assignment a local
// search finds (moves and swaps from many starts) and of the bound total speed / stages, with
// and without rebalancing; and moves per peer per 10 checks over the whole run (goal: <= 1).
// The stages' training (loss against the pipeline, DiLoCo inside the pools): bench/swarm_training.
//
//   bench_swarm [--seeds 1,2,3] [--noise 0.2] [--json bench/results/swarm.json]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "args.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/parallel/swarm/rebalance.hpp"
#include "decentrain/parallel/swarm/router.hpp"
#include "decentrain/transport/in_process.hpp"
#include "output_file.hpp"

namespace dt = decentrain;
using dt::parallel::pools::router;

namespace {

constexpr int stages = 4, per_stage = 4;

struct stage_sim {
  router r;
  std::vector<double> speeds;  // samples per second of each of its peers
};

// Routes `n` micro-batches through the stage; each peer's count.
std::vector<int> route(stage_sim& s, int n, double noise, dt::rng& gen) {
  std::vector<int> count(s.speeds.size(), 0);
  for (int i = 0; i < n; ++i) {
    const int p = *s.r.next();
    ++count[static_cast<std::size_t>(p)];
    s.r.measured(p, 1.0 / s.speeds[static_cast<std::size_t>(p)] * (1 + noise * (2 * gen.uniform() - 1)));
  }
  return count;
}
double worst_error(const std::vector<int>& count, const std::vector<double>& speeds) {
  double total = 0, total_speed = 0, worst = 0;
  for (const int c : count) total += c;
  for (const double v : speeds) total_speed += v;
  for (std::size_t p = 0; p < speeds.size(); ++p)
    worst = std::max(worst, std::abs(count[p] / total - speeds[p] / total_speed) / (speeds[p] / total_speed));
  return worst;
}

struct row {
  std::string router;
  int seed = 0;
  double shares = 0, slower = 0, faster = 0;
  std::uint64_t restarts = 0;
};

row measure(const std::string& name, dt::parallel::pools::router_settings settings, int seed, double noise) {
  row out{name, seed};
  const auto all = dt::transport::speeds::spread(stages * per_stage, static_cast<std::uint64_t>(seed));
  dt::rng gen(static_cast<std::uint64_t>(seed), "bench-swarm");
  for (int k = 0; k < stages; ++k) {
    for (int change = 0; change < 3; ++change) {  // 0: steady, 1: fastest 4x slower, 2: slowest 4x faster
      stage_sim s{router(settings), std::vector<double>(all.begin() + k * per_stage, all.begin() + (k + 1) * per_stage)};
      for (int p = 0; p < per_stage; ++p) s.r.add(p);
      const auto first = route(s, 1000, noise, gen);
      if (change == 0) {
        out.shares = std::max(out.shares, worst_error(first, s.speeds));
        (void)route(s, 9000, noise, gen);
        out.restarts += s.r.restarts();
        continue;
      }
      auto& v = s.speeds;
      if (change == 1) *std::max_element(v.begin(), v.end()) /= 4;
      else *std::min_element(v.begin(), v.end()) *= 4;
      (void)route(s, 50, noise, gen);
      const double e = worst_error(route(s, 1000, noise, gen), v);
      (change == 1 ? out.slower : out.faster) = std::max(change == 1 ? out.slower : out.faster, e);
    }
  }
  return out;
}

using dt::parallel::pools::pool_peer;

// The best assignment of these speeds to `stages` stages of cost 1 a local search finds: from
// many random starts, move or swap peers while that raises the slowest stage.
double best_found(const std::vector<double>& speeds, int stage_count, dt::rng& gen) {
  const std::vector<double> cost(static_cast<std::size_t>(stage_count), 1.0);
  double best = 0;
  for (int start = 0; start < 200; ++start) {
    std::vector<pool_peer> a;
    for (std::size_t p = 0; p < speeds.size(); ++p)
      a.push_back({static_cast<int>(p), static_cast<int>(gen.next_u64() % static_cast<std::uint64_t>(stage_count)), speeds[p]});
    for (bool better = true; better;) {
      better = false;
      const double now = dt::parallel::pools::bottleneck(a, cost);
      for (std::size_t i = 0; i < a.size() && !better; ++i) {
        for (int s = 0; s < stage_count && !better; ++s) {  // move i to s
          const int was = a[i].stage;
          a[i].stage = s;
          if (dt::parallel::pools::bottleneck(a, cost) > now + 1e-12) better = true;
          else a[i].stage = was;
        }
        for (std::size_t j = i + 1; j < a.size() && !better; ++j) {  // swap i and j
          std::swap(a[i].stage, a[j].stage);
          if (dt::parallel::pools::bottleneck(a, cost) > now + 1e-12) better = true;
          else std::swap(a[i].stage, a[j].stage);
        }
      }
    }
    best = std::max(best, dt::parallel::pools::bottleneck(a, cost));
  }
  return best;
}

struct balance_row {
  int seed = 0;
  double lost_with = 0, lost_without = 0, lost_bound = 0, joined_with = 0, joined_without = 0, joined_bound = 0;
  double moves_per_peer_per_10 = 0;
};

balance_row rebalance(int seed, double noise) {
  balance_row out{seed};
  const std::vector<double> cost(stages, 1.0);
  dt::rng gen(static_cast<std::uint64_t>(seed), "bench-swarm-rebalance");
  const auto speeds = dt::transport::speeds::spread(stages * per_stage, static_cast<std::uint64_t>(seed));
  std::vector<pool_peer> peers;
  for (int p = 0; p < stages * per_stage; ++p) peers.push_back({p, p % stages, speeds[static_cast<std::size_t>(p)]});
  // A quarter lost, at random.
  for (int k = 0; k < stages * per_stage / 4; ++k) peers.erase(peers.begin() + static_cast<std::ptrdiff_t>(gen.next_u64() % peers.size()));
  auto still = peers;  // without rebalancing
  dt::parallel::pools::rebalancer r;
  std::uint64_t peer_checks = 0;
  const auto settle = [&](int checks) {
    for (int i = 0; i < checks; ++i) {
      auto seen = peers;
      for (auto& p : seen) p.speed *= 1 + noise * (2 * gen.uniform() - 1);
      peer_checks += peers.size();
      if (const auto m = r.check(seen, cost))
        for (auto& p : peers) {
          if (p.peer == m->peer) p.stage = m->to;
          if (p.peer == m->partner) p.stage = m->from;
        }
    }
  };
  const auto speeds_of = [](const std::vector<pool_peer>& ps) {
    std::vector<double> v;
    for (const auto& p : ps) v.push_back(p.speed);
    return v;
  };
  settle(200);
  double best = best_found(speeds_of(peers), stages, gen), total = 0;
  for (const auto& p : peers) total += p.speed;
  out.lost_with = dt::parallel::pools::bottleneck(peers, cost) / best;
  out.lost_without = dt::parallel::pools::bottleneck(still, cost) / best;
  out.lost_bound = best / (total / stages);
  // Four joiners, 1x-4x, each on the slowest stage as it comes.
  const auto joiners = dt::transport::speeds::spread(4, static_cast<std::uint64_t>(seed) + 100);
  for (int j = 0; j < 4; ++j) {
    const pool_peer p{100 + j, 0, joiners[static_cast<std::size_t>(j)]};
    auto placed = p, placed_still = p;
    placed.stage = dt::parallel::pools::stage_for_joiner(peers, cost);
    placed_still.stage = dt::parallel::pools::stage_for_joiner(still, cost);
    peers.push_back(placed);
    still.push_back(placed_still);
  }
  settle(200);
  best = best_found(speeds_of(peers), stages, gen);
  total = 0;
  for (const auto& p : peers) total += p.speed;
  out.joined_with = dt::parallel::pools::bottleneck(peers, cost) / best;
  out.joined_without = dt::parallel::pools::bottleneck(still, cost) / best;
  out.joined_bound = best / (total / stages);
  out.moves_per_peer_per_10 = 10.0 * static_cast<double>(r.moves()) / static_cast<double>(peer_checks);  // peer_checks: peers x checks
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args a(argc, argv, "usage: bench_swarm [--seeds 1,2,3] [--noise 0.2] [--json PATH]");
  std::vector<int> seeds;
  for (const auto& s : bench::split(a.value("seeds", "1,2,3"), ',')) seeds.push_back(std::stoi(s));
  const double noise = std::stod(a.value("noise", "0.2"));
  const std::string json = a.value("json", "bench/results/swarm.json");
  a.finish();
  dt::detail::check(noise >= 0 && noise < 1, "bench_swarm: --noise must be in [0, 1), got ", noise);

  dt::parallel::pools::router_settings reference;  // SWARM's balancer: the moving average alone
  reference.change_ratio = 1e300;
  std::printf("routing among the 4 peers of each of 4 stages, speeds 1x-4x, round trips +-%.0f%%; the worst peer's\n"
              "share error (relative; goal <= 3%%)\n\n",
              100 * noise);
  std::printf("%-22s %5s %10s %12s %12s %10s\n", "router", "seed", "shares", "4x slower", "4x faster", "restarts");
  std::vector<row> rows;
  for (const int seed : seeds)
    for (const auto& r : {measure("decentrain", {}, seed, noise), measure("swarm (EMA 0.1)", reference, seed, noise)}) {
      std::printf("%-22s %5d %9.2f%% %11.2f%% %11.2f%% %10llu\n", r.router.c_str(), r.seed, 100 * r.shares, 100 * r.slower,
                  100 * r.faster, static_cast<unsigned long long>(r.restarts));
      rows.push_back(r);
    }
  std::printf("\nrebalancing 16 peers over 4 stages, speeds 1x-4x, each check's speeds +-%.0f%%: the pipeline's throughput\n"
              "as a share of the best assignment found (goal >= 95%%), with and without rebalancing; best / bound\n\n",
              100 * noise);
  std::printf("%5s %14s %14s %12s %14s %14s %12s %14s\n", "seed", "lost 4: with", "without", "best/bound", "joined 4: with",
              "without", "best/bound", "moves/peer/10");
  std::vector<balance_row> balance;
  for (const int seed : seeds) {
    const auto b = rebalance(seed, noise);
    std::printf("%5d %13.1f%% %13.1f%% %11.1f%% %13.1f%% %13.1f%% %11.1f%% %14.3f\n", b.seed, 100 * b.lost_with, 100 * b.lost_without,
                100 * b.lost_bound, 100 * b.joined_with, 100 * b.joined_without, 100 * b.joined_bound, b.moves_per_peer_per_10);
    balance.push_back(b);
  }
  bench::output_file out(json);
  out << "{\"routing\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? ",\n" : "") << "  {\"router\": \"" << r.router << "\", \"seed\": " << r.seed << ", \"noise\": " << noise
        << ", \"shares_error\": " << r.shares << ", \"slower_error\": " << r.slower << ", \"faster_error\": " << r.faster
        << ", \"restarts\": " << r.restarts << "}";
  }
  out << "\n], \"rebalancing\": [\n";
  for (std::size_t i = 0; i < balance.size(); ++i) {
    const auto& b = balance[i];
    out << (i ? ",\n" : "") << "  {\"seed\": " << b.seed << ", \"noise\": " << noise << ", \"lost_with\": " << b.lost_with
        << ", \"lost_without\": " << b.lost_without << ", \"lost_best_over_bound\": " << b.lost_bound
        << ", \"joined_with\": " << b.joined_with << ", \"joined_without\": " << b.joined_without
        << ", \"joined_best_over_bound\": " << b.joined_bound << ", \"moves_per_peer_per_10_checks\": " << b.moves_per_peer_per_10 << "}";
  }
  out << "\n]}\n";
  out.close();
  std::printf("\nrows written to %s\n", json.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_swarm: %s\n", e.what());
  return 1;
}
