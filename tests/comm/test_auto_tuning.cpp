// A DiLoCo that picks its own H and codec (comm/auto_tuning.hpp): the pick by hand, and peers of
// speeds 1, 1, 2, 4 on simulated links (deterministic in_process: an inner step costs 1 s / speed
// of a peer's clock) that agree on their picks bit for bit, keep the compute busy, pick again
// when the links slow mid-run, and resume bit for bit.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "support/trainer_fixture.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;

namespace {

using tuned_diloco = dt::comm::diloco<dt::comm::outer::sgd, dt::collective::any_codec>;

dt::comm::auto_tuning<dt::collective::any_codec> ladder() {
  dt::comm::auto_tuning<dt::collective::any_codec> t;
  for (const char* spec : {"identity", "int8", "int4"}) t.codecs.push_back(dt::collective::parse_codec(spec));
  return t;
}

tuned_diloco tuned() {
  tuned_diloco d;
  d.inner_steps = 4;  // until the first pick
  d.tune = ladder();
  d.tune->busy = 0.9;  // (H of tens, not hundreds: a short test)
  d.tune->min_inner_steps = 4;
  d.tune->prefer_inner_steps = 40;
  d.tune->max_inner_steps = 400;
  d.tune->min_rounds = 2;  // (runs of 80-100 steps)
  return d;
}

using tuned_streaming = dt::comm::streaming_diloco<dt::comm::outer::sgd, dt::collective::any_codec>;

tuned_streaming tuned_stream() {
  tuned_streaming s;
  s.inner_steps = 4;  // until the first pick (after step 0, before any exchange)
  s.fragments = 1;
  s.overlap = 1;
  s.tune = tuned().tune;
  s.tune->max_overlap = 0.5;  // (an exchange of ~10 steps hidden in rounds of tens, not of hundreds: a short test)
  return s;
}

// The model's f32 values, and links (10 ms) on which 4 replicas' f32 all-reduce of it takes
// about 10 s of a replica's clock (a ring: each replica sends 1.5x the model's bytes).
std::size_t tiny_values() { return static_cast<std::size_t>(fixture::tiny_gpt().parameter_count()); }
dt::transport::link_matrix ten_second_links() {
  const double bytes_per_s = 1.5 * 4.0 * static_cast<double>(tiny_values()) / 10.0;
  return {4, dt::transport::simulated_link{0.01, bytes_per_s, 0.0, 0.0, 0.0}};
}

struct tuned_run {
  std::vector<std::vector<float>> params;                       // by rank, at the end
  std::vector<std::vector<dt::comm::tuning_choice>> choices;    // by rank
  std::vector<std::vector<dt::train::step_metrics>> by_step;    // by rank
  std::vector<std::vector<std::int64_t>> round_ends;            // by rank: the steps that ended a round
  std::vector<std::string> codec_in_use;                        // by rank, at the end
  std::vector<std::size_t> ring_picks;                          // by rank: orders measured (with ring)
  std::vector<std::vector<int>> ring_order;                     // by rank: the last one
  std::vector<std::optional<dt::comm::tuning_choice>> last_exchange;  // by rank: Streaming DiLoCo's
};

// Four peers of `speeds` under `policy` for `steps` steps, the links slowed by `slowdown` from
// `slow_from` s on; from `saved` where given, stopping after `stop_after` steps (their
// checkpoints in *saved_out) where >= 0.
template <class Policy>
tuned_run run_tuned(const Policy& policy, std::int64_t steps, double slow_from = -1, double slowdown = 1,
                    const std::vector<dt::io::checkpoint>* saved = nullptr, std::int64_t stop_after = -1,
                    std::vector<dt::io::checkpoint>* saved_out = nullptr, std::vector<double> speeds = {1, 1, 2, 4}) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Policy>;
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};  // an inner step: 1 s / speed
  o.speeds = std::move(speeds);
  if (slow_from >= 0) o.slowdowns = {{slow_from, slowdown}};
  tuned_run out{std::vector<std::vector<float>>(4), std::vector<std::vector<dt::comm::tuning_choice>>(4),
                std::vector<std::vector<dt::train::step_metrics>>(4), std::vector<std::vector<std::int64_t>>(4),
                std::vector<std::string>(4), std::vector<std::size_t>(4), std::vector<std::vector<int>>(4),
                std::vector<std::optional<dt::comm::tuning_choice>>(4)};
  if (saved_out) saved_out->assign(4, {});
  dt::transport::in_process(ten_second_links(), o).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    auto options = fixture::small_run(steps);
    options.lr = 1e-2;
    Trainer t(fixture::tiny_gpt(), options, ep, policy);
    if (saved) t.restore((*saved)[r]);
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {  // (each peer writes its own slot)
      out.by_step[r].push_back(m);
      if (t.policy().ends_round_at(m.step)) out.round_ends[r].push_back(m.step);
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
    out.choices[r] = t.policy().choices();
    out.codec_in_use[r] = dt::compress::describe(t.policy().codec);
    if constexpr (requires { t.policy().last_exchange(); }) out.last_exchange[r] = t.policy().last_exchange();
    if constexpr (requires { t.policy().ordering(); }) {
      out.ring_picks[r] = t.policy().ordering().picks();
      if (const auto& last = t.policy().ordering().last()) out.ring_order[r] = last->order;
    }
  });
  return out;
}

bool same_picks(const std::vector<dt::comm::tuning_choice>& a, const std::vector<dt::comm::tuning_choice>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].step != b[i].step || a[i].inner_steps != b[i].inner_steps || a[i].codec != b[i].codec || a[i].why != b[i].why ||
        a[i].fragments != b[i].fragments || a[i].overlap != b[i].overlap ||
        a[i].measured.step_s != b[i].measured.step_s || a[i].measured.fixed_s != b[i].measured.fixed_s ||
        a[i].measured.per_byte_s != b[i].measured.per_byte_s)
      return false;
  return true;
}

// The compute share of peer r's clock from after step `from` to after step `to`.
double busy_between(const tuned_run& run, std::size_t r, std::int64_t from, std::int64_t to) {
  const auto& a = run.by_step[r][static_cast<std::size_t>(from)];
  const auto& b = run.by_step[r][static_cast<std::size_t>(to)];
  return (b.compute_s - a.compute_s) / (b.clock_s - a.clock_s);
}

}  // namespace

