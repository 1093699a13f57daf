// Pipeline schedules as data (parallel/schedule/): each generator's program passes the check,
// and its simulated bubble and stashed activations equal the closed forms of its paper, exactly,
// with a forward, an input half and a weight half of one unit each. The check refuses programs
// that cannot run, naming the action.
#include <catch2/catch.hpp>

#include <decentrain/parallel/link_placement.hpp>
#include <decentrain/parallel/partition.hpp>
#include <decentrain/parallel/schedule/schedule.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

namespace ps = decentrain::parallel::schedule;
using Catch::Matchers::Contains;

namespace {

// The bubble is idle / (peers x makespan); it equals num / den when idle x den == num x (peers x makespan).
bool bubble_is(const ps::timeline& t, std::int64_t num, std::int64_t den) {
  return t.idle() * den == num * t.makespan * static_cast<std::int64_t>(t.busy.size());
}

}  // namespace

TEST_CASE("schedules: GPipe and 1F1B have the bubble (S - 1) / (M + S - 1), GPipe stashes M, 1F1B min(S - s, M)") {
  for (int S : {1, 2, 4, 8})
    for (int M = std::max(S, 1); M <= 8 * S; ++M) {
      INFO("S = " << S << ", M = " << M);
      const auto g = ps::simulate(ps::gpipe(S, M));
      const auto f = ps::simulate(ps::one_f_one_b(S, M));
      CHECK(bubble_is(g, S - 1, M + S - 1));
      CHECK(bubble_is(f, S - 1, M + S - 1));
      CHECK(g.makespan == 3 * (M + S - 1));
      for (int s = 0; s < S; ++s) {
        CHECK(g.peak_stash[static_cast<std::size_t>(s)] == M);
        CHECK(f.peak_stash[static_cast<std::size_t>(s)] == std::min(S - s, M));
      }
    }
}

// The most micro-batches each peer holds between a forward and its input half (what 1F1B counts).
std::vector<int> most_before_input(const ps::program& p) {
  std::vector<int> most;
  for (const auto& list : p.actions) {
    int held = 0, peak = 0;
    for (const auto& a : list) {
      if (a.what == ps::op::forward) peak = std::max(peak, ++held);
      if (a.what == ps::op::backward_input || a.what == ps::op::backward) --held;
    }
    most.push_back(peak);
  }
  return most;
}

TEST_CASE("schedules: ZB-H1 has the bubble (S - 1) / (3M + S - 1) at 1F1B's stashed activations") {
  for (int S : {1, 2, 4, 8})
    for (int M = std::max(S, 1); M <= 8 * S; ++M) {
      INFO("S = " << S << ", M = " << M);
      const auto p = ps::zb_h1(S, M);
      const auto z = ps::simulate(p);
      CHECK(bubble_is(z, S - 1, 3 * M + S - 1));
      const auto before_input = most_before_input(p);
      for (int s = 0; s < S; ++s) {
        // As 1F1B between forward and input half; counting the weight halves owed, S on every
        // stage: 1F1B's most, on its first stage.
        CHECK(before_input[static_cast<std::size_t>(s)] == std::min(S - s, M));
        CHECK(z.peak_stash[static_cast<std::size_t>(s)] == S);
      }
    }
}

TEST_CASE("schedules: ZB-V takes 6M + S - 1 chunk actions from M = 3S/2 on, the least possible, at 1F1B's peak activations") {
  for (int S : {1, 2, 3, 4, 8, 16})
    for (int M = S; M <= 8 * S; ++M) {
      INFO("S = " << S << ", M = " << M);
      const auto p = ps::zb_v(S, M);
      REQUIRE(p.stages() == 2 * S);
      for (int s = 0; s < 2 * S; ++s) CHECK(p.peer_of[static_cast<std::size_t>(s)] == (s < S ? s : 2 * S - 1 - s));  // a V
      const auto t = ps::simulate(p);
      // Each peer runs 6M chunk actions (F, I and W of two chunks) and the last cannot start
      // before the first micro-batch's S - 1 forwards: 6M + S - 1 is the least; below 3S/2
      // micro-batches this schedule takes 4M + 4S - 2.
      CHECK(t.makespan == std::max(6 * M + S - 1, 4 * M + 4 * S - 2));
      if (2 * M >= 3 * S) CHECK(bubble_is(t, S - 1, 6 * M + S - 1));
      // At most 2S chunks' activations a peer, half a stage's each: S stages' worth, 1F1B's most.
      for (int q = 0; q < S; ++q) CHECK(t.peak_stash[static_cast<std::size_t>(q)] <= 2 * S);
      CHECK(t.peak_stash[static_cast<std::size_t>(S - 1)] == 2 * S);
    }
  // In stage time (a chunk's action half a stage's), ZB-V's step against ZB-H1's at S = 4, M = 8.
  const auto v = ps::simulate(ps::zb_v(4, 8)), h = ps::simulate(ps::zb_h1(4, 8));
  CHECK(v.makespan == 51);  // 25.5 stage units
  CHECK(h.makespan == 27);
  CHECK_THROWS_WITH(ps::by_name("zb-v", 4, 8, 1), Contains("schedule zb-v runs 2 chunk(s) per peer, not 1"));
}

