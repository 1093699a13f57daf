// Work sized to speed on simulated peers of different speeds (deterministic in_process: a peer's
// inner step costs step_seconds / speed of its clock). DiLoCo's sized_to_speed (DyLU): each
// replica takes inner steps in proportion to its speed (sized after its first step), its rows of its
// own for each, its pseudo-gradient weighed by its rows; and a run resumed mid-round ends as
// the whole run does. Sync's target batch (hivemind's rule): each replica adds up micro-batches
// in proportion to its speed, their mean gradient weighed by its rows, one exchange a step.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

dt::transport::in_process timed_peers(std::vector<double> speeds) {
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};  // an inner step: 1 s / speed
  const int world = static_cast<int>(speeds.size());
  o.speeds = std::move(speeds);
  return dt::transport::in_process(dt::transport::links::ideal(world), o);
}

dt::train::trainer_options run_of(std::int64_t steps) {
  auto o = fixture::small_run(steps);
  o.batch_size = 2;
  o.lr = 1e-2;  // replicas far enough apart that the weights show
  return o;
}

struct sized_run {
  std::vector<std::vector<float>> params;                // by rank, at the end
  std::vector<std::vector<std::int64_t>> inner_steps;    // by rank, each step's round_inner_steps()
  std::vector<std::vector<dt::train::step_metrics>> by_step;  // by rank
};

// Trains peers of `speeds` under the policy (DiLoCo wrapped in fixture::probe records each peer's
// parameters before the last exchange into *before_last), from `saved` where given, stopping
// after `stop_after` steps (returning each peer's checkpoint in *saved_out) where >= 0.
template <class Policy>
sized_run train(const std::vector<double>& speeds, const Policy& policy, std::int64_t steps,
                        const std::vector<dt::io::checkpoint>* saved = nullptr, std::int64_t stop_after = -1,
                        std::vector<dt::io::checkpoint>* saved_out = nullptr) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Policy>;
  const auto n = speeds.size();
  sized_run out{std::vector<std::vector<float>>(n), std::vector<std::vector<std::int64_t>>(n),
                        std::vector<std::vector<dt::train::step_metrics>>(n)};
  if (saved_out) saved_out->assign(n, {});
  timed_peers(speeds).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    Trainer t(fixture::tiny_gpt(), run_of(steps), ep, policy);
    if (saved) t.restore((*saved)[r]);
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {  // (each peer writes its own slot)
      if constexpr (requires { t.policy().inner.round_inner_steps(); })
        out.inner_steps[r].push_back(t.policy().inner.round_inner_steps());
      out.by_step[r].push_back(m);
      if (m.step == stop_after) {
        (*saved_out)[r] = t.capture();
        throw stop{};
      }
    });
    try {
      (void)t.fit(fixture::small_corpus().data);
    } catch (const stop&) {
    }
    out.params[r] = fixture::flat_params(t.model().parameters());
  });
  return out;
}

fixture::probe<dt::comm::diloco<dt::comm::outer::sgd>> sized(std::int64_t h, std::vector<std::vector<float>>* before_last = nullptr) {
  fixture::probe<dt::comm::diloco<dt::comm::outer::sgd>> p;
  p.inner.inner_steps = h;
  p.inner.sized_to_speed = true;
  p.inner.headroom = 0;  // (compute on the simulated clock is exact: the counts are the speeds')
  p.before_last = before_last;
  return p;
}

}  // namespace

TEST_CASE("diloco sized_to_speed: a peer 4x as fast takes 4H inner steps a round, and waits no more") {
  // H = 4, three rounds. Step 0: one inner step each (nothing measured yet); the first round's
  // other steps are sized at once: the fast peer takes 4 in each (3.25 s of compute in the
  // round's 4). Rounds 2 and 3: 16 inner steps, 4 s of compute a round, as the slow one's 4 take.
  const auto run = train({1, 4}, sized(4), 12);
  for (std::size_t r = 0; r < 2; ++r) REQUIRE(run.by_step[r].size() == 12);
  CHECK(run.inner_steps[0].back() == 4);
  CHECK(run.inner_steps[1][0] == 16);  // sized after step 0
  CHECK(run.inner_steps[1].back() == 16);
  const auto& slow = run.by_step[0];
  const auto& fast = run.by_step[1];
  CHECK(slow.back().compute_s == Approx(12.0));
  CHECK(fast[0].compute_s == Approx(0.25));
  CHECK(fast[3].compute_s == Approx(3.25));
  CHECK(fast.back().compute_s == Approx(3.25 + 4.0 + 4.0));
  // Ideal links: the exchanges take no time, so the clocks are the slow peer's compute.
  CHECK(fast.back().clock_s == Approx(12.0));
  // From step 1 on, the fast peer computes the whole time: 11 s of the last 11.
  CHECK(fast.back().compute_s - fast[0].compute_s == Approx(fast.back().clock_s - fast[0].clock_s));
  CHECK(fast.back().compute_s - fast[0].compute_s == Approx(11.0));

  // With the default headroom (5%) each round's deadline is 21 of the slow peer's inner steps for
  // H = 20, which it fills too (an inner step more in the round), as the fast peer fills its 84.
  auto margin = sized(20);
  margin.inner.headroom = 0.05;
  const auto with_margin = train({1, 4}, margin, 40);
  REQUIRE(with_margin.by_step[1].size() == 40);
  CHECK(with_margin.inner_steps[0].back() == 21);
  CHECK(with_margin.inner_steps[1].back() == 84);
  // (the first round: step 0 unsized, then 19 steps whose deadline of 19.95 s it fills with 20)
  CHECK(with_margin.by_step[0].back().compute_s == Approx(1.0 + 20.0 + 21.0));
  const auto& busy = with_margin.by_step[1];
  CHECK(busy.back().compute_s - busy[0].compute_s == Approx(busy.back().clock_s - busy[0].clock_s));

  // Unsized, the fast peer computes a quarter of the time.
  auto equal = sized(4);
  equal.inner.sized_to_speed = false;
  const auto plain = train({1, 4}, equal, 12);
  CHECK(plain.by_step[1].back().compute_s == Approx(3.0));
  CHECK(plain.by_step[1].back().clock_s == Approx(12.0));
  CHECK(plain.inner_steps[1].back() == 4);

  // Peers of one speed: one inner step a step, and the same run as weighted DiLoCo.
  const auto even = train({2, 2}, sized(4), 12);
  auto weighted = sized(4);
  weighted.inner.sized_to_speed = false;
  weighted.inner.weighted = true;
  const auto same = train({2, 2}, weighted, 12);
  CHECK(even.inner_steps[1].back() == 4);
  CHECK(even.params == same.params);
}

