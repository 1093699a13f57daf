// The ring's order from measured links: the pick on figures given by hand (exact for up to 16
// peers, the heuristic beyond checked against it), a communicator whose ring follows a set
// order (the same sums, the same bits on every peer, the codec's ring too, orders that differ
// refused), and on simulated links what measuring and ordering buys: fewer bytes between two
// sites, less time on links of different latencies.
#include <catch2/catch.hpp>

#include <decentrain/collective/encoded_all_reduce.hpp>
#include <decentrain/collective/ring_order.hpp>
#include <decentrain/compress/blockwise.hpp>
#include <decentrain/compress/top_k.hpp>
#include <decentrain/core/rng.hpp>
#include <decentrain/transport/in_process.hpp>
#include <decentrain/transport/tcp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
using dt::collective::best_ring;
using dt::collective::cost_of_ring;

namespace {
// Hops of `n` peers at two sites (even ranks at one, odd at the other): `near` inside, `far`
// between.
std::vector<double> two_sites(int n, double near, double far) {
  std::vector<double> c(static_cast<std::size_t>(n * n), 0.0);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) c[static_cast<std::size_t>(a * n + b)] = a % 2 == b % 2 ? near : far;
  return c;
}
// How many hops of `order` go between the two sites of two_sites.
int crossings(const std::vector<int>& order) {
  int k = 0;
  for (std::size_t i = 0; i < order.size(); ++i) k += order[i] % 2 != order[(i + 1) % order.size()] % 2;
  return k;
}
bool is_ring_of(const std::vector<int>& order, int n) {
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> ranks(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  return sorted == ranks && !order.empty() && order.front() == 0;
}
// Hops that cost the sum of their ends' latencies (as on links::heterogeneous).
std::vector<double> by_latency(const std::vector<double>& latency) {
  const int n = static_cast<int>(latency.size());
  std::vector<double> c(static_cast<std::size_t>(n * n), 0.0);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) c[static_cast<std::size_t>(a * n + b)] = latency[static_cast<std::size_t>(a)] + latency[static_cast<std::size_t>(b)];
  return c;
}
std::uint64_t bits_of(const std::vector<float>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &x, sizeof b);
    h = (h ^ b) * 1099511628211ull;
  }
  return h;
}
}  // namespace

TEST_CASE("ring order: the pick on given hops, and bad figures") {
  // Two sites dealt alternately: any ring crosses at least twice, and rank order crosses at
  // every hop; the pick crosses twice.
  for (const int n : {4, 6, 8, 9, 14}) {
    INFO(n << " peers");
    const auto cost = two_sites(n, 0.001, 0.1);
    const auto order = best_ring(cost, n);
    CHECK(is_ring_of(order, n));
    CHECK(crossings(order) == 2);
    CHECK(cost_of_ring(cost, n, order).total == Approx(2 * 0.1 + (n - 2) * 0.001));
  }
  // Hops that cost their ends' latencies added (10 to 80 ms): every ring adds up to the same,
  // twice the latencies, so the slowest hop decides. For 8 peers of latencies 10, 20, ..., 80
  // ms the best is 80 + 20 = 100 ms (80's two neighbours are at least 10 and 20), where rank
  // order's is 70 + 50 = 120.
  std::vector<double> lat = {0.04, 0.01, 0.08, 0.03, 0.06, 0.02, 0.07, 0.05};
  const auto cost = by_latency(lat);
  const auto order = best_ring(cost, 8);
  CHECK(cost_of_ring(cost, 8, order).slowest == Approx(0.10));
  CHECK(cost_of_ring(cost, 8, order).total == Approx(0.72));
  std::vector<int> ranks(8);
  std::iota(ranks.begin(), ranks.end(), 0);
  CHECK(cost_of_ring(cost, 8, ranks).slowest == Approx(0.12));  // (0.07 + 0.05)
  // Small worlds: rank order (there is nothing to choose).
  CHECK(best_ring(std::vector<double>{0}, 1) == std::vector<int>{0});
  CHECK(best_ring(two_sites(3, 1, 2), 3) == std::vector<int>{0, 1, 2});
  CHECK_THROWS_WITH(best_ring(std::vector<double>{0, 1, 1}, 2), Catch::Contains("3 hop costs for 2 peers"));
  CHECK_THROWS_WITH(best_ring(std::vector<double>{0, -1, 1, 0}, 2), Catch::Contains("hop from peer 0 to 1 costs -1"));
  CHECK_THROWS_WITH(best_ring(std::vector<double>{0, 1, std::nan(""), 0}, 2), Catch::Contains("hop from peer 1 to 0 costs nan"));
}