TEST_CASE("schedules: with other costs ZB-H1 is never slower than 1F1B, and a transfer time lengthens both") {
  for (const ps::costs c : {ps::costs{1, 1, 1, 0}, ps::costs{2, 3, 2, 0}, ps::costs{3, 2, 1, 1}, ps::costs{1, 2, 2, 2}}) {
    const auto f = ps::simulate(ps::one_f_one_b(4, 8), c);
    const auto z = ps::simulate(ps::zb_h1(4, 8), c);
    INFO("costs F " << c.forward << " B " << c.backward_input << " W " << c.backward_weight << " transfer " << c.transfer);
    CHECK(z.makespan <= f.makespan);
    for (std::size_t s = 0; s < 4; ++s) {
      CHECK(f.busy[s] == 8 * (c.forward + c.backward_input + c.backward_weight));
      CHECK(z.busy[s] == f.busy[s]);
    }
  }
  // GPipe's forwards reach the last stage (S - 1) transfers late and its backwards the first
  // (S - 1) more: 2 (S - 1) t added to 3 (M + S - 1). 1F1B's forward and backward take turns, so
  // it waits on transfers in its steady state too.
  ps::costs slow_link;
  slow_link.transfer = 5;
  CHECK(ps::simulate(ps::gpipe(4, 8), slow_link).makespan == 3 * (8 + 3) + 2 * 3 * 5);
  CHECK(ps::simulate(ps::one_f_one_b(4, 8), slow_link).makespan > 3 * (8 + 3) + 2 * 3 * 5);
}

TEST_CASE("schedules: the check refuses a program that cannot run, naming the action") {
  auto p = ps::one_f_one_b(2, 2);
  SECTION("a forward missing") {
    p.actions[1].erase(p.actions[1].begin());
    CHECK_THROWS_WITH(ps::check(p), Contains("micro-batch 0 on stage 1 goes forward 0 times"));
  }
  SECTION("a backward twice") {
    p.actions[0].push_back({ps::op::backward, 1, 0});
    CHECK_THROWS_WITH(ps::check(p), Contains("micro-batch 1 on stage 0 goes backward 2 times whole"));
  }
  SECTION("a stage run by a peer that does not hold it") {
    p.actions[0][0].stage = 1;
    CHECK_THROWS_WITH(ps::check(p), Contains("peer 0 runs F0@1 but stage 1 is held by peer 1"));
  }
  SECTION("half a backward") {
    p.actions[1].back().what = ps::op::backward_input;
    CHECK_THROWS_WITH(ps::check(p), Contains("micro-batch 1 on stage 1 goes backward 0 times whole, 1 times for its input gradient and 0"));
  }
  SECTION("a micro-batch out of range") {
    p.actions[0][0].micro = 2;
    CHECK_THROWS_WITH(ps::check(p), Contains("a micro-batch outside [0, 2)"));
  }
  SECTION("peers that wait on each other") {
    // Stage 0 runs its backward of micro-batch 0 before its forward of micro-batch 1, while
    // stage 1 wants micro-batch 1's forward first: each waits on the other.
    p.actions[0] = {{ps::op::forward, 0, 0}, {ps::op::backward, 0, 0}, {ps::op::forward, 1, 0}, {ps::op::backward, 1, 0}};
    p.actions[1] = {{ps::op::forward, 0, 1}, {ps::op::forward, 1, 1}, {ps::op::backward, 0, 1}, {ps::op::backward, 1, 1}};
    CHECK_THROWS_WITH(ps::check(p), Contains("peer 0 at B0@0 waits on I0@1") && Contains("peer 1 at F1@1 waits on F1@0"));
  }
  CHECK_THROWS_WITH(ps::gpipe(0, 4), Contains("schedule gpipe: needs at least one peer"));
  CHECK_THROWS_WITH(ps::zb_h1(4, 0), Contains("schedule zb-h1: needs at least one micro-batch, got 0"));
}