TEST_CASE("diloco sized_to_speed: a peer with twice the rows counts twice in the average") {
  // Speeds 1 and 2, H = 2, two rounds, outer SGD with lr 1 and no momentum: the new global
  // parameters are the rows-weighted mean of the replicas' parameters before the exchange. In
  // round 2 peer 1 takes 4 inner steps of 2 rows to peer 0's 2 (in round 1, 3 to 2).
  std::vector<std::vector<float>> before(2);
  const auto run = train({1, 2}, sized(2, &before), 4);
  REQUIRE(run.inner_steps[1].back() == 4);
  std::vector<float> by_rows(before[0].size()), mean(before[0].size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    by_rows[i] = (1.0f * before[0][i] + 2.0f * before[1][i]) / 3.0f;
    mean[i] = (before[0][i] + before[1][i]) / 2.0f;
  }
  const double tolerance = 2e-6;
  for (std::size_t r = 0; r < 2; ++r) CHECK(fixture::max_abs_diff(run.params[r], by_rows) < tolerance);
  CHECK(fixture::max_abs_diff(by_rows, mean) > 100 * tolerance);
}

TEST_CASE("diloco sized_to_speed: a run stopped mid-round and resumed ends bit for bit as the whole run") {
  // Speeds 1 and 3, H = 3, three rounds; stopped after step 4 (in round 2, where peer 1 takes
  // 9 inner steps spread 3 a step): the round's sizing and what it has measured so far are in
  // the checkpoint.
  const auto policy = sized(3);
  const auto whole = train({1, 3}, policy, 9);
  std::vector<dt::io::checkpoint> saved;
  (void)train({1, 3}, policy, 9, nullptr, 4, &saved);
  REQUIRE(saved[1].counter("comm.diloco.speed_round_steps") == 9);
  const auto resumed = train({1, 3}, policy, 9, &saved);
  CHECK(resumed.params == whole.params);
  CHECK(whole.inner_steps[1].back() == 9);

  // A checkpoint whose measurement is not a number is refused, naming the key.
  saved[0].text["comm.diloco.speed_compute_s"] = "fast";
  CHECK_THROWS_WITH(train({1, 3}, policy, 9, &saved), Catch::Matchers::Contains("'comm.diloco.speed_compute_s' is 'fast'"));
}

namespace {
dt::comm::streaming_diloco<dt::comm::outer::sgd> streaming_sized(std::int64_t h, std::int64_t fragments, std::int64_t overlap) {
  dt::comm::streaming_diloco<dt::comm::outer::sgd> p;
  p.inner_steps = h;
  p.fragments = fragments;
  p.overlap = overlap;
  p.sized_to_speed = true;
  return p;
}

// Streaming DiLoCo whose replicas measure their first step `cold` times as long as it took (caches
// and allocations: a real run's first step), as the policy reads it.
struct cold_first_step : dt::comm::streaming_diloco<dt::comm::outer::sgd> {
  double cold = 20;
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (ctx.step == 0) ctx.step_compute_s *= cold;
    streaming_diloco::after_step(ctx);
  }
};

// Streaming DiLoCo whose rank 0 reads its compute at `factor` of what it took (from its second
// step, where the speeds are measured from): the speeds' agreement then under-states the slowest
// replica's seconds per inner step, and each round's deadline falls short of the round it takes.
struct misjudged_slowest : dt::comm::streaming_diloco<dt::comm::outer::sgd> {
  double factor = 0.8;
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (ctx.replicas.rank() == 0 && ctx.step >= 1) ctx.step_compute_s *= factor;
    streaming_diloco::after_step(ctx);
  }
};

// Timed (the exchanges and agreements on lanes beside the steps; the deterministic simulator
// runs them in place): two peers whose inner steps take 100x and 25x what they take here (on
// their threads' clocks), on links of `latency_s`, `steps` steps under the policy: each peer's
// metrics, step by step.
template <class Policy>
std::vector<std::vector<dt::train::step_metrics>> timed_pair(const Policy& policy, std::int64_t steps, double latency_s) {
  dt::transport::in_process::options o;
  o.speeds = {0.01, 0.04};
  dt::transport::in_process net(dt::transport::link_matrix(2, dt::transport::simulated_link{latency_s, 1e9, 0, 0, 0}), o);
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Policy>;
  std::vector<std::vector<dt::train::step_metrics>> by_step(2);
  net.run([&](dt::transport::in_process::endpoint& ep) {
    auto options = run_of(steps);
    options.compute_on_thread_clock = true;
    Trainer t(fixture::tiny_gpt(), options, ep, policy);
    t.on_step([&](const dt::train::step_metrics& m) { by_step[static_cast<std::size_t>(ep.rank())].push_back(m); });
    (void)t.fit(fixture::small_corpus().data);
  });
  return by_step;
}
}  // namespace

