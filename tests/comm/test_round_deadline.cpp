// Rounds with deadlines (comm/round_deadline.hpp): DiLoCo's round closes once a quorum is in and
// the deadline its replicas' arrival offsets set has passed; a replica that comes later takes the
// group's average, so every replica ends on the same parameters, and skips the steps the group
// took meanwhile. Simulated peers (deterministic in_process) with a straggler tail: an inner
// step runs 10x as long now and then.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

using policy_type = dt::comm::diloco<dt::comm::outer::sgd>;

struct deadline_run {
  std::vector<std::vector<float>> params;     // by rank, at the end
  std::vector<double> clock_s;                // by rank, at the end
  std::vector<std::int64_t> missed, skipped;  // by rank: rounds missed, steps skipped
  std::vector<std::int64_t> steps_run;        // by rank: steps taken (metrics lines)
  std::int64_t dropped = 0;                   // the leader's count
  std::vector<dt::comm::deadline_round_record> rounds;
  std::vector<dt::comm::deadline_arrival> arrivals;
};

deadline_run train(const std::vector<double>& speeds, double straggle, std::optional<dt::comm::round_deadline> deadline,
                   std::int64_t steps = 48, std::int64_t h = 8, std::int64_t eval_every = 0) {
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};  // an inner step: 1 s / speed
  o.speeds = speeds;
  o.seed = 7;
  o.straggle = {straggle, 10};
  const auto n = speeds.size();
  deadline_run out;
  out.params.resize(n);
  out.clock_s.assign(n, 0);
  out.missed.assign(n, 0);
  out.skipped.assign(n, 0);
  out.steps_run.assign(n, 0);
  policy_type policy;
  policy.inner_steps = h;
  policy.sized_to_speed = true;
  policy.deadline = deadline;
  std::vector<std::int64_t> dropped(n, 0);
  std::vector<std::vector<dt::comm::deadline_round_record>> rounds(n);
  std::vector<std::vector<dt::comm::deadline_arrival>> arrivals(n);
  auto run = fixture::small_run(steps);
  run.batch_size = 2;
  run.eval_every = eval_every;
  run.eval_batches = 1;
  dt::transport::in_process(dt::transport::links::ideal(static_cast<int>(n)), o).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    dt::train::trainer<dt::nn::gpt<dt::cpu>, policy_type> t(fixture::tiny_gpt(), run, ep, policy);
    t.on_step([&](const dt::train::step_metrics& m) {  // (each peer writes its own slot)
      ++out.steps_run[r];
      out.clock_s[r] = m.clock_s;
    });
    (void)t.fit(fixture::small_corpus().data);
    out.params[r] = fixture::flat_params(t.model().parameters());
    out.missed[r] = t.policy().deadlines().missed();
    out.skipped[r] = t.skipped_steps();
    dropped[r] = t.policy().deadlines().dropped();
    rounds[r] = t.policy().deadlines().rounds();
    arrivals[r] = t.policy().deadlines().arrivals();
  });
  // Each round's records are its leader's.
  for (std::size_t r = 0; r < n; ++r) {
    out.dropped += dropped[r];
    out.rounds.insert(out.rounds.end(), rounds[r].begin(), rounds[r].end());
    out.arrivals.insert(out.arrivals.end(), arrivals[r].begin(), arrivals[r].end());
  }
  std::sort(out.rounds.begin(), out.rounds.end(), [](const auto& a, const auto& b) { return a.round < b.round; });
  return out;
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (auto x : v) s += x;
  return s;
}

dt::io::checkpoint offsets(const char* text) {
  dt::io::checkpoint c;
  c.text["p.deadline.offsets"] = text;
  c.counters["p.deadline.missed"] = 0;
  c.counters["p.deadline.dropped"] = 0;
  return c;
}

}  // namespace