TEST_CASE("auto_tuning: the least lossy codec whose round keeps the compute busy within the preferred H, by hand") {
  auto t = ladder();  // identity, int8, int4; busy 0.97: H >= 97/3 x exchange / step
  const std::size_t n = 1'000'000;
  const dt::collective::any_codec own;
  const auto exchange = [&](std::size_t codec, const dt::comm::tuning_measure& m) {
    return m.fixed_s + m.per_byte_s * 1.5 * static_cast<double>(t.codecs[codec].max_encoded_bytes(n));  // 4 replicas: a ring's 1.5x
  };
  // A fast link: f32's exchange of 4 MB (6 MB sent) takes 0.2 + 0.06 s, H = ceil(32.33 x 2.6) = 85.
  const dt::comm::tuning_measure fast{0.1, 0.2, 1e-8};
  const auto f = t.choose(fast, n, 4, own);
  CHECK(f.codec == 0);
  CHECK(f.codec_name == "identity");
  CHECK(f.exchange_s == Approx(0.26));
  CHECK(f.inner_steps == 85);
  CHECK(f.busy >= 0.97);
  CHECK(f.busy == Approx(8.5 / (8.5 + 0.26)));
  // A slower one: f32 needs ceil(32.33 x 0.95 / 0.1) = 308 > 100 inner steps; int8 (a byte a
  // value and a 4-byte scale a block of 64: 1,062,500 B) fits in ceil(32.33 x 0.289 / 0.1) = 94.
  const dt::comm::tuning_measure slow{0.1, 0.05, 1.5e-7};
  const auto s = t.choose(slow, n, 4, own);
  CHECK(s.codec == 1);
  CHECK(s.exchange_s == Approx(exchange(1, slow)));
  CHECK(s.inner_steps == static_cast<std::int64_t>(std::ceil(0.97 / 0.03 * exchange(1, slow) / 0.1)));
  CHECK(s.inner_steps == 94);
  // Slower still: nothing fits in 100; int4 needs the fewest: ceil(32.33 x (0.05 + 1.5 x 562,500 B x 1e-6) / 0.1) = 289.
  const dt::comm::tuning_measure slower{0.1, 0.05, 1e-6};
  const auto v = t.choose(slower, n, 4, own);
  CHECK(v.codec == 2);
  CHECK(v.inner_steps == static_cast<std::int64_t>(std::ceil(0.97 / 0.03 * exchange(2, slower) / 0.1)));
  CHECK(v.inner_steps == 289);
  // So slow that every codec needs more than max_inner_steps: int4 still, at the most allowed.
  const auto w = t.choose({0.1, 0.2, 1e-5}, n, 4, own);
  CHECK((w.codec == 2 && w.inner_steps == t.max_inner_steps));
  // Compute slow enough that f32 costs little: the fewest inner steps allowed. One replica: no exchange.
  CHECK(t.choose({100.0, 0.2, 1e-8}, n, 4, own).inner_steps == t.min_inner_steps);
  const auto alone = t.choose(slow, n, 1, own);
  CHECK((alone.codec == 0 && alone.inner_steps == t.min_inner_steps && alone.exchange_s == 0));
  // A run of 1000 steps keeps at least 4 rounds: H at most 250 (int4 needs 289).
  CHECK(t.choose(slower, n, 4, own, 1000).inner_steps == 250);
  CHECK(t.choose(slower, n, 4, own, 1000).codec == 2);
  CHECK(t.choose(slower, n, 4, own, 20).inner_steps == t.min_inner_steps);
  // Without codecs, the policy's own, H alone tuned.
  const dt::comm::auto_tuning<dt::collective::any_codec> h_only;
  const auto o = h_only.choose(fast, n, 4, dt::collective::parse_codec("int8"));
  CHECK((o.codec == 0 && o.codec_name == dt::compress::describe(dt::collective::parse_codec("int8"))));

  // Drift: the measure furthest off, relative; the link's by the exchange it predicts.
  using tuning = dt::comm::auto_tuning<dt::collective::any_codec>;
  auto [off, what] = tuning::drift_of({0.13, 0.2, 1e-8}, fast, 6e6);
  CHECK(off == Approx(0.3));
  CHECK(std::string(what) == "compute");
  std::tie(off, what) = tuning::drift_of({0.1, 0.2, 2e-8}, fast, 6e6);
  CHECK(off == Approx(0.06 / 0.26));
  CHECK(std::string(what) == "link");

  // What it refuses.
  tuned_diloco d = tuned();
  d.tune->busy = 1.0;
  CHECK_THROWS_WITH(d.tune->validate("diloco"), Catch::Matchers::Contains("tune.busy must be in (0, 1), got 1"));
  d = tuned();
  d.tune->min_inner_steps = 50;
  CHECK_THROWS_WITH(d.tune->validate("diloco"), Catch::Matchers::Contains("2 <= min_inner_steps <= prefer_inner_steps"));
}

TEST_CASE("diloco tune: peers of speeds 1, 1, 2, 4 agree on one pick bit for bit and keep their compute busy") {
  // f32's exchange takes ~10 s against 1 s a round-step: 9 x 10 inner steps would keep 90% busy,
  // more than the preferred 40; int8's ~2.6 s needs ~24.
  const auto run = run_tuned(tuned(), 80);
  for (std::size_t r = 0; r < 4; ++r) {
    REQUIRE(run.by_step[r].size() == 80);
    REQUIRE(!run.choices[r].empty());
    CHECK(same_picks(run.choices[r], run.choices[0]));
    CHECK(run.round_ends[r] == run.round_ends[0]);
  }
  const auto& first = run.choices[0].front();
  for (std::size_t r = 0; r < 4; ++r) CHECK(run.codec_in_use[r] == first.codec_name);
  CHECK(first.step == 0);
  CHECK(first.why == "start");
  CHECK(first.codec_name.rfind("int8", 0) == 0);
  CHECK(first.inner_steps > 4);
  CHECK(first.inner_steps <= 40);
  CHECK(first.measured.step_s == Approx(1.0));  // the slowest peer's inner step
  CHECK(first.busy >= 0.9);
  // Rounds of the picked H from step 0 on.
  const auto h = first.inner_steps;
  REQUIRE(run.round_ends[0].size() >= 2);
  CHECK(run.round_ends[0][0] == h - 1);
  // The fast peer takes 4 inner steps a step. Over the rounds after the first, every peer
  // computes at least 89% of its clock (the pick predicts 90%; with the 4 steps of f32
  // before it, every peer waited on f32's ~10 s exchange each 4 s of compute).
  const auto from = run.round_ends[0][0], to = run.round_ends[0].back();
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("peer " << r << " busy " << busy_between(run, r, from, to));
    CHECK(busy_between(run, r, from, to) >= 0.89);
  }
}

TEST_CASE("diloco tune: links slowed 5x mid-run are found at the next round's end and picked for again") {
  const auto run = run_tuned(tuned(), 100, 40.0, 5.0);
  for (std::size_t r = 0; r < 4; ++r) CHECK(same_picks(run.choices[r], run.choices[0]));
  const auto& picks = run.choices[0];
  REQUIRE(picks.size() >= 2);
  const auto& again = picks[1];
  CHECK(again.why.rfind("drift: link", 0) == 0);
  // (The rounds' measures are smoothed: the first round after the slowdown moves them 30% of the
  // way, 2.2x; a pick after that is judged against this one.)
  CHECK(again.measured.per_byte_s > 2 * picks[0].measured.per_byte_s);
  // int8 would now need more than 40 inner steps: int4, the codec that needs fewest.
  CHECK(again.codec_name.rfind("int4", 0) == 0);
  CHECK(again.inner_steps > picks[0].inner_steps);
  // Not slowed: no second pick (the measures stay within 30%).
  CHECK(run_tuned(tuned(), 100).choices[0].size() == 1);
}