TEST_CASE("ring order: beyond 16 peers a heuristic, checked against the exact pick on fewer") {
  // The heuristic alone (detail::search_ring) on 24 random worlds of 6 to 13 peers (each
  // pair's hop the same both ways, as measure_links gives them), against the exact pick: how
  // often it finds the same sum, and how far off it is where it does not.
  int same = 0;
  double worst = 1;
  for (int trial = 0; trial < 24; ++trial) {
    dt::rng gen(static_cast<std::uint64_t>(trial), "ring-order");
    const int n = 6 + trial % 8;
    std::vector<double> cost(static_cast<std::size_t>(n * n), 0.0);
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        cost[static_cast<std::size_t>(a * n + b)] = cost[static_cast<std::size_t>(b * n + a)] = 0.005 + 0.1 * gen.uniform();
    const auto exact = best_ring(cost, n), found = dt::collective::detail::search_ring(cost, n);
    CHECK(is_ring_of(exact, n));
    CHECK(is_ring_of(found, n));
    const double e = cost_of_ring(cost, n, exact).total, f = cost_of_ring(cost, n, found).total;
    CHECK(e <= f * (1 + 1e-12));  // (the exact pick is never beaten)
    same += f <= e * (1 + 1e-12);
    worst = std::max(worst, f / e);
  }
  INFO("the heuristic's sum matched the exact one in " << same << " of 24 worlds, at worst " << worst << "x");
  CHECK(same >= 20);
  CHECK(worst < 1.1);
  // And beyond 16: two sites of 10 dealt alternately, crossed twice.
  const auto order = best_ring(two_sites(20, 0.001, 0.1), 20);
  CHECK(is_ring_of(order, 20));
  CHECK(crossings(order) == 2);
}