TEST_CASE("streaming_diloco sized_to_speed: a peer 4x as fast takes 4 inner steps a step, and waits no more") {
  // H = 4, 2 fragments, overlap 1, twelve steps. Steps 0 and 1: one inner step each (the first is
  // cold in a real run: the speeds are measured from the second); then the fast peer takes 4 a
  // step (sized after step 1 from the speeds agreed then, at each round's end from those agreed
  // on a lane over the round before): 10 s of compute in the last 10.
  const auto run = train({1, 4}, streaming_sized(4, 2, 1), 12);
  for (std::size_t r = 0; r < 2; ++r) REQUIRE(run.by_step[r].size() == 12);
  const auto& slow = run.by_step[0];
  const auto& fast = run.by_step[1];
  CHECK(slow.back().compute_s == Approx(12.0));
  CHECK(fast[0].compute_s == Approx(0.25));
  CHECK(fast[1].compute_s == Approx(0.5));
  CHECK(fast.back().compute_s == Approx(0.5 + 10.0));
  CHECK(fast.back().clock_s == Approx(12.0));
  CHECK(run.params[0] == run.params[1]);  // (the run ends with every fragment merged with mix 0)
  // The metrics count the tokens trained: 12 inner steps' for the slow peer, 2 + 10 x 4 for the fast.
  REQUIRE(slow[0].tokens > 0);
  CHECK(slow.back().tokens == 12 * slow[0].tokens);
  CHECK(fast.back().tokens == 42 * slow[0].tokens);

  // A first step measured 20x as long (cold) sizes nothing: the slow peer still takes one inner
  // step a step, the fast one 4 (measured from step 0, every peer would take about 20 a step in
  // the first round).
  cold_first_step cold;
  static_cast<dt::comm::streaming_diloco<dt::comm::outer::sgd>&>(cold) = streaming_sized(4, 2, 1);
  const auto warm = train({1, 4}, cold, 12);
  CHECK(warm.by_step[0].back().tokens == 12 * slow[0].tokens);
  CHECK(warm.by_step[1].back().tokens == 42 * slow[0].tokens);

  // Unsized, the fast peer computes a quarter of the time.
  auto equal = streaming_sized(4, 2, 1);
  equal.sized_to_speed = false;
  const auto plain = train({1, 4}, equal, 12);
  CHECK(plain.by_step[1].back().compute_s == Approx(3.0));
  CHECK(plain.by_step[1].back().clock_s == Approx(12.0));

  // What it refuses: eager updates (nothing is trained: start() checks). With tune:
  // tests/comm/test_auto_tuning.cpp.
  auto eager = streaming_sized(4, 2, 1);
  eager.eager = true;
  CHECK_THROWS_WITH(train({1, 4}, eager, 2), Catch::Matchers::Contains("sized_to_speed and eager cannot be set together"));
}

TEST_CASE("streaming_diloco sized_to_speed: a peer with twice the rows counts twice in a fragment's average") {
  // Speeds 1 and 2, H = 2, one fragment, no overlap, 4 steps: the run's last exchange (after step
  // 3) merges with mix 0 through outer SGD with lr 1, so every peer ends on the rows-weighted mean
  // of the replicas' parameters before it. Since the exchange after step 1, peer 1 took 2 inner
  // steps a step to peer 0's 1: twice the rows.
  std::vector<std::vector<float>> before(2);
  fixture::probe<dt::comm::streaming_diloco<dt::comm::outer::sgd>> p;
  p.inner = streaming_sized(2, 1, 0);
  p.before_last = &before;
  const auto run = train({1, 2}, p, 4);
  REQUIRE(run.by_step[1][3].compute_s - run.by_step[1][1].compute_s == Approx(2.0));  // (4 inner steps of 0.5 s)
  std::vector<float> by_rows(before[0].size()), mean(before[0].size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    by_rows[i] = (1.0f * before[0][i] + 2.0f * before[1][i]) / 3.0f;
    mean[i] = (before[0][i] + before[1][i]) / 2.0f;
  }
  const double tolerance = 2e-6;
  for (std::size_t r = 0; r < 2; ++r) CHECK(fixture::max_abs_diff(run.params[r], by_rows) < tolerance);
  CHECK(fixture::max_abs_diff(by_rows, mean) > 100 * tolerance);
}

TEST_CASE("streaming_diloco sized_to_speed: a run stopped mid-round and resumed ends bit for bit as the whole run") {
  // Speeds 1 and 3, H = 4, 2 fragments, overlap 1; stopped after step 5 (in round 2, with the
  // speeds of round 1 agreed on a lane and a fragment's exchange in flight).
  const auto policy = streaming_sized(4, 2, 1);
  const auto whole = train({1, 3}, policy, 12);
  std::vector<dt::io::checkpoint> saved;
  (void)train({1, 3}, policy, 12, nullptr, 5, &saved);
  REQUIRE(saved[1].counter("comm.streaming_diloco.speed_agreed") == 1);
  REQUIRE(saved[1].counter("comm.streaming_diloco.speed_round_steps") == 12);
  const auto resumed = train({1, 3}, policy, 12, &saved);
  CHECK(resumed.params == whole.params);
  CHECK(whole.by_step[1].back().compute_s == Approx(2.0 / 3.0 + 10.0));
}