TEST_CASE("diloco tune with ring: the ring is ordered once its exchange goes around one, and again after the links drift") {
  // Until the first pick the policy's own codec (identity) would all-reduce this small model by
  // recursive doubling on these links: the probe measures no order. The pick, int8, goes around
  // the ring: its first exchange measures the order; the links slowed 5x bring another pick
  // ("drift: link"), and the order is measured again before the next exchange. Every replica
  // picks the same orders.
  auto policy = tuned();
  policy.ring = dt::comm::measured_ring{};
  const auto slowed = run_tuned(policy, 100, 40.0, 5.0);
  REQUIRE(slowed.choices[0].size() >= 2);
  CHECK(slowed.choices[0][1].why.rfind("drift: link", 0) == 0);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("peer " << r);
    CHECK(same_picks(slowed.choices[r], slowed.choices[0]));
    CHECK(slowed.ring_picks[r] == 2);
    CHECK(slowed.ring_order[r] == slowed.ring_order[0]);
    CHECK(slowed.ring_order[r].size() == 4);
  }
  // Not slowed: one order, measured at int8's first exchange.
  const auto steady = run_tuned(policy, 100);
  for (std::size_t r = 0; r < 4; ++r) CHECK(steady.ring_picks[r] == 1);
}

TEST_CASE("diloco tune: a run stopped mid-round after its pick and resumed ends bit for bit as the whole run") {
  // (Without the slowdown: a resumed simulation's clocks start again at 0.)
  const auto policy = tuned();
  const auto whole = run_tuned(policy, 80);
  REQUIRE(!whole.choices[0].empty());
  const auto stop_at = whole.choices[0][0].inner_steps + 3;  // in the second round
  std::vector<dt::io::checkpoint> saved;
  (void)run_tuned(policy, 80, -1, 1, nullptr, stop_at, &saved);
  CHECK(saved[0].counter("comm.diloco.tune.inner_steps") == whole.choices[0][0].inner_steps);
  CHECK(saved[0].counter("comm.diloco.tune.codec") == 1);  // int8, picked: the codec's state and H came back
  const auto resumed = run_tuned(policy, 80, -1, 1, &saved);
  CHECK(resumed.params == whole.params);
  CHECK(resumed.choices[0].size() == whole.choices[0].size());  // (no pick made again)
  // A checkpoint whose codec is not one of the policy's is refused, naming it.
  saved[0].counters["comm.diloco.tune.codec"] = 7;
  CHECK_THROWS_WITH(run_tuned(policy, 80, -1, 1, &saved), Catch::Matchers::Contains("codec 7 of 3"));
}

TEST_CASE("diloco tune: the codec picked is the one in use, also where the policy's own is none of those it picks from") {
  // Its own codec f32, its choices int8 and int4: int8, the first of them, is picked and used.
  auto policy = tuned();
  policy.tune->codecs.erase(policy.tune->codecs.begin());
  const auto run = run_tuned(policy, 60);
  REQUIRE(!run.choices[0].empty());
  CHECK(run.choices[0][0].codec == 0);
  CHECK(run.choices[0][0].codec_name.rfind("int8", 0) == 0);
  for (std::size_t r = 0; r < 4; ++r) CHECK(run.codec_in_use[r] == run.choices[0][0].codec_name);
}

TEST_CASE("diloco tune: checkpoints of a tuned run and of an untuned one, each resumed the other way") {
  // A tuned run's checkpoint resumed without tune is refused (its H and codec would be lost).
  std::vector<dt::io::checkpoint> saved;
  (void)run_tuned(tuned(), 60, -1, 1, nullptr, 30, &saved);
  auto untuned = tuned();
  untuned.tune.reset();
  CHECK_THROWS_WITH(run_tuned(untuned, 60, -1, 1, &saved), Catch::Matchers::Contains("resume it with tune set (--auto)"));
  // An untuned run's (H = 4, f32), resumed with tune after 5 steps, mid-round: the group probes
  // at its start and picks after its first step (step 5); every peer alike, the round it was in kept.
  std::vector<dt::io::checkpoint> plain;
  (void)run_tuned(untuned, 60, -1, 1, nullptr, 5, &plain);
  const auto resumed = run_tuned(tuned(), 60, -1, 1, &plain);
  REQUIRE(!resumed.choices[0].empty());
  CHECK(resumed.choices[0][0].step == 5);
  CHECK(resumed.choices[0][0].codec_name.rfind("int8", 0) == 0);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(same_picks(resumed.choices[r], resumed.choices[0]));
    CHECK(resumed.codec_in_use[r] == resumed.choices[0].back().codec_name);
  }
  // The round that began at step 4 under H = 4 ends H steps after its start, at the picked H.
  REQUIRE(!resumed.round_ends[0].empty());
  CHECK(resumed.round_ends[0][0] == 4 + resumed.choices[0][0].inner_steps - 1);
}

TEST_CASE("diloco tune under fault::elastic: a fast peer never outruns the group into a state reload, and the run is the plain one") {
  // hivemind issue 443: a peer 4x as fast, ahead of the group, kept reloading the group's state.
  // Here every round ends at one step for all (sized to speed, picked alike): over 80 steps no
  // membership change, no state taken, and the parameters bit for bit those of the run without
  // the fault policy.
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, tuned_diloco, dt::parallel::data, dt::fault::elastic>;
  const auto plain = run_tuned(tuned(), 80);
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  o.speeds = {1, 1, 2, 4};
  std::vector<std::vector<float>> params(4);
  std::vector<std::uint64_t> changes(4, 99);
  std::vector<std::int64_t> steps(4, 0);
  dt::transport::in_process(ten_second_links(), o).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    auto options = fixture::small_run(80);
    options.lr = 1e-2;
    Trainer t(fixture::tiny_gpt(), options, ep, tuned());
    t.on_step([&](const dt::train::step_metrics& m) { steps[r] = m.step; });
    (void)t.fit(fixture::small_corpus().data);
    params[r] = fixture::flat_params(t.model().parameters());
    changes[r] = t.fault().change_count();
  });
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(changes[r] == 0);
    CHECK(steps[r] == 80);
    CHECK(params[r] == plain.params[r]);
  }
}

