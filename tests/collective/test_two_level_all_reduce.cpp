// The two-level all-reduce over sites: the map the peers agree on, sums equal to the flat
// all-reduce's (bit for bit on integers, within rounding on floats, the same bits on every peer),
// sites of different sizes, and on simulated WAN links between sites the bytes that cross
// between them, counted per link, against a flat ring.
#include <catch2/catch.hpp>

#include <decentrain/collective/sites.hpp>
#include <decentrain/collective/two_level_all_reduce.hpp>
#include <decentrain/core/rng.hpp>
#include <decentrain/transport/in_process.hpp>
#include <decentrain/transport/tcp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
using dt::collective::site_map;

namespace {
std::vector<std::string> site_names(std::initializer_list<const char*> names) { return {names.begin(), names.end()}; }
}  // namespace

TEST_CASE("sites: the map from each peer's site name, and bad names") {
  const auto m = site_map::from_names(site_names({"b", "a", "b", "c", "a", "b"}));
  CHECK(m.world() == 6);
  CHECK(m.sites() == 3);
  CHECK(m.name(0) == "b");  // numbered by their first rank
  CHECK(m.site_of(4) == 1);
  CHECK(m.members(0) == std::vector<int>{0, 2, 5});
  CHECK(m.members(2) == std::vector<int>{3});
  CHECK(m.position(5) == 2);
  CHECK(m.position(4) == 1);
  CHECK(m.smallest() == 1);
  CHECK(m.describe() == "b: 0 2 5, a: 1 4, c: 3");
  CHECK_THROWS_WITH(site_map::from_names(site_names({"a", ""})), Catch::Contains("peer 1's site name must be 1 to 63 bytes, got 0"));
  CHECK_THROWS_WITH(site_map::from_names(std::vector<std::string>{"a", std::string(64, 'x')}),
                    Catch::Contains("peer 1's site name must be 1 to 63 bytes, got 64"));
  CHECK_THROWS_WITH(site_map::from_names(std::vector<std::string>{}), Catch::Contains("no peers named"));
}

TEST_CASE("sites from round trips: near pairs joined, the widest jump the split, one site without one") {
  using dt::collective::sites_from_round_trips;
  // 0 and 2 near (1 ms), 1, 3 and 4 near (2-3 ms: 3 near 4, 1 near 3), the sites 100-200 ms apart.
  const std::vector<double> rtt = {0,     0.2,   0.001, 0.15,  0.2,    //
                                   0.2,   0,     0.17,  0.002, 0.05,   // (1-4: 50 ms, joined through 3)
                                   0.001, 0.17,  0,     0.19,  0.18,   //
                                   0.15,  0.002, 0.19,  0,     0.003,  //
                                   0.2,   0.05,  0.18,  0.003, 0};
  const auto m = sites_from_round_trips(rtt, 5);
  CHECK(m.describe() == "near-0: 0 2, near-1: 1 3 4");
  // About equally far (within the factor of 4): one site.
  CHECK(sites_from_round_trips(std::vector<double>{0, 0.1, 0.12, 0.1, 0, 0.3, 0.12, 0.3, 0}, 3).sites() == 1);
  CHECK(sites_from_round_trips(std::vector<double>{0, 0, 0, 0}, 2).sites() == 1);  // ideal links
  CHECK(sites_from_round_trips(std::vector<double>{0}, 1).sites() == 1);
  CHECK_THROWS_WITH(sites_from_round_trips(std::vector<double>{0, 1, 1}, 2), Catch::Contains("3 round trips for 2 peers"));
  CHECK_THROWS_WITH(sites_from_round_trips(std::vector<double>{0, -1, -1, 0}, 2), Catch::Contains("peers 0 and 1 is not a time"));
  CHECK_THROWS_WITH(sites_from_round_trips(std::vector<double>{0, 1, 1, 0}, 2, 1.0), Catch::Contains("gap must be a factor > 1"));
}

TEST_CASE("sites by latency: simulated peers of two sites are found from the round trips they measure") {
  // Six peers, the sites dealt a, b, a, b, b, a; lan inside, wan between (100 ms, 10 ms jitter).
  const std::vector<int> site_of = {0, 1, 0, 1, 1, 0};
  const int n = 6;
  const auto links = dt::transport::links::by_site(dt::transport::links::wan(n), dt::transport::links::lan(n), site_of);
  std::vector<std::string> found(n);
  std::vector<double> near(n), far(n);
  dt::transport::in_process(links, {5, std::chrono::milliseconds(20000)}).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator comm(ep);
    const auto rtt = dt::collective::measure_round_trips(comm);
    const auto r = static_cast<std::size_t>(ep.rank());
    near[r] = rtt[0 * n + 2];
    far[r] = rtt[0 * n + 1];
    found[r] = dt::collective::sites_from_round_trips(rtt, n).describe();
  });
  for (int r = 0; r < n; ++r) {
    CHECK(found[static_cast<std::size_t>(r)] == "near-0: 0 2 5, near-1: 1 3 4");
    CHECK(near[static_cast<std::size_t>(r)] < 0.001);  // two LAN latencies of 50 us
    CHECK(far[static_cast<std::size_t>(r)] >= 0.2);    // two WAN latencies
  }
}