TEST_CASE("partition: the cut that makes the slowest stage fastest, against every cut, and the even cut on uneven ends") {
  namespace par = decentrain::parallel;
  // Every cut of n blocks into S stages, by brute force: the smallest slowest stage.
  const auto brute = [](const par::model_costs& c, int S) {
    const int n = static_cast<int>(c.blocks.size());
    double best = 1e300;
    std::vector<std::int64_t> cut(static_cast<std::size_t>(S), 1);
    const std::function<void(int, int)> go = [&](int s, int left) {
      if (s == S - 1) {
        cut[static_cast<std::size_t>(s)] = left;
        const auto costs = par::stage_costs(c, cut);
        best = std::min(best, *std::max_element(costs.begin(), costs.end()));
        return;
      }
      for (int k = 1; k <= left - (S - 1 - s); ++k) {
        cut[static_cast<std::size_t>(s)] = k;
        go(s + 1, left - k);
      }
    };
    go(0, n);
    return best;
  };
  std::uint64_t x = 12345;
  const auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>((x >> 33) % 100) + 1.0;
  };
  for (int trial = 0; trial < 200; ++trial) {
    par::model_costs c;
    const int n = 1 + trial % 8;
    for (int i = 0; i < n; ++i) c.blocks.push_back(next());
    c.first_extra = trial % 3 == 0 ? next() : 0.0;
    c.last_extra = trial % 2 == 0 ? 3 * next() : 0.0;
    const int S = 1 + trial % n;
    const auto cut = par::partition(c, S);
    INFO("trial " << trial << ": " << n << " blocks, " << S << " stages");
    REQUIRE(cut.size() == static_cast<std::size_t>(S));
    CHECK(std::accumulate(cut.begin(), cut.end(), std::int64_t{0}) == n);
    CHECK(*std::min_element(cut.begin(), cut.end()) >= 1);
    const auto costs = par::stage_costs(c, cut);
    CHECK(*std::max_element(costs.begin(), costs.end()) == brute(c, S));
  }
  // Equal blocks and no extras: the even cut. A last stage that costs three blocks more: it
  // takes fewer blocks, and the slowest stage is faster than the even cut's.
  par::model_costs even{std::vector<double>(12, 1.0), 0, 0};
  CHECK(par::partition(even, 4) == std::vector<std::int64_t>{3, 3, 3, 3});
  par::model_costs heavy_head{std::vector<double>(12, 1.0), 0, 3};
  const auto cut = par::partition(heavy_head, 4);
  const auto slowest = [&](const std::vector<std::int64_t>& k) {
    const auto s = par::stage_costs(heavy_head, k);
    return *std::max_element(s.begin(), s.end());
  };
  CHECK(slowest(cut) == 4.0);
  CHECK(slowest({3, 3, 3, 3}) == 6.0);
  CHECK_THROWS_WITH(par::partition(even, 13), Contains("13 stages for 12 blocks"));
}

TEST_CASE("schedules: simulated with each stage's own costs, a slow stage sets the pace") {
  // GPipe, S = 2, M = 2; stage 0: forward 1, backward 1 + 1; stage 1 twice that. By hand:
  // stage 1 runs F0 1-3, F1 3-5, B0 5-9, B1 9-13; stage 0 F0 0-1, F1 1-2, B0 9-11, B1 13-15.
  const auto t = ps::simulate(ps::gpipe(2, 2), std::vector<ps::costs>{{1, 1, 1, 0}, {2, 2, 2, 0}});
  CHECK(t.makespan == 15);
  CHECK(t.busy == std::vector<std::int64_t>{6, 12});
  CHECK_THROWS_WITH(ps::simulate(ps::gpipe(2, 2), std::vector<ps::costs>{{1, 1, 1, 0}}),
                    Contains("1 stages' costs for a program of 2 stages"));
}

