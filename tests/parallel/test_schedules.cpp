// Pipeline schedules as data (parallel/schedule/): each generator's program passes the check,
// and its simulated bubble and stashed activations equal the closed forms of its paper, exactly,
// with a forward, an input half and a weight half of one unit each. The check refuses programs
// that cannot run, naming the action.
#include <catch2/catch.hpp>

#include <decentrain/parallel/schedule/schedule.hpp>

#include <algorithm>
#include <cstdint>

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

TEST_CASE("schedules: ZB-H1 has the bubble (S - 1) / (3M + S - 1) at 1F1B's stashed activations") {
  for (int S : {1, 2, 4, 8})
    for (int M = std::max(S, 1); M <= 8 * S; ++M) {
      INFO("S = " << S << ", M = " << M);
      const auto z = ps::simulate(ps::zb_h1(S, M));
      CHECK(bubble_is(z, S - 1, 3 * M + S - 1));
      for (int s = 0; s < S; ++s) CHECK(z.peak_stash[static_cast<std::size_t>(s)] == std::min(S - s, M));
    }
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