TEST_CASE("round_deadline: the deadline is the offsets' median plus k robust deviations, after a warm-up") {
  dt::comm::round_deadline d;  // k 2, min_wait 0.1, warm-up 2 (n - 1)
  dt::comm::deadline_rounds s;
  s.load(offsets("0.1 0.2 0.3 0.4 5"), "p.");  // median 0.3, deviations 0.2 0.1 0 0.1 4.7: MAD 0.1
  CHECK(s.deadline_s(d, 3, 1.0) == Approx(0.3 + 2 * 1.4826 * 0.1));
  CHECK(std::isinf(s.deadline_s(d, 4, 1.0)));  // 6 offsets needed for 4 replicas
  d.warmup = 5;
  CHECK(std::isfinite(s.deadline_s(d, 4, 1.0)));
  CHECK(s.deadline_s(d, 3, 100.0) == Approx(10.0));  // the floor: 10% of 100 s planned
  d.fixed_s = 0.25;
  CHECK(s.deadline_s(d, 3, 100.0) == 0.25);
  // Saved and loaded, exactly.
  dt::io::checkpoint saved;
  s.save(saved, "q.");
  dt::comm::deadline_rounds again;
  again.load(saved, "q.");
  CHECK(again.deadline_s(d, 3, 1.0) == s.deadline_s(d, 3, 1.0));
  CHECK_THROWS_WITH(s.load(offsets("0.1 x"), "p."), Catch::Contains("deadline.offsets' holds something other than seconds"));
  dt::comm::round_deadline bad;
  bad.quorum = 0;
  CHECK_THROWS_WITH(bad.validate("diloco"), Catch::Contains("deadline's quorum must be in (0, 1]"));
  CHECK(dt::comm::round_deadline{}.quorum_of(4) == 2);
  CHECK(dt::comm::round_deadline{}.quorum_of(5) == 3);
}

TEST_CASE("round_deadline: a state taken from another replica keeps this one's own speed and counts") {
  // The donor's: its offsets (the group's), and its own steps' seconds (1 s an inner step), the
  // rounds it missed and the arrivals it dropped.
  dt::comm::deadline_rounds donor;
  dt::io::checkpoint saved = offsets("0.1 0.2 0.3 0.4 5");
  saved.counters["p.deadline.missed"] = 3;
  saved.counters["p.deadline.dropped"] = 7;
  donor.load(saved, "p.");  // (a checkpoint written before these were a peer's own: their old names)
  donor.add_step(0, 1.0, 1);
  donor.add_step(1, 2.0, 2);
  CHECK(donor.typical_step_s() == 1.0);
  CHECK(donor.missed() == 3);
  dt::io::checkpoint handed;
  donor.save(handed, "p.");
  dt::io::leave_out_own_state(handed);
  // A replica at 0.25 s an inner step that missed one round takes it: the offsets are the
  // donor's (the deadline the group sets), the speed and counts its own.
  dt::comm::deadline_rounds fast;
  fast.add_step(0, 1.0, 4);
  dt::io::checkpoint before;
  fast.save(before, "p.");
  before.counters["p.deadline.own.missed"] = 1;
  fast.load(before, "p.");
  fast.load(handed, "p.");
  const dt::comm::round_deadline d;
  CHECK(fast.deadline_s(d, 3, 1.0) == donor.deadline_s(d, 3, 1.0));
  CHECK(fast.typical_step_s() == 0.25);
  CHECK(fast.missed() == 1);
  CHECK(fast.dropped() == 0);
  // Its own checkpoint (a resume) restores its own as saved.
  dt::io::checkpoint mine;
  donor.save(mine, "p.");
  fast.load(mine, "p.");
  CHECK(fast.typical_step_s() == 1.0);
  CHECK(fast.missed() == 3);
  CHECK(fast.dropped() == 7);
}

TEST_CASE("round_deadline: rounds close without a straggler, which catches up, and every replica ends alike") {
  const std::vector<double> speeds{1, 1, 2, 4};
  const auto run = train(speeds, 0.04, dt::comm::round_deadline{});
  const auto waited = train(speeds, 0.04, std::nullopt);
  // Some rounds closed without a replica; each one missed is counted where it happened.
  CHECK(run.dropped > 0);
  CHECK(sum(run.missed) == run.dropped);
  // The late ones skipped steps to come back with the group, never past the end.
  CHECK(sum(run.skipped) > 0);
  for (std::size_t r = 0; r < speeds.size(); ++r) CHECK(run.steps_run[r] + run.skipped[r] == 48);
  // Every replica holds the group's global parameters after the last round.
  for (std::size_t r = 1; r < speeds.size(); ++r) CHECK(run.params[r] == run.params[0]);
  // Rounds after the warm-up close at the deadline, not with the last replica.
  REQUIRE(run.rounds.size() == 6);
  int cut = 0;
  for (const auto& round : run.rounds)
    if (round.members < round.replicas) {
      ++cut;
      CHECK(std::isfinite(round.deadline_s));
      // (a quorum comes first, and the leader itself)
      CHECK(round.close_s <= std::max({round.first_s + round.deadline_s, round.quorum_s, round.leader_s}) + 0.05);
    }
  CHECK(cut > 0);
  // Waiting for every replica takes longer in all.
  CHECK(run.clock_s[0] < waited.clock_s[0]);
  CHECK(waited.params[1] == waited.params[0]);
}

