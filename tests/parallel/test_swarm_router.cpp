// SWARM's router: shares of micro-batches proportional to the peers' measured throughput, a
// change of speed followed within a few micro-batches, noise not taken for one, its state resumed.
#include <catch2/catch.hpp>

#include <decentrain/core/rng.hpp>
#include <decentrain/io/checkpoint.hpp>
#include <decentrain/parallel/swarm/router.hpp>
#include <decentrain/transport/in_process.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace dt = decentrain;
using dt::parallel::pools::router;

namespace {
// Routes `micro_batches` through `r` to peers of the given speeds (samples per second), each
// round trip off by up to +-`noise` (uniform), and returns each peer's count.
std::map<int, int> route(router& r, const std::vector<double>& speeds, int micro_batches, double noise, dt::rng& gen) {
  std::map<int, int> count;
  for (int i = 0; i < micro_batches; ++i) {
    const auto peer = r.next();
    REQUIRE(peer.has_value());
    ++count[*peer];
    const double seconds = 1.0 / speeds[static_cast<std::size_t>(*peer)] * (1 + noise * (2 * gen.uniform() - 1));
    r.measured(*peer, seconds);
  }
  return count;
}
// The largest relative distance of a peer's share from its speed's share.
double worst_share_error(const std::map<int, int>& count, const std::vector<double>& speeds) {
  double total_speed = 0, total = 0, worst = 0;
  for (const double s : speeds) total_speed += s;
  for (const auto& [peer, n] : count) total += n;
  for (std::size_t p = 0; p < speeds.size(); ++p) {
    const auto it = count.find(static_cast<int>(p));
    const double share = (it == count.end() ? 0 : it->second) / total, want = speeds[p] / total_speed;
    worst = std::max(worst, std::abs(share - want) / want);
  }
  return worst;
}
}  // namespace

TEST_CASE("swarm router: shares follow the peers' speeds within 3%, and a 4x change within 50 micro-batches") {
  const auto speeds0 = dt::transport::speeds::spread(4, 3);  // 1x to 4x
  router r;
  for (int p = 0; p < 4; ++p) r.add(p);
  dt::rng gen(11, "router-test");
  const auto first = route(r, speeds0, 1000, 0.2, gen);
  INFO("first 1000: worst share error " << worst_share_error(first, speeds0));
  CHECK(worst_share_error(first, speeds0) < 0.03);
  CHECK(r.restarts() == 0);  // +-20% noise is not a change of speed

  // The fastest peer becomes 4x slower: after 50 micro-batches its share is its new speed's.
  auto speeds1 = speeds0;
  const auto fastest = static_cast<std::size_t>(std::max_element(speeds0.begin(), speeds0.end()) - speeds0.begin());
  speeds1[fastest] /= 4;
  (void)route(r, speeds1, 50, 0.2, gen);
  const auto after = route(r, speeds1, 1000, 0.2, gen);
  INFO("after the change: worst share error " << worst_share_error(after, speeds1));
  CHECK(worst_share_error(after, speeds1) < 0.03);
  CHECK(r.restarts() == 1);
  CHECK(r.throughput(static_cast<int>(fastest)) == Approx(speeds1[fastest]).epsilon(0.1));

  // Ten micro-batches after such a change, the router knows the new speed; a moving average
  // with alpha 0.1 alone (SWARM's balancer: no restart) still expects about twice it.
  dt::parallel::pools::router_settings plain;
  plain.change_ratio = 1e9;
  router restarting, averaging(plain);
  for (int p = 0; p < 4; ++p) restarting.add(p), averaging.add(p);
  dt::rng gen_a(5, "router-test"), gen_b(5, "router-test");
  (void)route(restarting, speeds0, 1000, 0.2, gen_a);
  (void)route(averaging, speeds0, 1000, 0.2, gen_b);
  (void)route(restarting, speeds1, 10, 0.2, gen_a);
  (void)route(averaging, speeds1, 10, 0.2, gen_b);
  const int f = static_cast<int>(fastest);
  INFO("after 10: restarting " << restarting.throughput(f) << ", averaging " << averaging.throughput(f) << ", true " << speeds1[fastest]);
  CHECK(restarting.throughput(f) == Approx(speeds1[fastest]).epsilon(0.2));
  CHECK(averaging.throughput(f) > 1.5 * speeds1[fastest]);
}

TEST_CASE("swarm router: interleaved picks, exclusions, joiners, and a state that resumes the same picks") {
  router r;
  for (int p = 0; p < 3; ++p) r.add(p);
  r.measured(0, 1.0);
  r.measured(1, 0.5);  // twice as fast
  r.measured(2, 0.5);
  // Interleaved: within any 5 picks, peer 0 (a fifth of the throughput) goes once.
  std::vector<int> picks;
  for (int i = 0; i < 20; ++i) picks.push_back(*r.next());
  for (std::size_t at = 0; at + 5 <= picks.size(); at += 5)
    CHECK(std::count(picks.begin() + static_cast<std::ptrdiff_t>(at), picks.begin() + static_cast<std::ptrdiff_t>(at + 5), 0) == 1);
  // Excluded peers are skipped; all excluded: none.
  for (int i = 0; i < 10; ++i) CHECK(*r.next({1}) != 1);
  CHECK(!r.next({0, 1, 2}).has_value());
  // A joiner is assumed as fast as the mean of the measured: (1 + 2 + 2) / 3 samples/s.
  r.add(7);
  CHECK(r.throughput(7) == Approx(5.0 / 3));
  CHECK(!r.expected_seconds(7).has_value());
  CHECK(*r.expected_seconds(1, 4) == Approx(2.0));

  // Saved and loaded, the next picks are the same.
  dt::io::checkpoint c;
  r.save(c, "swarm.");
  router resumed;
  resumed.load(c, "swarm.");
  for (int i = 0; i < 50; ++i) {
    const auto a = r.next(), b = resumed.next();
    REQUIRE(a == b);
    r.measured(*a, 0.3 + 0.01 * i);
    resumed.measured(*b, 0.3 + 0.01 * i);
  }
  dt::io::checkpoint bad;
  bad.text["swarm.router"] = "0 zz";
  CHECK_THROWS_WITH(resumed.load(bad, "swarm."), Catch::Contains("the checkpoint's entry '0 zz' is malformed"));
  CHECK_THROWS_WITH(resumed.load(dt::io::checkpoint{}, "swarm."), Catch::Contains("the checkpoint has no 'swarm.router'"));
  CHECK_THROWS_WITH(r.measured(0, -1.0), Catch::Contains("needs seconds > 0"));
  dt::parallel::pools::router_settings s;
  s.alpha = 0;
  CHECK_THROWS_WITH(router(s), Catch::Contains("alpha must be in (0, 1], got 0"));
}