TEST_CASE("streaming_diloco sized_to_speed: timed, nobody waits for the first speeds' agreement, and the fast peer fills its first round") {
  // Timed (timed_pair): links of 0.1 s latency, H = 64, one fragment, no overlap. The speeds
  // measured at step 1 are agreed on a lane while each peer goes on at one inner step a step;
  // once the agreement has landed by a peer's clock, the rest of its first round is sized from
  // the round's start, so the fast peer, which ran ahead meanwhile, fills the round to about the
  // slow one's compute. Waiting for the agreement at step 1 costs the fast peer a latency and
  // the slow peer's first step; sizing from the landing alone leaves the fast one short by the
  // steps it ran ahead.
  const auto timed_run = [](bool sized) {
    auto policy = streaming_sized(64, 1, 0);
    policy.sized_to_speed = sized;
    return timed_pair(policy, 65, 0.1);
  };
  const auto sized = timed_run(true), equal = timed_run(false);
  for (const auto* run : {&sized, &equal})
    for (const auto& peer : *run) REQUIRE(peer.size() == 65);
  const auto waited = [](const std::vector<dt::train::step_metrics>& peer) { return peer[62].clock_s - peer[62].compute_s; };
  // Neither peer waits before step 63 (the round's last) more than it does unsized: the start's checks.
  INFO("waits through step 62: sized " << waited(sized[0]) << " s and " << waited(sized[1]) << " s, unsized "
                                       << waited(equal[0]) << " s and " << waited(equal[1]) << " s");
  for (std::size_t r = 0; r < 2; ++r) CHECK(waited(sized[r]) < waited(equal[r]) + 0.05);
  // The fast peer's compute in the first round (steps 0-63) against the slow one's.
  const double fast_share = sized[1][63].compute_s / sized[0][63].compute_s;
  const double unsized_share = equal[1][63].compute_s / equal[0][63].compute_s;
  INFO("the fast peer's compute over the slow one's in the first round: sized " << fast_share << ", unsized " << unsized_share);
  CHECK(unsized_share < 0.5);
  // (the run's cold first step is left out of the fill: the fast peer ends short by up to 3/4 of
  // a slow step of the round's 64, and a loaded machine's noise; sized from the landing alone, 0.65)
  CHECK(fast_share > 0.8);
}

TEST_CASE("streaming_diloco sized_to_speed: timed, a peer that ends rounds ahead of the slowest by the clock makes up its lead") {
  // Timed (timed_pair): links of 0.02 s latency, H = 8, 2 fragments, overlap 6, 80 steps (10
  // rounds). The slow peer reads its compute at 0.8 of what it took, so each round's deadline is
  // a fifth short of the round it takes (one inner step a step): the fast peer, which fills the
  // deadline, ends each round further ahead of it by the clock, and spends that lead waiting at
  // landings and at the last exchange (the slow peer's cold first step, longer, leaves it ahead
  // too). Its lead rides with the speeds' agreement and lengthens the round running once that
  // lands: it stays about one round's shortfall ahead, and computes 0.94-0.96 of what the slow
  // peer does (without the making up, 0.71-0.73).
  misjudged_slowest policy;
  static_cast<dt::comm::streaming_diloco<dt::comm::outer::sgd>&>(policy) = streaming_sized(8, 2, 6);
  const auto by_step = timed_pair(policy, 80, 0.02);
  for (const auto& peer : by_step) REQUIRE(peer.size() == 80);
  const auto& slow = by_step[0];
  const auto& fast = by_step[1];
  const double share = fast.back().compute_s / slow.back().compute_s;
  const auto waited = [](const dt::train::step_metrics& m) { return m.clock_s - m.compute_s; };
  INFO("the fast peer's compute over the slow one's: " << share << "; waited " << waited(fast.back()) << " s (the last step "
                                                       << waited(fast.back()) - waited(fast[78]) << " s), the slow peer "
                                                       << waited(slow.back()) << " s; the run " << slow.back().clock_s << " s");
  CHECK(share > 0.9);
  CHECK(share < 1.02);
}

TEST_CASE("speed_sizing: a step that ran slow is made up by the steps after it, and the slowest takes more where it ran fast") {
  // One round of H = 4 steps against a deadline of 4 s, each inner step costing `actual` s where
  // the sizing measured per_step_s: the compute the round took and its inner steps.
  const auto round = [](double per_step_s, double actual) {
    dt::comm::speed_sizing s;
    s.deadline_s = 4.0;  // 4 steps of the slowest replica's 1 s
    s.slowest_s = 1.0;
    s.per_step_s = per_step_s;
    for (std::int64_t left = 4; left >= 1; --left) {
      const auto k = s.share(left);
      s.compute_s += static_cast<double>(k) * actual;
      s.steps += k;
    }
    return std::pair{s.compute_s, s.steps};
  };
  // Sized at 0.25 s an inner step (16 a round, 4 a step), it runs at 0.375: after the first step
  // (4 inner steps, 1.5 s) the rest take 2, 2 and 3; the round ends within half an inner step of
  // the deadline, where 16 would take 6 s.
  const auto [slow_s, slow_steps] = round(0.25, 0.375);
  CHECK(slow_steps == 11);
  CHECK(std::abs(slow_s - 4.0) <= 0.375 / 2 + 1e-12);
  // At twice the time it was sized at, its seconds per inner step are this round's: 8 inner steps
  // end at the deadline (by the sizing's 0.25 s it would take 9, and end at 4.5 s).
  CHECK(round(0.25, 0.5) == std::pair{4.0, std::int64_t{8}});
  // The slowest replica (1 s, one a step) running at 0.8 s takes one more and ends at the deadline.
  const auto [fast_s, fast_steps] = round(1.0, 0.8);
  CHECK(fast_steps == 5);
  CHECK(fast_s == Approx(4.0));
  // On time, it takes exactly its share; unsized, one a step.
  CHECK(round(0.25, 0.25) == std::pair{4.0, std::int64_t{16}});
  CHECK(dt::comm::speed_sizing{}.share(4) == 1);
}

TEST_CASE("speed_sizing: a replica whose speed is no whole multiple of the slowest one's keeps its pace all through a round") {
  // A round of 150 steps against the slowest replica's 1 s an inner step, on a replica that takes
  // 1/speed s. After each step its compute should be where the slowest one's is (one inner step a
  // step): a whole number of inner steps a step keeps it within half of its own inner step of that.
  // Each step's spread rounded alone, a 1.22x replica took 1 a step for the round's first 56% and
  // fell 15 of the slowest one's steps ahead by the clock (a 1.81x one, 2 a step, 10 behind), which
  // streaming_diloco's exchanges that land mid-round turned into waits.
  for (const double speed : {1.22, 1.49, 1.81, 2.5, 3.28}) {
    dt::comm::speed_sizing s;
    s.deadline_s = 150.0;
    s.slowest_s = 1.0;
    s.per_step_s = 1.0 / speed;
    double worst = 0;
    for (std::int64_t left = 150; left >= 1; --left) {
      const auto k = s.share(left);
      s.compute_s += static_cast<double>(k) / speed;
      s.steps += k;
      worst = std::max(worst, std::abs(s.compute_s - static_cast<double>(151 - left)));
    }
    INFO("speed " << speed << ": " << s.steps << " inner steps, " << s.compute_s << " s, at most " << worst
                  << " s off the slowest one's pace");
    CHECK(worst <= 0.5 / speed + 1e-9);
    CHECK(std::abs(s.compute_s - 150.0) <= 0.5 / speed + 1e-9);
  }
}