TEMPLATE_TEST_CASE("ring order: a communicator's ring in a set order sums as rank order does, the same bits on every peer",
                   "[collective]", TRANSPORTS) {
  const int n = 5;
  const std::vector<int> order = {0, 3, 1, 4, 2};
  harness::peer_checks checks;
  TestType::run(n, [&](auto& ep) {
    dt::collective::options small;
    small.chunk_bytes = 4 << 10;  // (several chunks a segment)
    small.window_bytes = 16 << 10;
    dt::collective::communicator comm(ep, small);
    const int r = ep.rank();
    std::vector<std::int64_t> ints(20011), flat_ints;
    std::iota(ints.begin(), ints.end(), std::int64_t{r} * 7);
    flat_ints = ints;
    comm.all_reduce(std::span<std::int64_t>(flat_ints), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
    dt::rng gen(static_cast<std::uint64_t>(r) + 5, "ring-order");
    std::vector<float> values(10007), flat;
    for (auto& v : values) v = static_cast<float>(gen.uniform() * 2 - 1);
    flat = values;
    comm.all_reduce(std::span<float>(flat), dt::collective::reduce_op::average, dt::collective::algorithm::ring);
    comm.set_ring_order(order);
    PEER_CHECK(checks, comm.ring_order() == order);
    PEER_CHECK(checks, comm.ring_at(comm.ring_position() + 1) == order[static_cast<std::size_t>((std::find(order.begin(), order.end(), r) - order.begin() + 1) % n)]);
    comm.all_reduce(std::span<std::int64_t>(ints), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
    PEER_CHECK(checks, ints == flat_ints);  // (integers: exact in any order)
    comm.all_reduce(std::span<float>(values), dt::collective::reduce_op::average, dt::collective::algorithm::ring);
    float worst = 0;
    for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(values[i] - flat[i]));
    PEER_CHECK(checks, worst <= 4 * std::numeric_limits<float>::epsilon());
    PEER_CHECK(checks, comm.all_same(bits_of(values)));
    // The all-gather's blocks stay in rank order.
    const std::int32_t mine[2] = {r, 10 * r};
    const auto all = comm.all_gather(std::span<const std::int32_t>(mine, 2));
    bool ranked = all.size() == 2 * n;
    for (int q = 0; q < n && ranked; ++q) ranked = all[static_cast<std::size_t>(2 * q)] == q && all[static_cast<std::size_t>(2 * q + 1)] == 10 * q;
    PEER_CHECK(checks, ranked);
    // A codec's ring (int8 blocks) follows the order too: one result on every peer.
    dt::compress::int8_blockwise codec;
    std::vector<float> coded(4096);
    for (auto& v : coded) v = static_cast<float>(gen.uniform());
    dt::collective::encoded_all_reduce(codec, comm, std::span<float>(coded), true);
    PEER_CHECK(checks, comm.all_same(bits_of(coded)));
    // A gathered codec's payloads (top-k) go around it too, each decoded in rank order: the sum
    // of every peer's top value, whatever the ring's order.
    dt::compress::top_k sparse;
    sparse.fraction = 1.0 / 4096;
    std::vector<float> one(4096, 0.0f);
    one[static_cast<std::size_t>(r)] = static_cast<float>(r + 1);
    dt::collective::encoded_all_reduce(sparse, comm, std::span<float>(one), false);
    bool gathered = true;
    for (int q = 0; q < n; ++q) gathered = gathered && one[static_cast<std::size_t>(q)] == static_cast<float>(q + 1);
    PEER_CHECK(checks, gathered);
    // Orders that differ: every peer fails, naming it, before a message goes the wrong way.
    comm.set_ring_order(r == 2 ? std::vector<int>{0, 1, 2, 3, 4} : order);
    harness::expect_throws_with(checks, [&] {
      comm.all_reduce(std::span<std::int64_t>(ints), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
    }, "different ring orders", "orders that differ");
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 9);
}

TEST_CASE("ring order: orders that are not a ring of the world are refused") {
  harness::peer_checks checks;
  dt::transport::in_process(3).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator comm(ep);
    harness::expect_throws_with(checks, [&] { comm.set_ring_order({0, 1}); }, "a ring order lists 2 ranks for a world of 3", "short");
    harness::expect_throws_with(checks, [&] { comm.set_ring_order({0, 1, 1}); }, "once, got rank 1 twice", "twice");
    harness::expect_throws_with(checks, [&] { comm.set_ring_order({0, 1, 3}); }, "once, got rank 3", "outside");
    comm.set_ring_order({});
    PEER_CHECK(checks, comm.ring_order().empty() && comm.ring_position() == ep.rank());
  });
  checks.report(3 * 4);
}

TEST_CASE("ring order: measured on simulated links, fewer bytes between two sites and less time on mixed latencies") {
  // Two sites of 4 dealt a, b, a, b, ... (lan inside, wan between): the measured order crosses
  // twice, rank order at every hop. The segment hops run at once over links of their own, so the
  // time is about the same; the bytes between the sites are not.
  const int n = 8;
  const std::vector<int> site_of = {0, 1, 0, 1, 0, 1, 0, 1};
  struct outcome {
    std::uint64_t across = 0;
    double seconds = 0;  // the all-reduce's, after the order was set
    std::vector<int> order;
    bool exact = true;
  };
  auto run = [&](const dt::transport::link_matrix& links, bool ordered, std::size_t probe_bytes, std::size_t values) {
    dt::transport::in_process::options o;
    o.seed = 7;
    dt::transport::in_process net(links, o);
    std::vector<double> took(n);
    std::vector<int> exact(n);
    std::vector<std::vector<int>> orders(n);
    std::vector<std::uint64_t> before(static_cast<std::size_t>(n * n));
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator comm(ep);
      if (ordered) (void)dt::collective::order_ring(comm, 4.0 * values / n, probe_bytes);
      orders[static_cast<std::size_t>(ep.rank())] = comm.ring_order();
      comm.barrier();
      for (int d = 0; d < n; ++d) before[static_cast<std::size_t>(ep.rank() * n + d)] = net.bytes_sent(ep.rank(), d);
      std::vector<float> v(values, static_cast<float>(ep.rank() + 1));
      comm.all_reduce(std::span<float>(v), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);  // (agrees on sizes)
      const double t0 = ep.stats().clock_seconds;
      std::fill(v.begin(), v.end(), static_cast<float>(ep.rank() + 1));
      comm.all_reduce(std::span<float>(v), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
      took[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds - t0;
      exact[static_cast<std::size_t>(ep.rank())] = std::all_of(v.begin(), v.end(), [](float x) { return x == 36.0f; });
    });
    outcome out;
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d)
        if (site_of[static_cast<std::size_t>(s)] != site_of[static_cast<std::size_t>(d)])
          out.across += net.bytes_sent(s, d) - before[static_cast<std::size_t>(s * n + d)];
    out.seconds = *std::max_element(took.begin(), took.end());
    out.order = orders[0];
    out.exact = std::all_of(exact.begin(), exact.end(), [](int e) { return e != 0; }) &&
                std::all_of(orders.begin(), orders.end(), [&](const auto& o) { return o == orders[0]; });
    return out;
  };
  const auto sites = dt::transport::links::by_site(dt::transport::links::wan(n), dt::transport::links::lan(n), site_of);
  const std::size_t values = 1 << 20;
  const auto rank_order = run(sites, false, 0, values), measured = run(sites, true, 0, values);
  INFO("rank order: " << rank_order.across << " B across in " << rank_order.seconds << " s; measured ("
                      << dt::collective::describe_order(measured.order) << "): " << measured.across << " B in " << measured.seconds << " s");
  CHECK(rank_order.exact);
  CHECK(measured.exact);
  CHECK(crossings(measured.order) == 2);
  // Two ring all-reduces of 4 MB (the first also agrees on the sizes): every hop of rank order
  // crosses, 2 of the measured ring's do.
  CHECK(rank_order.across >= 2 * 8 * 2 * 7 * values / 8 * 4 / 2);
  CHECK(measured.across * 3 < rank_order.across);
  // Peers in three regions dealt 0, 1, 2, 0, 1, 2, 0, 1 (5 ms inside a region, 40, 75 and 110 ms
  // between them), 64 KB: a latency-bound ring, about twice its hops' sum. Rank order crosses
  // between regions at every hop (530 ms of hops), the measured order three or four times (3:
  // 40 + 110 + 75 ms, 4: 40 + 40 + 75 + 75, within the links' jitter of each other).
  const double between[3][3] = {{0.005, 0.04, 0.075}, {0.04, 0.005, 0.11}, {0.075, 0.11, 0.005}};
  dt::transport::link_matrix regions(n, dt::transport::simulated_link{}, dt::transport::access_link{12.5e6, 12.5e6});
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) regions.at(a, b) = dt::transport::simulated_link{between[a % 3][b % 3], 12.5e6, 0.002, 0.0, 0.3};
  const auto plain = run(regions, false, 0, 16384), tuned = run(regions, true, 64 << 10, 16384);
  INFO("regions: rank order " << plain.seconds << " s, measured (" << dt::collective::describe_order(tuned.order) << ") "
                              << tuned.seconds << " s");
  CHECK(plain.exact);
  CHECK(tuned.exact);
  int crossed = 0;
  for (std::size_t i = 0; i < tuned.order.size(); ++i) crossed += tuned.order[i] % 3 != tuned.order[(i + 1) % tuned.order.size()] % 3;
  CHECK(crossed <= 4);
  CHECK(tuned.seconds < 0.6 * plain.seconds);
}