TEST_CASE("auto_tuning: streaming's fragments and overlap that keep the compute busy in the fewest inner steps, by hand") {
  auto t = ladder();  // identity, int8, int4; busy 0.97; fragment counts 1, 2, 4; overlap at most H / 10
  const std::size_t n = 1'000'000;
  const std::vector<std::size_t> largest{n, n / 2, n / 4};  // fragments of equal size
  const dt::collective::any_codec own;
  const auto exchange = [&](std::size_t codec, std::size_t values, const dt::comm::tuning_measure& m) {
    return m.fixed_s + m.per_byte_s * 1.5 * static_cast<double>(t.codecs[codec].max_encoded_bytes(values));  // 4 replicas: a ring's 1.5x
  };
  // Latency-bound: f32's whole exchange, 0.26 s, would hide behind 3 steps of 0.1 s; an overlap
  // of at most H / 10 hides 0.2 s of it at H = 20 (97.1% busy; H = 19 overlaps 1 step: 92.2%).
  // Fragments shorten the exchange little and multiply what is exposed: one fragment.
  const dt::comm::tuning_measure fast{0.1, 0.2, 1e-8};
  const auto f = t.choose_streaming(fast, largest, 4, own);
  CHECK((f.codec == 0 && f.fragments == 1 && f.overlap == 2 && f.inner_steps == 20));
  CHECK(f.exchange_s == Approx(0.26));
  CHECK(f.busy == Approx(2.0 / 2.06));
  // Bandwidth-bound: 0.61 s whole, 0.16 s a quarter: 4 fragments hidden behind 2 steps each, H 20.
  const dt::comm::tuning_measure wide{0.1, 0.01, 1e-7};
  const auto w = t.choose_streaming(wide, largest, 4, own);
  CHECK((w.codec == 0 && w.fragments == 4 && w.overlap == 2 && w.inner_steps == 20));
  CHECK(w.exchange_s == Approx(exchange(0, n / 4, wide)));
  CHECK(w.busy == 1.0);
  // A slow link where DiLoCo's rounds need int4 and 289 inner steps (the case above): f32 would
  // need 150 here; int8's quarter (0.448 s) hides behind 5 steps of rounds of 50.
  const dt::comm::tuning_measure slower{0.1, 0.05, 1e-6};
  CHECK(t.choose(slower, n, 4, own).codec == 2);
  const auto s = t.choose_streaming(slower, largest, 4, own);
  CHECK((s.codec == 1 && s.fragments == 4 && s.overlap == 5 && s.inner_steps == 50));
  CHECK(s.exchange_s == Approx(exchange(1, n / 4, slower)));
  // Slower still: every codec needs more than the preferred 100; int4 in 4 fragments needs fewest,
  // its overlap still at most a tenth of the round.
  const dt::comm::tuning_measure slowest{0.1, 0.05, 1e-5};
  const auto v = t.choose_streaming(slowest, largest, 4, own);
  CHECK((v.codec == 2 && v.fragments == 4));
  CHECK(v.inner_steps > 100);
  CHECK(v.overlap <= v.inner_steps / 10);
  CHECK(v.busy >= 0.97);
  // A count the model cannot be cut into is left out: 2 fragments of int8 (rounds of 80, overlap 8).
  const std::vector<std::size_t> no_four{n, n / 2, 0};
  const auto two = t.choose_streaming(slower, no_four, 4, own);
  CHECK((two.codec == 1 && two.fragments == 2 && two.overlap == 8 && two.inner_steps == 80));
  // A short run caps H (at least 4 rounds): nothing keeps 97% busy in 30 inner steps, so the
  // busiest there, int4 in 4 fragments, overlapping 3 steps of each exchange of 2.16 s.
  const auto capped = t.choose_streaming(slowest, largest, 4, own, 120);
  CHECK((capped.codec == 2 && capped.fragments == 4 && capped.inner_steps == 30 && capped.overlap == 3));
  CHECK(capped.busy == Approx(3.0 / (3.0 + 4 * (capped.exchange_s - 0.3))));
  // One replica: nothing to hide, the least H and one step's overlap.
  const auto alone = t.choose_streaming(slower, largest, 1, own);
  CHECK((alone.codec == 0 && alone.fragments == 1 && alone.overlap == 1 && alone.inner_steps == t.min_inner_steps));
  CHECK_THROWS_WITH(t.choose_streaming(slower, std::vector<std::size_t>{0, 0, 0}, 4, own),
                    Catch::Matchers::Contains("no fragment count"));
  t.max_overlap = 1.0;
  CHECK_THROWS_WITH(t.validate("streaming_diloco"), Catch::Matchers::Contains("tune.max_overlap must be in (0, 1), got 1"));
  t = ladder();
  t.fragment_counts = {0};
  CHECK_THROWS_WITH(t.validate("streaming_diloco"), Catch::Matchers::Contains("tune.fragment_counts holds 0"));
}

TEST_CASE("auto_tuning: the run's last exchange through the rounds' codec where the run has the time to spare, else the least lossy dense codec after it that fits, by hand") {
  auto t = ladder();  // identity, int8, int4
  t.codecs.push_back(dt::collective::parse_codec("topk:0.01,ef"));
  const std::size_t n = 1'000'000;
  const std::vector<std::size_t> quarters(4, n / 4);  // every fragment at once
  // 4 replicas on a ring (nothing by recursive doubling: no small_s), 0.05 s of latencies and
  // 1 s a MB sent: each fragment's 1.5x of its payload (a dense codec's). The four run at once:
  // their latencies overlap, their bytes add up.
  const dt::comm::tuning_measure m{0.1, 0.05, 1e-6};
  const auto all = [&](std::size_t codec) {
    return 0.05 + 4 * 1e-6 * 1.5 * static_cast<double>(t.codecs[codec].max_encoded_bytes(n / 4));
  };
  REQUIRE(all(0) == Approx(6.05));
  REQUIRE((all(1) < 2.0 && all(2) < 0.8 * all(1)));
  const auto pick = [&](std::size_t at, double spare) { return t.choose_last_exchange(m, quarters, 4, at, spare); };
  const auto roomy = pick(0, 10.0);  // f32 fits: kept
  CHECK((roomy.codec == 0 && roomy.codec_name == "identity" && roomy.fragments == 4));
  CHECK(roomy.exchange_s == Approx(all(0)));
  const auto some = pick(0, 3.0);  // int8 is the least lossy that fits
  CHECK((some.codec == 1 && some.exchange_s == Approx(all(1))));
  CHECK(pick(0, (all(1) + all(2)) / 2).codec == 2);
  // None fits: the quickest dense one (top-k, quicker, would drop 99% of the last round).
  const auto none = pick(0, 0.0);
  CHECK((none.codec == 2 && none.exchange_s == Approx(all(2))));
  // Never less lossy than the rounds' codec; a sparse one of the rounds is kept where nothing after it is quicker.
  CHECK(pick(1, 10.0).codec == 1);
  CHECK(pick(2, 10.0).codec == 2);
  const auto sparse = pick(3, 0.0);
  CHECK((sparse.codec == 3 && sparse.exchange_s < all(2)));
  CHECK_THROWS_WITH(pick(4, 1.0), Catch::Matchers::Contains("codec 4 of 4 for the last exchange"));
}