TEST_CASE("speed_sizing: with headroom, a slowest replica that computes a round slower than measured still ends it by the deadline") {
  // The slowest replica, measured at 1 s an inner step, computes a round of 50 steps at `actual`
  // s (compute on a clock wanders from round to round); the deadline is 50 s and `headroom` of
  // it. It takes one inner step a step at least, so without a margin it runs past the deadline,
  // where every other replica (which fills it) waits for it at the round's end.
  const auto round_end = [](double actual, double headroom) {
    dt::comm::speed_sizing s;
    s.headroom = headroom;
    s.slowest_s = s.per_step_s = 1.0;
    s.set_round(50, 50);
    for (std::int64_t left = 50; left >= 1; --left) {
      const auto k = s.share(left);
      s.compute_s += static_cast<double>(k) * actual;
      s.steps += k;
    }
    return std::pair{s.compute_s, s.deadline_s};
  };
  for (const double actual : {1.0, 1.02, 1.04}) {
    const auto [end, deadline] = round_end(actual, 0.05);
    INFO("at " << actual << " s an inner step: the round ends at " << end << " s, the deadline " << deadline << " s");
    CHECK(deadline == Approx(52.5));
    CHECK(std::abs(end - deadline) <= actual / 2 + 1e-9);  // (it fills the margin, as the others fill theirs)
  }
  // Without the margin, 4% slower ends 2 s (two of its inner steps) past the deadline.
  const auto [late, deadline] = round_end(1.04, 0.0);
  CHECK(deadline == Approx(50.0));
  CHECK(late - deadline == Approx(2.0));
}

TEST_CASE("speed_sizing: the rest of a round sized late counts what its own steps spent, not the steps before it") {
  // A 4x replica (0.25 s an inner step, the slowest 1 s) took 30 steps unsized (one inner step
  // each, 7.5 s counted) when the speeds' agreement landed: `done` of them are the round's, which
  // has `left` steps after this one. The round's deadline: its done + left steps at the slowest
  // one's second, less the done steps' 0.25 s each.
  const auto sized_late = [](std::int64_t done, std::int64_t left) {
    dt::comm::speed_sizing s;
    s.compute_s = 7.5;
    s.steps = 30;
    s.rest_of_round_from(1.0, 0.25, 40, left, done);
    return s.deadline_s;
  };
  // The whole count in the round (the run's first round: 10 steps left of 40).
  CHECK(sized_late(30, 10) == Approx(10 + 30 - 7.5));
  // A first pick set rounds of 40 where the steps taken were 10 into the second: 30 left, and 10
  // steps' 2.5 s spent, not the 7.5 s of all 30 (which would leave 27.5 s, 110 inner steps, for
  // the 120 of the 30 steps left).
  CHECK(sized_late(10, 30) == Approx(30 + 10 - 2.5));
  // More steps said done than counted: those counted.
  CHECK(sized_late(35, 5) == Approx(5 + 30 - 7.5));
}

TEST_CASE("speed_sizing: a state taken from another replica mid-round goes on at this replica's own pace") {
  // The donor: a round of 10 s (10 of the slowest replica's 1 s inner steps), 4 s computed at
  // 1 s an inner step; its state handed over (fault::elastic's adopt leaves a peer's own out).
  dt::comm::speed_sizing donor;
  donor.slowest_s = donor.per_step_s = 1.0;
  donor.set_round(10, 10);
  donor.compute_s = 4.0;
  donor.steps = 4;
  dt::io::checkpoint handed;
  donor.save(handed, "p.");
  dt::io::leave_out_own_state(handed);
  // A replica 4x as fast, measured at 0.25 s (8 inner steps in 2 s), takes it: the round's 6 s
  // left are its own pace's 24 inner steps, 4 a step over the 6 steps left, not the donor's 1.
  dt::comm::speed_sizing fast;
  fast.compute_s = 2.0;
  fast.steps = 8;
  fast.load(handed, "p.");
  CHECK(fast.pace() == 0.25);
  CHECK(fast.deadline_s == 6.0);
  CHECK(fast.seconds_per_step() == 0);  // (what it measures from here is its own)
  CHECK(fast.slowest_s == 1.0);
  CHECK(fast.share(6) == 4);
  CHECK(fast.round_steps == 40);
  // A joiner (no pace of its own yet) plans at the donor's until its steps measure it.
  dt::comm::speed_sizing joiner;
  joiner.load(handed, "p.");
  CHECK(joiner.pace() == 1.0);
  CHECK(joiner.deadline_s == 6.0);
  CHECK(joiner.share(6) == 1);
  // A replica's own checkpoint (a resume) restores it as saved, pace and all.
  dt::io::checkpoint own;
  donor.save(own, "p.");
  dt::comm::speed_sizing resumed = fast;
  resumed.load(own, "p.");
  CHECK(resumed.pace() == 1.0);
  CHECK(resumed.deadline_s == 10.0);
  CHECK(resumed.compute_s == 4.0);
}