TEMPLATE_TEST_CASE("sites by latency: peers on one machine are one site, the same map on every peer", "[collective]", TRANSPORTS) {
  const int n = 4;
  harness::peer_checks checks;
  TestType::run(n, [&](auto& ep) {
    dt::collective::communicator comm(ep);
    const auto sites = dt::collective::sites_by_latency(comm, 4.0, 1);
    PEER_CHECK(checks, sites.world() == n);
    PEER_CHECK(checks, comm.all_same(std::hash<std::string>{}(sites.describe())));
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 2);
}

TEMPLATE_TEST_CASE("two-level all-reduce: equals the flat one, the same bits on every peer", "[collective]", TRANSPORTS) {
  // Six peers at three sites of 3, 2 and 1 (ranks interleaved): one segment each across (the
  // smallest site has one member), and the others of the larger sites send and receive only.
  // Then 2 + 2 + 2 for three segments.
  const int n = 6;
  const std::vector<std::vector<std::string>> layouts = {site_names({"x", "y", "x", "z", "y", "x"}),
                                                         site_names({"x", "y", "z", "x", "y", "z"})};
  harness::peer_checks checks;
  TestType::run(n, [&](auto& ep) {
    dt::collective::communicator comm(ep);
    const int r = ep.rank();
    for (const auto& names : layouts) {
      const auto sites = dt::collective::agree_on_sites(comm, names[static_cast<std::size_t>(r)]);
      PEER_CHECK(checks, sites == site_map::from_names(names));
      dt::collective::two_level levels(comm, sites);
      // Integers add exactly in any order: bit for bit the flat sum.
      std::vector<std::int64_t> ints(10007), flat_ints;
      std::iota(ints.begin(), ints.end(), std::int64_t{r} * 1000);
      flat_ints = ints;
      levels.all_reduce(std::span<std::int64_t>(ints));
      comm.all_reduce(std::span<std::int64_t>(flat_ints));
      PEER_CHECK(checks, ints == flat_ints);
      // Floats: within rounding of the flat average, and one result on every peer.
      dt::rng gen(static_cast<std::uint64_t>(r) + 11, "two-level");
      std::vector<float> values(4099), flat;
      for (auto& v : values) v = static_cast<float>(gen.uniform() * 2 - 1);
      flat = values;
      levels.all_reduce(std::span<float>(values), dt::collective::reduce_op::average);
      comm.all_reduce(std::span<float>(flat), dt::collective::reduce_op::average);
      float worst = 0;
      for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(values[i] - flat[i]));
      PEER_CHECK(checks, worst <= 4 * std::numeric_limits<float>::epsilon());
      std::uint64_t bits = 0;
      for (float v : values) {
        std::uint32_t b = 0;
        std::memcpy(&b, &v, sizeof b);
        bits = bits * 1099511628211ull + b;
      }
      PEER_CHECK(checks, comm.all_same(bits));
      // Sites whose members hold the same values (synchronous inside): step 1 sends nothing, and
      // the sum still counts every member's.
      std::vector<std::int64_t> same(1001), flat_same;
      std::iota(same.begin(), same.end(), std::int64_t{sites.site_of(r)} * 100000);
      flat_same = same;
      levels.reduce(std::span<std::int64_t>(same), dt::collective::reduce_op::sum, 1,
                    [](auto& across, std::span<std::int64_t> segment) { across.all_reduce(segment); }, true);
      comm.all_reduce(std::span<std::int64_t>(flat_same));
      PEER_CHECK(checks, same == flat_same);
      std::vector<double> top(3, static_cast<double>(r));
      levels.all_reduce(std::span<double>(top), dt::collective::reduce_op::max);
      PEER_CHECK(checks, top == std::vector<double>(3, n - 1.0));
    }
    // A peer without a site: every peer fails, naming it.
    harness::expect_throws_with(checks, [&] { (void)dt::collective::agree_on_sites(comm, r == 4 ? "" : "x"); },
                                "sites: peers 4 name no site", "a peer without a site");
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 13);
}

TEST_CASE("two-level all-reduce over TCP: many chunks through small queues, a window at a time") {
  // Three peers at one site, 4 KiB chunks and 32 KiB windows, 32 MB of floats: each segment is
  // 2600 chunks, so a peer receives over 10,000 messages in the call, more than a mailbox keeps
  // expectations for, and more bytes from a member than the sockets' buffers hold; each peer may
  // queue only 256 KiB that no receive expected. Said a window at a time, every message is
  // expected before it is sent, and the call ends with the exact sum.
  const int n = 3;
  const std::size_t values = 8'000'000;
  std::vector<int> exact(n);
  const auto thrown = harness::tcp::run_each(n, [](dt::transport::tcp_options& o) {
    o.max_frame_bytes = o.max_queued_bytes = 256 << 10;
    o.budget_grace = std::chrono::milliseconds(2000);
  }, [&](dt::transport::tcp& ep) {
    dt::collective::options small;
    small.chunk_bytes = 4 << 10;
    small.window_bytes = 32 << 10;
    dt::collective::communicator comm(ep, small);
    dt::collective::two_level levels(comm, site_map::from_names(site_names({"a", "a", "a"})));
    std::vector<float> v(values, static_cast<float>(ep.rank() + 1));
    levels.all_reduce(std::span<float>(v));
    exact[static_cast<std::size_t>(ep.rank())] = std::all_of(v.begin(), v.end(), [](float x) { return x == 6.0f; });
  });
  std::vector<std::string> errors;
  for (const auto& e : thrown) errors.push_back(harness::tcp::what(e));
  for (int r = 0; r < n; ++r) {
    INFO("peer " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(exact[static_cast<std::size_t>(r)] == 1);
  }
}

TEST_CASE("two-level all-reduce: on WAN links between two sites, the bytes that cross them and the time") {
  // Two sites of 4 peers, a LAN inside each and `wan` between (100 ms, 12.5 MB/s a pair), 1M
  // floats (4 MB). Two-level: each member all-reduces a quarter with its counterpart, a ring of
  // two sending its whole segment (1 MB) once, so 8 x 1 MB cross. A flat ring in site order
  // crosses twice, each hop carrying 2 x 7/8 of the buffer: 2 x 7 MB.
  const int n = 8;
  const std::vector<int> site_of = {0, 0, 0, 0, 1, 1, 1, 1};
  const std::size_t values = 1'000'000;
  const auto links = dt::transport::links::by_site(dt::transport::links::wan(n), dt::transport::links::lan(n), site_of);
  CHECK(links.at(0, 1).latency_s == dt::transport::links::lan(n).at(0, 1).latency_s);
  CHECK(links.at(0, 4).latency_s == dt::transport::links::wan(n).at(0, 4).latency_s);
  struct outcome {
    std::uint64_t across = 0, inside = 0;
    double seconds = 0;
    bool exact = true;
  };
  auto run = [&](bool two, bool same_in_site = false) {
    dt::transport::in_process::options o;
    o.seed = 3;
    dt::transport::in_process net(links, o);
    std::vector<double> clock(n);
    std::vector<int> exact(n);
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator comm(ep);
      // (the same values at every member of a site: 1 at site a, 8 at b, summing to 36 as well)
      std::vector<float> v(values, same_in_site ? (ep.rank() < 4 ? 1.0f : 8.0f) : static_cast<float>(ep.rank() + 1));
      if (two) {
        std::vector<std::string> names;
        for (int s : site_of) names.push_back(s ? "b" : "a");
        dt::collective::two_level levels(comm, site_map::from_names(names));
        levels.reduce(std::span<float>(v), dt::collective::reduce_op::sum, 1,
                      [](auto& across, std::span<float> segment) { across.all_reduce(segment); }, same_in_site);
      } else {
        comm.all_reduce(std::span<float>(v), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
      }
      exact[static_cast<std::size_t>(ep.rank())] = std::all_of(v.begin(), v.end(), [](float x) { return x == 36.0f; });
      clock[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
    });
    outcome out;
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d)
        (site_of[static_cast<std::size_t>(s)] == site_of[static_cast<std::size_t>(d)] ? out.inside : out.across) += net.bytes_sent(s, d);
    out.seconds = *std::max_element(clock.begin(), clock.end());
    out.exact = std::all_of(exact.begin(), exact.end(), [](int e) { return e != 0; });
    return out;
  };
  const auto flat = run(false), two = run(true), same = run(true, true);
  INFO("flat: " << flat.across << " B across in " << flat.seconds << " s; two-level: " << two.across << " B across, " << two.inside
                << " B inside, in " << two.seconds << " s");
  CHECK(flat.exact);
  CHECK(two.exact);
  CHECK(two.across == 8 * values);                   // 8 members x a quarter of 4 bytes a value
  // 2 hops x 2 (n - 1) / n of the buffer, and the ring's first call agreeing on its sizes (8
  // int64 by recursive doubling, whose last exchange pairs every peer across)
  CHECK(flat.across == 2 * 2 * 7 * values / 8 * 4 + 8 * 64);
  // Steps 1 and 3 inside each site: every member sends 3 quarters (step 1), every owner its
  // quarter to 3 members (step 3). Equal values inside a site: step 3 alone.
  CHECK(two.inside == 2 * (4 * 3 + 4 * 3) * values);
  CHECK(same.exact);
  CHECK(same.across == two.across);
  CHECK(same.inside == 2 * 4 * 3 * values);
  CHECK(two.seconds < 0.5 * flat.seconds);
}