TEST_CASE("streaming_diloco tune: peers agree on H, fragments, overlap and codec, priced as their exchange goes, and pick again for slowed links") {
  // The links on which DiLoCo's rounds need int8 (an f32 exchange ~10 s against 1 s a step):
  // Streaming DiLoCo keeps f32 and hides each exchange behind its overlap. (A deterministic
  // run's exchanges block its peers, so the busy share is measured in the next case.)
  const std::vector<double> same_speed{1, 1, 1, 1};
  const auto run = run_tuned(tuned_stream(), 80, -1, 1, nullptr, -1, nullptr, same_speed);
  for (std::size_t r = 0; r < 4; ++r) {
    REQUIRE(run.by_step[r].size() == 80);
    CHECK(same_picks(run.choices[r], run.choices[0]));
    CHECK(run.round_ends[r] == run.round_ends[0]);
    CHECK(run.params[r] == run.params[0]);  // (the run ends on the global parameters)
    CHECK(run.codec_in_use[r] == run.choices[0].back().codec_name);
  }
  REQUIRE(!run.choices[0].empty());
  const auto& pick = run.choices[0][0];
  CHECK((pick.step == 0 && pick.why == "start"));
  CHECK(pick.codec_name == "identity");
  CHECK(pick.measured.step_s == Approx(1.0));
  CHECK(pick.inner_steps > pick.overlap);
  CHECK(2 * pick.overlap <= pick.inner_steps);  // (max_overlap 0.5)
  CHECK(pick.busy >= 0.9);                        // (what is not hidden is within the 10% asked for)
  const auto h = pick.inner_steps;
  REQUIRE(run.round_ends[0].size() >= 3);
  CHECK(run.round_ends[0][0] == h - 1);
  // This small model's f32 average goes by recursive doubling (2 payloads a peer, not a ring's
  // 1.5): the pick prices it so, from the probe's small all-reduce and its seconds per byte, and
  // the exchanges measured stay within 30% of that: no other pick. (Priced as a ring, they took
  // a third longer than predicted and brought a second pick.)
  const dt::collective::any_codec f32;
  const double ring = pick.measured.fixed_s + pick.measured.per_byte_s * dt::comm::exchange_bytes(f32, tiny_values(), 4);
  CHECK(pick.exchange_s == Approx(dt::comm::exchange_seconds(f32, tiny_values(), 4, pick.measured, std::size_t{512} << 10)));
  CHECK(pick.exchange_s > 1.2 * ring);
  CHECK(run.choices[0].size() == 1);
  CHECK(run.round_ends[0][1] == 2 * h - 1);
  // The run's last exchange, which nothing hides: f32's (more than 10 s) does not fit in what
  // 80 steps of 1 s at 90% busy leave (at most 8.9 s), so it goes through a lossier codec, the
  // same on every peer, which still ends every peer on the same bits; the rounds' codec is back
  // after it. It sends less than half of f32's recursive doubling (2 payloads a peer).
  REQUIRE(run.last_exchange[0]);
  const auto& last = *run.last_exchange[0];
  INFO("the last exchange: " << last.codec_name << ", " << last.exchange_s << " s (" << last.why << ")");
  CHECK((last.step == 79 && last.codec_name != "identity" && last.codec > 0));
  CHECK(last.why.find("identity would take") != std::string::npos);
  for (std::size_t r = 0; r < 4; ++r) {
    REQUIRE(run.last_exchange[r]);
    CHECK((run.last_exchange[r]->codec == last.codec && run.last_exchange[r]->exchange_s == last.exchange_s));
  }
  const auto last_bytes = run.by_step[0][79].policy_bytes_sent - run.by_step[0][78].policy_bytes_sent;
  CHECK(last_bytes > 0);
  CHECK(static_cast<double>(last_bytes) < 0.5 * 2 * 4 * static_cast<double>(tiny_values()));
  // Links slowed 5x mid-run: picked again ("drift: link"), every peer alike.
  const auto slowed = run_tuned(tuned_stream(), 100, 60.0, 5.0, nullptr, -1, nullptr, same_speed);
  for (std::size_t r = 0; r < 4; ++r) CHECK(same_picks(slowed.choices[r], slowed.choices[0]));
  REQUIRE(slowed.choices[0].size() >= 2);
  CHECK(slowed.choices[0][1].why.rfind("drift: link", 0) == 0);
  // (its f32 exchanges went by recursive doubling: that algorithm's seconds per byte scaled, the ring's kept)
  CHECK(slowed.choices[0][1].measured.rd_per_byte_s > 2 * slowed.choices[0][0].measured.rd_per_byte_s);
  CHECK(slowed.choices[0][1].measured.per_byte_s == slowed.choices[0][0].measured.per_byte_s);
  // (f32 would need more than the preferred 40 inner steps now: a lossier codec)
  CHECK(slowed.choices[0][1].codec_name != "identity");
  // DiLoCo's pick on the same links and peers: a lossier codec.
  const auto diloco = run_tuned(tuned(), 80, -1, 1, nullptr, -1, nullptr, same_speed);
  REQUIRE(!diloco.choices[0].empty());
  CHECK(diloco.choices[0][0].codec_name != "identity");
}

TEST_CASE("streaming_diloco tune: exchanges in the background hide behind the overlap picked, on simulated links and measured compute") {
  // Not deterministic: every exchange runs on a lane beside the compute, which each peer's
  // thread clock measures (the CPU time its steps took, whatever else this machine runs).
  // Links of 1 ms and 100 MB/s, on which this small model's f32 exchange (recursive doubling)
  // takes about 4 ms, a few of its steps in an optimised build or a debug one: the picks hide it,
  // and from the round after the last pick on, every peer computes more of its clock than it
  // would with the exchange waited for at each round's end (H steps, then the exchange: about
  // 0.65-0.7 here), by a margin. Not a fixed share: four peers share two cores, and a peer's
  // share was as low as 0.77 in runs of the same build on an idle 2-core machine (a threshold of
  // 0.85 failed in CI, and of 0.8 three runs in seven).
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, tuned_streaming>;
  dt::transport::link_matrix links(4, dt::transport::simulated_link{0.001, 1e8, 0.0, 0.0, 0.0});
  std::vector<std::vector<dt::comm::tuning_choice>> choices(4);
  std::vector<std::vector<dt::train::step_metrics>> by_step(4);
  std::vector<std::vector<std::int64_t>> round_ends(4);
  dt::transport::in_process(links).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    auto options = fixture::small_run(400);
    options.lr = 1e-2;
    options.compute_on_thread_clock = true;
    auto policy = tuned_stream();
    policy.tune->busy = 0.97;
    policy.tune->min_inner_steps = 4;
    Trainer t(fixture::tiny_gpt(), options, ep, policy);
    t.on_step([&](const dt::train::step_metrics& m) {
      by_step[r].push_back(m);
      if (t.policy().ends_round_at(m.step)) round_ends[r].push_back(m.step);
    });
    (void)t.fit(fixture::small_corpus().data);
    choices[r] = t.policy().choices();
  });
  REQUIRE(!choices[0].empty());
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("peer " << r);
    CHECK(same_picks(choices[r], choices[0]));
    CHECK(round_ends[r] == round_ends[0]);
  }
  // The last pick in force for 3 rounds or more is judged, from the round after it to the next
  // pick or the last round's end before the run's final exchange (drift under this machine's
  // load can pick again late: after step 389 once, which left no round after it).
  std::size_t judged = choices[0].size();
  std::vector<std::int64_t> after;
  for (std::size_t k = choices[0].size(); k-- > 0;) {
    const std::int64_t until = k + 1 < choices[0].size() ? choices[0][k + 1].step : 399;
    std::vector<std::int64_t> rounds;
    for (const auto e : round_ends[0])
      if (e > choices[0][k].step && e < until) rounds.push_back(e);
    if (rounds.size() >= 3) {
      judged = k;
      after = std::move(rounds);
      break;
    }
  }
  INFO("picks " << choices[0].size() << ", after steps " << [&] {
    std::string steps;
    for (const auto& c : choices[0])
      steps += " " + std::to_string(c.step) + " (H " + std::to_string(c.inner_steps) + ", " + c.why + ", " + c.codec_name +
               ", exchange " + std::to_string(c.exchange_s) + " s, step " + std::to_string(c.measured.step_s) + " s, busy " +
               std::to_string(c.busy) + ")";
    return steps;
  }());
  REQUIRE(judged < choices[0].size());
  const auto& last = choices[0][judged];
  INFO("judged: the pick after step " << last.step << ": H " << last.inner_steps << ", " << last.fragments << " fragments, overlap "
                                      << last.overlap << ", exchange " << last.exchange_s << " s, step " << last.measured.step_s << " s");
  const tuned_run view{{}, {}, by_step, {}, {}, {}, {}, {}};
  const double round_s = static_cast<double>(last.inner_steps) * last.measured.step_s;
  const double waited_for = round_s / (round_s + last.exchange_s);
  INFO("busy with the exchange waited for: " << waited_for);
  for (std::size_t r = 0; r < 4; ++r) {
    const double busy = busy_between(view, r, after[0], after.back());
    INFO("peer " << r << " busy " << busy);
    CHECK(busy > waited_for + 0.05);
  }
}