TEST_CASE("schedules: interleaved 1F1B with v chunks has the bubble (S - 1) / (vM + S - 1) and needs M % S == 0") {
  for (int S : {1, 2, 4, 8})
    for (int v : {1, 2, 3})
      for (int M = S; M <= 8 * S; M += S) {
        INFO("S = " << S << ", v = " << v << ", M = " << M);
        const auto p = ps::interleaved(S, M, v);
        REQUIRE(p.stages() == S * v);
        const auto t = ps::simulate(p);
        CHECK(bubble_is(t, S - 1, v * M + S - 1));
        // Peer 0 runs (S - 1) x 2 + (v - 1) x S forwards ahead, and holds one more in the steady phase.
        if (v > 1) CHECK(t.peak_stash[0] == std::min((S - 1) * 2 + (v - 1) * S + 1, v * M));
      }
  CHECK_THROWS_WITH(ps::interleaved(4, 6, 2), Contains("micro-batches (6) must be a multiple of the peers (4)"));
  CHECK_THROWS_WITH(ps::by_name("1f1b", 4, 8, 2), Contains("runs 1 chunk(s) per peer, not 2"));
}

TEST_CASE("placement by links: the search finds the best of every placement on a small world, and beats rank order") {
  namespace dp = decentrain::parallel;
  // Two regions, the even ranks and the odd ones: 1 GB/s and 1 ms within a region, 10 MB/s and
  // 50 ms between. In rank order every pipeline hop crosses between regions.
  const auto regions = [](int world) {
    dp::link_table links(world);
    for (int a = 0; a < world; ++a)
      for (int b = 0; b < world; ++b)
        links.at(a, b) = a % 2 == b % 2 ? dp::link_estimate{0.001, 1e9} : dp::link_estimate{0.05, 1e7};
    return links;
  };
  dp::pipeline_traffic t;
  t.micro_batches = 4;
  t.activation_bytes = 4e6;  // 4 micro-batches' streams and gradients a step outweigh the stages' 1 MB
  const ps::costs stage{.forward = 10000, .backward_input = 10000, .backward_weight = 10000};  // 10 ms each
  t.compute = {stage, stage};
  t.parameter_bytes = {1e6, 1e6};
  {
    const auto links = regions(4);  // 2 stages x 2 copies: every placement, by brute force
    std::vector<int> perm{0, 1, 2, 3};
    double best = 1e30;
    do best = std::min(best, dp::step_seconds({{perm[0], perm[1]}, {perm[2], perm[3]}}, links, t));
    while (std::next_permutation(perm.begin(), perm.end()));
    const auto found = dp::place_by_links(links, t, 2, 1, 4);
    dp::check_grid(found, 2, 4);
    CHECK(dp::step_seconds(found, links, t) == Approx(best).epsilon(1e-12));
    CHECK(dp::step_seconds(dp::rank_order(2, 2), links, t) > 2 * best);
    for (std::size_t c = 0; c < 2; ++c) CHECK(found[0][c] % 2 == found[1][c] % 2);  // each copy within a region
  }
  {
    const auto links = regions(16);  // 4 stages x 4 copies: better than rank order and than 200 random placements
    t.compute = {stage, stage, stage, stage};
    t.parameter_bytes = {1e6, 1e6, 1e6, 1e6};
    const auto found = dp::place_by_links(links, t, 4, 1, 2);
    dp::check_grid(found, 4, 16);
    const double mine = dp::step_seconds(found, links, t);
    CHECK(mine < 0.5 * dp::step_seconds(dp::rank_order(4, 4), links, t));
    std::mt19937_64 gen(7);
    for (int i = 0; i < 200; ++i) CHECK(mine <= dp::step_seconds(dp::random_grid(4, 4, gen), links, t));
    for (std::size_t c = 0; c < 4; ++c)
      for (std::size_t s = 1; s < 4; ++s) CHECK(found[s][c] % 2 == found[0][c] % 2);
  }
  // A grid that is not a placement of the world is refused, naming why.
  CHECK_THROWS_WITH(dp::check_grid({{0, 1, 2}, {3, 4, 4}}, 2, 6), Contains("must hold each of the 6 ranks once"));
  CHECK_THROWS_WITH(dp::check_grid({{0, 1, 2}, {3, 4}}, 2, 6), Contains("as many copies as stage 0"));
  CHECK_THROWS_WITH(dp::place_by_links(regions(6), t, 4), Contains("6 peers do not divide into copies of 4 stages"));
}