TEST_CASE("round_deadline: replicas rounds late, a short last round and evaluations between, every replica ending alike") {
  // A heavy tail (a quarter of the inner steps 10x as long) on 6 peers: replicas miss rounds in
  // a row, take later rounds' averages as they find them, and go on where the group is, never
  // past an evaluation (every peer meets there) nor past the run's end (50 steps, H = 8: the last
  // round is 2 steps long).
  const auto run = train({1, 1, 1, 2, 3, 4}, 0.25, dt::comm::round_deadline{}, 50, 8, 20);
  CHECK(run.dropped > 0);
  CHECK(sum(run.missed) == run.dropped);
  for (std::size_t r = 0; r < run.params.size(); ++r) {
    CHECK(run.steps_run[r] + run.skipped[r] == 50);
    CHECK(run.params[r] == run.params[0]);
  }
  // The deadline counts from the first arrival of a replica that ran its round whole: one that
  // went on partway into it (after skipping steps) may come earlier and does not set it.
  int set_aside = 0;
  for (const auto& round : run.rounds) {
    double first_whole = std::numeric_limits<double>::infinity(), first_part = first_whole;
    for (const auto& a : run.arrivals)
      if (a.round == round.round && a.in) {
        double& first = a.part ? first_part : first_whole;
        first = std::min(first, a.after_start_s);
      }
    INFO("round " << round.round);
    if (std::isfinite(first_whole)) CHECK(round.first_s == first_whole);
    if (first_part < first_whole) ++set_aside;
  }
  CHECK(set_aside > 0);
}

TEST_CASE("round_deadline: without stragglers no replica of any speed is dropped") {
  const auto run = train({1, 1, 2, 4}, 0.0, dt::comm::round_deadline{});
  CHECK(run.dropped == 0);
  CHECK(sum(run.missed) == 0);
  CHECK(sum(run.skipped) == 0);
  for (const auto& a : run.arrivals) CHECK(a.in);
  CHECK(run.arrivals.size() == 6 * 4);
}

// What each of 2 peers' fit threw (empty: nothing) under `policy` and the fault policy Fault.
template <class Fault = dt::fault::none>
std::vector<std::string> errors_of(const policy_type& policy) {
  std::vector<std::string> errors(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    try {
      dt::train::trainer<dt::nn::gpt<dt::cpu>, policy_type, dt::parallel::data, Fault> t(fixture::tiny_gpt(),
                                                                                         fixture::small_run(4), ep, policy);
      (void)t.fit(fixture::small_corpus().data);
    } catch (const dt::error& e) {
      errors[static_cast<std::size_t>(ep.rank())] = e.what();
    }
  });
  return errors;
}

TEST_CASE("round_deadline: diloco refuses it without sized_to_speed or with tune, and fault::elastic takes it") {
  policy_type p;
  p.inner_steps = 4;
  p.deadline = dt::comm::round_deadline{};
  for (const auto& e : errors_of(p)) CHECK_THAT(e, Catch::Contains("a deadline needs sized_to_speed"));
  p.sized_to_speed = true;
  p.tune.emplace();
  for (const auto& e : errors_of(p)) CHECK_THAT(e, Catch::Contains("a deadline needs sized_to_speed, and not tune"));
  // fault::elastic does not meet at a round's start where the policy catches up (a late
  // replica skips it; tests/fault/test_churn.cpp runs the two under churn).
  p.tune.reset();
  for (const auto& e : errors_of<dt::fault::elastic>(p)) CHECK(e.empty());
}
