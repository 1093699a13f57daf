// Shares of a partitioned all-reduce balanced by bandwidth: hand-computed optima, the model's
// minimum against other shares, whole counts, agreement across peers, and on simulated links a
// slow peer that no longer paces the rest.
#include <catch2/catch.hpp>

#include <decentrain/collective/balanced_all_reduce.hpp>
#include <decentrain/core/rng.hpp>
#include <decentrain/transport/in_process.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
using dt::collective::peer_capacity;

namespace {
std::vector<peer_capacity> capacities(std::initializer_list<double> bytes_per_s) {
  std::vector<peer_capacity> out;
  for (double b : bytes_per_s) out.push_back({b, true});
  return out;
}
double slowest(const std::vector<double>& shares, const std::vector<peer_capacity>& peers) {
  return dt::collective::partitioned_seconds(shares, peers, 1.0);
}
}  // namespace

TEST_CASE("balanced shares: the hand-computed optimum, client mode, and bad capacities") {
  using dt::collective::balanced_shares;
  // Equal peers: equal shares, each peer at (1 + 2 x 1/4) / 1 = 1.5 s per byte.
  const auto even = capacities({1, 1, 1, 1});
  const auto s_even = balanced_shares(even);
  for (double s : s_even) CHECK(s == Approx(0.25));
  CHECK(slowest(s_even, even) == Approx(1.5));
  // 1, 2 and 4 bytes/s among three: the slowest spends 1 s sending its values and receiving the
  // result whatever happens; the other two stay within that level with shares up to
  // (1 x b - 1) / 1, so 1 and 3 (capped at 1): scaled to add up to 1, half each.
  const auto three = capacities({1, 2, 4});
  const auto s_three = balanced_shares(three);
  CHECK(s_three[0] == Approx(0.0));
  CHECK(s_three[1] == Approx(0.5));
  CHECK(s_three[2] == Approx(0.5));
  CHECK(slowest(s_three, three) == Approx(1.0));
  CHECK(slowest(dt::collective::equal_shares(3), three) == Approx(4.0 / 3.0));  // 1/3 more on the slowest
  // 1, 1, 1, 4 among four: at the floor of 1 s the fast peer can take it all ((1 + 2) / 4 = 0.75).
  const auto one_fast = capacities({1, 1, 1, 4});
  const auto s_fast = balanced_shares(one_fast);
  CHECK(s_fast[3] == Approx(1.0));
  CHECK(slowest(s_fast, one_fast) == Approx(1.0));
  // 2, 2, 3, 3 among four, above the floor of 1/2: each peer at level L takes (b L - 1) / 2, and
  // (2L - 1) + (3L - 1) = 1 gives L = 3/5, shares 0.1 and 0.4.
  const auto mixed = capacities({2, 2, 3, 3});
  const auto s_mixed = balanced_shares(mixed);
  CHECK(slowest(s_mixed, mixed) == Approx(0.6));
  CHECK(s_mixed[0] == Approx(0.1));
  CHECK(s_mixed[2] == Approx(0.4));
  CHECK(std::accumulate(s_mixed.begin(), s_mixed.end(), 0.0) == Approx(1.0));
  // Client mode: a peer that accepts no connections reduces nothing, however fast.
  std::vector<peer_capacity> client = capacities({10, 10, 10});
  client[1].aggregates = false;
  const auto s_client = balanced_shares(client);
  CHECK(s_client[0] == Approx(0.5));
  CHECK(s_client[1] == 0.0);
  CHECK(s_client[2] == Approx(0.5));
  // Two peers move the whole buffer each way whatever the shares: by bandwidth, then.
  const auto two = balanced_shares(capacities({1, 3}));
  CHECK(two[0] == Approx(0.25));
  CHECK(balanced_shares(capacities({5}))[0] == 1.0);
  CHECK_THROWS_WITH(balanced_shares(capacities({1, 0, 1})), Catch::Contains("peer 1's bandwidth must be a number > 0, got 0"));
  CHECK_THROWS_WITH(balanced_shares(std::vector<peer_capacity>{{1, false}, {2, false}}),
                    Catch::Contains("no peer aggregates"));
}

TEST_CASE("balanced shares: no other shares make the slowest peer faster, by the model") {
  // Random capacities over two decades (as links::heterogeneous draws them), and against each
  // optimum 200 random shares and 200 small moves away from it.
  dt::rng gen(7, "balanced-shares");
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 3 + trial % 14;
    std::vector<peer_capacity> peers(static_cast<std::size_t>(n));
    for (auto& p : peers) p = {1.25e6 * std::pow(100.0, gen.uniform()), gen.uniform() > 0.1};
    peers[static_cast<std::size_t>(trial) % peers.size()].aggregates = true;
    const auto best = dt::collective::balanced_shares(peers);
    const double level = slowest(best, peers);
    CHECK(std::accumulate(best.begin(), best.end(), 0.0) == Approx(1.0));
    CHECK(level <= slowest(dt::collective::equal_shares(n), peers) * (1 + 1e-12));
    int beaten = 0;
    for (int k = 0; k < 400; ++k) {
      std::vector<double> other(best.size());
      double total = 0;
      for (std::size_t i = 0; i < other.size(); ++i) {
        other[i] = !peers[i].aggregates ? 0.0 : k < 200 ? gen.uniform() : std::max(0.0, best[i] + 0.01 * (gen.uniform() - 0.5));
        total += other[i];
      }
      for (auto& o : other) o /= total;
      if (slowest(other, peers) < level * (1 - 1e-9)) ++beaten;
    }
    CHECK(beaten == 0);
  }
}