TEST_CASE("diloco sized_to_speed: a round's inner steps spread evenly over its steps, and what it refuses") {
  dt::comm::diloco<> d;
  d.inner_steps = 4;
  d.sized_to_speed = true;
  for (std::int64_t s = 0; s < 8; ++s) CHECK(d.local_steps(s) == 1);  // not measured yet
  // Speeds 1 and 2.5, H = 4: an inner step costs the fast peer 0.4 s of its clock, and it takes
  // the 10 that fit in the slow peer's 4 s a round, 2 or 3 a step; in the first round 1
  // (unmeasured), then, from the speeds' all-reduce after it (where the slow peer's 1 s sets the
  // time), 7 or 8 in the 3 s left (7.5 fit), 2 or 3 a step.
  const auto run = train({1, 2.5}, sized(4), 8);
  const auto& fast = run.by_step[1];
  REQUIRE(fast.size() == 8);
  CHECK(run.inner_steps[1].back() == 10);
  std::vector<long> per_step;
  for (std::size_t j = 0; j < 8; ++j)
    per_step.push_back(std::lround((fast[j].compute_s - (j > 0 ? fast[j - 1].compute_s : 0.0)) * 2.5));
  INFO("inner steps a step: " << ::Catch::Detail::stringify(per_step));
  CHECK(per_step[0] == 1);
  const auto round_of = [&](std::size_t from, std::size_t to) {
    long sum = 0;
    for (std::size_t j = from; j < to; ++j) {
      CHECK((per_step[j] == 2 || per_step[j] == 3));  // spread evenly
      sum += per_step[j];
    }
    return sum;
  };
  const long first = round_of(1, 4);
  CHECK((first == 7 || first == 8));
  CHECK(round_of(4, 8) == 10);
  // The slow peer, one inner step a step: its round of 4 s is the deadline.
  CHECK(run.by_step[0].back().compute_s == Approx(8.0));
  // The fast one waits for the first step's 0.6 s, then at most half an inner step (0.2 s), in
  // the first round alone.
  CHECK(fast.back().clock_s - fast.back().compute_s <= 0.6 + 0.2 + 1e-9);
  // Moshpit's averaging is there to avoid an all-reduce over every replica; sizing needs one.
  auto mosh = sized(4);
  mosh.inner.moshpit = dt::comm::moshpit_grid{};
  CHECK_THROWS_WITH(train({1, 1}, mosh, 2), Catch::Matchers::Contains("sized_to_speed needs one all-reduce"));
}