TEST_CASE("link_probe: a replica proposes the step its clock passes the probe's end at its latest step's pace, sized to speed too") {
  // 5 s of clock ahead after 20 steps. The slowest replica: one inner step of 0.1 s a step, 50
  // steps more. A 4x replica sized to speed: four inner steps of 0.025 s a step, also 0.1 s, and
  // the same 50 (priced by an unsized step of one inner step, it would propose 200 more).
  CHECK(dt::comm::probing::proposal(20, 5.0, 0.1, 1, 1000) == 70);
  CHECK(dt::comm::probing::proposal(20, 5.0, 0.025, 4, 1000) == 70);
  // Before its sizing lands, one inner step a step: 200 more, as its steps then go.
  CHECK(dt::comm::probing::proposal(20, 5.0, 0.025, 1, 1000) == 220);
  // At `latest` at the most, after the step it is at at the least (nothing measured, or nothing ahead).
  CHECK(dt::comm::probing::proposal(20, 5.0, 0.1, 1, 40) == 40);
  CHECK(dt::comm::probing::proposal(20, 5.0, 0.0, 1, 1000) == 20);
  CHECK(dt::comm::probing::proposal(20, 0.0, 0.1, 1, 1000) == 20);
}

TEST_CASE("link_probe: recursive doubling priced at its own seconds per byte where links differ per peer, and a round's ratio scales that algorithm's figures alone") {
  // 8 peers on `heterogeneous` links without their drops (deterministic; a drop costs 0.3 s,
  // noise this checks nothing of): the probe, then an f32 exchange of a 200 KB fragment by
  // recursive doubling, timed: priced within 15% (0.72 s against 0.64). At the ring's seconds per
  // byte, as before the probe measured its own, 0.50 s, 21% short (each round sends the whole
  // payload to one partner, and every round meets the slowest peer's connection, which a ring's
  // pieces pipeline past; 2.3 times the ring's seconds per byte here).
  constexpr int world = 8;
  constexpr std::size_t fragment = 50'000;
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  auto links = dt::transport::links::heterogeneous(world);
  for (int a = 0; a < world; ++a)
    for (int b = 0; b < world; ++b) links.at(a, b).drop_probability = 0;
  std::vector<double> took(world), ring_took(world);
  std::vector<dt::comm::tuning_measure> measured(world), ring_only(world);
  std::vector<std::uint64_t> probe_bytes(world), ring_only_bytes(world);
  dt::transport::in_process(links, o).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    dt::collective::communicator comm(ep);
    const auto sent = [&] { return ep.stats().bytes_sent; };
    const auto before = sent();
    const auto probed = dt::comm::probe_links(comm, 4 * fragment, std::size_t{1} << 17, dt::comm::probing::time_recursive_doubling::yes);
    probe_bytes[r] = sent() - before;
    measured[r] = probed.link;
    measured[r].small_s = probed.small_s;
    std::vector<float> x(fragment, 1.0f);
    comm.barrier();
    const double t0 = ep.stats().clock_seconds;
    comm.all_reduce(std::span<float>(x), dt::collective::reduce_op::sum, dt::collective::algorithm::recursive_doubling);
    took[r] = ep.stats().clock_seconds - t0;
    comm.barrier();
    const double t1 = ep.stats().clock_seconds;
    comm.all_reduce(std::span<float>(x), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
    ring_took[r] = ep.stats().clock_seconds - t1;
    // DiLoCo's probe: the ring's figures alone, without recursive doubling's all-reduce.
    const auto before_ring_only = sent();
    const auto ring_probed = dt::comm::probe_links(comm, 4 * fragment, std::size_t{1} << 17, dt::comm::probing::time_recursive_doubling::no);
    ring_only[r] = ring_probed.link;
    ring_only[r].small_s = ring_probed.small_s;
    ring_only_bytes[r] = sent() - before_ring_only;
  });
  const auto& m = measured[0];
  for (const auto& other : measured) CHECK((other.rd_per_byte_s == m.rd_per_byte_s && other.per_byte_s == m.per_byte_s));
  // Without recursive doubling: no figure of it, and each peer sent that all-reduce's bytes less
  // (its 3 rounds of the probe's 25,000 values; the first probe's first ring also agreed the
  // ring's sizes, once a communicator: 192 bytes).
  const std::uint64_t rd_payload = 3 * 4 * 25'000;
  for (std::size_t r = 0; r < world; ++r) {
    INFO("peer " << r << ": " << probe_bytes[r] << " bytes sent by the probe, " << ring_only_bytes[r] << " without recursive doubling");
    CHECK(ring_only[r].rd_per_byte_s == 0);
    CHECK(ring_only[r].per_byte_s == ring_only[0].per_byte_s);
    CHECK(probe_bytes[r] - ring_only_bytes[r] >= rd_payload);
    CHECK(probe_bytes[r] - ring_only_bytes[r] < rd_payload + 256);
  }
  const dt::collective::any_codec f32;
  const std::size_t rd_below = std::size_t{1} << 30;
  const double slowest = *std::max_element(took.begin(), took.end());
  const double priced = dt::comm::exchange_seconds(f32, fragment, world, m, rd_below);
  auto by_ring = m;
  by_ring.rd_per_byte_s = 0;  // (the ring's seconds per byte in its place)
  const double ring_priced = dt::comm::exchange_seconds(f32, fragment, world, by_ring, rd_below);
  INFO("took " << slowest << " s; priced " << priced << " s, at the ring's seconds per byte " << ring_priced << " s; "
               << m.rd_per_byte_s << " against " << m.per_byte_s << " s a byte");
  CHECK(dt::comm::by_recursive_doubling(f32, fragment, m, rd_below));
  CHECK(std::abs(priced / slowest - 1) < 0.15);
  CHECK(ring_priced < 0.85 * slowest);
  // The same exchange by the ring: its latencies (the probe's fixed part less the small
  // all-reduce it counts, which a DiLoCo round adds and an exchange alone does not) and bytes,
  // within 20% (1.71 s against 1.47); with the small all-reduce counted, 2.05 s, 39% over.
  const double ring_slowest = *std::max_element(ring_took.begin(), ring_took.end());
  const double ring_price = dt::comm::exchange_seconds(f32, fragment, world, m, 0);
  const double with_small = m.fixed_s + m.per_byte_s * dt::comm::exchange_bytes(f32, fragment, world);
  INFO("by the ring: took " << ring_slowest << " s, priced " << ring_price << " s (with the small all-reduce " << with_small << " s)");
  CHECK(std::abs(ring_price / ring_slowest - 1) < 0.2);
  CHECK(with_small > 1.3 * ring_slowest);
  // DiLoCo's probe, without recursive doubling: a DiLoCo round's exchange is priced as
  // auto_tuning::choose prices it (the probe's fixed part, which counts the small all-reduce a
  // round has beside its exchange, and the ring's bytes) within 25% of that ring and a small
  // all-reduce (2.22 s against 1.89; the probe above, 2.05 s against 1.81). Its split into
  // latencies and bytes differs from the probe above (1.22 s and 1.67 us a byte, against 1.61 s
  // and 0.27 us): that one's ring of s, the communicator's first ring, also agreed the ring's
  // sizes (a small all-reduce of 0.3-0.4 s here), and on these links the ends of each ring differ
  // among the replicas by up to 0.5 s, where the ring of 2s values' extra bytes take about 0.14
  // s at the slowest link's bandwidth, so the difference of two rings is noise as much as bytes.
  const auto& ro = ring_only[0];
  const double round_priced = ro.fixed_s + ro.per_byte_s * dt::comm::exchange_bytes(f32, fragment, world);
  INFO("DiLoCo's probe: fixed " << ro.fixed_s << " s, " << ro.per_byte_s << " s a byte: a round's exchange priced " << round_priced
                                << " s, the ring and the small all-reduce took " << ring_slowest + ro.small_s << " s");
  CHECK(std::abs(round_priced / (ring_slowest + ro.small_s) - 1) < 0.25);
  // An exchange that took twice its price scales the algorithm it went by, not the other.
  const auto rd2 = dt::comm::scaled_for(m, true, 2.0);
  CHECK(dt::comm::exchange_seconds(f32, fragment, world, rd2, rd_below) == Approx(2 * priced));
  CHECK(dt::comm::exchange_seconds(f32, fragment, world, rd2, 0) == Approx(dt::comm::exchange_seconds(f32, fragment, world, m, 0)));
  const auto ring2 = dt::comm::scaled_for(m, false, 2.0);
  CHECK((ring2.small_s == m.small_s && ring2.rd_per_byte_s == m.rd_per_byte_s));
  CHECK(dt::comm::exchange_seconds(f32, fragment, world, ring2, 0) == Approx(2 * dt::comm::exchange_seconds(f32, fragment, world, m, 0)));
}