TEST_CASE("ring order: the links measured on simulated links are the links") {
  // Four peers of one site at 20 ms and 50 MB/s between each pair (no jitter, no loss): the
  // round trips are 40 ms, the bandwidths 50 MB/s, within the probe's rounding.
  const int n = 4;
  dt::transport::link_matrix links(n, dt::transport::simulated_link{0.02, 50e6, 0.0, 0.0, 0.0},
                                   dt::transport::access_link{1e12, 1e12});
  std::vector<dt::collective::measured_links> seen(n);
  dt::transport::in_process(links, {1, std::chrono::milliseconds(20000)}).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator comm(ep);
    seen[static_cast<std::size_t>(ep.rank())] = dt::collective::measure_links(comm, 1 << 20, 3);
  });
  for (int r = 0; r < n; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    INFO("peer " << r);
    REQUIRE(m.world == n);
    REQUIRE(m.bytes_per_s.size() == static_cast<std::size_t>(n * n));
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        CHECK(m.round_trip(a, b) == Approx(0.04).epsilon(0.05));
        CHECK(m.bytes_per_s[static_cast<std::size_t>(a * n + b)] == Approx(50e6).epsilon(0.1));
        CHECK(m.hop(a, b, 1e6) == Approx(0.02 + 0.02).epsilon(0.1));
      }
    CHECK(m.round_trip_s == seen[0].round_trip_s);
    CHECK(m.bytes_per_s == seen[0].bytes_per_s);
  }
}