namespace {

// A GPT that keeps the token ids of every batch it computes a loss on (training and evaluation),
// whole (parallel::data) or through its first stage (parallel::pipeline).
struct ids_recording_gpt : dt::nn::gpt<dt::cpu> {
  using dt::nn::gpt<dt::cpu>::gpt;
  mutable std::vector<std::vector<std::int32_t>> seen;  // (a stage's forward is const)
  dt::var<dt::cpu> loss(const dt::tensor<dt::cpu>& ids, const dt::tensor<dt::cpu>& targets, dt::rng* dropout = nullptr) {
    seen.push_back(ids.to_vector<std::int32_t>());
    return dt::nn::gpt<dt::cpu>::loss(ids, targets, dropout);
  }
  dt::var<dt::cpu> stage_forward(int s, const dt::var<dt::cpu>& in, const dt::tensor<dt::cpu>& ids,
                                 const dt::tensor<dt::cpu>& targets, dt::rng* dropout = nullptr) const {
    if (s == 0) seen.push_back(ids.to_vector<std::int32_t>());
    return dt::nn::gpt<dt::cpu>::stage_forward(s, in, ids, targets, dropout);
  }
};

// A GPT that keeps each batch it computes a loss on, with the weights it had then, whole
// (parallel::data) or through its first stage (parallel::pipeline).
struct batch_recording_gpt : dt::nn::gpt<dt::cpu> {
  using dt::nn::gpt<dt::cpu>::gpt;
  struct batch {
    dt::tensor<dt::cpu> ids, targets;
    std::vector<float> weights;
  };
  mutable std::vector<batch> batches;  // (a stage's forward is const)
  dt::var<dt::cpu> loss(const dt::tensor<dt::cpu>& ids, const dt::tensor<dt::cpu>& targets, dt::rng* dropout = nullptr) {
    batches.push_back({ids, targets, fixture::flat_params(parameters())});
    return dt::nn::gpt<dt::cpu>::loss(ids, targets, dropout);
  }
  dt::var<dt::cpu> stage_forward(int s, const dt::var<dt::cpu>& in, const dt::tensor<dt::cpu>& ids,
                                 const dt::tensor<dt::cpu>& targets, dt::rng* dropout = nullptr) const {
    if (s == 0) batches.push_back({ids, targets, fixture::flat_params(parameters())});
    return dt::nn::gpt<dt::cpu>::stage_forward(s, in, ids, targets, dropout);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("diloco sized_to_speed: each of a step's inner steps trains on rows of its own", "", dt::parallel::data,
                   dt::parallel::pipeline<>) {
  // Speeds 1 and 3, H = 2, 4 steps: the fast peer takes 3 inner steps in each step after the
  // first. Rows repeated within a step (the sub-step ignored where the rows are drawn) would show
  // as one batch seen twice; each step's and each peer's rows differ as well. Whole models, and
  // one-stage pipelines (data parallelism as the command line runs it).
  using Trainer = dt::train::trainer<ids_recording_gpt, dt::comm::diloco<dt::comm::outer::sgd>, TestType>;
  dt::comm::diloco<dt::comm::outer::sgd> policy;
  policy.inner_steps = 2;
  policy.sized_to_speed = true;
  TestType parallel{};
  if constexpr (requires { parallel.stages; }) parallel.stages = 1;
  std::vector<std::vector<std::vector<std::int32_t>>> seen(2);
  timed_peers({1, 3}).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(fixture::tiny_gpt(), run_of(4), ep, policy, parallel);
    (void)t.fit(fixture::small_corpus().data);
    seen[static_cast<std::size_t>(ep.rank())] = t.model().seen;  // (each peer writes its own slot)
  });
  INFO("batches seen: " << seen[0].size() << " by the slow peer, " << seen[1].size() << " by the fast one");
  // Inner steps 1 + 3 + 3 + 3 against 4 (and one evaluation batch each at the end).
  REQUIRE(seen[1].size() == seen[0].size() + 6);
  std::vector<std::vector<std::int32_t>> all;
  for (const auto& peer : seen) all.insert(all.end(), peer.begin(), peer.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no batch seen twice, by one peer or two
}

namespace {

// Sync with a target batch of `rows` (micro-batches of run_of's 2 rows), its costs exchanged
// every `every` steps; where given, each replica's gradients at step `at` before the exchange
// (*before) and after it (*after).
fixture::probe<dt::comm::sync_allreduce<>> target_batch_of(std::int64_t rows, std::int64_t every = 10, std::int64_t at = 0,
                                                           std::vector<std::vector<float>>* before = nullptr,
                                                           std::vector<std::vector<float>>* after = nullptr) {
  fixture::probe<dt::comm::sync_allreduce<>> p;
  p.inner.target_batch = rows;
  p.inner.resize_every = every;
  p.grads_at = at;
  p.grads_before = before;
  p.grads = after;
  return p;
}

}  // namespace

TEST_CASE("sync target_batch: peers 1x and 3x share the target's micro-batches by speed, and the fast one waits no more") {
  // A target of 8 rows: 4 micro-batches of 2 rows a step. Step 0 unmeasured: 2 each (the slow
  // peer 2 s, the fast one 2/3 s of compute). Sized after it: 1 and 3, 1 s of compute each a step.
  const auto run = train({1, 3}, target_batch_of(8), 6);
  for (std::size_t r = 0; r < 2; ++r) REQUIRE(run.by_step[r].size() == 6);
  const auto& slow = run.by_step[0];
  const auto& fast = run.by_step[1];
  CHECK(slow[0].compute_s == Approx(2.0));
  CHECK(fast[0].compute_s == Approx(2.0 / 3.0));
  for (std::size_t j = 1; j < 6; ++j) {
    INFO("step " << j);
    CHECK(slow[j].compute_s - slow[j - 1].compute_s == Approx(1.0));
    CHECK(fast[j].compute_s - fast[j - 1].compute_s == Approx(1.0));
    CHECK(fast[j].clock_s - fast[j - 1].clock_s == Approx(1.0));  // (ideal links: the exchange takes no time)
  }
  // Without a target: one micro-batch each a step, the fast peer computing a third of the time.
  const auto plain = train({1, 3}, target_batch_of(0), 6);
  CHECK(plain.by_step[1].back().compute_s == Approx(2.0));
  CHECK(plain.by_step[1].back().clock_s == Approx(6.0));
  // Peers of one speed and a target of one micro-batch each: the plain weighted sync, bit for bit.
  auto weighted = target_batch_of(0);
  weighted.inner.weighted = true;
  CHECK(train({2, 2}, target_batch_of(4), 4).params == train({2, 2}, weighted, 4).params);
}

TEST_CASE("sync target_batch: replicas weigh by the rows they were dealt") {
  // Speeds 1 and 3, a target of 8 rows: at step 1 the slow peer takes 1 micro-batch (2 rows), the
  // fast one 3 (6 rows). The average after the exchange is the rows-weighted one of the replicas'
  // gradients before it, not their plain mean.
  std::vector<std::vector<float>> before(2), after(2);
  (void)train({1, 3}, target_batch_of(8, 10, 1, &before, &after), 3);
  REQUIRE(before[0].size() == before[1].size());
  std::vector<float> by_rows(before[0].size()), mean(before[0].size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    by_rows[i] = (2.0f * before[0][i] + 6.0f * before[1][i]) / 8.0f;
    mean[i] = (before[0][i] + before[1][i]) / 2.0f;
  }
  for (std::size_t r = 0; r < 2; ++r) CHECK(fixture::max_abs_diff(after[r], by_rows) < 1e-6);
  CHECK(fixture::max_abs_diff(by_rows, mean) > 1e-4);
}

TEMPLATE_TEST_CASE("sync target_batch: one replica's gradient at the exchange is the mean of its micro-batches' gradients", "",
                   dt::parallel::data, dt::parallel::pipeline<>) {
  // A target of 3 micro-batches on one replica: each micro-batch's gradient computed apart from
  // the same weights, then their mean. Whole models, and one-stage pipelines (data parallelism as
  // the command line runs it).
  using Trainer = dt::train::trainer<batch_recording_gpt, fixture::probe<dt::comm::sync_allreduce<>>, TestType>;
  TestType parallel{};
  if constexpr (requires { parallel.stages; }) parallel.stages = 1;
  std::vector<std::vector<float>> alone_before(1), alone_after(1);
  std::vector<batch_recording_gpt::batch> batches;
  timed_peers({1}).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(fixture::tiny_gpt(), run_of(1), ep, target_batch_of(6, 10, 0, &alone_before, &alone_after), parallel);
    (void)t.fit(fixture::small_corpus().data);
    batches = t.model().batches;
  });
  REQUIRE(batches.size() >= 3);  // the step's three micro-batches (then the evaluation's)
  dt::rng init(1, "init");
  dt::nn::gpt<dt::cpu> apart(fixture::tiny_gpt(), init);
  std::vector<float> mean_of_three;
  for (std::size_t k = 0; k < 3; ++k) {
    REQUIRE(batches[k].weights == batches[0].weights);  // (no optimizer step between them)
    dt::comm::scatter_values(apart.parameters(), batches[0].weights);
    apart.parameters().zero_grad();
    apart.loss(batches[k].ids, batches[k].targets).backward();
    std::vector<float> g;
    dt::comm::gather_grads(apart.parameters(), g);
    mean_of_three.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) mean_of_three[i] += g[i] / 3.0f;
  }
  CHECK(fixture::max_abs_diff(alone_before[0], mean_of_three) < 1e-6);
  CHECK(alone_before[0] == alone_after[0]);  // one replica: the exchange leaves it as it is
}