TEST_CASE("streaming_diloco tune: the start's probe runs beside the first steps, and every peer picks after the same one") {
  // Not deterministic: the probe runs on a lane (comm/link_probe.hpp). On links of 1 ms the probe
  // waited for (an all-reduce to meet, one timed, recursive doubling, two rings and one to agree)
  // would cost each peer 2 x its ring's latencies + 4 small all-reduces (recursive doubling of
  // this model's few values about one), some tens of this model's steps: the peers
  // compute through it instead, agree after which step they take its figures, and send nothing
  // before.
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, tuned_streaming>;
  dt::transport::link_matrix links(4, dt::transport::simulated_link{0.001, 1e8, 0.0, 0.0, 0.0});
  std::vector<std::vector<dt::comm::tuning_choice>> choices(4);
  std::vector<std::vector<dt::train::step_metrics>> by_step(4);
  dt::transport::in_process(links).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    auto options = fixture::small_run(400);
    options.lr = 1e-2;
    options.compute_on_thread_clock = true;
    Trainer t(fixture::tiny_gpt(), options, ep, tuned_stream());
    t.on_step([&](const dt::train::step_metrics& m) { by_step[r].push_back(m); });
    (void)t.fit(fixture::small_corpus().data);
    choices[r] = t.policy().choices();
  });
  REQUIRE(!choices[0].empty());
  const auto& first = choices[0].front();
  INFO("first pick after step " << first.step << ": ring latencies " << first.measured.fixed_s << " s, small all-reduce "
                                << first.measured.small_s << " s, step " << first.measured.step_s << " s");
  CHECK(first.why == "start");
  REQUIRE(first.step > 1);  // (waited for, the probe gives its figures after step 0)
  REQUIRE(first.step < 399);
  const double small = first.measured.small_s, ring = first.measured.fixed_s - small;
  REQUIRE(small > 0.0015);
  REQUIRE(ring > 2 * small);
  // The network's share of the clock up to the pick, on the path of the replica that computed
  // longest: every replica's clock after the pick's all-reduce, less the most any spent off the
  // network (compute and the rest). A replica's own waits also count the others' compute ahead of
  // its own, which measured on the threads' clocks wanders with the host's load (four threads on
  // two cores beside another test: the reason a bound on them failed under ctest -j2).
  const auto at = static_cast<std::size_t>(first.step);
  double off_network = 0;
  for (std::size_t r = 0; r < 4; ++r) off_network = std::max(off_network, by_step[r][at].clock_s - by_step[r][at].network_wait_s);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("peer " << r);
    CHECK(same_picks(choices[r], choices[0]));
    // Up to the pick: the start's checks (three small all-reduces) and the pick's own comparison
    // (one), about 4 small (3.5-4 here), not the probe's 2 x ring + 4 small all-reduces on top (8
    // small + 2 ring in all, were it waited for: 0.027-0.028 s against a bound of 0.017 with the
    // probe run on the training thread before its lane). The bound lies between the two.
    const double network = by_step[r][at].clock_s - off_network;
    INFO("the network's " << network << " s of the clock up to the pick (this replica waited " << by_step[r][at].network_wait_s
                          << " s)");
    CHECK(network < 5.5 * small + ring);
    // Nothing of the policy's went out before the pick (the probe's bytes count once it is taken).
    CHECK(by_step[r][at - 1].policy_bytes_sent == by_step[r][0].policy_bytes_sent);
  }
}