TEST_CASE("balanced shares: whole counts add up to the buffer, the largest remainders first") {
  using dt::collective::counts_for;
  CHECK(counts_for(std::vector<double>{0.5, 0.0, 0.5}, 7) == std::vector<std::size_t>{4, 0, 3});
  CHECK(counts_for(std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3}, 10) == std::vector<std::size_t>{4, 3, 3});
  CHECK(counts_for(std::vector<double>{0.1, 0.9}, 3) == std::vector<std::size_t>{0, 3});
  CHECK(counts_for(std::vector<double>{0.25, 0.75}, 0) == std::vector<std::size_t>{0, 0});
  CHECK(counts_for(std::vector<double>{0.0, 1.0}, 5) == std::vector<std::size_t>{0, 5});
  CHECK_THROWS_WITH(counts_for(std::vector<double>{0.0, 0.0}, 5), Catch::Contains("the shares add up to 0"));
  CHECK_THROWS_WITH(counts_for(std::vector<double>{-0.5, 1.5}, 5), Catch::Contains("share 0 must be >= 0, got -0.5"));
}

TEMPLATE_TEST_CASE("balanced all-reduce: peers agree on the shares from what each states, and sum exactly", "[collective]",
                   TRANSPORTS) {
  const int n = 5;
  harness::peer_checks checks;
  std::vector<peer_capacity> stated(n);
  for (int r = 0; r < n; ++r) stated[static_cast<std::size_t>(r)] = {1e6 * (r + 1), r != 2};
  const auto expected = dt::collective::balanced_shares(stated);
  TestType::run(n, [&](auto& ep) {
    dt::collective::communicator comm(ep);
    const int r = ep.rank();
    const auto shares = dt::collective::agree_on_shares(comm, stated[static_cast<std::size_t>(r)]);
    PEER_CHECK(checks, shares == expected);  // bit for bit
    PEER_CHECK(checks, shares[2] == 0.0);
    std::vector<std::int64_t> v(10007);
    std::iota(v.begin(), v.end(), std::int64_t{r});
    dt::collective::balanced_all_reduce(comm, std::span<std::int64_t>(v), std::span<const double>(shares));
    bool exact = true;
    for (std::size_t i = 0; i < v.size(); ++i) exact = exact && v[i] == static_cast<std::int64_t>(n * i + n * (n - 1) / 2);
    PEER_CHECK(checks, exact);
    harness::expect_throws_with(checks, [&] { (void)dt::collective::agree_on_shares(comm, {0.0, true}); },
                                "this peer's bandwidth must be a number > 0, got 0", "a bandwidth of 0");
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 4);
}

TEST_CASE("balanced all-reduce: on simulated links a slow peer reduces less and no longer paces the rest") {
  // Eight peers, one on 10 Mbit/s and seven on 1 Gbit/s, 10 ms links, 4 MB of floats: S / b = 3.2 s
  // on the slow connection. With equal shares the slow peer moves (1 + 6/8) S each way: at least
  // 5.6 s. Balanced, it reduces nothing: it sends S (3.2 s), and the results come back as each
  // aggregator finishes, the last one's S/7 after its values left: (1 + 1/7) 3.2 = 3.66 s.
  using dt::transport::access_link;
  const double slow = 1.25e6, fast = 125e6;
  const int n = 8;
  dt::transport::link_matrix links(n, dt::transport::simulated_link{0.01, 1e12});
  std::vector<peer_capacity> peers;
  for (int r = 0; r < n; ++r) {
    const double b = r == 1 ? slow : fast;
    links.access(r) = access_link{b, b};
    peers.push_back({b, true});
  }
  const std::size_t values = 1'000'000;
  const double bytes = values * sizeof(float), floor_s = bytes / slow;
  auto run = [&](const std::vector<double>& shares) {
    dt::transport::in_process net(links);
    std::vector<double> clock(n);
    std::vector<int> exact(n);
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator comm(ep);
      std::vector<float> v(values, static_cast<float>(ep.rank() + 1));
      dt::collective::balanced_all_reduce(comm, std::span<float>(v), std::span<const double>(shares));
      exact[static_cast<std::size_t>(ep.rank())] = std::all_of(v.begin(), v.end(), [](float x) { return x == 36.0f; });
      clock[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
    });
    CHECK(std::all_of(exact.begin(), exact.end(), [](int e) { return e != 0; }));
    return *std::max_element(clock.begin(), clock.end());
  };
  const auto balanced = dt::collective::balanced_shares(peers);
  CHECK(balanced[1] == 0.0);
  const double equal_s = run(dt::collective::equal_shares(n)), balanced_s = run(balanced);
  INFO("equal shares " << equal_s << " s, balanced " << balanced_s << " s, S / b " << floor_s << " s");
  CHECK(equal_s >= 1.75 * floor_s);
  CHECK(balanced_s >= floor_s);
  CHECK(balanced_s <= (1.0 + 1.0 / 7) * floor_s + 0.1);  // + latencies
}