TEST_CASE("sync target_batch: a run stopped between exchanges of speeds and resumed ends bit for bit as the whole run") {
  // Speeds 1 and 3, a target of 10 rows (5 micro-batches), speeds exchanged every 3 steps;
  // stopped after step 4, where the sizing of step 2's exchange and what step 3 and 4 measured
  // are in the checkpoint.
  const auto policy = target_batch_of(10, 3);
  const auto whole = train({1, 3}, policy, 8);
  std::vector<dt::io::checkpoint> saved;
  (void)train({1, 3}, policy, 8, nullptr, 4, &saved);
  REQUIRE(saved[0].counter("comm.sync.batch_current") == 1);  // of 5: 1 and 3 whole shares, the
  REQUIRE(saved[1].counter("comm.sync.batch_current") == 4);  // fifth to the one done with it first
  CHECK(train({1, 3}, policy, 8, &saved).params == whole.params);
  saved[0].text["comm.sync.batch_passes_s"] = "slow";
  CHECK_THROWS_WITH(train({1, 3}, policy, 8, &saved), Catch::Matchers::Contains("'comm.sync.batch_passes_s' is 'slow'"));
}

TEST_CASE("sync target_batch: the micro-batches dealt keep the step's longest compute least") {
  using sizing = dt::comm::batch_sizing;
  const auto speeds = [](std::vector<double> v) {  // micro-batches a second, nothing else a step
    std::vector<sizing::cost> c;
    for (const double x : v) c.push_back({1.0 / x, 0.0});
    return c;
  };
  CHECK(sizing::shares(4, speeds({1, 3})) == std::vector<std::int64_t>{1, 3});
  CHECK(sizing::shares(5, speeds({1, 3})) == std::vector<std::int64_t>{1, 4});
  CHECK(sizing::shares(3, speeds({1, 100})) == std::vector<std::int64_t>{1, 2});  // at least one each
  CHECK(sizing::shares(6, speeds({2, 2, 2})) == std::vector<std::int64_t>{2, 2, 2});
  CHECK(sizing::shares(5, speeds({1, 0, 2})) == std::vector<std::int64_t>{2, 2, 2});  // one unmeasured: equal
  CHECK(sizing::shares(5, {{1, 0}, {std::nan(""), 0}, {1, 0}}) == std::vector<std::int64_t>{2, 2, 2});
  CHECK(sizing::shares(5, {{1, -1}, {1, 0}}) == std::vector<std::int64_t>{3, 3});
  // What a step costs besides its micro-batches counts: a peer 4x as fast whose step costs it 2 s
  // besides (the slow one's micro-batch: 1 s) takes 5 of 8 (its step 3.25 s), not the 7 its
  // speed alone gives it (3.75 s).
  CHECK(sizing::shares(8, {{1, 0}, {0.25, 2}}) == std::vector<std::int64_t>{3, 5});
  CHECK(sizing::shares(8, speeds({1, 4})) == std::vector<std::int64_t>{1, 7});
  // Against every way of dealing them (at least one each) on random costs: the same longest
  // step, and exactly the total.
  dt::rng gen(7, "shares");
  for (int draw = 0; draw < 200; ++draw) {
    std::vector<sizing::cost> c;
    for (int i = 0; i < 3; ++i) c.push_back({0.1 + 2 * gen.uniform(), draw % 2 ? 3 * gen.uniform() : 0.0});
    const std::int64_t total = 3 + static_cast<std::int64_t>(gen.uniform() * 20);
    const auto k = sizing::shares(total, c);
    REQUIRE(k[0] + k[1] + k[2] == total);
    const auto longest = [&](std::int64_t x, std::int64_t y, std::int64_t z) {
      return std::max({c[0].fixed_s + x * c[0].batch_s, c[1].fixed_s + y * c[1].batch_s, c[2].fixed_s + z * c[2].batch_s});
    };
    double best = 1e300;
    for (std::int64_t x = 1; x <= total - 2; ++x)
      for (std::int64_t y = 1; x + y <= total - 1; ++y) best = std::min(best, longest(x, y, total - x - y));
    INFO("draw " << draw << ": " << total << " micro-batches");
    CHECK(longest(k[0], k[1], k[2]) == Approx(best));
  }
}

TEST_CASE("sync target_batch: what it refuses") {
  CHECK_THROWS_WITH(train({1, 1}, target_batch_of(1), 1), Catch::Matchers::Contains("less than one micro-batch"));
  CHECK_THROWS_WITH(train({1, 1}, target_batch_of(-2), 1), Catch::Matchers::Contains("target_batch must be >= 0"));
  CHECK_THROWS_WITH(train({1, 1}, target_batch_of(4, 0), 1), Catch::Matchers::Contains("resize_every must be >= 1"));
  // A robust aggregator caps the weights that the shares give.
  fixture::probe<dt::comm::sync_allreduce<dt::compress::identity, dt::collective::any_aggregator>> robust;
  robust.inner.target_batch = 4;
  robust.inner.aggregator = dt::collective::parse_aggregator("median");
  CHECK_THROWS_WITH(train({1, 1}, robust, 1), Catch::Matchers::Contains("which aggregator 'median' caps: use the mean"));
  // Peers dealing other targets would pair the deal's all-gather with another's all-reduce.
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  std::vector<std::string> errors(2);
  dt::transport::in_process(dt::transport::links::ideal(2), o).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    try {
      dt::train::trainer<dt::nn::gpt<dt::cpu>, fixture::probe<dt::comm::sync_allreduce<>>> t(
          fixture::tiny_gpt(), run_of(2), ep, target_batch_of(r == 0 ? 4 : 8));
      (void)t.fit(fixture::small_corpus().data);
    } catch (const std::exception& e) {
      errors[r] = e.what();  // (each peer writes its own slot)
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Matchers::Contains("a target batch of"));
}