TEST_CASE("streaming_diloco tune over TCP: steps short against the probe wait for it a step before the longest round a pick may set") {
  // Over TCP the probe's lane runs in real time beside steps of about a millisecond, so the
  // steps outrun it: each peer waits for the answer at the step before `latest` (here the longest
  // round is 2 steps: the pick comes after step 1), proposing `latest` itself. Without that wait
  // the peers would take the figures after whatever step their lanes proposed, some later.
  std::vector<std::vector<dt::comm::tuning_choice>> choices(2);
  harness::tcp::run(2, [&](dt::transport::tcp& ep) {
    auto options = fixture::small_run(40);
    options.lr = 1e-2;
    auto policy = tuned_stream();
    policy.tune->min_inner_steps = 2;
    policy.tune->prefer_inner_steps = 2;
    policy.tune->min_rounds = 20;  // (40 steps / 20: rounds of at most 2 inner steps)
    dt::train::trainer<dt::nn::gpt<dt::cpu>, tuned_streaming> t(fixture::tiny_gpt(), options, ep, policy);
    (void)t.fit(fixture::small_corpus().data);
    choices[static_cast<std::size_t>(ep.rank())] = t.policy().choices();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("peer " << r);
    REQUIRE(!choices[r].empty());
    CHECK(choices[r].front().why == "start");
    CHECK(choices[r].front().step == 1);
    CHECK(choices[r].front().inner_steps == 2);
    CHECK(same_picks(choices[r], choices[0]));
  }
}

TEST_CASE("streaming_diloco tune: a run stopped mid-round and resumed ends bit for bit as the whole run, and its checkpoints resumed untuned are refused") {
  const std::vector<double> same_speed{1, 1, 1, 1};
  const auto policy = tuned_stream();
  const auto whole = run_tuned(policy, 100, -1, 1, nullptr, -1, nullptr, same_speed);
  REQUIRE(whole.choices[0].size() == 1);
  const auto& pick = whole.choices[0][0];
  // Mid-round, a round after the pick: an exchange in flight, the last round's measures agreed
  // in the background.
  const auto stop_at = pick.step + pick.inner_steps + pick.inner_steps / 2;
  REQUIRE(stop_at < 98);
  std::vector<dt::io::checkpoint> saved;
  (void)run_tuned(policy, 100, -1, 1, nullptr, stop_at, &saved, same_speed);
  CHECK(saved[0].counter("comm.streaming_diloco.tune.inner_steps") == pick.inner_steps);
  CHECK(saved[0].counter("comm.streaming_diloco.tune.overlap") == pick.overlap);
  CHECK(saved[0].counter("comm.streaming_diloco.fragments") == pick.fragments);
  CHECK(saved[0].counter("comm.streaming_diloco.tune.agreed") == 1);
  const auto resumed = run_tuned(policy, 100, -1, 1, &saved, -1, nullptr, same_speed);
  CHECK(resumed.params == whole.params);
  CHECK(resumed.choices[0].size() == 1);  // (a placeholder for the picks before; none made again)
  // (the last exchange priced from the pick's busy share, which the checkpoint keeps)
  CHECK(dt::comm::load_exact(saved[0], "comm.streaming_diloco.tune.busy", "a share") == pick.busy);
  REQUIRE((whole.last_exchange[0] && resumed.last_exchange[0]));
  CHECK((resumed.last_exchange[0]->codec == whole.last_exchange[0]->codec &&
         resumed.last_exchange[0]->exchange_s == whole.last_exchange[0]->exchange_s));
  CHECK(resumed.round_ends[0] == std::vector<std::int64_t>(whole.round_ends[0].end() - static_cast<std::ptrdiff_t>(resumed.round_ends[0].size()),
                                                            whole.round_ends[0].end()));
  auto untuned = policy;
  untuned.tune.reset();
  CHECK_THROWS_WITH(run_tuned(untuned, 100, -1, 1, &saved, -1, nullptr, same_speed),
                    Catch::Matchers::Contains("resume it with tune set (--auto)"));
  auto eager = policy;
  eager.eager = true;
  CHECK_THROWS_WITH(run_tuned(eager, 10, -1, 1, nullptr, -1, nullptr, same_speed), Catch::Matchers::Contains("eager does not go with it"));
}

TEST_CASE("streaming_diloco tune sized to speed: peers of speeds 1, 1, 2, 4 pick alike, the fast ones fill each step after a pick for slowed links too, and a run resumes bit for bit") {
  // Deterministic (run_tuned: an inner step costs 1 s / speed, an f32 exchange about 10 s).
  // Sized to speed, each peer takes as many inner steps a step as fit in the slowest one's from
  // its third step on (the 4x peer 4), and the picks price a step at the slowest replica's inner
  // step. The links slowed 5x after 60 s bring a pick of other rounds at a round's end: the round
  // it starts is sized by its own H (speed_sizing::shift_round), and every peer goes on at its
  // speed's inner steps a step.
  auto policy = tuned_stream();
  policy.sized_to_speed = true;
  const auto run = run_tuned(policy, 100, 60.0, 5.0);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("peer " << r);
    REQUIRE(run.by_step[r].size() == 100);
    CHECK(same_picks(run.choices[r], run.choices[0]));
    CHECK(run.round_ends[r] == run.round_ends[0]);
    CHECK(run.params[r] == run.params[0]);
  }
  REQUIRE(run.choices[0].size() >= 2);
  const auto& first = run.choices[0][0];
  const auto& again = run.choices[0][1];
  INFO("picks: H " << first.inner_steps << ", overlap " << first.overlap << ", " << first.fragments << " fragments, "
                   << first.codec_name << " after step " << first.step << "; H " << again.inner_steps << ", overlap "
                   << again.overlap << ", " << again.fragments << " fragments, " << again.codec_name << " after step "
                   << again.step << " (" << again.why << ")");
  CHECK((first.step == 0 && first.why == "start"));
  CHECK(first.measured.step_s == Approx(1.0));  // (the slowest replica's inner step)
  CHECK(again.why.rfind("drift: link", 0) == 0);
  REQUIRE(again.inner_steps != first.inner_steps);
  // From its third step on, each peer takes as many inner steps a step as its speed over the
  // slowest one's: the slowest one, the 2x two, the 4x four, also in the round the second pick
  // starts (which, sized by the H before it, would hold twice the inner steps a step for every
  // peer, or half, where the new H is half or twice the old). Counted from the tokens trained.
  const std::int64_t one = run.by_step[0][0].tokens;
  REQUIRE(one > 0);
  const std::vector<std::int64_t> each{1, 1, 2, 4};
  for (std::size_t r = 0; r < 4; ++r) {
    std::vector<std::int64_t> off;  // the steps with another count
    for (std::size_t k = 2; k < 100; ++k)
      if (run.by_step[r][k].tokens - run.by_step[r][k - 1].tokens != each[r] * one) off.push_back(static_cast<std::int64_t>(k));
    INFO("peer " << r << ": steps with other than " << each[r] << " inner steps: " << off.size()
                 << (off.empty() ? std::string() : ", the first after step " + std::to_string(off.front())));
    CHECK(off.empty());
  }

  // Stopped mid-round after the pick (an exchange in flight, the speeds and the round's
  // measures agreed in the background) and resumed: bit for bit the whole run.
  const auto whole = run_tuned(policy, 100);
  REQUIRE(!whole.choices[0].empty());
  const auto& pick = whole.choices[0][0];
  const auto stop_at = pick.step + pick.inner_steps + pick.inner_steps / 2;
  REQUIRE(stop_at < 98);
  std::vector<dt::io::checkpoint> saved;
  (void)run_tuned(policy, 100, -1, 1, nullptr, stop_at, &saved);
  CHECK(saved[3].counter("comm.streaming_diloco.speed_round_steps") == 4 * pick.inner_steps);
  CHECK(saved[3].counter("comm.streaming_diloco.tune.inner_steps") == pick.inner_steps);
  const auto resumed = run_tuned(policy, 100, -1, 1, &saved);
  CHECK(resumed.params == whole.params);
}
